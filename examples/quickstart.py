"""Quickstart: write a DataFrame into a Lance table's MemWAL with Spark, read it back.

Runs on local disk with no server: ``make demo``. Pass a table URI to use another
location, e.g. ``python examples/quickstart.py s3://bucket/demo.lance`` with the
storage options of conf/s3.properties exported as MEMWAL_STORAGE_* variables.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this interpreter

from pyspark.sql import SparkSession  # noqa: E402

from memwal_datasource import MemWalDataSource  # noqa: E402
from memwal_datasource.log.commit import CommitLog  # noqa: E402
from memwal_datasource.shard.manifest import ManifestStore, list_shards  # noqa: E402
from memwal_datasource.spark import partition_for_table  # noqa: E402
from memwal_datasource.store import open_store  # noqa: E402


def storage_from_env() -> dict[str, str]:
    """MEMWAL_STORAGE_AWS_ENDPOINT=... -> {"storage.aws_endpoint": ...}."""
    prefix = "MEMWAL_STORAGE_"
    return {f"storage.{k[len(prefix):].lower()}": v for k, v in os.environ.items()
            if k.startswith(prefix)}


def next_steps(uri: str, storage: dict[str, str]) -> str:
    """What to try after the demo: the CLI on this table, compaction, the docs.

    Storage options are shown for everything but credentials (never printed:
    the CLI reads them from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY too).
    """
    from memwal_datasource.options import is_secret

    flags = "".join(f" --storage {k[len('storage.'):]}={v}" for k, v in sorted(storage.items())
                    if not is_secret(k))
    secrets = any(is_secret(k) for k in storage)
    lines = [
        "",
        "Next steps:",
        f"  memwal inspect {uri}{flags}      # shards, commits, lag",
        f"  memwal tail {uri} <shard>{flags}  # a shard's last WAL entries",
        f"  memwal compact {uri}{flags}      # fold the WAL into the base Lance table",
        f"  memwal gc {uri}{flags}           # then delete what compaction made unnecessary",
        "  memwal --help, memwal options    # every command; every Spark option",
        "  README.md; docs/cluster.md, docs/troubleshooting.md",
    ]
    if secrets:
        lines.append("  (credentials: export AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
    return "\n".join(lines)


def main() -> None:
    uri = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "demo.lance")
    storage = storage_from_env()
    spark = (SparkSession.builder.master("local[2]").appName("memwal-quickstart")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MemWalDataSource)
    print(f"table: {uri}")

    rows = 200_000
    for mode, start in (("false", 0), ("true", rows)):
        df = spark.range(start, start + rows, numPartitions=4).selectExpr(
            "id", "concat('event-', id) AS payload", "id % 7 AS kind")
        t0 = time.perf_counter()
        # A primary-key table is sharded by bucket(id, 16): one task per bucket is fastest.
        create = {"primary_key": "id", **storage}  # used when the table is created
        (partition_for_table(df, uri, storage_options=storage, create_options=create)
         .write.format("memwal").mode("append")
         .option("enable_memtable", mode)          # false: our WAL-only pipeline
         .options(**create)
         .save(uri))
        secs = time.perf_counter() - t0
        label = "WAL-only" if mode == "false" else "MemTable (pylance native)"
        note = " (includes Spark's Python worker start-up)" if start == 0 else ""
        print(f"wrote {rows:,} rows in {label} mode in {secs:.2f}s "
              f"({rows / secs:,.0f} rows/s){note}")

    t0 = time.perf_counter()
    back = spark.read.format("memwal").options(**storage).load(uri)
    total = back.count()
    print(f"read back {total:,} committed rows in {time.perf_counter() - t0:.2f}s; "
          f"distinct ids: {back.select('id').distinct().count():,}")
    back.orderBy("id").show(5)
    (spark.read.format("memwal").option("metadata_columns", "true").options(**storage).load(uri)
     .groupBy("_shard_id").count().orderBy("_shard_id").show(truncate=False))

    store = open_store(uri, {k[len("storage."):]: v for k, v in storage.items()})
    for shard in list_shards(store):
        m = ManifestStore(store, shard).latest()
        print(f"shard {shard}: epoch {m.writer_epoch}, manifest v{m.version}, "
              f"{len(m.sstables)} SSTable(s)")
    for rec in CommitLog(store).records():
        print(f"commit {rec.sequence}: {rec.kind}, {len(rec.ranges)} task ranges, "
              f"{sum(r.rows for r in rec.ranges):,} rows")
    assert total == 2 * rows, "every row written is read back exactly once"
    spark.stop()
    print(next_steps(uri, storage))


if __name__ == "__main__":
    main()
