"""df.write.format("memwal"): end to end on a real SparkSession, local disk and S3."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest
from pyspark.sql.utils import AnalysisException

from memwal_datasource.errors import Fenced
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.shard.wal import WalTailer
from memwal_datasource.spark import partition_for_table
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table.sharding import ShardConflict, table_sharding
from memwal_datasource.table.view import create_table, open_table

MODES = ["false", "true"]  # enable_memtable


def frame(spark, start, n, parts=4):
    return spark.range(start, start + n, numPartitions=parts).selectExpr(
        "id", "cast(id * 2 as string) as v")


# A primary-key table bucketed into 4 shards (test frames have 4 partitions).
BUCKETS_4 = {"primary_key": "id", "shard_by_bucket": "id", "num_buckets": "4"}


def storage_of(opts) -> dict[str, str]:
    """Lance's storage options from the tests' ``storage.<name>`` write options."""
    return {k[len("storage."):]: v for k, v in opts.items()}


def routed(df, uri, opts, **create):
    """``df`` as a user prepares it for a primary-key table: ``partition_for_table``,
    creating the table (with the ``create`` write options) if it is missing."""
    return partition_for_table(df, uri, storage_options=opts, create_options=create or None)


def write(df, uri, opts, mode="append", **extra):
    w = df.write.format("memwal").mode(mode)
    for k, v in {**opts, **extra}.items():
        w = w.option(k, v)
    w.save(uri)


def read(spark, uri, opts, **extra):
    r = spark.read.format("memwal")
    for k, v in {**opts, **extra}.items():
        r = r.option(k, v)
    return r.load(uri)


def tailer_ids(uri, opts) -> list[int]:
    """Every data row in the raw WAL, straight from the tailer (no Spark)."""
    store = open_store(uri, storage_of(opts))
    ids = []
    from memwal_datasource.shard.manifest import list_shards

    for shard in list_shards(store):
        for _pos, entry in WalTailer(store, shard).entries(1):
            for b in entry.batches:
                ids.extend(b.column("id").to_pylist())
    return ids


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("memtable", MODES)
def test_rows_written_equal_rows_read(spark, spark_location, memtable):
    uri, opts = spark_location
    write(routed(frame(spark, 0, 5000), uri, opts, **BUCKETS_4), uri, opts,
          enable_memtable=memtable, max_wal_flush_interval_ms="20", **BUCKETS_4)
    got = read(spark, uri, opts).collect()
    assert sorted(r.id for r in got) == list(range(5000))
    assert all(r.v == str(r.id * 2) for r in got)
    assert sorted(tailer_ids(uri, opts)) == list(range(5000))
    # A second job appends; the shard set stays bounded (same buckets -> same shards).
    write(routed(frame(spark, 5000, 1000), uri, opts), uri, opts, enable_memtable=memtable)
    meta = read(spark, uri, opts, metadata_columns="true")
    assert meta.count() == 6000
    assert meta.select("_shard_id").distinct().count() == 4
    rec = list(CommitLog(open_store(uri, storage_of(opts))).records())
    assert [r.kind for r in rec] == ["append", "append"]
    assert sum(x.rows for x in rec[0].ranges) == 5000


def fail_first_attempt(df, at_id_mod, n_per_part):
    """A UDF that raises on attempt 0 late in each partition (after durable entries)."""
    return fail_first_attempt_at(df, lambda i: i % n_per_part == at_id_mod)


def fail_first_attempt_at(df, hit):
    """A UDF that raises on attempt 0 at each id for which ``hit(id)`` is true."""
    from pyspark import TaskContext
    from pyspark.sql.functions import col, udf

    @udf("long")
    def boom(i):
        if TaskContext.get().attemptNumber() == 0 and hit(i):
            raise RuntimeError(f"injected failure at id {i}")
        return i

    return df.withColumn("id", boom(col("id")))


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("memtable", MODES)
def test_exactly_once_when_first_attempts_fail_mid_write(spark, spark_location, memtable):
    uri, opts = spark_location
    n_per_part, parts = 100_000, 2
    pk = {"primary_key": "id", "shard_by_bucket": "id", "num_buckets": str(parts)}
    df = routed(frame(spark, 0, n_per_part * parts, parts), uri, opts, **pk)
    # One failing id per bucket (so per task), after ~45,000 of the task's rows: the
    # first attempts have durable entries (durable_write=true) when they fail.
    sharding = table_sharding(open_table(uri, storage_of(opts)))
    late = pa.array(range(90_000, 90_100), pa.int64())
    buckets = sharding.values(pa.record_batch([late], names=["id"])).to_pylist()
    first_late: dict[int, int] = {}
    for i, b in zip(late.to_pylist(), buckets, strict=True):
        first_late.setdefault(b, i)
    fail_at = frozenset(first_late.values())
    assert len(fail_at) == parts
    write(fail_first_attempt_at(df, fail_at.__contains__), uri, opts, enable_memtable=memtable,
          max_wal_flush_interval_ms="10", durable_write="true", **pk)
    committed = read(spark, uri, opts)
    assert committed.count() == n_per_part * parts
    assert committed.select("id").distinct().count() == n_per_part * parts
    raw = read(spark, uri, opts, isolation="read_uncommitted", metadata_columns="true")
    # The failed first attempts left durable entries behind: the raw log shows them...
    assert raw.count() > n_per_part * parts
    epochs: dict[str, set[int]] = {}
    per_epoch = raw.groupBy("_shard_id", "_writer_epoch").count().collect()
    for r in per_epoch:
        epochs.setdefault(r._shard_id, set()).add(r._writer_epoch)
    (rec,) = CommitLog(open_store(uri, storage_of(opts))).records()
    committed_at = sorted((r.shard_id, r.epoch, r.attempt) for r in rec.ranges)
    seen = (f"rows per (shard, epoch): {sorted(tuple(r) for r in per_epoch)}; committed "
            f"(shard, epoch, attempt): {committed_at}")
    # Every epoch is one attempt's claim: WAL-only mode claims once per attempt, MemTable
    # mode twice (our fence, then pylance's writer; only the second writes rows). Under
    # load the order can turn: a failed first attempt's Python worker still holds the
    # batches the JVM had sent and may claim after the retry did (a zombie, never
    # committed), and Spark may fail a retry too (local[2,4]: four tries), so a shard's
    # epochs are bounded by its attempts, not fixed.
    claims, first = (2, 2) if memtable == "true" else (1, 1)
    assert len(rec.ranges) == parts and len({r.shard_id for r in rec.ranges}) == parts, seen
    for r in rec.ranges:
        # ...the commit record lists a retried attempt (attempt 0 always fails), at an
        # epoch its shard has, and no claim on the shard came from outside its attempts.
        assert r.attempt >= 1 and r.epoch in epochs[r.shard_id], seen
        assert max(epochs[r.shard_id]) <= claims * (r.attempt + 1), seen
    # ...and the failed first attempts' durable entries are there, below a committed epoch.
    assert any(first in epochs[r.shard_id] and r.epoch > first for r in rec.ranges), seen


class _Gate:
    """An iterator of batches that stops at a gate until the test opens it."""

    def __init__(self, batches, pause_after: int):
        self.batches = batches
        self.pause_after = pause_after
        self.reached = threading.Event()
        self.go = threading.Event()

    def __iter__(self):
        for i, b in enumerate(self.batches):
            if i == self.pause_after:
                self.reached.set()
                self.go.wait(timeout=60)
            yield b


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("memtable", MODES)
def test_concurrent_attempts_older_is_fenced_and_not_committed(spark, spark_location, memtable):
    uri, opts = spark_location
    # durable_write=true: the old attempt's first batch is durable before it pauses.
    wopts = WriteOptions.parse({"path": uri, "enable_memtable": memtable,
                                "max_wal_flush_interval_ms": "10", "durable_write": "true",
                                **opts})
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    table = create_table(uri, schema, ["id"], wopts.storage).schema
    writer = MemWalBatchWriter(wopts, table, overwrite=False)

    def batches(lo):
        return [pa.record_batch([pa.array(range(lo + i * 10, lo + i * 10 + 10), pa.int64()),
                                 pa.array(["x"] * 10)], schema=schema) for i in range(3)]

    old_input = _Gate(batches(0), pause_after=1)
    outcome = {}

    def old_attempt():
        try:
            outcome["old"] = writer.write(iter(old_input))
        except ShardConflict as exc:  # routed shard: names the fixes, chains Fenced
            assert isinstance(exc.__cause__, Fenced)
            outcome["old_error"] = exc.__cause__

    t = threading.Thread(target=old_attempt)
    t.start()
    assert old_input.reached.wait(60)
    # A newer attempt of the same task (same job, same partition) takes the lease over,
    # writes the same shard and fences the old attempt.
    new_msg = writer.write(iter(batches(1000)))
    # The table records no sharding spec: every row of the PK table goes to one shard.
    (new,) = new_msg.shards
    old_input.go.set()
    t.join(60)
    assert "old_error" in outcome and "old" not in outcome
    assert outcome["old_error"].shard_id == new.shard_id
    # MemTable mode: our fence claims an epoch before pylance's writer claims its own.
    assert new.epoch == outcome["old_error"].local_epoch + (2 if memtable == "true" else 1)
    writer.commit([new_msg])
    ids = sorted(r.id for r in read(spark, uri, opts).collect())
    assert ids == list(range(1000, 1030))
    # The old attempt's durable entry is in the raw log, but never committed.
    assert set(range(0, 10)) <= set(tailer_ids(uri, opts))


@pytest.mark.parametrize("backend", ["local"])
def test_overwrite_replaces_committed_view_atomically(spark, spark_location):
    uri, opts = spark_location
    write(frame(spark, 0, 100, 2), uri, opts, enable_memtable="false")
    write(frame(spark, 1000, 50, 2), uri, opts, mode="overwrite", enable_memtable="false")
    assert sorted(r.id for r in read(spark, uri, opts).collect()) == list(range(1000, 1050))

    from pyspark.sql.functions import col, udf

    @udf("long")
    def always_fail(i):
        if i == 2010:
            raise RuntimeError("this overwrite never finishes")
        return i

    with pytest.raises(Exception, match="this overwrite never finishes"):
        write(frame(spark, 2000, 50, 2).withColumn("id", always_fail(col("id"))), uri, opts,
              mode="overwrite", enable_memtable="false")
    # The failed overwrite left the previous committed view in place.
    assert sorted(r.id for r in read(spark, uri, opts).collect()) == list(range(1000, 1050))


@pytest.mark.parametrize("backend", ["local"])
@pytest.mark.parametrize("mode", ["errorifexists", "ignore"])
def test_unsupported_save_modes_error_as_documented(spark, spark_location, mode):
    uri, opts = spark_location
    with pytest.raises(AnalysisException, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        write(frame(spark, 0, 10, 1), uri, opts, mode=mode)


@pytest.mark.parametrize("backend", ["local"])
def test_sql_temporary_view_reads(spark, spark_location):
    uri, opts = spark_location
    write(frame(spark, 0, 30, 1), uri, opts, enable_memtable="false")
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW memwal_view USING memwal OPTIONS (path '{uri}')")
    assert spark.sql("SELECT count(*) AS n FROM memwal_view").collect()[0].n == 30


def test_identity_sharded_upserts_deletes_and_the_driver_check_without_spark(tmp_path):
    """write_task and commit called directly (as Spark would): rows route by a non-key
    identity column, deletes carry key + sharding column; two partitions that wrote one
    shard in turns commit, and a commit whose ranges break the fencing order (epochs not
    rising with WAL positions) is refused before any record is written."""
    import dataclasses

    from memwal_datasource.table import sharding
    from memwal_datasource.table.view import read_table

    uri = str(tmp_path / "t.lance")
    schema = pa.schema([("id", pa.int64()), ("tenant", pa.string()), ("v", pa.string())])
    table = sharding.create_table(uri, schema, ["id"], {},
                                  sharding.ShardingRequest(identity_column="tenant")).schema
    opts = WriteOptions.parse({"path": uri, "enable_memtable": "false"})
    writer = MemWalBatchWriter(opts, table, overwrite=False)

    def rows(ids, tenant, v):
        return pa.record_batch([pa.array(ids, pa.int64()), pa.array([tenant] * len(ids)),
                                pa.array([v] * len(ids))], schema=schema)

    first = write_task(writer.opts, table, iter([rows([1, 2], "a", "x"), rows([3], "b", "x"),
                                                 rows([1], "a", "y")]))
    assert {s.value for s in first.shards} == {"'a'", "'b'"}
    writer.commit([first])
    assert sorted(read_table(uri).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "tenant": "a", "v": "y"}, {"id": 2, "tenant": "a", "v": "x"},
        {"id": 3, "tenant": "b", "v": "x"}]

    dopts = WriteOptions.parse({"path": uri, "operation": "delete"})
    deleter = MemWalBatchWriter(dopts, table, overwrite=False)
    keys = pa.record_batch([pa.array([2, 3], pa.int64()), pa.array(["a", "b"])],
                           names=["id", "tenant"])
    deleter.commit([write_task(deleter.opts, table, iter([keys]))])
    assert read_table(uri).to_pylist() == [{"id": 1, "tenant": "a", "v": "y"}]

    one = write_task(writer.opts, table, iter([rows([7, 1], "a", "z")]))
    other = dataclasses.replace(write_task(writer.opts, table, iter([rows([1], "a", "w")])),
                                partition_id=1)
    records = len(list(CommitLog(open_store(uri, {})).records()))
    (late,) = other.shards
    bad = dataclasses.replace(other, shards=[dataclasses.replace(late,
                                                                 epoch=one.shards[0].epoch)])
    with pytest.raises(sharding.ShardConflict, match=r"^Run the job again \(nothing was "
                                                     r"committed.*break the fencing order"):
        writer.commit([one, bad])
    assert len(list(CommitLog(open_store(uri, {})).records())) == records
    assert read_table(uri).to_pylist() == [{"id": 1, "tenant": "a", "v": "y"}]
    writer.commit([other, one])  # one shard, two tasks: the later turn (WAL order) wins
    assert sorted(read_table(uri).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "tenant": "a", "v": "w"}, {"id": 7, "tenant": "a", "v": "z"}]


@pytest.mark.parametrize("backend", ["local"])
def test_catalog_tables_are_refused_naming_the_alternatives(spark, spark_location):
    """Spark's Python data source API gives a source no location for a catalog table
    (saveAsTable without a path, writeTo, spark.table): refused, nothing written."""
    uri, opts = spark_location
    df = frame(spark, 0, 10, 1)
    alternatives = (r"Catalog tables \(saveAsTable without a path, df.writeTo\(name\), "
                    r"spark.table\(name\)\) are not supported.*\.save\('<table uri>'\).*"
                    r"\.load\('<table uri>'\).*createOrReplaceTempView")
    with pytest.raises(Exception, match=alternatives):
        df.writeTo("memwal_evt").using("memwal").create()
    with pytest.raises(Exception, match=alternatives):
        df.write.format("memwal").mode("append").saveAsTable("memwal_evt2")
    assert not spark.catalog.tableExists("memwal_evt")
    assert not spark.catalog.tableExists("memwal_evt2")
    # With a path, saveAsTable hands the source the same options as save().
    df.write.format("memwal").mode("append").option("path", uri).saveAsTable("memwal_evt3")
    try:
        with pytest.raises(Exception, match=alternatives):
            df.writeTo("memwal_evt3").append()
        with pytest.raises(Exception, match=alternatives):
            spark.table("memwal_evt3").collect()
    finally:
        spark.sql("DROP TABLE IF EXISTS memwal_evt3")
    assert sorted(r.id for r in read(spark, uri, opts).collect()) == list(range(10))


@pytest.mark.parametrize("backend", ["local"])
def test_hidden_row_key_column_is_reserved(spark, spark_location):
    uri, opts = spark_location
    df = frame(spark, 0, 3, 1).withColumnRenamed("v", "_memwal_row")
    with pytest.raises(Exception, match="column '_memwal_row' is reserved: compaction adds it"):
        write(df, uri, opts)
    assert not os.path.exists(uri)
