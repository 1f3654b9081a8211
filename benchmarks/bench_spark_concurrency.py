"""16 concurrent appending jobs in one SparkSession, memwal vs the Lance append.

``small_writes`` at 16 writers, local disk, Spark's TCP sockets: 16 threads (each first
sets the session active on its JVM thread) run N appends of 5,000 rows, a job each:
``format("memwal")`` (defaults) vs ``lance.write_dataset(df.toArrow(), mode="append")``
vs a no-op Python sink (``noop_arrow``: what Spark's Python data source path costs with
nothing written) vs the durable Python sink of ``durable_sink`` (one durable object per
task and one per job, nothing else). Appends/s, p99, CPU s per append of the driver, the
JVM and the Python workers, and memwal's ratio to each.
"""

from __future__ import annotations

from typing import Any

from . import harness as h
from .bench_small_writes import DURABLE, LANCE, MEMWAL, NOOP, case

NAME = "spark_concurrency"
THREADS, ROWS = 16, 5_000
KINDS = ("driver", "jvm", "python workers")


def run(ctx: h.Ctx) -> dict[str, Any]:
    # 10 appends per job: with 5 (80 appends a round, ~3 s) a round ended before the
    # competitors' tails showed (the Lance append's commit retries: 1-4 s, a few a round).
    n = ctx.pick(1, 10, 20)
    with h.spark_session(ctx, **{"spark.scheduler.mode": "FAIR"}) as spark:
        # Two rounds' appends of every competitor untimed first: run first in a fresh JVM,
        # the job paths' JIT warm-up otherwise lands in the timed rounds (JVM CPU per
        # append 0.07-0.10 s in the first rounds, 0.05 s later).
        _case, runs = case(ctx, spark, n, None, warm=2 * n, writers=THREADS,
                           only=(MEMWAL, LANCE, NOOP, DURABLE))
    comp = h.stats(runs)
    rt = {k: h.ratios(runs, MEMWAL, k, [LANCE])[LANCE] for k in ("appends_s", "p99_ms")}
    vs = h.ratios(runs, MEMWAL, "appends_s", [LANCE, NOOP, DURABLE])
    durable = h.ratios(runs, DURABLE, "appends_s", [NOOP, LANCE])
    cpu = [f"cpu_s_per_append {k}" for k in KINDS]
    return {"title": f"{THREADS} concurrent appending jobs x {n} x {ROWS:,} rows in one "
                     "SparkSession: memwal vs the Lance append",
            "config": {"threads": THREADS, "appends_per_thread": n, "rows_per_append": ROWS},
            "competitors": comp, "ratios": rt,
            "panels": [h.panel("appends/s", comp, "appends_s", "appends/s"),
                       h.panel("p99 per append", comp, "p99_ms", "ms"),
                       *(h.panel(f"CPU s per append: {c[17:]}", comp, c, "CPU s") for c in cpu)],
            "table": {"columns": ["competitor", "appends/s", "p50 ms", "p99 ms",
                                  *(f"CPU s/append {k}" for k in KINDS), "objects/append",
                                  "memwal / it"],
                      "rows": h.rows(comp, [("appends_s", "{:.1f}"), ("p50_ms", "{:.0f}"),
                                            ("p99_ms", "{:.0f}"), *((c, "{:.3f}") for c in cpu),
                                            ("objects_per_append", "{:.2f}")], vs=vs)},
            "targets": [h.target("memwal / Lance append appends/s", rt["appends_s"], 1.0),
                        h.target("memwal / Lance append p99 per append", rt["p99_ms"], 1.0,
                                 at_most=True),
                        h.target("no-op Python sink / Lance append appends/s (the ceiling of "
                                 "any Python sink)", h.ratios(runs, NOOP, "appends_s", [LANCE])[
                                     LANCE]),
                        *(h.target(f"durable Python sink / {k} appends/s", durable[o])
                          for o, k in ((LANCE, "Lance append (the ceiling of any durable "
                                                "Python sink)"), (NOOP, "no-op Python sink")))]}
