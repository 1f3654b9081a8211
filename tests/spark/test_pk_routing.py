"""Primary-key tables without sharding options (issue 10): one key, one shard.

A new primary-key table gets Lance's ``bucket(key, 16)`` spec; an existing one
whose MemWAL records no spec is written to one shard. pylance is the oracle:
its recorded spec, ``evaluate_sharding_spec`` and ``LsmScanner``.
"""

from __future__ import annotations

import dataclasses

import lance
import pyarrow as pa
import pytest
from lance.mem_wal import evaluate_sharding_spec
from pyspark.sql.functions import spark_partition_id

from memwal_datasource import compact
from memwal_datasource.errors import ConfigError
from memwal_datasource.format.table_schema import with_primary_key
from memwal_datasource.shard.manifest import ManifestStore, list_shards
from memwal_datasource.spark import partition_for_table
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table.sharding import DEFAULT_NUM_BUCKETS, table_sharding
from memwal_datasource.table.view import open_table, read_table
from tests.spark.test_sharding import frame, lsm_rows, shards_of_keys
from tests.spark.test_writer import storage_of, write

MEM = {"enable_memtable": "true", "max_wal_flush_interval_ms": "20"}


def test_default_pk_table_keeps_each_key_in_one_shard(spark, tmp_path):
    """Keys spread over every partition, two jobs, no sharding options: every key in one
    shard, read once with its newest value by LsmScanner and the whole-table read."""
    uri = str(tmp_path / "t.lance")
    old = frame(spark, 0, 400, "old", parts=8)
    # The first write of a new table: partition_for_table creates it as the write would.
    write(partition_for_table(old, uri, create_options={"primary_key": "id"}), uri, {},
          primary_key="id", **MEM)
    ds = lance.dataset(uri)
    (spec,) = ds.mem_wal_index_details()["sharding_specs"]
    assert spec["fields"][0]["transform"] == "bucket"
    assert spec["fields"][0]["parameters"] == {"num_buckets": str(DEFAULT_NUM_BUCKETS)}
    sharding = table_sharding(ds)
    assert sharding.columns == ("id",)

    new = frame(spark, 0, 200, "new", parts=8)  # round-robin: each key's bucket in any task
    placed = partition_for_table(new, uri).select("id", spark_partition_id().alias("p"))
    tasks: dict[int, set[int]] = {}
    rows = placed.collect()
    ids = pa.array([r.id for r in rows], pa.int64())
    values = evaluate_sharding_spec(pa.record_batch([ids, pa.array(["x"] * len(rows))],
                                                    names=["id", "v"]),
                                    spec, ds.lance_schema).column(0).to_pylist()
    for value, r in zip(values, rows, strict=True):
        tasks.setdefault(value, set()).add(r.p)
    assert all(len(p) == 1 for p in tasks.values()), tasks  # Lance's value, one task each
    write(partition_for_table(new, uri), uri, {}, **MEM)

    where = shards_of_keys(uri, {})
    assert sorted(where) == list(range(400))
    assert all(len(s) == 1 for s in where.values()), "a key landed in two shards"
    shards = list_shards(open_store(uri))
    assert len(shards) == DEFAULT_NUM_BUCKETS
    for value in set(values):  # our shard ids are the public rule of Lance's values
        assert sharding.shard_id(value) in shards
    for shard in shards:
        m = ManifestStore(open_store(uri), shard).latest()
        assert m.shard_spec_id == 1 and len(m.shard_field_entries) == 1
    newest = {i: f"{'new' if i < 200 else 'old'}-{i}" for i in range(400)}
    assert lsm_rows(uri) == newest
    table = read_table(uri).to_pylist()
    assert {r["id"]: r["v"] for r in table} == newest and len(table) == 400


def test_default_pk_table_takes_a_job_splitting_a_key(spark, tmp_path):
    """Without partition_for_table two tasks write one bucket: they take turns, the job
    commits, every key is read once (LsmScanner and the whole-table read agree)."""
    uri = str(tmp_path / "t.lance")
    write(frame(spark, 0, 40, "a").coalesce(1), uri, {}, primary_key="id", **MEM)
    write(frame(spark, 0, 200, "b", parts=2), uri, {}, **MEM)
    want = {i: f"b-{i}" for i in range(200)}
    assert {r["id"]: r["v"] for r in read_table(uri).to_pylist()} == want
    assert lsm_rows(uri) == want


def specless_pk_table(uri: str) -> pa.Schema:
    """A primary-key table made with pylance alone: initialize_mem_wal() without a spec."""
    schema = with_primary_key(pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"])
    lance.write_dataset(schema.empty_table(), uri).initialize_mem_wal()
    ds = lance.dataset(uri)
    assert ds.mem_wal_index_details()["sharding_specs"] == []
    return ds.schema


def batch(schema: pa.Schema, ids, tag: str) -> pa.RecordBatch:
    ids = list(ids)
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"{tag}-{i}" for i in ids])],
                           schema=schema)


def test_specless_pk_table_writes_one_shard_and_two_tasks_take_turns_without_spark(tmp_path):
    """write_task and commit called directly (as Spark would): every job's rows go to one
    deterministic shard (spec id 0, no field entries), keys read once and newest; a job
    whose two tasks wrote it in turns commits, the later turn's row winning."""
    uri = str(tmp_path / "t.lance")
    schema = specless_pk_table(uri)
    writer = MemWalBatchWriter(WriteOptions.parse({"path": uri, "enable_memtable": "false"}),
                               schema, overwrite=False)
    assert not writer.opts.sharding.recorded
    # Two jobs (a partition each, different partition ids) with overlapping keys.
    writer.commit([write_task(writer.opts, schema, iter([batch(schema, range(0, 60), "old")]))])
    second = write_task(writer.opts, schema, iter([batch(schema, range(30, 90), "new")]))
    writer.commit([dataclasses.replace(second, partition_id=5)])
    store = open_store(uri)
    (shard,) = list_shards(store)
    assert shard == table_sharding(lance.dataset(uri)).shard_id(0)
    first = ManifestStore(store, shard).load(1)
    assert (first.shard_spec_id, first.shard_field_entries) == (0, [])
    newest = {i: f"{'new' if i >= 30 else 'old'}-{i}" for i in range(90)}
    table = read_table(uri).to_pylist()
    assert {r["id"]: r["v"] for r in table} == newest and len(table) == 90
    lance.dataset(uri).mem_wal_writer(shard).close()  # a native opener replays nothing:
    assert lsm_rows(uri) == {}  # committed WAL-only rows reach Lance's readers by compaction
    compact(uri)
    assert lsm_rows(uri) == newest

    one = write_task(writer.opts, schema, iter([batch(schema, [1], "z")]))
    other = dataclasses.replace(write_task(writer.opts, schema, iter([batch(schema, [1, 2], "y")])),
                                partition_id=1)
    writer.commit([other, one])
    assert {r["id"]: r["v"] for r in read_table(uri).to_pylist()} == newest | {1: "y-1", 2: "y-2"}

    # No spec to add, as before: sharding options are refused naming the reason.
    with pytest.raises(ConfigError, match="already has a MemWAL without one"):
        MemWalBatchWriter(WriteOptions.parse({"path": uri, "shard_by_bucket": "id",
                                              "num_buckets": "4"}), schema, overwrite=False)


def test_specless_pk_table_from_spark_goes_through_one_partition(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    specless_pk_table(uri)
    df = frame(spark, 0, 300, "a", parts=4)
    prepared = partition_for_table(df, uri)
    assert prepared.rdd.getNumPartitions() == 1
    write(prepared, uri, {}, enable_memtable="false")
    write(partition_for_table(frame(spark, 100, 300, "b", parts=4), uri), uri, {},
          enable_memtable="false")
    assert len(list_shards(open_store(uri))) == 1
    want = {i: f"{'b' if i >= 100 else 'a'}-{i}" for i in range(400)}
    table = read_table(uri).to_pylist()
    assert {r["id"]: r["v"] for r in table} == want and len(table) == 400
    write(frame(spark, 0, 50, "c", parts=2), uri, {}, enable_memtable="false")  # in turns
    want |= {i: f"c-{i}" for i in range(50)}
    assert {r["id"]: r["v"] for r in read_table(uri).to_pylist()} == want
    assert len(list_shards(open_store(uri))) == 1


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_default_pk_table_upserts_from_spread_keys_on_each_store(spark, spark_location):
    """No sharding options, keys spread over every partition, local disk and S3: the table
    gets bucket(id, 16), every key is in one shard, the newest value wins, and a job that
    skips partition_for_table is written too (its tasks take turns per shard)."""
    uri, opts = spark_location
    create = {"primary_key": "id", **MEM}
    write(partition_for_table(frame(spark, 0, 300, "old"), uri, opts, create_options=create),
          uri, opts, **create)
    sharding = table_sharding(open_table(uri, storage_of(opts)))
    assert (sharding.transform, sharding.num_buckets, sharding.columns) == \
        ("bucket", DEFAULT_NUM_BUCKETS, ("id",))
    write(partition_for_table(frame(spark, 100, 300, "new"), uri, opts), uri, opts, **MEM)
    assert all(len(s) == 1 for s in shards_of_keys(uri, opts).values())
    want = {i: f"old-{i}" for i in range(100)} | {i: f"new-{i}" for i in range(100, 400)}
    rows = read_table(uri, storage_of(opts)).to_pylist()
    assert {r["id"]: r["v"] for r in rows} == want and len(rows) == len(want)
    write(frame(spark, 0, 50, "late"), uri, opts, **MEM)
    want |= {i: f"late-{i}" for i in range(50)}
    assert all(len(s) == 1 for s in shards_of_keys(uri, opts).values())
    assert {r["id"]: r["v"] for r in read_table(uri, storage_of(opts)).to_pylist()} == want
