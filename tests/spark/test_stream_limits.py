"""Stream read limits: Spark's ReadLimit decides a micro-batch, availableNow serves everything."""

from __future__ import annotations

import pytest

from memwal_datasource.errors import ConfigError
from memwal_datasource.spark.options import ReadOptions
from memwal_datasource.spark.stream import MemWalStreamReader, refuse_unsupported

from .test_stream import add_files, memory_query, run_sink


@pytest.mark.parametrize("backend", ["local"])
@pytest.mark.parametrize("limit", [{"max_entries_per_trigger": "1"},
                                   {"max_rows_per_trigger": "200"}])
def test_available_now_serves_every_record_in_limited_batches(spark, spark_location, tmp_path,
                                                                limit):
    uri, opts = spark_location
    add_files(spark, str(tmp_path / "src"), 0, 6)  # six records of one entry, 100 rows each
    run_sink(spark, str(tmp_path / "src"), uri, str(tmp_path / "ck1"), opts)
    name = "lim_" + next(iter(limit)).split("_")[1]
    ids, sizes = memory_query(spark, uri, str(tmp_path / "ck2"), name, **limit)
    assert ids == list(range(600))
    expected = [100] * 6 if "max_entries_per_trigger" in limit else [200] * 3
    assert sizes == expected


def test_both_limits_are_refused_on_the_driver(tmp_path):
    opts = ReadOptions.parse({"path": str(tmp_path / "t.lance"), "max_rows_per_trigger": "10",
                              "max_entries_per_trigger": "2"})
    with pytest.raises(ConfigError, match="max_rows_per_trigger.*max_entries_per_trigger"):
        refuse_unsupported(opts)


def test_read_limit_maps_options_and_the_engine_limit_wins(tmp_path):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows

    reader = MemWalStreamReader(ReadOptions.parse(
        {"path": str(tmp_path / "t.lance"), "max_entries_per_trigger": "3"}), None)
    assert reader.getDefaultReadLimit() == ReadMaxFiles(3)
    assert reader._bounds(ReadAllAvailable()) == (None, None)
    assert reader._bounds(ReadMaxRows(7)) == (7, None)
    assert reader._bounds(None) == (None, 3)
