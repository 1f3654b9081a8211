"""Compaction of Spark-written tables, and compaction as a Spark job
(``memwal_datasource.spark.compact``): every committed row exactly once."""

from __future__ import annotations

from collections import Counter

import lance
import pytest

from memwal_datasource import compact, read_table
from memwal_datasource.format.table_schema import ROW_KEY
from memwal_datasource.options import lance_storage_options
from tests.spark.test_writer import routed


def append(spark, uri, opts, lo, hi, tag="", **extra):
    """A Spark append of ids lo..hi-1 (3 partitions); with option ``primary_key`` the
    rows are routed by the table's sharding spec, as its users must."""
    df = spark.range(lo, hi, numPartitions=3).selectExpr(
        "id", f"concat('{tag}', cast(id as string)) as v")
    if "primary_key" in extra:
        df = routed(df, uri, opts, primary_key=extra["primary_key"])
    w = df.write.format("memwal").mode("append")
    for k, v in {"enable_memtable": "false", **opts, **extra}.items():
        w = w.option(k, v)
    w.save(uri)


def base(uri, storage) -> Counter:
    """The base Lance table as a multiset of (id, v), read as any Lance reader would."""
    rows = lance.dataset(uri, storage_options=lance_storage_options(storage)).to_table()
    keys = rows.column(ROW_KEY).to_pylist()
    assert None not in keys and len(set(keys)) == len(keys)
    return Counter(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))


def rows(lo, hi, tag="") -> Counter:
    return Counter((i, f"{tag}{i}") for i in range(lo, hi))


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_spark_appends_without_primary_key_compact_exactly_once(spark, spark_location):
    """Spark's default tables have no primary key (WAL-only writes): compact, write on."""
    uri, opts = spark_location
    storage = {k[len("storage."):]: v for k, v in opts.items()}
    append(spark, uri, opts, 0, 30)
    append(spark, uri, opts, 20, 50)  # same ids again: rows, not updates
    append(spark, uri, opts, 50, 60)
    want = rows(0, 30) + rows(20, 50) + rows(50, 60)
    summary = compact(uri, storage)
    assert summary.rows == 70 and summary.pending_records == 0
    assert base(uri, storage) == want
    assert compact(uri, storage).rounds == []  # a re-run changes nothing
    assert spark.read.format("memwal").options(**opts).load(uri).count() == 0  # tail empty

    # The table stays writable and readable with the hidden row key in its base.
    append(spark, uri, opts, 100, 110, tag="w-")
    append(spark, uri, opts, 110, 120, tag="m-")
    tail = spark.read.format("memwal").options(**opts).load(uri)
    assert tail.columns == ["id", "v"] and tail.count() == 20
    view = spark.read.format("memwal").options(**opts).option("view", "table").load(uri)
    assert view.columns == ["id", "v"]
    want += rows(100, 110, "w-") + rows(110, 120, "m-")
    assert Counter((r.id, r.v) for r in view.collect()) == want
    whole = read_table(uri, storage)
    assert whole.column_names == ["id", "v"]
    assert compact(uri, storage).rows == 20
    assert base(uri, storage) == want


# --- compaction as a Spark job -------------------------------------------------------

def pk_history(spark, uri, opts) -> dict[int, str]:
    """Spark appends to a primary-key table spread over shards; the newest value per key."""
    append(spark, uri, opts, 0, 40, primary_key="id")
    append(spark, uri, opts, 30, 60, tag="u-", primary_key="id")  # updates 30..39
    append(spark, uri, opts, 0, 5, tag="n-", primary_key="id")
    want = {i: str(i) for i in range(0, 30)}
    want.update({i: f"u-{i}" for i in range(30, 60)})
    want.update({i: f"n-{i}" for i in range(0, 5)})
    return want


def pk_base(uri, storage) -> dict[int, str]:
    rows = lance.dataset(uri, storage_options=lance_storage_options(storage)).to_table()
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the base table twice"
    return dict(zip(ids, rows.column("v").to_pylist(), strict=True))


class Crash(Exception):
    """Stands for the driver dying at a compaction step."""


@pytest.mark.parametrize("backend", ["local"])
@pytest.mark.parametrize("point", ["compact.intent", "compact.before_commit",
                                   "compact.after_commit"])
def test_spark_compaction_job_crash_between_steps_then_rerun(spark, spark_location, point,
                                                              caplog):
    from memwal_datasource import hooks
    from memwal_datasource.spark import compact as spark_compact

    uri, opts = spark_location
    storage = {k[len("storage."):]: v for k, v in opts.items()}
    want = pk_history(spark, uri, opts)

    def crash(**_):
        raise Crash(point)

    hooks.register(point, crash)
    try:
        with pytest.raises(Crash):
            spark_compact(spark, uri, storage, max_records_per_round=2)
    finally:
        hooks.clear()
    caplog.set_level("INFO", logger="memwal_datasource")
    summary = spark_compact(spark, uri, storage, max_records_per_round=2)
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("memwal spark compaction round 2: ") and " task(s) read " in m
               for m in lines), lines  # a progress line per round
    assert any(" committed here), " in m and " rows merged" in m for m in lines)  # summary
    # Round 1 was left as an intent (or committed, after_commit): the re-run finishes it.
    assert [r.number for r in summary.rounds] == ([2] if point == "compact.after_commit"
                                                  else [1, 2])
    assert all(r.committed for r in summary.rounds) and summary.pending_records == 0
    assert pk_base(uri, storage) == want
    version = lance.dataset(uri, storage_options=lance_storage_options(storage)).version
    again = spark_compact(spark, uri, storage)
    assert again.rounds == [] and again.pending_records == 0  # a re-run changes nothing
    assert lance.dataset(uri, storage_options=lance_storage_options(storage)).version == version


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_spark_compaction_job_against_a_stalled_core_compactor(spark, spark_location):
    """A core compactor stalls before its commit; the Spark job compacts everything;
    the stalled one wakes and Lance refuses its stale mark. Tables without a key too."""
    import threading

    from memwal_datasource import hooks
    from memwal_datasource.maintenance.compact import compact as core_compact
    from memwal_datasource.spark import compact as spark_compact
    from memwal_datasource.table.view import TableView

    uri, opts = spark_location
    storage = {k[len("storage."):]: v for k, v in opts.items()}
    append(spark, uri, opts, 0, 30)
    append(spark, uri, opts, 20, 50)
    append(spark, uri, opts, 50, 60)
    want = rows(0, 30) + rows(20, 50) + rows(50, 60)
    held, release = threading.Event(), threading.Event()

    def hold(**_):
        if threading.current_thread().name == "stalled":
            held.set()
            assert release.wait(120)

    hooks.register("compact.before_commit", hold)
    out: dict = {}
    stalled = threading.Thread(name="stalled", target=lambda: out.update(s=core_compact(
        TableView(uri, storage), max_records_per_round=2, max_rounds=1)))
    try:
        stalled.start()
        assert held.wait(120)
        job = spark_compact(spark, uri, storage, max_records_per_round=2)
        assert [(r.number, r.committed) for r in job.rounds] == [(1, True), (2, True)]
        release.set()
        stalled.join(120)
    finally:
        release.set()
        hooks.clear()
    assert [r.committed for r in out["s"].rounds] == [False]
    assert base(uri, storage) == want


@pytest.mark.parametrize("backend", ["local"])
def test_zoned_timestamps_still_write_after_the_row_key_is_added(spark, spark_location):
    """The writer's schema check aligns zoned timestamps against the table's columns
    without the hidden key (Spark hands them over in the session's zone)."""
    uri, opts = spark_location
    storage = {k[len("storage."):]: v for k, v in opts.items()}
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        def write(lo, hi):
            df = spark.range(lo, hi, numPartitions=2).selectExpr(
                "id", "timestamp'2024-03-10 01:30:00' + make_interval(0, 0, 0, 0, id) as ts")
            df.write.format("memwal").mode("append").option("enable_memtable", "false") \
                .options(**opts).save(uri)

        write(0, 4)
        assert compact(uri, storage).rows == 4
        write(4, 8)  # the table now has the hidden key
        assert compact(uri, storage).rows == 4
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    got = read_table(uri, storage)
    assert got.column_names == ["id", "ts"] and sorted(got.column("id").to_pylist()) == \
        list(range(8))
