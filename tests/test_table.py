"""MemWalTable: one view of shards, commits and compaction for every reader."""

from __future__ import annotations

import uuid

import pytest

from memwal_datasource.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.store import open_store
from tests.helpers import DelegatingStore


class Counting(DelegatingStore):
    """Counts reads (get, head, list)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.reads = 0

    def get(self, key):
        self.reads += 1
        return self.inner.get(key)

    def head(self, key):
        self.reads += 1
        return self.inner.head(key)

    def list(self, prefix):
        self.reads += 1
        return self.inner.list(prefix)


@pytest.mark.parametrize("backend", ["local"])
def test_read_plan_costs_records_since_the_checkpoint_not_history(pk_table):
    from memwal_datasource.table import MemWalTable

    uri, opts = pk_table
    log = CommitLog(open_store(uri, opts))  # a checkpoint every 100 records
    shard = str(uuid.uuid4())
    for i in range(250):
        log.append(APPEND, [CommittedRange(shard, 1, i + 1, i + 1, rows=1)])
    counting = Counting(open_store(uri, opts))
    tail = MemWalTable(uri, opts, store=counting).committed_tail()
    assert [r.first for r in tail] == list(range(1, 251))
    assert [r.sequence for r in tail] == list(range(1, 251))
    assert counting.reads <= 70, counting.reads  # ~50 records + checkpoint + manifest
