"""``df.write.format("memwal")`` vs a no-op Python sink and Spark's parquet writer.

One cached DataFrame (4 partitions), 10k- and 100k-row Arrow batches: memwal (defaults:
WAL-only), the no-op ``DataSourceArrowWriter`` (any Python sink's most), parquet, and
parquet with its files fsynced (memwal's rows are durable when the job returns).
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import harness as h

NAME = "spark_write"
WAL, NOOP = "memwal (Spark defaults, WAL-only)", "no-op DataSourceArrowWriter"
PARQUET, PARQUET_SYNC = "Spark parquet", "Spark parquet, then fsync (durable)"


def run(ctx: h.Ctx) -> dict[str, Any]:
    rows, cases = ctx.pick(200_000, 2_000_000, 4_000_000), []
    with h.spark_session(ctx) as spark:
        df = h.frame(spark, 0, rows, parts=4).cache()
        assert df.count() == rows

        def timed(write):
            def run(r: int) -> dict[str, Any]:
                path, cpu0, t0 = str(ctx.scratch("sw") / "t"), h.cpu_tree(), time.perf_counter()
                write(path)
                secs, cpu = time.perf_counter() - t0, sum(h.cpu_tree().values())
                return {"rows_s": rows / secs, "cores_busy": (cpu - sum(cpu0.values())) / secs,
                        "seconds": secs}
            return run

        def memwal(path: str) -> None:
            df.write.format("memwal").mode("append").save(path)
            assert h.committed_rows(path) == rows

        def parquet(path: str, durable: bool = False) -> None:
            df.write.parquet(path)
            walk = list(os.walk(path)) if durable else []  # files, then directories
            h.fsync_path(*(os.path.join(d, f) for d, _s, fs in walk for f in fs),
                         *(d for d, *_ in walk))

        comps = {WAL: timed(memwal),
                 NOOP: timed(lambda p: df.write.format("noop_arrow").mode("append").save()),
                 PARQUET: timed(parquet), PARQUET_SYNC: timed(lambda p: parquet(p, True))}
        for batch in (10_000, 100_000):
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch))
            runs = h.alternate(ctx, comps, label=f"{batch:,}-row batches: ")
            rt = h.ratios(runs, WAL, "rows_s", [NOOP, PARQUET, PARQUET_SYNC])
            rt["noop/parquet"] = h.ratios(runs, NOOP, "rows_s", [PARQUET])[PARQUET]
            cases.append({"label": f"{batch:,}-row batches", "competitors": h.stats(runs),
                          "ratios": rt})
    return h.per_case(
        f"Spark df.write of {rows:,} rows: memwal vs no-op Python sink vs parquet",
        {"rows": rows, "partitions": 4, "timed": "df.write...save(path)"}, cases, "batches",
        [("rows/s", "rows_s", "{:,.0f}"), ("cores busy", "cores_busy", "{:.2f}")],
        lambda c, b: [
            h.target(f"{b}: memwal / no-op Arrow writer rows/s", c["ratios"][NOOP], 0.97),
            h.target(f"{b}: memwal / Spark parquet rows/s", c["ratios"][PARQUET], 1.0),
            h.target(f"{b}: memwal / parquet made durable rows/s", c["ratios"][PARQUET_SYNC], 1.0),
            h.target(f"{b}: no-op writer / Spark parquet rows/s", c["ratios"]["noop/parquet"])],
        [("", "rows_s", "rows/s")])
