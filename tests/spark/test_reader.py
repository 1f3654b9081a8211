"""spark.read.format("memwal"): committed and raw reads, options, native entries."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.spark.options import ReadOptions
from memwal_datasource.spark.reader import MemWalBatchReader, WalRange, plan_partitions
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.spark.test_writer import fail_first_attempt, frame, read, storage_of, write

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_read_uncommitted_shows_failed_attempts_committed_does_not(spark, spark_location):
    uri, opts = spark_location
    # ~100k rows per partition: Spark hands a Python writer rows through a
    # socket buffer, so only a large partition has durable entries before it fails.
    write(fail_first_attempt(frame(spark, 0, 200_000, 2), 90_000, 100_000), uri, opts,
          enable_memtable="false", max_wal_flush_interval_ms="5", durable_write="true")
    committed = read(spark, uri, opts, metadata_columns="true")
    raw = read(spark, uri, opts, isolation="read_uncommitted", metadata_columns="true")
    assert committed.count() == 200_000
    assert committed.select("id").distinct().count() == 200_000
    assert raw.count() > 200_000
    assert {r._writer_epoch for r in committed.select("_writer_epoch").distinct().collect()} == {2}
    failed = raw.where("_writer_epoch = 1")
    assert failed.count() > 0  # the failed attempts' durable entries, never committed
    assert failed.join(committed, ["_shard_id", "_wal_position"]).count() == 0


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_shard_and_position_options(spark, spark_location):
    uri, opts = spark_location
    for job in range(4):  # each job appends entries to the same two shards
        write(frame(spark, job * 1000, 1000, 2), uri, opts, enable_memtable="false")
    meta = read(spark, uri, opts, metadata_columns="true").cache()
    shards = sorted(r._shard_id for r in meta.select("_shard_id").distinct().collect())
    assert len(shards) == 2
    one = read(spark, uri, opts, shards=shards[0])
    assert one.count() == meta.where(f"_shard_id = '{shards[0]}'").count()
    positions = sorted(r._wal_position for r in
                       meta.where(f"_shard_id = '{shards[0]}'").select("_wal_position")
                       .distinct().collect())
    assert len(positions) >= 3
    lo, hi = positions[1], positions[-2]
    sliced = read(spark, uri, opts, metadata_columns="true", shards=shards[0],
                  starting_positions=json.dumps({shards[0]: lo}),
                  ending_positions=json.dumps({shards[0]: hi}))
    got = sorted(r._wal_position for r in sliced.select("_wal_position").distinct().collect())
    assert got == [p for p in positions if lo <= p <= hi]
    meta.unpersist()


def test_long_shards_split_into_position_ranges(tmp_path):
    uri = str(tmp_path / "t.lance")
    store = open_store(uri)
    app = WalAppender.open(store, "6f1c1e1e-0000-4000-8000-000000000001")
    for i in range(10):
        app.append(SCHEMA, [pa.record_batch([pa.array([i], pa.int64()), pa.array(["x"])],
                                            schema=SCHEMA)])
    CommitLog(store).append(APPEND, [CommittedRange(app.shard_id, app.epoch, 1, 10, 10)])
    opts = ReadOptions.parse({"path": uri, "max_entries_per_partition": "3"})
    parts = plan_partitions(opts, store)
    assert [(p.first, p.last) for p in parts] == [(1, 3), (4, 6), (7, 9), (10, 10)]
    reader = MemWalBatchReader(opts, SCHEMA)
    rows = [v for p in parts for b in reader.read(p) for v in b.column("id").to_pylist()]
    assert rows == list(range(10))
    # Small entries are coalesced: the partition's three one-row entries are one batch.
    assert [b.num_rows for b in reader.read(parts[0])] == [3]


def test_read_partition_skips_entries_of_other_epochs(tmp_path):
    uri = str(tmp_path / "t.lance")
    store = open_store(uri)
    shard = "6f1c1e1e-0000-4000-8000-000000000002"
    old = WalAppender.open(store, shard)
    old.append(SCHEMA, [pa.record_batch([pa.array([1], pa.int64()), pa.array(["a"])],
                                        schema=SCHEMA)])
    new = WalAppender.open(store, shard)  # sentinel at 2
    new.append(SCHEMA, [pa.record_batch([pa.array([2], pa.int64()), pa.array(["b"])],
                                        schema=SCHEMA)])
    reader = MemWalBatchReader(ReadOptions.parse({"path": uri}), SCHEMA)
    part = WalRange(shard, 1, 3, ((2, 1, 3),))  # only epoch 2 is committed
    assert [b.column("id").to_pylist() for b in reader.read(part)] == [[2]]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_entries_of_the_native_writer_are_read(spark, spark_location):
    uri, opts = spark_location
    table = create_table(uri, SCHEMA, ["id"], storage_of(opts)).schema
    shard = "6f1c1e1e-0000-4000-8000-000000000003"
    cfg = ShardWriterConfig(enable_memtable=True, max_wal_flush_interval_ms=10)
    with open_shard_writer(uri, shard, table, cfg, storage_of(opts)) as w:
        w.put(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
    stats = w.stats()
    CommitLog(open_store(uri, storage_of(opts))).append(APPEND, [CommittedRange(
        shard, stats.epoch, stats.first_wal_position, stats.last_wal_position, 3)])
    df = read(spark, uri, opts)
    assert df.columns == ["id", "v"]  # the native _tombstone column is not a data column
    assert sorted((r.id, r.v) for r in df.collect()) == [(1, "a"), (2, "b"), (3, "c")]
    meta = read(spark, uri, opts, metadata_columns="true")
    assert {r._tombstone for r in meta.collect()} == {False}


def test_bad_read_options_fail_on_driver(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA)
    with pytest.raises(Exception, match="option 'isolation' must be one of"):
        spark.read.format("memwal").option("isolation", "dirty").load(uri).collect()
    with pytest.raises(Exception, match="unknown read option 'bogus'"):
        spark.read.format("memwal").option("bogus", "1").load(uri).collect()
    with pytest.raises(Exception, match=f"no memwal table at {tmp_path}/missing.lance: "
                       "write to it first"):
        spark.read.format("memwal").load(str(tmp_path / "missing.lance")).collect()


def test_empty_table_reads_no_rows(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA)
    assert spark.read.format("memwal").load(uri).count() == 0
