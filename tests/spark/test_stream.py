"""Streaming: memwal sink (exactly-once per micro-batch) and memwal source."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from memwal_datasource.commit import CommitLog
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalStreamWriter, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table import create_table

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def add_files(spark, src, start, n_files, rows_per_file=100):
    for f in range(start, start + n_files):
        lo = f * rows_per_file
        spark.range(lo, lo + rows_per_file, numPartitions=1).selectExpr(
            "id", "cast(id as string) as v").write.mode("append").parquet(src)


def run_sink(spark, src, uri, ck, opts):
    """Files -> memwal sink, one file per micro-batch, until caught up."""
    stream = spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1)
    w = stream.parquet(src).writeStream.format("memwal").option("checkpointLocation", ck)
    for k, v in {"enable_memtable": "false", **opts}.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start(uri)
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def run_source(spark, uri, ck, out, opts, **extra):
    """memwal source -> parquet sink until caught up, then stop (a restart point).

    Spark's memory sink cannot restart from a checkpoint in append mode, so the
    restartable end of the pipeline is a parquet sink (itself exactly-once).
    Returns every row the sink holds so far and this run's non-empty batches.
    """
    r = spark.readStream.format("memwal")
    for k, v in {**opts, **extra}.items():
        r = r.option(k, v)
    q = (r.load(uri).writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", ck).start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    return sorted(row.id for row in spark.read.parquet(out).collect()), batches


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_stream_pipeline_exactly_once_across_restarts(spark, spark_location, tmp_path):
    uri, opts = spark_location
    src, ck_sink, ck_src = (str(tmp_path / p) for p in ("src", "ck_sink", "ck_src"))
    add_files(spark, src, 0, 3)
    run_sink(spark, src, uri, ck_sink, opts)
    out = str(tmp_path / "out")
    first, _ = run_source(spark, uri, ck_src, out, opts)
    assert first == list(range(300))
    # Both queries restart from their checkpoints and pick up only new data.
    add_files(spark, src, 3, 2)
    run_sink(spark, src, uri, ck_sink, opts)
    everything, batches = run_source(spark, uri, ck_src, out, opts)
    assert everything == list(range(500))  # every input row exactly once
    assert sum(b["numInputRows"] for b in batches) == 200  # the restart read only new rows
    records = list(CommitLog(open_store(uri, {k[8:]: v for k, v in opts.items()})).records())
    assert [r.batch_id for r in records] == [0, 1, 2, 3, 4]
    assert len({r.query_id for r in records}) == 1


@pytest.mark.parametrize("backend", ["local"])
def test_replayed_batch_is_not_committed_twice(spark, spark_location, tmp_path):
    uri, opts = spark_location
    src, ck = str(tmp_path / "src"), str(tmp_path / "ck")
    add_files(spark, src, 0, 2)
    run_sink(spark, src, uri, ck, opts)
    store = open_store(uri)
    assert len(list(CommitLog(store).records())) == 2
    # Lose Spark's record that batch 1 committed: on restart Spark runs batch 1 again
    # (a crash between our commit and Spark's own checkpoint looks exactly like this).
    for name in ("1", ".1.crc"):
        os.remove(os.path.join(ck, "commits", name))
    run_sink(spark, src, uri, ck, opts)
    assert len(list(CommitLog(store).records())) == 2
    ids = sorted(r.id for r in spark.read.format("memwal").load(uri).collect())
    assert ids == list(range(200))
    raw = spark.read.format("memwal").option("isolation", "read_uncommitted").load(uri)
    assert raw.count() == 300  # the replay's entries exist, uncommitted and invisible


@pytest.mark.parametrize("backend", ["local"])
def test_source_read_limit_spreads_commits_over_batches(spark, spark_location, tmp_path):
    uri, opts = spark_location
    add_files(spark, str(tmp_path / "src"), 0, 4)
    run_sink(spark, str(tmp_path / "src"), uri, str(tmp_path / "ck1"), opts)
    ids, batches = run_source(spark, uri, str(tmp_path / "ck2"), str(tmp_path / "out"), opts,
                              max_entries_per_trigger="1")
    assert ids == list(range(400))
    assert len(batches) == 4  # one commit record (one entry) per micro-batch


@pytest.mark.parametrize("backend", ["local"])
def test_source_available_now_then_stops(spark, spark_location, tmp_path):
    uri, opts = spark_location
    add_files(spark, str(tmp_path / "src"), 0, 2)
    run_sink(spark, str(tmp_path / "src"), uri, str(tmp_path / "ck1"), opts)
    q = (spark.readStream.format("memwal").load(uri).writeStream.format("memory")
         .queryName("avail").option("checkpointLocation", str(tmp_path / "ck2"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    assert spark.sql("SELECT count(*) AS n FROM avail").collect()[0].n == 200


def test_stream_writer_commit_is_idempotent_per_batch(tmp_path):
    uri = str(tmp_path / "t.lance")
    table = create_table(uri, SCHEMA).schema
    opts = WriteOptions.parse({"path": uri, "enable_memtable": "false"})
    writer = MemWalStreamWriter(opts, table, overwrite=False, query_id="q-1")
    batch = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], schema=SCHEMA)
    msg = write_task(opts, table, iter([batch]))
    writer.commit([msg], 7)
    writer.commit([msg], 7)  # replayed after a crash
    records = list(CommitLog(open_store(uri)).records())
    assert [(r.query_id, r.batch_id) for r in records] == [("q-1", 7)]
    other = MemWalStreamWriter(opts, table, overwrite=False, query_id="q-2")
    other.commit([msg], 7)  # same batch id, another stream: a separate commit
    assert len(list(CommitLog(open_store(uri)).records())) == 2


def test_stream_sink_requires_checkpoint_or_query_id(spark, tmp_path):
    df = spark.readStream.format("rate").load().selectExpr("value as id", "'x' as v")
    with pytest.raises(Exception, match="checkpointLocation"):
        q = df.writeStream.format("memwal").start(str(tmp_path / "t.lance"))
        q.awaitTermination(30)
        raise RuntimeError(str(q.exception()))


def test_commit_logs_one_summary_line_without_secrets(tmp_path, caplog):
    import logging

    uri = str(tmp_path / "t.lance")
    table = create_table(uri, SCHEMA).schema
    opts = WriteOptions.parse({"path": uri, "enable_memtable": "false",
                               "storage.aws_secret_access_key": "top-secret-value"})
    batch = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], schema=SCHEMA)
    msg = write_task(opts, table, iter([batch]))
    from memwal_datasource.spark.writer import MemWalBatchWriter

    with caplog.at_level(logging.INFO, logger="memwal_datasource"):
        MemWalBatchWriter(opts, table, overwrite=False).commit([msg])
    lines = [r.getMessage() for r in caplog.records if "memwal commit" in r.getMessage()]
    assert len(lines) == 1
    assert "1 tasks, 2 rows" in lines[0] and "1 WAL entries" in lines[0]
    assert "top-secret-value" not in lines[0] and "***" in lines[0]
