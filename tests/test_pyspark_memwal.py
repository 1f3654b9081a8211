"""``pyspark_memwal``: the installed module Spark registers the ``memwal`` format from."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from memwal_datasource import MemWalDataSource

# A driver that never calls spark.dataSource.register: Spark must find the format.
DRIVER = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("memwal-no-register")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.warehouse.dir", sys.argv[2])
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(7).selectExpr("id", "cast(id * 2 as string) as v") \\
        .write.format("memwal").mode("append").save(sys.argv[1])
    rows = spark.read.format("memwal").load(sys.argv[1]).orderBy("id").collect()
    print("ROWS", [(r.id, r.v) for r in rows])
    spark.stop()
""")


def test_default_source_is_the_memwal_data_source():
    import pyspark_memwal

    assert pyspark_memwal.DefaultSource is MemWalDataSource
    # What Spark's lookup (pyspark/sql/worker/lookup_data_sources.py) iterates over.
    assert "pyspark_memwal" in {m.name for m in pkgutil.iter_modules()}


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_new_session_reads_and_writes_memwal_without_registering(tmp_path):
    table = tmp_path / "t.lance"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(table), str(tmp_path / "wh")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ROWS {[(i, str(i * 2)) for i in range(7)]}" in done.stdout
