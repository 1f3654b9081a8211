"""The Spark driver for tests/spark/test_cluster.py, run in its own Python process.

Usage: ``python tests/spark/cluster_job.py MASTER_URL WORK_DIR [--wait-for-go]``

One JVM can host only one SparkContext and the test session already has a
local-mode one, so this script is the driver of a standalone-cluster
application. It writes ``ROWS`` rows in ``PARTS`` partitions with
``format("memwal")`` into one table per mode (WAL-only and MemTable), reads
each table back, and prints one line ``RESULT {json}`` with what it saw.
With ``--wait-for-go`` it starts its JVM at once, then waits for a line
``go`` on stdin before connecting: the test overlaps driver start-up with the
cluster's and says go once the master lists an ALIVE worker.

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


def tag_reader(batches):
    """mapInArrow over the read: add the reading process's pid and parent chain."""
    import pyarrow as pa

    pid = os.getpid()
    chain = ",".join(map(str, lineage()))
    for b in batches:
        n = b.num_rows
        yield b.append_column("rpid", pa.array([pid] * n, pa.int64())).append_column(
            "rlineage", pa.array([chain] * n, pa.string()))


def procs(table, pid: str, chain: str) -> list[list]:
    """Distinct (pid, parent chain) pairs in ``table``'s columns."""
    pairs = zip(table.column(pid).to_pylist(), table.column(chain).to_pylist(), strict=True)
    return [list(p) for p in sorted(set(pairs))]


def run_mode(spark, uri: str, memtable: str) -> dict:
    from memwal_datasource.spark import partition_for_table

    df = (spark.range(0, ROWS, numPartitions=PARTS)
          .selectExpr("id", "cast(id * 2 as string) as v")
          .mapInArrow(tag_with_process, "id long, v string, pid long, lineage string"))
    # A primary-key table: one bucket per task, as partition_for_table prepares it.
    sharded = {"primary_key": "id", "shard_by_bucket": "id", "num_buckets": str(PARTS)}
    df = partition_for_table(df, uri, create_options=sharded)
    (df.write.format("memwal").mode("append").options(**sharded)
       .option("enable_memtable", memtable)
       .option("max_wal_flush_interval_ms", "20")
       .save(uri))

    back = spark.read.format("memwal").load(uri).mapInArrow(
        tag_reader, "id long, v string, pid long, lineage string, rpid long, rlineage string")
    got = back.toArrow()  # one job; 20k small rows
    ids = got.column("id").to_pylist()
    vs = got.column("v").to_pylist()
    return {
        "written": ROWS,
        "rows": len(ids),
        "distinct": len(set(ids)),
        "min": min(ids, default=None),
        "max": max(ids, default=None),
        "bad_v": sum(v != str(i * 2) for i, v in zip(ids, vs, strict=True)),
        "write_procs": procs(got, "pid", "lineage"),
        "read_procs": procs(got, "rpid", "rlineage"),
    }


def main() -> None:
    master, work = sys.argv[1], sys.argv[2]
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from memwal_datasource import MemWalDataSource

    if "--wait-for-go" in sys.argv[3:]:
        # Start the driver JVM now, while the test waits for the cluster; then wait for it.
        SparkContext._ensure_initialized()
        if sys.stdin.readline().strip() != "go":
            sys.exit("no 'go' on stdin: the cluster never became ready")
    os.chdir(work)
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
            # Relative paths, as users type them: the driver must resolve them once,
            # or executors (in the worker's directory) would write somewhere else.
            "modes": {m: run_mode(spark, f"memtable_{m}.lance", m) for m in MODES},
        }
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
