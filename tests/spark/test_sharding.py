"""Sharded primary-key tables from Spark: routing, upserts, deletes, tasks taking turns."""

from __future__ import annotations

from collections import defaultdict

import lance
import pytest
from lance.mem_wal import LsmScanner, ShardSnapshot
from pyspark.sql.functions import spark_partition_id

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.shard.manifest import ManifestStore, list_shards
from memwal_datasource.shard.wal import WalTailer
from memwal_datasource.spark import partition_for_table
from memwal_datasource.store import open_store
from memwal_datasource.table.sharding import table_sharding
from memwal_datasource.table.view import TableView, read_table
from memwal_datasource.write.native import committed_lsm_scanner
from tests.spark.test_writer import read, storage_of, write

BUCKETED = {"primary_key": "id", "shard_by_bucket": "id", "num_buckets": "4"}


def frame(spark, ids_from, n, tag, parts=4):
    """Keys spread over every partition (round-robin), deliberately not by bucket."""
    return (spark.range(ids_from, ids_from + n, numPartitions=1)
            .selectExpr("id", f"concat('{tag}-', id) as v").repartition(parts))


def shards_of_keys(uri, opts) -> dict[int, set[str]]:
    """key -> every shard whose WAL holds a row (or marker) for it."""
    store = open_store(uri, storage_of(opts))
    where = defaultdict(set)
    for shard in list_shards(store):
        for _pos, entry in WalTailer(store, shard).entries(1):
            for b in entry.batches:
                for key in b.column("id").to_pylist():
                    where[key].add(shard)
    return where


def lsm_rows(uri) -> dict[int, str]:
    """Every shard's SSTables through pylance's LsmScanner (base + SSTables, newest wins)."""
    ds = lance.dataset(uri)
    store = open_store(uri)
    snaps = []
    for shard in list_shards(store):
        m = ManifestStore(store, shard).latest()
        snap = ShardSnapshot(shard).with_spec_id(m.shard_spec_id)
        snap = snap.with_current_generation(m.current_generation)
        for t in m.sstables:
            snap = snap.with_sstable(t.generation, t.path)
        snaps.append(snap)
    got = LsmScanner.from_snapshots(ds, snaps).to_table().to_pylist()
    out = {r["id"]: r["v"] for r in got}
    assert len(out) == len(got), "LsmScanner returned a key twice"
    return out


def test_partition_for_table_puts_each_bucket_in_one_task(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    write(frame(spark, 0, 8, "a").coalesce(1), uri, {}, enable_memtable="false", **BUCKETED)
    sharding = table_sharding(lance.dataset(uri))
    df = partition_for_table(frame(spark, 0, 400, "b"), uri)
    assert df.columns == ["id", "v"]
    placed = df.select("id", spark_partition_id().alias("pid")).collect()
    assert sorted(r.id for r in placed) == list(range(400))
    import pyarrow as pa

    ids = pa.array([r.id for r in placed], pa.int64())
    buckets = sharding.values(pa.record_batch([ids], names=["id"])).to_pylist()
    tasks = defaultdict(set)
    for bucket, r in zip(buckets, placed, strict=True):
        tasks[bucket].add(r.pid)
    assert len(tasks) == 4 and all(len(p) == 1 for p in tasks.values()), tasks
    # Bucket b in partition b: every task writes exactly one shard, none is idle.
    assert {b: p.pop() for b, p in tasks.items()} == {b: b for b in range(4)}
    # Fewer partitions than buckets: bucket b in partition b % n.
    two = partition_for_table(frame(spark, 0, 400, "b"), uri, num_partitions=2)
    placed = two.select("id", spark_partition_id().alias("pid")).collect()
    ids = pa.array([r.id for r in placed], pa.int64())
    buckets = sharding.values(pa.record_batch([ids], names=["id"])).to_pylist()
    assert all(r.pid == b % 2 for b, r in zip(buckets, placed, strict=True))


def test_spark_hash_long_is_sparks_hash(spark):
    """partition_for_table relies on computing Spark's hash partitioning in Python."""
    from pyspark.sql import functions as F

    from memwal_datasource.spark.routing import partition_keys, spark_hash_long

    values = [0, 1, -1, 7, 2**31, -(2**31) - 1, 2**40 + 7, -(2**63), 2**63 - 1]
    rows = (spark.createDataFrame([(v,) for v in values], "v long")
            .select("v", F.hash("v").alias("h")).collect())
    assert [spark_hash_long(r.v) for r in rows] == [r.h for r in rows]
    for n in (1, 3, 16, 1024):
        assert [spark_hash_long(k) % n for k in partition_keys(n)] == list(range(n))


def test_bucketed_pk_job_upserts_and_deletes_read_once_newest(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    mem = {"enable_memtable": "true", "max_wal_flush_interval_ms": "20"}
    # partition_for_table needs the table: a one-row job creates it with its spec.
    write(frame(spark, 0, 1, "seed").coalesce(1), uri, {}, **mem, **BUCKETED)
    write(partition_for_table(frame(spark, 0, 300, "old"), uri), uri, {}, **mem)
    write(partition_for_table(frame(spark, 0, 150, "new"), uri), uri, {}, **mem)
    sharding = table_sharding(lance.dataset(uri))
    where = shards_of_keys(uri, {})
    assert sorted(where) == list(range(300))
    assert all(len(s) == 1 for s in where.values()), "a key landed in two shards"
    assert len(list_shards(open_store(uri))) == 4
    for shard in list_shards(open_store(uri)):
        m = ManifestStore(open_store(uri), shard).latest()
        assert m.shard_spec_id == sharding.spec_id and len(m.shard_field_entries) == 1
    newest = {i: f"{'new' if i < 150 else 'old'}-{i}" for i in range(300)}
    assert lsm_rows(uri) == newest
    table = read_table(uri).to_pylist()
    assert {r["id"]: r["v"] for r in table} == newest and len(table) == 300

    # Deletes: the keys of a DataFrame (other columns are ignored), WAL-only markers.
    doomed = spark.range(0, 50, numPartitions=3).selectExpr("id", "'ignored' as note")
    write(partition_for_table(doomed, uri), uri, {}, operation="delete")
    live = {k: v for k, v in newest.items() if k >= 50}
    table = read_table(uri).to_pylist()
    assert {r["id"]: r["v"] for r in table} == live and len(table) == 250
    assert all(len(s) == 1 for s in shards_of_keys(uri, {}).values())
    # A native opener replays nothing no commit record names (no replay debt): the
    # WAL-only delete markers reach Lance's readers through compaction.
    ds = lance.dataset(uri)
    for shard in list_shards(open_store(uri)):
        ds.mem_wal_writer(shard).close()
    # Compaction folds the newest row of each key (and the deletes) into the base table.
    compact(TableView(uri))
    base = lance.dataset(uri).to_table(columns=["id", "v"]).to_pylist()
    assert {r["id"]: r["v"] for r in base} == live and len(base) == 250
    got = committed_lsm_scanner(TableView(uri)).to_table().to_pylist()
    assert {r["id"]: r["v"] for r in got} == live and len(got) == 250


def test_one_value_in_two_tasks_is_written_in_turns(spark, tmp_path):
    """An unprepared DataFrame (every bucket in both tasks) is written: the tasks take
    turns per shard, each key lands in one shard and is read once."""
    uri = str(tmp_path / "t.lance")
    wal = {"enable_memtable": "false"}
    write(frame(spark, 0, 40, "a").coalesce(1), uri, {}, **wal, **BUCKETED)
    write(frame(spark, 0, 200, "b", parts=2), uri, {}, **wal)
    (rec,) = list(CommitLog(open_store(uri)).records())[-1:]
    assert {r.task for r in rec.ranges} == {0, 1}
    assert len(rec.ranges) == 8  # two turns on each of the 4 buckets
    assert all(len(s) == 1 for s in shards_of_keys(uri, {}).values())
    table = read_table(uri).to_pylist()
    assert {r["id"]: r["v"] for r in table} == {i: f"b-{i}" for i in range(200)}


@pytest.mark.parametrize("backend", ["s3"])
def test_sharded_upserts_and_deletes_on_s3(spark, spark_location):
    uri, opts = spark_location
    wal = {"enable_memtable": "false", **opts}
    write(frame(spark, 0, 1, "seed").coalesce(1), uri, {}, **wal, **BUCKETED)
    write(partition_for_table(frame(spark, 0, 120, "old"), uri, opts), uri, {}, **wal)
    write(partition_for_table(frame(spark, 0, 60, "new"), uri, opts), uri, {}, **wal)
    doomed = spark.range(100, 120, numPartitions=2)
    write(partition_for_table(doomed, uri, opts), uri, {}, operation="delete", **opts)
    want = {i: f"{'new' if i < 60 else 'old'}-{i}" for i in range(100)}
    table = read_table(uri, storage_of(opts)).to_pylist()
    assert {r["id"]: r["v"] for r in table} == want and len(table) == 100
    assert all(len(s) == 1 for s in shards_of_keys(uri, opts).values())
    # The WAL-tail read is the log: markers only when asked for, as _tombstone rows.
    tail = read(spark, uri, opts, metadata_columns="true").filter("_tombstone").collect()
    assert sorted(r.id for r in tail) == list(range(100, 120))
    assert read(spark, uri, opts).count() == 1 + 120 + 60


@pytest.mark.parametrize("extra, match", [
    ({"enable_memtable": "true"}, "option 'enable_memtable' is true .* no primary key"),
    ({"enable_memtable": "false", "operation": "delete"}, "'operation=delete' needs a primary"),
    ({"operation": "delete", "enable_memtable": "true"}, "written WAL-only"),
    ({"operation": "merge"}, "option 'operation' must be one of"),
    ({"enable_memtable": "false", "shard_by_bucket": "id"}, "'num_buckets' go together"),
])
def test_driver_refusals(spark, tmp_path, extra, match):
    uri = str(tmp_path / "t.lance")
    write(frame(spark, 0, 5, "a", parts=1), uri, {}, enable_memtable="false")
    with pytest.raises(Exception, match=match):
        write(frame(spark, 0, 5, "a", parts=1), uri, {}, **extra)


def test_sharding_options_conflicting_with_the_table_are_refused(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    write(frame(spark, 0, 5, "a", parts=1), uri, {}, enable_memtable="false", **BUCKETED)
    for extra, match in [({"num_buckets": "8", "shard_by_bucket": "id"}, "conflict with"),
                         ({"num_shards": "2"}, "'num_shards' does not apply")]:
        with pytest.raises(Exception, match=match):
            write(frame(spark, 0, 5, "a", parts=1), uri, {}, enable_memtable="false", **extra)
