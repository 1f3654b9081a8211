"""A table deleted and made anew at the same path while Spark's Python workers live on.

Reused workers keep state per path: kept shard writers (their shard ids are the
path's writer-group slots, and a new table's epochs start again at 1), the commit
log's remembered fold, table descriptions, the LanceSchema a primary-key task routes
with. None of it may leak into the new table: every read sees exactly the new rows,
every shard's WAL positions run from 1 without a gap, and no shard manifest claims
entries past its WAL.
"""

from __future__ import annotations

import shutil

import pytest

from memwal_datasource import read_table
from memwal_datasource.format.memwal import parse_bit_reversed_name, shard_dir
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.shard.manifest import ManifestStore, list_shards
from memwal_datasource.store import local_path, open_store
from tests.spark.test_writer import routed, write


def storage_of(opts: dict[str, str]) -> dict[str, str]:
    return {k[len("storage."):]: v for k, v in opts.items() if k.startswith("storage.")}


def wipe(uri: str, storage: dict[str, str]) -> None:
    """``rm -r`` the table (every object under the path, on a bucket)."""
    path = local_path(uri)
    if path is not None:
        shutil.rmtree(path)
        return
    store = open_store(uri, storage)
    for key in list(store.list("")):
        store.delete(key)


def check_shards(uri: str, storage: dict[str, str]) -> None:
    store = open_store(uri, storage)
    shards = list_shards(store)
    assert shards
    for shard in shards:
        if not any(store.list(f"{shard_dir(shard)}/")):
            continue  # an emptied directory SeaweedFS still lists (its filer keeps them)
        positions = sorted(parse_bit_reversed_name(k.rsplit("/", 1)[-1].split(".")[0])
                           for k in store.list(f"{shard_dir(shard)}/wal/"))
        assert positions == list(range(1, len(positions) + 1)), (shard, positions)
        m = ManifestStore(store, shard).latest()
        assert m is not None, shard
        tip = positions[-1] if positions else 0
        assert m.replay_after_wal_entry_position <= tip, (shard, m, tip)
        assert m.wal_entry_position_last_seen <= tip, (shard, m, tip)
    seqs = [r.sequence for r in CommitLog(store).records()]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_appends_to_a_table_made_anew_see_only_the_new_table(spark, spark_location):
    uri, opts = spark_location
    storage = storage_of(opts)

    def frame(lo, hi, tag):
        return spark.range(lo, hi, numPartitions=2).selectExpr(
            "id", f"concat('{tag}', cast(id as string)) as v")

    for i in range(4):  # the workers now keep writers and the commit log's fold
        write(frame(100 * i, 100 * i + 50, "old-"), uri, opts)
    wipe(uri, storage)
    for i in range(2):
        write(frame(1000 + 10 * i, 1000 + 10 * i + 5, "new-"), uri, opts)
    got = spark.read.format("memwal").options(**opts).load(uri).select("id", "v").collect()
    assert sorted((r.id, r.v) for r in got) == [
        (i, f"new-{i}") for i in (*range(1000, 1005), *range(1010, 1015))]
    assert sorted(read_table(uri, storage).column("id").to_pylist()) == [
        *range(1000, 1005), *range(1010, 1015)]
    check_shards(uri, storage)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_primary_key_table_made_anew_with_another_key_routes_by_the_new_one(
        spark, spark_location):
    uri, opts = spark_location
    storage = storage_of(opts)
    old = spark.range(0, 40, numPartitions=2).selectExpr("id", "cast(id as string) as v")
    for _ in range(2):
        write(routed(old, uri, storage, primary_key="id"), uri, opts, primary_key="id")
    wipe(uri, storage)
    new = spark.range(0, 40, numPartitions=2).selectExpr(
        "concat('k', cast(id as string)) as key", "cast(id as double) as n")
    for _ in range(2):  # upserts: the second write replaces the first's rows
        write(routed(new, uri, storage, primary_key="key"), uri, opts, primary_key="key")
    rows = read_table(uri, storage)
    assert rows.schema.names[:2] == ["key", "n"]
    assert sorted(rows.column("key").to_pylist()) == sorted(f"k{i}" for i in range(40))
    check_shards(uri, storage)
