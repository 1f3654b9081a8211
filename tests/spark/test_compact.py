"""Compaction of Spark-written tables, and compaction as a Spark job
(``memwal_datasource.spark.compact``): every committed row exactly once."""

from __future__ import annotations

from collections import Counter

import lance
import pytest

from memwal_datasource import compact, read_table
from memwal_datasource.options import lance_storage_options
from memwal_datasource.table import ROW_KEY


def append(spark, uri, opts, lo, hi, tag="", **extra):
    """A Spark append of ids lo..hi-1 (3 partitions) to a table without a primary key."""
    df = spark.range(lo, hi, numPartitions=3).selectExpr(
        "id", f"concat('{tag}', cast(id as string)) as v")
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
