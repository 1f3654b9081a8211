"""Concurrent primary-key writers in Spark: an overtaken commit is re-homed, not refused.

A job's tasks release their shards when they end, so another writer can take a
shard later and commit first; the overtaken job's driver then re-homes its rows
of that shard (memwal_datasource.write.rehome) and commits. The overlap is forced by
holding one writer's commit at ``commit.before`` in Spark's Python worker
(the socket gates of ``test_concurrent_jobs``) until the other has committed.
"""

from __future__ import annotations

import pytest

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.spark.source import checkpoint_query_id
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, read_table
from memwal_datasource.write.native import committed_lsm_scanner
from tests.spark.test_concurrent_jobs import finish, in_thread, storage, worker_gates
from tests.spark.test_writer import write

BUCKETED = {"primary_key": "id", "shard_by_bucket": "id", "num_buckets": "4"}


def tagged(spark, lo: int, hi: int, tag: str, parts: int = 2):
    return spark.range(lo, hi, numPartitions=parts).selectExpr("id", f"'{tag}' as v")


def records(uri: str, opts: dict) -> list:
    return list(CommitLog(open_store(uri, storage(opts))).records())


def agree(spark, uri: str, opts: dict, want: dict[int, str], memtable: str) -> None:
    """The whole-table read, view=table, Lance's LSM view and (after compaction) the base
    table all hold ``want``, each key once."""
    table = TableView(uri, storage(opts))

    def keyed(rows) -> dict[int, str]:
        out = {r["id"]: r["v"] for r in rows}
        assert len(out) == len(rows), "a key read twice"
        return out

    reader = spark.read.format("memwal").option("view", "table")
    for k, v in opts.items():
        reader = reader.option(k, v)
    assert keyed(read_table(uri, storage(opts)).to_pylist()) == want
    assert keyed([r.asDict() for r in reader.load(uri).collect()]) == want
    if memtable == "true":
        assert keyed(committed_lsm_scanner(table).to_table().to_pylist()) == want
    compact(table)
    assert keyed(table.dataset().to_table(columns=["id", "v"]).to_pylist()) == want


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("memtable", ["false", "true"])
def test_two_concurrent_upserts_both_commit(spark, spark_location, tmp_path, memtable):
    """Job A's commit is held until job B (same keys, every bucket, planned later so its
    tasks take the shards after A's) has committed: A's commit is overtaken on every shard,
    re-homes them and commits; A's values are the newest (it committed last)."""
    uri, opts = spark_location
    mode = {**opts, "enable_memtable": memtable}
    write(tagged(spark, 0, 1000, "seed"), uri, mode, **BUCKETED)
    with worker_gates(spark, tmp_path, ["commit.before"], hold={"commit.before"}) as gates:
        job_a, out_a = in_thread(spark, write, tagged(spark, 0, 600, "a"), uri, mode)
        gates.next("commit.before")  # A's tasks are done and released; its commit waits
    try:
        write(tagged(spark, 300, 900, "b"), uri, mode)  # job B: newer epochs, commits first
        assert "result" not in out_a and "error" not in out_a
        gates.release("commit.before")
        finish(job_a, out_a)  # no CommitRefused
    finally:
        gates.close()
    seed, b, a = records(uri, opts)
    b_epochs = {r.shard_id: r.epoch for r in b.ranges}
    assert len(b_epochs) == 4 and {r.shard_id for r in a.ranges} == set(b_epochs)
    assert all(r.epoch > b_epochs[r.shard_id] for r in a.ranges)  # re-homed above B
    assert a.extra["label"].startswith(f"job {a.job_id}")
    want = {k: "seed" for k in range(1000)} | {k: "b" for k in range(300, 900)} | {
        k: "a" for k in range(600)}
    agree(spark, uri, opts, want, memtable)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_stream_overtaken_by_a_batch_job_keeps_running(spark, spark_location, tmp_path):
    """A micro-batch's commit is held until a batch job on the same buckets has committed:
    the stream's commit re-homes, the query runs on (its next batch commits too) and the
    stream's values are the newest where it committed last."""
    uri, opts = spark_location
    write(tagged(spark, 0, 1000, "seed"), uri, opts, **BUCKETED)
    src, ck = str(tmp_path / "src"), str(tmp_path / "ck")
    for lo, hi, tag in ((0, 400, "s0"), (2000, 2100, "s1")):
        tagged(spark, lo, hi, tag, parts=1).write.mode("append").parquet(src)
    with worker_gates(spark, tmp_path, ["commit.before"], hold={"commit.before"}) as gates:
        stream = (spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1)
                  .parquet(src).writeStream.format("memwal").option("checkpointLocation", ck))
        for k, v in opts.items():
            stream = stream.option(k, v)
        q = stream.trigger(availableNow=True).start(uri)
        try:
            gates.next("commit.before")  # micro-batch 0 wrote and released; its commit waits
            write(tagged(spark, 200, 600, "b"), uri, opts)  # the batch job commits first
            gates.release("commit.before")
            q.awaitTermination(300)
        finally:
            q.stop()
            gates.close()
    assert q.exception() is None, q.exception()
    query = checkpoint_query_id(ck)
    recs = records(uri, opts)
    assert [r.job_id for r in recs[2:]] == [f"{query}:0", f"{query}:1"]
    assert recs[1].query_id is None  # the batch job, committed before micro-batch 0
    b_epochs = {r.shard_id: r.epoch for r in recs[1].ranges}
    assert all(r.epoch > b_epochs.get(r.shard_id, 0) for r in recs[2].ranges)
    assert recs[2].extra["label"] == f"stream {query} batch 0"
    want = {k: "seed" for k in range(1000)} | {k: "b" for k in range(200, 600)} | {
        k: "s0" for k in range(400)} | {k: "s1" for k in range(2000, 2100)}
    agree(spark, uri, opts, want, "true")
