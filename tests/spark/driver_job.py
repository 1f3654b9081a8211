"""A Spark driver for tests/spark/test_idempotency.py, run in its own Python process.

Usage: ``python tests/spark/driver_job.py SPEC_JSON``

``SPEC_JSON`` is ``{"jobs": [{"uri", "options", "start", "rows", "parts", "kill_at"}]}``.
Each job appends ids ``start .. start+rows-1`` (and ``v = str(id * 2)``) in
``parts`` partitions with ``df.write.format("memwal")`` and the job's options,
and reports how it ended. The script prints one line ``RESULT {json}``.

Spark 4.3 runs a Python data source writer's ``commit()`` not in this (the
driver's) Python process but in a Python worker the driver JVM starts
(``pyspark.sql.worker.commit_data_source_write``, forked by a
``pyspark.daemon``). So ``MEMWAL_KILL_AT`` must reach Spark's Python workers,
not ``os.environ`` here. The workers' environment is ``sc.environment`` (what
``spark.executorEnv.*`` fills) as it was when the data source was registered,
so each job sets or clears ``MEMWAL_KILL_AT`` there and registers the data
source again: a job's workers (tasks and its commit) get its kill point, and
one JVM serves every job. The hook's SIGKILL hits the commit worker; Spark
fails the job and this process lives on to report it.

Run it as a script, not with ``-m``, from any directory: it imports only the
installed ``memwal_datasource`` package.
"""

from __future__ import annotations

import json
import os
import sys

KILL_VAR = "MEMWAL_KILL_AT"


def run_job(spark, job: dict) -> dict:
    from memwal_datasource import MemWalDataSource

    env = spark.sparkContext.environment
    if job.get("kill_at"):
        env[KILL_VAR] = job["kill_at"]
    else:
        env.pop(KILL_VAR, None)
    spark.dataSource.register(MemWalDataSource)  # captures sc.environment now
    df = (spark.range(job["start"], job["start"] + job["rows"], numPartitions=job["parts"])
          .selectExpr("id", "cast(id * 2 as string) as v"))
    w = df.write.format("memwal").mode("append")
    for k, v in job["options"].items():
        w = w.option(k, v)
    try:
        w.save(job["uri"])
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        return {"ok": False, "error_type": type(exc).__name__, "error": str(exc)[:20_000]}
    return {"ok": True}


def main() -> None:
    spec = json.loads(sys.argv[1])
    if os.environ.get(KILL_VAR):
        sys.exit(f"{KILL_VAR} must not be set in the driver's own environment")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("memwal-idempotency-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        jobs = [run_job(spark, job) for job in spec["jobs"]]
    finally:
        spark.stop()
    print("RESULT " + json.dumps({"driver_pid": os.getpid(), "jobs": jobs}), flush=True)


if __name__ == "__main__":
    main()
