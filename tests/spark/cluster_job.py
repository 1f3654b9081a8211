"""The Spark driver for tests/spark/test_cluster.py, run in its own Python process.

Usage: ``python tests/spark/cluster_job.py MASTER_URL WORK_DIR``

One JVM can host only one SparkContext and the test session already has a
local-mode one, so this script is the driver of a standalone-cluster
application. It writes ``ROWS`` rows in ``PARTS`` partitions with
``format("memwal")`` into one table per mode (WAL-only and MemTable), reads
each table back, and prints one line ``RESULT {json}`` with what it saw.

Every row carries the pid (and the /proc parent chain) of the executor-side
Python process that produced it, so the test can check the tasks ran outside
the driver. Run it as a script, not with ``-m``: its functions then live in
``__main__`` and cloudpickle ships them by value, because executors run in the
worker's directory where the ``tests`` package cannot be imported.
"""

from __future__ import annotations

import json
import os
import sys

ROWS = 20_000
PARTS = 4
MODES = ("false", "true")  # enable_memtable


def lineage() -> list[int]:
    """This process's pid, then its parent's, up to init (just the pid without /proc)."""
    chain = [os.getpid()]
    while chain[-1] > 1:
        try:
            with open(f"/proc/{chain[-1]}/stat") as f:
                stat = f.read()
        except OSError:
            break
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid <= 0:
            break
        chain.append(ppid)
    return chain


def tag_with_process(batches):
    """mapInArrow: add the producing process's pid and parent chain to every row."""
    import pyarrow as pa

    pid = os.getpid()
    chain = ",".join(map(str, lineage()))
    for b in batches:
        n = b.num_rows
        yield pa.RecordBatch.from_arrays(
            [b.column(0), b.column(1), pa.array([pid] * n, pa.int64()),
             pa.array([chain] * n, pa.string())],
            names=["id", "v", "pid", "lineage"])


def probe_process(batches):
    """mapInArrow: one row per read partition with the reading process's pid and chain."""
    import pyarrow as pa

    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict(
        {"pid": [os.getpid()], "lineage": [",".join(map(str, lineage()))], "rows": [rows]},
        schema=pa.schema([("pid", pa.int64()), ("lineage", pa.string()), ("rows", pa.int64())]))


def run_mode(spark, uri: str, memtable: str) -> dict:
    from pyspark.sql import functions as F

    df = (spark.range(0, ROWS, numPartitions=PARTS)
          .selectExpr("id", "cast(id * 2 as string) as v")
          .mapInArrow(tag_with_process, "id long, v string, pid long, lineage string"))
    (df.write.format("memwal").mode("append")
       .option("enable_memtable", memtable).option("primary_key", "id")
       .option("max_wal_flush_interval_ms", "20")
       .save(uri))

    back = spark.read.format("memwal").load(uri)
    stats = back.agg(
        F.count("*").alias("rows"),
        F.countDistinct("id").alias("distinct"),
        F.min("id").alias("min"),
        F.max("id").alias("max"),
        F.sum(F.when(F.col("v") != (F.col("id") * 2).cast("string"), 1).otherwise(0))
        .alias("bad_v"),
    ).first()
    writers = back.select("pid", "lineage").distinct().collect()
    readers = back.mapInArrow(probe_process, "pid long, lineage string, rows long").collect()
    return {
        "written": ROWS,
        "rows": stats["rows"],
        "distinct": stats["distinct"],
        "min": stats["min"],
        "max": stats["max"],
        "bad_v": stats["bad_v"] or 0,
        "write_procs": sorted({(r.pid, r.lineage) for r in writers}),
        "read_procs": sorted({(r.pid, r.lineage) for r in readers}),
        "read_rows": sum(r.rows for r in readers),
    }


def main() -> None:
    master, work = sys.argv[1], sys.argv[2]
    from pyspark.sql import SparkSession

    from memwal_datasource import MemWalDataSource

    spark = (
        SparkSession.builder.master(master)
        .appName("memwal-cluster-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "1g")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("WARN")
        spark.dataSource.register(MemWalDataSource)
        result = {
            "driver_pid": os.getpid(),
            "driver_lineage": lineage(),
            "app_id": spark.sparkContext.applicationId,
            "modes": {m: run_mode(spark, os.path.join(work, f"memtable_{m}.lance"), m)
                      for m in MODES},
        }
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
