"""Peak RSS of the Python worker writing one big Spark task with default options.

``spark.python.worker.reuse=false`` (a fresh worker per task, so each run's peak is
its own); the RSS of every Python process below this one that the run started is
sampled every 20 ms. memwal (WAL-only, defaults) vs the no-op Python sink. Goal: the
memwal worker's peak <= 2 x max_wal_buffer_size (10 MiB) + 300 MB.
"""

from __future__ import annotations

from typing import Any

from . import harness as h

NAME = "worker_rss"
WAL = "memwal (WAL-only, Spark defaults)"
NOOP = "no-op DataSourceArrowWriter"
LIMIT = 2 * 10 * h.MiB + 300 * h.MB


def run(ctx: h.Ctx) -> dict[str, Any]:
    total = ctx.pick(64 * h.MB, 512 * h.MB, 2_000 * h.MB)
    rows = total // 58
    spark = h.spark_session(ctx, **{"spark.python.worker.reuse": "false"})
    try:
        df = h.frame(spark, 0, rows, parts=1)

        def sampled(write):
            def run(r: int) -> dict[str, Any]:
                path = str(ctx.scratch("rss") / "t.lance")
                with h.RssSampler() as s:
                    write(path)
                return {"peak_rss_mb": s.peak / h.MB}
            return run

        runs = h.alternate(ctx, {
            WAL: sampled(lambda p: df.write.format("memwal").mode("append").save(p)),
            NOOP: sampled(lambda p: df.write.format("noop_arrow").mode("append").save())})
    finally:
        spark.stop()
    comp, rt = h.stats(runs), h.ratios(runs, WAL, "peak_rss_mb", [NOOP])
    return {"title": f"Peak RSS of the Python worker writing {total / h.MB:,.0f} MB in one task",
            "config": {"bytes": total, "limit_mb": LIMIT / h.MB, "sampled": "every 20 ms (psutil)"},
            "competitors": comp,
            "panels": [h.panel("peak worker RSS", comp, "peak_rss_mb", "MB")],
            "table": {"columns": ["writer", "peak RSS MB"],
                      "rows": h.rows(comp, [("peak_rss_mb", "{:.0f}")])},
            "targets": [h.target("memwal worker peak RSS MB", comp[WAL]["peak_rss_mb"],
                               round(LIMIT / h.MB), at_most=True),
                        h.target("memwal / no-op worker peak RSS", rt[NOOP])]}
