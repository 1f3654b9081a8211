"""A table that lives: Spark appends, compaction, garbage collection and reads
(WAL tail, whole table, stream) agree, every row exactly once."""

from __future__ import annotations

import lance
import pytest

from memwal_datasource import compact, read_table
from memwal_datasource.maintenance.gc import collect
from memwal_datasource.options import lance_storage_options
from memwal_datasource.table.view import TableView
from tests.helpers import later
from tests.spark.test_stream import run_source
from tests.spark.test_writer import routed


def append(spark, uri, opts, lo, hi, mode="append", tag="", **extra):
    df = spark.range(lo, hi, numPartitions=3).selectExpr(
        "id", f"concat('{tag}', cast(id as string)) as v")
    w = (routed(df, uri, opts, primary_key="id").write.format("memwal").mode(mode)
         .option("primary_key", "id"))
    for k, v in {"enable_memtable": "false", **opts, **extra}.items():
        w = w.option(k, v)
    w.save(uri)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_appends_compaction_gc_and_every_reader(spark, spark_location, tmp_path):
    uri, opts = spark_location
    storage = {k[len("storage."):]: v for k, v in opts.items()}
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    append(spark, uri, opts, 0, 300)
    append(spark, uri, opts, 200, 400)  # updates 200..299
    ids, _ = run_source(spark, uri, ck, out, opts)
    assert ids == sorted([*range(300), *range(200, 400)])  # the stream sees both writes

    summary = compact(uri, storage)
    assert summary.rows == 400 and summary.pending_records == 0
    base = lance.dataset(uri, storage_options=lance_storage_options(storage)).to_table()
    assert sorted(base.column("id").to_pylist()) == list(range(400))
    assert spark.read.format("memwal").options(**opts).load(uri).count() == 0  # tail empty
    freed = collect(t := TableView(uri, storage), retain_seconds=0, clock=later(t))
    assert freed.shards  # WAL entries were released

    append(spark, uri, opts, 400, 450)
    append(spark, uri, opts, 0, 10, tag="new-")  # updates 0..9 again
    assert spark.read.format("memwal").options(**opts).load(uri).count() == 60
    whole = read_table(uri, storage)
    assert sorted(whole.column("id").to_pylist()) == list(range(450))
    # The same view through Spark: base fragments minus replaced keys, plus the tail.
    view = spark.read.format("memwal").options(**opts).option("view", "table").load(uri)
    got = sorted((r.id, r.v) for r in view.collect())
    assert got == sorted((r["id"], r["v"]) for r in whole.to_pylist())
    assert len(got) == 450 and (3, "new-3") in got and (3, "3") not in got
    # The stream resumes from its checkpoint through the compaction and the collection.
    ids, _ = run_source(spark, uri, ck, out, opts)
    assert ids == sorted([*range(300), *range(200, 450), *range(10)])
    assert compact(uri, storage).rows == 60
    assert sorted(read_table(uri, storage).column("id").to_pylist()) == list(range(450))


@pytest.mark.parametrize("backend", ["local"])
def test_view_option_is_checked_on_the_driver(spark, spark_location):
    from pyspark.errors import AnalysisException

    uri, opts = spark_location
    append(spark, uri, opts, 0, 10)
    for extra, text in [({"view": "everything"}, "option 'view' must be one of"),
                        ({"view": "table", "metadata_columns": "true"}, "cannot be combined")]:
        with pytest.raises(AnalysisException, match=text):
            spark.read.format("memwal").options(**opts, **extra).load(uri).collect()
    from memwal_datasource.errors import ConfigError
    from memwal_datasource.spark.options import ReadOptions
    from memwal_datasource.spark.stream import refuse_unsupported

    with pytest.raises(ConfigError, match="view=table' is not supported by readStream"):
        refuse_unsupported(ReadOptions.parse({"path": uri, "view": "table"}))
