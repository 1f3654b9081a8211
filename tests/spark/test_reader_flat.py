"""Reads flat in the number of entries: many one-commit entries read as a few
partitions, the same rows as before in both views; filters pushed to Lance's
scanner and to tail rows return what Spark's own filtering returns."""

from __future__ import annotations

import os
from collections import Counter

import pyarrow.compute as pc
import pytest

from memwal_datasource.maintenance.compact import compact
from memwal_datasource.spark.options import ReadOptions
from memwal_datasource.spark.reader import (
    BaseFragments,
    MemWalBatchReader,
    MergedTail,
    TailSlices,
)
from memwal_datasource.table.view import TOMBSTONE, TableView, create_table
from tests.helpers import SCHEMA
from tests.table.test_tail_scan import Entries, small_entries

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def reference_tail(uri) -> Counter:
    """The committed tail as the one-entry-at-a-time path reads it (``range_rows``)."""
    view = TableView(uri)
    t = view.range_rows(view.committed_tail(), SCHEMA)
    live = t.filter(pc.invert(t.column(TOMBSTONE)))
    return Counter(zip(live.column("id").to_pylist(), live.column("v").to_pylist(),
                       strict=True))


def reference_table(uri) -> Counter:
    t = TableView(uri).to_table()
    return Counter(zip(t.column("id").to_pylist(), t.column("v").to_pylist(), strict=True))


def reader(uri, **options) -> MemWalBatchReader:
    return MemWalBatchReader(ReadOptions.parse({"path": uri, **options}), SCHEMA)


def test_many_small_entries_read_the_same_rows_in_a_few_partitions(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA)
    ranges = small_entries(uri, {}, shards=4, entries=400, rows=3)
    load = spark.read.format("memwal")
    want = reference_tail(uri)
    assert sum(want.values()) == 1200
    assert rows(load.load(uri)) == want
    # Partitions: about min_partitions (twice the cores by default), never one per entry.
    assert 1 < load.load(uri).rdd.getNumPartitions() <= 2 * os.cpu_count()
    few = load.option("min_partitions", "3").load(uri)
    assert few.rdd.getNumPartitions() == 3 and rows(few) == want
    parts = reader(uri, min_partitions="3").partitions()
    # One kept writer per shard, a commit per entry: each slice is one span of positions.
    assert len(parts) == 3 and all(len(s.spans) == 1 for p in parts for s in p.slices)
    assert sum(len(p.slices) for p in parts) <= 3 + 4 - 1
    # max_entries_per_partition still splits by entries (100 a shard: 2 partitions each).
    by_entries = load.option("max_entries_per_partition", "50").load(uri)
    assert by_entries.rdd.getNumPartitions() == 8 and rows(by_entries) == want
    # Metadata columns name each row's entry exactly.
    meta = load.option("metadata_columns", "true").option("min_partitions", "2").load(uri)
    got = meta.select("id", "_shard_id", "_wal_position", "_writer_epoch").collect()
    want_meta = {(i, r.shard_id, r.first, r.epoch) for k, r in enumerate(ranges)
                 for i in range(3 * k, 3 * k + 3)}
    assert {tuple(x) for x in got} == want_meta and len(got) == 1200


def test_view_table_without_a_key_splits_its_tail_by_shard(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA)
    small_entries(uri, {}, shards=4, entries=80, rows=5)
    compact(TableView(uri))
    small_entries(uri, {}, shards=4, entries=400, rows=3, start=10_000)
    table = spark.read.format("memwal").option("view", "table")
    assert rows(table.load(uri)) == reference_table(uri)
    assert sum(reference_table(uri).values()) == 400 + 1200
    parts = reader(uri, view="table", min_partitions="4").partitions()
    tails = [p for p in parts if isinstance(p, TailSlices)]
    assert len(tails) == 4 and not any(isinstance(p, MergedTail) for p in parts)
    assert {s.shard_id for p in tails for s in p.slices} == {
        r.shard_id for r in TableView(uri).committed_tail()}
    assert any(isinstance(p, BaseFragments) for p in parts)
    assert rows(table.option("min_partitions", "4").load(uri)) == reference_table(uri)


def test_view_table_with_a_key_merges_many_entries_newest_first(spark, tmp_path):
    uri = str(tmp_path / "k.lance")
    create_table(uri, SCHEMA, primary_key=["id"])
    small_entries(uri, {}, shards=3, entries=60, rows=4, pk=True)
    compact(TableView(uri))
    w = Entries(uri, {}, shards=3)
    for i in range(300):  # updates and deletes of base keys across shards, and new keys
        ids = [i % 240, 1000 + i]
        w.append(i % 3, ids, f"t{i}", [i % 7 == 0, False])
    want = reference_table(uri)
    got = rows(spark.read.format("memwal").option("view", "table").load(uri))
    assert got == want
    parts = reader(uri, view="table").partitions()
    assert sum(isinstance(p, MergedTail) for p in parts) == 1  # the key decides across shards
    assert not any(isinstance(p, TailSlices) for p in parts)


FILTERS = ["id = 17", "id > 200 AND id <= 230", "id IN (1, 2, 3, 1005, 4000)",
           "NOT id IN (1, 2, 3)", "id != 17", "v = 'e3-13'", "v > 'e5'", "v IS NULL",
           "v LIKE 't1%'", "cast(id as double) > 1100.5", "id = 17 OR id = 1003"]


@pytest.mark.parametrize("key", [False, True])
def test_pushed_filters_return_what_spark_returns(spark, tmp_path, key):
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA, primary_key=["id"] if key else ())
    small_entries(uri, {}, shards=2, entries=80, rows=4, pk=key)
    compact(TableView(uri))
    base = dict(zip(*TableView(uri).to_table().to_pydict().values(), strict=True))
    w = Entries(uri, {}, shards=2)
    for i in range(120):  # with a key: base rows replaced by rows a filter may not select
        w.append(i % 2, [i % 60 * 4 + 1, 1000 + i], f"t{i}", [key and i % 9 == 0, False])
    # The base value of a key the tail rewrote: with a key no row has it any more.
    replaced = f"v = '{base[5]}'"
    filters = [*FILTERS, replaced]
    views = ["table", "tail"]
    want = {(view, f): rows(spark.read.format("memwal").option("view", view).load(uri)
                            .where(f)) for view in views for f in filters}
    spark.conf.set(PUSHDOWN, "true")
    try:
        for view in views:
            for f in filters:
                df = spark.read.format("memwal").option("view", view).load(uri).where(f)
                assert rows(df) == want[view, f], (view, f)
    finally:
        spark.conf.unset(PUSHDOWN)
    assert want["table", replaced] == (Counter() if key else Counter({(5, base[5]): 1}))
    assert want["table", "id = 17"] == (Counter({(17, "t64-17"): 1}) if key else Counter(
        {(17, base[17]): 1, (17, "t4-17"): 1, (17, "t64-17"): 1}))


def test_pushdown_goes_to_lance_and_the_rest_stays_with_spark(tmp_path, monkeypatch):
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNull, Not, StringStartsWith

    from memwal_datasource.spark import reader as reader_mod
    from memwal_datasource.table.predicate import Pred

    uri = str(tmp_path / "k.lance")
    create_table(uri, SCHEMA, primary_key=["id"])
    small_entries(uri, {}, shards=2, entries=40, rows=5)
    compact(TableView(uri))
    r = reader(uri, view="table")
    pushed = [EqualTo(("id",), 7), In(("id",), (7, 8)), Not(IsNull(("v",))),
              GreaterThan(("v",), "e")]
    kept = [StringStartsWith(("v",), "e1"), EqualTo(("v",), 7), EqualTo(("a", "b"), 1)]
    left = r.pushFilters(pushed + kept)
    assert [id(f) for f in left] == [id(f) for f in kept]  # the same objects, as Spark asks
    assert r.filters == (Pred("id", "eq", 7), Pred("id", "in", (7, 8)),
                         Pred("v", "is_not_null"), Pred("v", "gt", "e"))
    seen = []
    real = reader_mod.read_base

    def spy(table, version, ids, tail, preds=(), stats=None):
        seen.append(preds)
        return real(table, version, ids, tail, preds, stats)

    monkeypatch.setattr(reader_mod, "read_base", spy)
    parts = r.partitions()
    # Compaction keeps a BTREE on the key: the index answers id = 7, one task reads the
    # base; and the tail is empty, so no task merges it.
    assert [type(p) for p in parts] == [BaseFragments]
    got = [row for p in parts for b in r.read(p) for row in b.to_pylist()]
    assert got == [{"id": 7, "v": "e1-7"}]
    assert seen and all(p == r.filters for p in seen)


def test_an_empty_table_reads_no_rows_in_either_view(spark, tmp_path):
    for key in ((), ["id"]):
        uri = str(tmp_path / f"t{len(key)}.lance")
        create_table(uri, SCHEMA, primary_key=key)
        for view in ("tail", "table"):
            assert spark.read.format("memwal").option("view", view).load(uri).count() == 0
