"""TableView and MemWalTable: one view of shards, commits and compaction for every reader."""

from __future__ import annotations

import uuid

import pytest

from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
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
    from memwal_datasource.table.view import TableView

    uri, opts = pk_table
    log = CommitLog(open_store(uri, opts))  # a checkpoint every 100 records
    shard = str(uuid.uuid4())
    for i in range(250):
        log.append(APPEND, [CommittedRange(shard, 1, i + 1, i + 1, rows=1)])
    counting = Counting(open_store(uri, opts))
    tail = TableView(uri, opts, store=counting).committed_tail()
    assert [r.first for r in tail] == list(range(1, 251))
    assert [r.sequence for r in tail] == list(range(1, 251))
    assert counting.reads <= 70, counting.reads  # ~50 records + checkpoint + manifest


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_one_table_object_reads_compacts_collects_and_tells_history(pk_table):
    from memwal_datasource import MemWalError, MemWalTable
    from tests.helpers import later
    from tests.maintenance.test_compact import batch, write

    uri, opts = pk_table
    shard = str(uuid.uuid4())
    write(uri, opts, shard, [batch([1, 2], "a")])
    write(uri, opts, shard, [batch([2, 3], "b")])
    table = MemWalTable.open(uri, opts)
    got = table.read().sort_by("id")
    assert got.column("id").to_pylist() == [1, 2, 3]
    assert got.column("v").to_pylist() == ["a-1", "b-2", "b-3"]
    history = table.history()
    assert [h["sequence"] for h in history] == [2, 1]
    assert [h["kind"] for h in history] == ["append", "append"] and history[0]["rows"] == 2
    assert table.history(limit=1)[0]["sequence"] == 2
    summary = table.compact()
    assert summary.rows == 3 and table.compact().rounds == []  # nothing left to fold
    freed = table.gc(retain_seconds=0, clock=later(table))
    assert freed.shards and freed.gc_sequence == 3
    assert table.history()[0]["kind"] == "gc"
    assert table.read().sort_by("id").equals(got)
    with pytest.raises(MemWalError, match="no Lance table"):
        MemWalTable.open(uri + "-missing", opts)


@pytest.mark.parametrize("keys", [["k"], ["k", "j"]])
def test_last_per_key_keeps_the_last_row_of_each_key_in_order(keys):
    """Unique keys come back as they are; with repeats, the last row of each key, in the
    order of those last rows (compaction's fold), one column or several."""
    import numpy as np
    import pyarrow as pa

    from memwal_datasource.table.view import last_per_key

    rng = np.random.default_rng(7)
    # spread 1: ascending keys (the quick test); -1: descending (the hash pass); else random
    for n, spread in ((0, 1), (1, 1), (500, 1), (500, -1), (500, 10_000_000), (500, 40),
                      (500, 3)):
        k = (rng.integers(0, spread, n) if spread > 1 else
             np.arange(n) if spread == 1 else np.arange(n)[::-1].copy())
        t = pa.table({"k": k, "j": k % 2, "seq": np.arange(n)})
        last: dict = {}
        for i, row in enumerate(zip(*(t.column(c).to_pylist() for c in keys), strict=True)):
            last[row] = i
        expected = sorted(last.values())
        assert last_per_key(t, keys).column("seq").to_pylist() == expected, (n, spread)
