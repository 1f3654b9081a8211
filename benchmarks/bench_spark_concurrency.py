"""16 concurrent appending jobs in one SparkSession, memwal vs the Lance append.

``small_writes`` at 16 writers, local disk, TCP: 16 threads run N 5,000-row appends, a job
each: ``format("memwal")`` vs ``lance.write_dataset(df.toArrow())`` vs the no-op and the
durable Python sinks (``durable_sink``). Appends/s, p99, CPU s per append by process.
"""

from __future__ import annotations

from typing import Any

from . import harness as h
from .bench_small_writes import DURABLE, LANCE, MEMWAL, NOOP, case

NAME = "spark_concurrency"
THREADS, ROWS = 16, 5_000
CPU = [f"cpu_s_per_append {k}" for k in ("driver", "jvm", "python workers")]


def run(ctx: h.Ctx) -> dict[str, Any]:
    # 10 appends per job: with 5 (~3 s a round) a round ended before the Lance append's
    # commit retries (1-4 s) showed.
    n = ctx.pick(1, 10, 20)
    with h.spark_session(ctx, **{"spark.scheduler.mode": "FAIR"}) as spark:
        # Two rounds' appends untimed first: a fresh JVM's JIT warm-up (JVM CPU per append
        # 0.07-0.10 s in the first rounds, 0.05 s later) stays out of the timed rounds.
        _case, runs = case(ctx, spark, n, None, warm=2 * n, writers=THREADS,
                           only=(MEMWAL, LANCE, NOOP, DURABLE))
    comp = h.stats(runs)
    rt = {k: h.ratios(runs, MEMWAL, k, [LANCE])[LANCE] for k in ("appends_s", "p99_ms")}
    durable = h.ratios(runs, DURABLE, "appends_s", [NOOP, LANCE])
    return h.per_case(
        f"{THREADS} concurrent appending jobs x {n} x {ROWS:,} rows in one SparkSession: "
        "memwal vs the Lance append",
        {"threads": THREADS, "appends_per_thread": n, "rows_per_append": ROWS},
        [{"label": "local disk, tcp", "competitors": comp,
          "vs": h.ratios(runs, MEMWAL, "appends_s", [LANCE, NOOP, DURABLE])}], "case",
        [("appends/s", "appends_s", "{:.1f}"), ("p50 ms", "p50_ms", "{:.0f}"),
         ("p99 ms", "p99_ms", "{:.0f}"), *((f"CPU s/append {c[17:]}", c, "{:.3f}") for c in CPU),
         ("objects/append", "objects_per_append", "{:.2f}")],
        lambda c, w: [
            h.target("memwal / Lance append appends/s", rt["appends_s"], 1.0),
            h.target("memwal / Lance append p99 per append", rt["p99_ms"], 1.0, at_most=True),
            h.target("no-op Python sink / Lance append appends/s (the ceiling of any Python "
                     "sink)", h.ratios(runs, NOOP, "appends_s", [LANCE])[LANCE]),
            h.target("durable Python sink / Lance append (the ceiling of any durable Python "
                     "sink) appends/s", durable[LANCE]),
            h.target("durable Python sink / no-op Python sink appends/s", durable[NOOP])],
        [("appends/s", "appends_s", "appends/s"), ("p99 per append", "p99_ms", "ms"),
         *((f"CPU s per append: {c[17:]}", c, "CPU s") for c in CPU)],
        {"memwal / it": "vs"}, competitors=comp, ratios=rt)
