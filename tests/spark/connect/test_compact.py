"""``memwal_datasource.spark.compact`` from a Spark Connect client (issue 45, defect 3)."""

from __future__ import annotations

import pytest

from memwal_datasource.spark import compact

pytestmark = [pytest.mark.spark, pytest.mark.connect]


def test_spark_compaction_from_a_connect_client(connect_spark, tmp_path):
    path = str(tmp_path / "pk.lance")
    for version in range(2):  # two jobs upsert the same keys: the last one wins
        (connect_spark.range(0, 40, 1, 2)
         .selectExpr("id", f"concat('v{version}-', cast(id as string)) AS v")
         .write.format("memwal").mode("append").option("primary_key", "id").save(path))

    summary = compact(connect_spark, path)

    assert [(r.number, r.committed, r.rows) for r in summary.rounds] == [(1, True, 40)]
    assert summary.pending_records == 0
    whole = connect_spark.read.format("memwal").option("view", "table").load(path)
    assert sorted((r.id, r.v) for r in whole.collect()) == [(i, f"v1-{i}") for i in range(40)]
    assert connect_spark.read.format("memwal").load(path).count() == 0  # the tail is folded
    again = compact(connect_spark, path)
    assert again.rounds == [] and again.pending_records == 0
