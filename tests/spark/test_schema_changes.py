"""Spark writes after Lance's ``add_columns``: a DataFrame may leave out the table's
nullable columns (they are stored as nulls, as Delta and Iceberg do), in both modes and
for deletes; a column the table lacks is refused with the ``add_columns`` call."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest
from pyspark.sql.utils import AnalysisException

from memwal_datasource import compact
from memwal_datasource.options import lance_storage_options
from tests.spark.test_source import first_sentence
from tests.spark.test_writer import read, storage_of, write


def narrow(spark, lo, hi):
    """Rows ``lo..hi-1`` with the table's first columns only (no 'extra', no 'note')."""
    return spark.range(lo, hi, numPartitions=2).selectExpr("id", "concat('v', id) as v")


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_writes_leaving_out_added_columns_store_nulls(spark, spark_location):
    uri, opts = spark_location
    storage = storage_of(opts)
    write(narrow(spark, 0, 20), uri, opts, primary_key="id", enable_memtable="false")
    ds = lance.dataset(uri, storage_options=lance_storage_options(storage))
    ds.add_columns(pa.field("extra", pa.int32()))  # metadata only
    lance.dataset(uri, storage_options=lance_storage_options(storage)).add_columns(
        {"note": "CAST(NULL AS string)"})  # a SQL expression: data files rewritten

    write(narrow(spark, 20, 30), uri, opts, enable_memtable="false")  # WAL-only
    write(narrow(spark, 30, 40), uri, opts, enable_memtable="true")  # MemTable (native)
    full = spark.range(40, 45, numPartitions=1).selectExpr(
        "id", "concat('v', id) as v", "cast(id as int) as extra", "'n' as note")
    write(full, uri, opts, enable_memtable="false")
    only_note = spark.range(45, 50, numPartitions=1).selectExpr(
        "id", "concat('v', id) as v", "'m' as note")  # leaves out 'extra' in the middle
    write(only_note, uri, opts, enable_memtable="false")
    # A delete only needs the key.
    write(spark.range(0, 5, numPartitions=1), uri, opts, operation="delete")

    def want(ids):
        return {i: (f"v{i}", i if 40 <= i < 45 else None,
                    "n" if 40 <= i < 45 else "m" if 45 <= i < 50 else None) for i in ids}

    def as_dict(rows):
        rows = list(rows)
        out = {r["id"]: (r["v"], r["extra"], r["note"]) for r in rows}
        assert len(out) == len(rows), "a key read twice"
        return out

    # The WAL tail (what was written, deletes as markers) and the whole table.
    tail = read(spark, uri, opts)
    assert tail.columns == ["id", "v", "extra", "note"]
    assert as_dict(r.asDict() for r in tail.collect()) == want(range(50))
    whole = read(spark, uri, opts, view="table").collect()
    assert as_dict(r.asDict() for r in whole) == want(range(5, 50))
    # Compaction folds them; any Lance reader sees the nulls.
    compact(uri, storage)
    base = lance.dataset(uri, storage_options=lance_storage_options(storage)).to_table()
    assert as_dict(base.to_pylist()) == want(range(5, 50))
    assert as_dict(r.asDict() for r in read(spark, uri, opts, view="table").collect()) == \
        want(range(5, 50))


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_column_the_table_lacks_is_refused_with_add_columns(spark, spark_location):
    uri, opts = spark_location
    write(narrow(spark, 0, 5), uri, opts, primary_key="id", enable_memtable="false")
    wider = narrow(spark, 5, 10).selectExpr("id", "v", "cast(id as int) as w")
    with pytest.raises(AnalysisException) as info:
        write(wider, uri, opts, enable_memtable="false")
    message = str(info.value)
    assert first_sentence(message[message.index("Add column"):]) == (
        "Add column(s) ['w'] to the table first, then write again")
    assert f"lance.dataset('{uri}').add_columns([pa.field('w', pa.int32())])" in message
    # The key is not nullable: a DataFrame without it is refused, naming it.
    with pytest.raises(AnalysisException, match=r"Add column\(s\) \['id'\] to the DataFrame"):
        write(narrow(spark, 5, 10).select("v"), uri, opts, enable_memtable="false")
    assert read(spark, uri, opts).count() == 5
