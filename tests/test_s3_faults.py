"""Exactly-once on a real S3 server, the GCS emulator and Azurite, with faults injected
at the HTTP level.

A proxy on 127.0.0.1 (``tests.fault_proxy``) sits between the package and
SeaweedFS (or fake-gcs-server's gateway, or Azurite) and drops responses after a
PUT landed, answers 500/503 before or after forwarding, resets connections and
delays requests. Under each fault,
WAL appends, claims and commit records must lose no acknowledged row,
duplicate none in ``read_committed``, send each conditional PUT once per
protocol attempt, and fail, when they must, with a typed error saying what to do.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import WriterPoisoned
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, Txn, stream_app_id
from memwal_datasource.store import open_store
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.fault_proxy import FaultRule
from tests.helpers import SCHEMA, make_batch, new_shard

pytestmark = pytest.mark.s3

FAULTS = {
    "lost response": dict(fault="drop_response"),
    "500 after landing": dict(fault="error_after", status=500),
    "503 after landing": dict(fault="error_after", status=503),
    "503 before": dict(fault="error_before", status=503),
    "reset before": dict(fault="reset_before"),
    "reset after landing": dict(fault="drop_response", rst=True),
}
TARGETS = {
    "wal": r"/wal/[01]+\.arrow$",
    "claim": r"/manifest/[01]+\.binpb$",
    "commit": r"/_memwal_commits/\d+\.json$",
}


def committed_ids(uri: str, opts: dict) -> list[int]:
    """Every id a read_committed reader returns, through the real read path."""
    from memwal_datasource.spark.options import ReadOptions
    from memwal_datasource.spark.reader import plan_partitions, read_partition

    ropts = ReadOptions.parse({"path": uri, **{f"storage.{k}": v for k, v in opts.items()}})
    ids: list[int] = []
    for part in plan_partitions(ropts, open_store(uri, opts)):
        for batch in read_partition(ropts, SCHEMA, part):
            ids.extend(batch.column("id").to_pylist())
    return sorted(ids)


def write_and_commit(uri: str, opts: dict, shard: str, start: int, puts: int,
                     txn: Txn | None = None) -> list[int]:
    """One task's worth: open, durable puts, close, one commit record; returns acked ids."""
    config = ShardWriterConfig(enable_memtable=False, durable_write=True,
                               wal_persist_retry_base_delay_ms=1, max_wal_flush_interval_ms=1)
    acked: list[int] = []
    with open_shard_writer(uri, shard, SCHEMA, config, opts) as writer:
        for i in range(puts):
            writer.put(make_batch(start + 10 * i, 10))
            acked.extend(range(start + 10 * i, start + 10 * i + 10))
    s = writer.stats()
    rng = CommittedRange(shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows)
    CommitLog(open_store(uri, opts), retry_base_delay_ms=1).append(
        APPEND, [rng], job_id=f"job-{start}", txn=txn)
    return acked


def conditional_puts(proxy, pattern: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rec in proxy.records(method="PUT"):
        if rec.conditional and re.search(pattern, rec.path):
            counts[rec.path] = counts.get(rec.path, 0) + 1
    return counts


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_one_fault_loses_and_duplicates_nothing(proxied_location, fault, target):
    fault_proxy, (uri, opts) = proxied_location
    shard = new_shard()
    acked = write_and_commit(uri, opts, shard, 0, 3)  # epoch 1, clean
    fault_proxy.clear_records()
    # Hit the second matching conditional PUT: a claim of epoch 2, a WAL entry
    # past the sentinel, or the second job's commit record.
    rule = fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=TARGETS[target],
                                          only_conditional=True, times=1, **FAULTS[fault]))
    skip_first = {"wal": 1, "claim": 0, "commit": 0}[target]
    if skip_first:  # let the sentinel through, hit the first data entry
        rule.times = None
        hits: list[str] = []

        def pick(rec, _orig=rule._matches):
            if _orig(rec):
                hits.append(rec.path)
                return len(hits) == skip_first + 1
            return False

        rule._matches = pick
    acked += write_and_commit(uri, opts, shard, 1000, 3, txn=Txn(stream_app_id("q"), 0))
    assert rule.hits == 1 or (skip_first and len(hits) >= 2), "the fault never fired"
    assert committed_ids(uri, opts) == sorted(acked)
    # The SDK never retried behind the protocol's back: the faulted key saw one
    # PUT for the fault and at most one protocol retry; every other key one PUT.
    counts = conditional_puts(fault_proxy, TARGETS[target])
    assert max(counts.values()) <= 2 and sorted(counts.values()).count(2) <= 1, counts
    # Replaying the same keyed commit (a stream batch Spark re-runs) adds nothing.
    again = CommitLog(open_store(uri, opts)).append(APPEND, [], txn=Txn(stream_app_id("q"), 0))
    assert not again.created and committed_ids(uri, opts) == sorted(acked)


@pytest.mark.parametrize("fault", ["503 before", "lost response"])
def test_persistent_fault_is_a_typed_error_and_reopen_recovers(proxied_location, fault):
    fault_proxy, (uri, opts) = proxied_location
    shard = new_shard()
    acked = write_and_commit(uri, opts, shard, 0, 2)
    fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=TARGETS["wal"],
                                   only_conditional=True, **FAULTS[fault]))
    with pytest.raises(WriterPoisoned, match="reopen"):
        write_and_commit(uri, opts, shard, 1000, 2)
    fault_proxy.clear_rules()
    acked += write_and_commit(uri, opts, shard, 2000, 2)
    # The failed task committed nothing: its landed entries never show.
    assert committed_ids(uri, opts) == sorted(acked)


def test_delayed_requests_change_nothing(proxied_location):
    fault_proxy, (uri, opts) = proxied_location
    fault_proxy.add_rule(FaultRule(method="PUT", fault="delay", delay_s=0.05,
                                   probability=0.5, seed=7))
    shard = new_shard()
    acked = write_and_commit(uri, opts, shard, 0, 3)
    acked += write_and_commit(uri, opts, shard, 1000, 3)
    assert committed_ids(uri, opts) == sorted(acked)


def test_native_writer_lost_response_is_poisoned_not_fenced(proxied_s3_table, fault_proxy):
    """pylance's own writer duplicates an entry on a lost response and stops: we say reopen."""
    from memwal_datasource.table.view import create_table

    uri, opts = proxied_s3_table
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    shard = new_shard()
    fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=TARGETS["wal"],
                                   only_conditional=True, fault="drop_response", times=1))
    config = ShardWriterConfig(enable_memtable=True, durable_write=True,
                               max_wal_flush_interval_ms=10)
    with pytest.raises(WriterPoisoned, match="reopen"):
        with open_shard_writer(uri, shard, SCHEMA, config, opts) as writer:
            writer.put(pa.Table.from_batches([make_batch(0, 5)]))
            writer.put(pa.Table.from_batches([make_batch(5, 5)]))
    assert committed_ids(uri, opts) == []  # the failed writer's entries never show
    # Reopening recovers: the next writer's rows commit once.
    with open_shard_writer(uri, shard, SCHEMA, config, opts) as writer:
        writer.put(pa.Table.from_batches([make_batch(100, 5)]))
    s = writer.stats()
    CommitLog(open_store(uri, opts)).append(APPEND, [CommittedRange(
        shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows)])
    assert committed_ids(uri, opts) == list(range(100, 105))
