"""Streaming: memwal sink (exactly-once per micro-batch) and memwal source."""

from __future__ import annotations

import os
import re
import uuid

import pyarrow as pa
import pytest

from memwal_datasource.format.table_schema import without_row_key
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalStreamWriter, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table
from tests.helpers import later

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
    table = without_row_key(create_table(uri, SCHEMA).schema)
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


def test_batch_wall_time_counts_from_its_first_task_not_the_writer(tmp_path, caplog):
    """A stream's writer object lives for the whole query: a micro-batch's wall time is
    measured from its earliest task start (the writer's start only without one)."""
    import dataclasses
    import logging
    import time

    uri = str(tmp_path / "t.lance")
    table = without_row_key(create_table(uri, SCHEMA).schema)
    opts = WriteOptions.parse({"path": uri, "enable_memtable": "false"})
    writer = MemWalStreamWriter(opts, table, overwrite=False, query_id="q-wall")
    writer.started = time.time() - 100_000  # the query started long ago
    batch = pa.record_batch([pa.array([1], pa.int64()), pa.array(["a"])], schema=SCHEMA)
    msg = write_task(writer.opts, table, iter([batch]))
    assert 0 < time.time() - msg.started < 100_000
    with caplog.at_level(logging.INFO, logger="memwal_datasource"):
        writer.commit([dataclasses.replace(msg, started=time.time() - 1_000)], 0)
        writer.commit([dataclasses.replace(msg, started=0.0)], 1)  # no task start: the writer's
    walls = [float(m.group(1)) for r in caplog.records
             if (m := re.search(r"([0-9.]+)s wall", r.getMessage()))]
    assert len(walls) == 2
    assert 1_000 <= walls[0] < 100_000 <= walls[1]


def test_stream_sink_requires_checkpoint_or_query_id(spark, tmp_path):
    df = spark.readStream.format("rate").load().selectExpr("value as id", "'x' as v")
    with pytest.raises(Exception, match="checkpointLocation"):
        q = df.writeStream.format("memwal").start(str(tmp_path / "t.lance"))
        q.awaitTermination(30)
        raise RuntimeError(str(q.exception()))


def test_commit_logs_one_summary_line_without_secrets(tmp_path, caplog):
    import logging

    uri = str(tmp_path / "t.lance")
    table = without_row_key(create_table(uri, SCHEMA).schema)
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


# --- where a source starts, and what it refuses --------------------------------

def write_batch(spark, uri, lo, hi):
    """One batch job: one commit record holding ids lo..hi-1."""
    spark.range(lo, hi, numPartitions=1).selectExpr("id", "cast(id as string) as v").write \
        .format("memwal").mode("append").option("enable_memtable", "false").save(uri)


def memory_query(spark, uri, ck, name, **options) -> tuple[list[int], list[int]]:
    """Run a memwal source with ``options`` into a memory sink until caught up.

    Returns the sorted ids and the row count of each non-empty micro-batch.
    """
    r = spark.readStream.format("memwal")
    for k, v in options.items():
        r = r.option(k, v)
    q = (r.load(uri).writeStream.format("memory").queryName(name)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    assert q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    return sorted(row.id for row in spark.sql(f"SELECT id FROM {name}").collect()), sizes


def source_ids(spark, uri, ck, name, **options) -> list[int]:
    """The ids a memwal source with ``options`` serves into a memory sink."""
    return memory_query(spark, uri, ck, name, **options)[0]


def start_error(spark, uri, ck, **options) -> str:
    """The error a memwal source query with ``options`` fails with (it must fail)."""
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    r = spark.readStream.format("memwal")
    for k, v in options.items():
        r = r.option(k, v)
    try:
        q = (r.load(uri).writeStream.format("memory").queryName("refused")
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination(120)
        error = q.exception()
    except Exception as exc:  # noqa: BLE001 - refused at start() is as good
        error = exc
    assert error is not None, f"{options} was accepted"
    # Refused on the driver: no Spark job ran.
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs_before
    return str(error)


@pytest.mark.parametrize("backend", ["local"])
def test_source_starting_commit_and_timestamp(spark, spark_location, tmp_path):
    from datetime import datetime, timezone

    uri, _ = spark_location
    for lo in (0, 10, 20):
        write_batch(spark, uri, lo, lo + 10)
    r1, r2, _ = CommitLog(open_store(uri)).records()
    assert r1.created_ms < r2.created_ms  # the jobs ran one after another
    iso = datetime.fromtimestamp(r2.created_ms / 1000, tz=timezone.utc).isoformat()
    cases = [({}, 0), ({"starting_commit": "earliest"}, 0), ({"starting_commit": "2"}, 10),
             ({"starting_commit": "4"}, 30), ({"starting_commit": iso}, 10),
             ({"starting_timestamp": str(r2.created_ms)}, 10),
             ({"starting_timestamp": iso.replace("+00:00", "Z")}, 10)]
    for i, (options, first) in enumerate(cases):
        got = source_ids(spark, uri, str(tmp_path / f"ck{i}"), f"start{i}", **options)
        assert got == list(range(first, 30)), options


@pytest.mark.parametrize("backend", ["local"])
def test_source_starting_latest_serves_only_new_commits(spark, spark_location, tmp_path):
    uri, _ = spark_location
    write_batch(spark, uri, 0, 10)
    q = (spark.readStream.format("memwal").option("starting_commit", "latest").load(uri)
         .writeStream.format("memory").queryName("latest")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
        write_batch(spark, uri, 10, 20)
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    assert sorted(r.id for r in spark.sql("SELECT id FROM latest").collect()) == \
        list(range(10, 20))


def test_batch_zero_rerun_plans_from_its_stored_origin(tmp_path):
    """Spark asks for the initial offset again when it re-runs batch 0 after a restart;
    'latest' may have moved by then, so batch 0 is planned from its stored origin."""
    from pyspark.sql.datasource import ReadAllAvailable

    from memwal_datasource.log.commit import APPEND, CommittedRange
    from memwal_datasource.spark.options import ReadOptions
    from memwal_datasource.spark.stream import MemWalStreamReader

    uri = str(tmp_path / "t.lance")
    log = CommitLog(open_store(uri))
    shard = "6f1c1e1e-0000-4000-8000-0000000000aa"

    def commit(position: int) -> None:
        log.append(APPEND, [CommittedRange(shard, 1, position, position, 1, 1)])

    opts = ReadOptions.parse({"path": uri, "starting_commit": "latest"})
    commit(1)
    reader = MemWalStreamReader(opts, SCHEMA)
    initial = reader.initialOffset()
    assert initial["commit"] == 1
    commit(2)
    assert reader.initialOffset() == initial  # resolved once per run, though 'latest' moved
    end = reader.latestOffset(initial, ReadAllAvailable())
    assert (end["commit"], end["origin"]) == (2, 1)
    commit(3)  # then the driver dies before batch 0 is marked done, and restarts
    rerun = MemWalStreamReader(opts, SCHEMA)
    fresh = rerun.initialOffset()
    assert fresh["commit"] == 3
    parts = rerun.partitions(fresh, end)
    assert [(p.shard_id, p.first, p.last) for p in parts] == [(shard, 2, 2)]
    # Later batches plan from their start as before.
    nxt = rerun.latestOffset(end, ReadAllAvailable())
    assert [(p.first, p.last) for p in rerun.partitions(end, nxt)] == [(3, 3)]


@pytest.mark.parametrize("backend", ["local"])
def test_source_refuses_what_a_stream_cannot_honour(spark, spark_location, tmp_path):
    uri, _ = spark_location
    write_batch(spark, uri, 0, 10)
    shard = '{"6f1c1e1e-0000-4000-8000-0000000000aa": 1}'
    for i, (options, match) in enumerate([
        ({"isolation": "read_uncommitted"}, "'isolation=read_uncommitted' is not supported by "
                                            "readStream"),
        ({"ending_positions": shard}, "option 'ending_positions' is not supported by readStream"),
        ({"starting_positions": shard}, "option 'starting_positions' \\(per-shard positions\\) "
                                        "is not supported by readStream"),
        ({"starting_commit": "soon"}, "option 'starting_commit' must be 'earliest', 'latest'"),
        ({"starting_commit": "7"}, "option 'starting_commit' is 7 but the commit log of .* ends "
                                   "at record 1"),
        ({"starting_commit": "1", "starting_timestamp": "0"}, "set one of options"),
    ]):
        error = start_error(spark, uri, str(tmp_path / f"ck{i}"), **options)
        assert re.search(match, error), error
    with pytest.raises(Exception, match="option 'starting_commit' applies to spark.readStream"):
        spark.read.format("memwal").option("starting_commit", "2").load(uri).collect()


# --- the sink: identity and output modes -------------------------------------

def test_checkpoint_location_spellings_are_one_query(tmp_path, monkeypatch):
    from memwal_datasource.spark.source import checkpoint_query_id

    monkeypatch.chdir(tmp_path)
    absolute = str(tmp_path / "ck")
    same = {checkpoint_query_id(x) for x in (
        "ck", "ck/", "./ck", "ck//", absolute, absolute + "/", f"file://{absolute}",
        f"file:{absolute}", f"file://localhost{absolute}/", f" {absolute} ")}
    assert len(same) == 1
    # Absolute locations keep the identity earlier versions derived from the raw string.
    assert same == {str(uuid.uuid5(uuid.NAMESPACE_URL, absolute))}
    assert checkpoint_query_id("ck2") not in same
    remote = {checkpoint_query_id(x) for x in ("s3a://b/ck", "s3a://b/ck/", "s3a://b/./ck//")}
    assert remote == {str(uuid.uuid5(uuid.NAMESPACE_URL, "s3a://b/ck"))}
    assert checkpoint_query_id("s3a://b/ck2") not in remote


@pytest.mark.parametrize("backend", ["local"])
def test_replay_with_trailing_slash_is_the_same_query(spark, spark_location, tmp_path):
    uri, opts = spark_location
    src, ck = str(tmp_path / "src"), str(tmp_path / "ck")
    add_files(spark, src, 0, 2)
    run_sink(spark, src, uri, ck, opts)
    for name in ("1", ".1.crc"):
        os.remove(os.path.join(ck, "commits", name))
    run_sink(spark, src, uri, ck + "/", opts)  # Spark replays batch 1 under "ck/"
    assert len(list(CommitLog(open_store(uri)).records())) == 2
    ids = sorted(r.id for r in spark.read.format("memwal").load(uri).collect())
    assert ids == list(range(200))


@pytest.mark.parametrize("backend", ["local"])
def test_complete_mode_overwrites_with_each_batch(spark, spark_location, tmp_path):
    uri, _ = spark_location
    src = str(tmp_path / "src")
    add_files(spark, src, 0, 3)  # ids 0..299, one file per micro-batch
    counts = (spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1)
              .parquet(src).selectExpr("id % 3 as k").groupBy("k").count())
    q = (counts.writeStream.format("memwal").outputMode("complete")
         .option("enable_memtable", "false").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start(uri))
    assert q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    records = list(CommitLog(open_store(uri)).records())
    assert [r.kind for r in records] == ["overwrite"] * 3
    assert [r.batch_id for r in records] == [0, 1, 2]
    got = sorted((r.k, r["count"]) for r in spark.read.format("memwal").load(uri).collect())
    assert got == [(0, 100), (1, 100), (2, 100)]  # the last result only, no earlier ones


@pytest.mark.parametrize("backend", ["local"])
def test_update_mode_is_refused(spark, spark_location, tmp_path):
    uri, _ = spark_location
    src = str(tmp_path / "src")
    add_files(spark, src, 0, 1)
    counts = spark.readStream.schema("id long, v string").parquet(src).groupBy("v").count()
    with pytest.raises(Exception, match="memwal does not support Update mode"):
        q = (counts.writeStream.format("memwal").outputMode("update")
             .option("checkpointLocation", str(tmp_path / "ck")).start(uri))
        q.awaitTermination(120)
        raise RuntimeError(str(q.exception()))
    assert not os.path.exists(uri)


def test_new_stream_after_compaction_and_garbage_collection(tmp_path):
    """'earliest' is the oldest record whose WAL entries are still stored."""
    from pyspark.sql.datasource import ReadAllAvailable

    from memwal_datasource.errors import ConfigError
    from memwal_datasource.log.commit import APPEND, CommittedRange, record_key
    from memwal_datasource.maintenance.compact import compact
    from memwal_datasource.maintenance.gc import collect
    from memwal_datasource.shard.wal import WalAppender
    from memwal_datasource.spark.options import ReadOptions
    from memwal_datasource.spark.stream import MemWalStreamReader
    from memwal_datasource.table.view import TableView

    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA, primary_key=["id"])
    store = open_store(uri)
    shard = "6f1c1e1e-0000-4000-8000-0000000000aa"

    def commit(i: int) -> None:
        app = WalAppender.open(store, shard)
        app.append(SCHEMA, [pa.record_batch([pa.array([i], pa.int64()), pa.array(["x"])],
                                            schema=SCHEMA)])
        CommitLog(store).append(APPEND, [CommittedRange(shard, app.epoch, app.first_position,
                                                        app.last_position, 1, 1)])

    for i in range(3):
        commit(i)
    CommitLog(store).checkpoint()
    compact(TableView(uri))
    t = TableView(uri)
    collect(t, retain_seconds=0, clock=later(t))  # records 1..3 are in the base table only
    commit(3)  # record 5, after the gc record (4)
    assert not store.exists(record_key(1))
    reader = MemWalStreamReader(ReadOptions.parse({"path": uri}), SCHEMA)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["commit"] == 5
    rows = [b.column("id").to_pylist() for p in reader.partitions(start, end)
            for b in reader.read(p)]
    assert rows == [[3]]
    for value in ("1", "3"):
        late = MemWalStreamReader(ReadOptions.parse({"path": uri, "starting_commit": value}),
                                  SCHEMA)
        with pytest.raises(ConfigError, match="were compacted and garbage-collected"):
            late.initialOffset()


def test_two_live_streams_with_one_query_id_fail_naming_it(tmp_path):
    import json as _json
    import time as _time

    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from memwal_datasource import MemWalDataSource
    from memwal_datasource.errors import ConfigError
    from memwal_datasource.spark.source import STREAM_LIVE_S, StreamMark

    schema = StructType([StructField("id", LongType()), StructField("v", StringType())])
    uri = str(tmp_path / "t.lance")

    def plan(ck):  # what Spark does before every micro-batch of a stream
        return MemWalDataSource({"path": uri, "query_id": "q-shared",
                                 "checkpointlocation": str(tmp_path / ck)}
                                ).streamWriter(schema, False)

    first = plan("ck1")
    with pytest.raises(ConfigError) as err:
        plan("ck2")
    message = str(err.value)
    assert message.split(": ", 1)[0].startswith("Give each stream its own query_id")
    assert "query_id 'q-shared' is in use by another live stream" in message
    assert str(tmp_path / "ck1") in message
    plan("ck1")  # the first stream goes on (the second removed its mark)
    store = open_store(uri, {})
    # A stream that took the query id after this one planned fails this one's commit.
    other = StreamMark("q-shared", str(tmp_path / "ck3"))
    store.put(other.key, _json.dumps({"checkpoint": "ck3",
                                      "seen_ms": int(_time.time() * 1000)}).encode())
    with pytest.raises(ConfigError, match="query_id 'q-shared' is in use"):
        first.commit([], 0)
    assert list(CommitLog(store).records()) == []
    # A stopped stream's mark expires.
    StreamMark("q-shared", str(tmp_path / "ck2")).renew(
        store, now_ms=int((_time.time() + STREAM_LIVE_S + 1) * 1000))
