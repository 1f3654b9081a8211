"""Issue 18, interleaving 5: gc never fences a live, leased writer.

gc takes each shard's lease before fencing it; a shard a live writer (or a Spark
task) holds is skipped (``plan.skipped_busy``) until a later run, and that writer's
next put and its job's commit succeed. The Spark test pauses a task inside its
Python worker at a hook point through the socket gates of test_concurrent_jobs.
"""

from __future__ import annotations

import time

import pytest

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.maintenance.gc import collect
from memwal_datasource.shard.leases import Holder, Leases
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, read_table
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA, later, new_shard
from tests.maintenance.test_compact import batch
from tests.maintenance.test_compact import write as write_task
from tests.spark.test_concurrent_jobs import finish, in_thread, storage, worker_gates
from tests.spark.test_writer import frame, read, write


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_gc_skips_a_shard_a_live_writer_leases(pk_table):
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    write_task(uri, opts, shard, [batch([1], "old")])
    table = TableView(uri, opts)
    compact(table)
    holder = Holder(job_id="live-job", partition=0, label="job live (test)",
                    job_started_ms=int(time.time() * 1000))
    with Leases(store).held(shard, holder):
        w = open_shard_writer(uri, shard, SCHEMA, ShardWriterConfig(enable_memtable=False), opts)
        w.put(batch([2], "live"))
        w.flush()
        epoch = w.stats().epoch
        done = collect(table, retain_seconds=0, clock=later(table))
        assert ManifestStore(store, shard).latest().writer_epoch == epoch  # not fenced
        w.put(batch([3], "live"))  # the next put lands
        w.close()
        s = w.stats()
        res = CommitLog(store).append(APPEND, [CommittedRange(
            shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows)])
        assert res.created
        assert done.skipped_busy == [shard]
        assert shard not in {sp.shard_id for sp in done.shards} and done.gc_sequence is None
        assert "held by a live writer" in done.kept_reason()
    want = {1: "old-1", 2: "live-2", 3: "live-3"}
    assert {r["id"]: r["v"] for r in read_table(uri, opts).to_pylist()} == want
    # Once the lease is released, a later run collects the shard.
    done = collect(TableView(uri, opts), retain_seconds=0, clock=later(table))
    assert [sp.shard_id for sp in done.shards] == [shard] and not done.skipped_busy
    assert {r["id"]: r["v"] for r in read_table(uri, opts).to_pylist()} == want


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_gc_while_a_spark_task_is_paused_mid_write(spark, spark_location, tmp_path):
    """A job's task pauses right after a WAL append (holding its shard's lease) while gc
    runs on the driver: gc skips that shard, the job then finishes and commits, and
    every row is read once."""
    uri, opts = spark_location
    write(frame(spark, 0, 40, 2), uri, opts)  # creates the table, commits on pool shards
    table = TableView(uri, storage(opts))
    compact(table)
    with worker_gates(spark, tmp_path, ["append.after"], hold={"append.after"}) as gates:
        job, out = in_thread(spark, write, frame(spark, 1000, 400, 2), uri, opts)
        paused = gates.next("append.after")
    try:
        done = collect(TableView(uri, storage(opts)), retain_seconds=0, clock=later(table))
        assert paused["shard"] in done.skipped_busy, (paused, done)
        assert paused["shard"] not in {sp.shard_id for sp in done.shards}
        assert "result" not in out and "error" not in out  # still paused
        gates.release("append.after")
        finish(job, out)  # the gates answer the task's later appends until it is done
    finally:
        gates.close()
    want = list(range(40)) + list(range(1000, 1400))
    assert sorted(r.id for r in read(spark, uri, opts, view="table").collect()) == want
    assert sorted(r.id for r in read(spark, uri, opts).collect()) == want[40:]  # the tail
    assert sorted(read_table(uri, storage(opts)).column("id").to_pylist()) == want
