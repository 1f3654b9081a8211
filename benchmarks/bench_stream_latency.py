"""Issue 21: Structured Streaming micro-batch latency, memwal sink vs foreachBatch Lance append.

A ``rate-micro-batch`` source gives every micro-batch ``ROWS_PER_S`` x the trigger
interval rows (5,000 at 1 s, 2,500 at 0.5 s), so data arrives at the trigger rate.
(The plain ``rate`` source releases its rows in whole seconds: at a 0.5 s trigger
every other batch is empty and the others carry 5,000 rows.) Each competitor runs its
own query (fresh table, fresh checkpoint) until it has ``BATCHES`` non-empty batches
after ``SKIP`` warm-up batches; rounds alternate the competitors. Reported: the
``durationMs.addBatch`` of ``query.recentProgress`` (the sink's time per batch),
p50 and p99 per round and pooled.
"""

from __future__ import annotations

import time
from typing import Any

from .bench_spark import _session
from .common import (
    BenchContext,
    bars_figure,
    cell,
    paired,
    percentile,
    ratio_target,
    rm_tree,
    run_alternated,
    summarize,
)

ROWS_PER_S = 5_000
TRIGGERS = ("1 second", "500 milliseconds")
SKIP = 2  # first non-empty batches: worker start, table open
MEMWAL = "memwal sink (writeStream.format('memwal'))"
FOREACH = "foreachBatch: toArrow + lance.write_dataset(append)"
SUFFIX = "-abcdefghijklmnopqrstuvwxyz0123"


def _progress(p) -> tuple[int, float | None]:
    """(numInputRows, durationMs.addBatch) of a progress object or dict."""
    if isinstance(p, dict):
        return p.get("numInputRows", 0), (p.get("durationMs") or {}).get("addBatch")
    return p.numInputRows, (p.durationMs or {}).get("addBatch")


def _stream(spark, seconds: float):
    return (spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", int(ROWS_PER_S * seconds))
            .option("numPartitions", 1).load()
            .selectExpr("value as id", f"concat(cast(value as string), '{SUFFIX}') as payload",
                        "cast(value as double) * 0.001 as score"))


def _run_query(start, batches: int, timeout_s: float) -> dict[str, Any]:
    """Start a query, wait for SKIP + ``batches`` non-empty batches, stop it."""
    q = start()
    deadline = time.monotonic() + timeout_s
    prog: list[tuple[int, float | None]] = []
    full: list[tuple[int, float]] = []
    try:
        while time.monotonic() < deadline:
            prog = [_progress(p) for p in q.recentProgress]
            full = [(rows, ms) for rows, ms in prog if rows > 0 and ms is not None]
            if len(full) >= SKIP + batches:
                break
            if q.exception() is not None:
                raise RuntimeError(f"query failed: {q.exception()}")
            time.sleep(0.2)
    finally:
        q.stop()
    timed = [ms for _rows, ms in full[SKIP: SKIP + batches]]
    rows = sum(r for r, _ms in full[SKIP: SKIP + batches])
    if len(timed) < batches:
        raise RuntimeError(f"only {len(timed)} timed batches in {timeout_s:.0f} s")
    return {"p50_ms": percentile(timed, 50), "p99_ms": percentile(timed, 99),
            "max_ms": max(timed), "batches": len(timed), "add_batch_ms": timed,
            "rows_per_batch": rows / max(1, len(timed))}


def _case(ctx: BenchContext, spark, trigger: str, batches: int) -> dict[str, Any]:
    import lance

    seconds = float(trigger.split()[0]) * (0.001 if "milli" in trigger else 1.0)
    timeout = 120 + 3 * (SKIP + batches) * max(seconds, 1.0)
    tag = trigger.replace(" ", "")

    def memwal(r: int) -> dict[str, Any]:
        root = ctx.scratch(f"st_memwal_{tag}_{r + 1}")
        path = str(root / "t.lance")
        spark.range(0, 1).selectExpr("id", "'x' as payload", "0.0D as score").write.format(
            "memwal").mode("append").option("enable_memtable", "false").save(path)
        try:
            return _run_query(lambda: _stream(spark, seconds).writeStream.format("memwal")
                              .option("enable_memtable", "false")
                              .option("checkpointLocation", str(root / "ck"))
                              .trigger(processingTime=trigger).start(path),
                              batches if r >= 0 else 2, timeout)
        finally:
            rm_tree(root)

    def foreach(r: int) -> dict[str, Any]:
        root = ctx.scratch(f"st_lance_{tag}_{r + 1}")
        path = str(root / "t.lance")
        lance.write_dataset(spark.range(0, 1).selectExpr(
            "id", "'x' as payload", "0.0D as score").toArrow(), path)

        def append(df, batch_id: int) -> None:
            lance.write_dataset(df.toArrow(), path, mode="append")

        try:
            return _run_query(lambda: _stream(spark, seconds).writeStream.foreachBatch(append)
                              .option("checkpointLocation", str(root / "ck"))
                              .trigger(processingTime=trigger).start(),
                              batches if r >= 0 else 2, timeout)
        finally:
            rm_tree(root)

    runs = run_alternated(ctx, {MEMWAL: memwal, FOREACH: foreach}, label=f"{trigger}: ",
                          repeats=ROUNDS[ctx.scale])
    comp = {}
    for name, rs in runs.items():
        pooled = [v for x in rs for v in x["add_batch_ms"]]
        comp[name] = {"p50_ms": summarize([x["p50_ms"] for x in rs]),
                      "p99_ms": summarize([x["p99_ms"] for x in rs]),
                      "pooled_p50_ms": percentile(pooled, 50),
                      "pooled_p99_ms": percentile(pooled, 99),
                      "batches": len(pooled), "runs": rs}
    ratios = {k: paired([x[f"{k}_ms"] for x in runs[MEMWAL]], [x[f"{k}_ms"] for x in runs[FOREACH]])
              for k in ("p50", "p99")}
    return {"trigger": trigger, "competitors": comp, "ratios": ratios}


ROUNDS = {"quick": 1, "default": 2, "full": 3}


def bench_stream_latency(ctx: BenchContext) -> dict[str, Any]:
    per_round = ctx.pick(5, 15, 20)
    spark = _session()
    try:
        cases = [_case(ctx, spark, t, per_round) for t in TRIGGERS]
    finally:
        spark.stop()
    rows, targets = [], []
    for c in cases:
        for name, s in c["competitors"].items():
            rows.append([c["trigger"], name, f"{s['pooled_p50_ms']:.0f}",
                         f"{s['pooled_p99_ms']:.0f}", cell(s["p50_ms"], "{:.0f}"),
                         cell(s["p99_ms"], "{:.0f}"), str(s["batches"]),
                         f"{s['runs'][0]['rows_per_batch']:,.0f}"])
        pooled = {k: c["competitors"][MEMWAL][f"pooled_{k}_ms"]
                  / c["competitors"][FOREACH][f"pooled_{k}_ms"] for k in ("p50", "p99")}
        for k in ("p50", "p99"):
            t = ratio_target(f"trigger {c['trigger']}: memwal / foreachBatch Lance addBatch {k}",
                             c["ratios"][k], 1.0, at_most=True)
            t["value"] += f"; pooled over all batches {pooled[k]:.3g}"
            targets.append(t)
    return {
        "name": "stream_latency",
        "title": f"Streaming addBatch latency, {ROWS_PER_S:,} rows/s at the trigger rate: "
                 "memwal sink vs foreachBatch Lance append",
        "config": {"source": f"rate-micro-batch, rowsPerBatch={ROWS_PER_S} x trigger seconds, "
                             "numPartitions=1",
                   "triggers": list(TRIGGERS), "rounds": ROUNDS[ctx.scale],
                   "batches_per_round": per_round, "skipped_batches_per_round": SKIP,
                   "measure": "query.recentProgress durationMs.addBatch of non-empty batches",
                   "memwal": "writeStream.format('memwal'), enable_memtable=false, no primary "
                             "key, table created by an untimed batch write first",
                   "foreachBatch": "df.toArrow() on the driver + lance.write_dataset("
                                   "mode='append') into a table created first (no fsync)",
                   "spark": "local[2], one session, one query at a time"},
        "cases": cases,
        "table": {"columns": ["trigger", "sink", "pooled p50 ms", "pooled p99 ms",
                              "per-round p50 ms", "per-round p99 ms", "batches",
                              "rows/batch"], "rows": rows},
        "targets": targets,
    }


def plot_stream_latency(result: dict[str, Any], machine: dict[str, Any]) -> None:
    panels = []
    for c in result["cases"]:
        for k in ("p50", "p99"):
            panels.append((f"trigger {c['trigger']}: addBatch {k}",
                           {n.split(" (")[0].split(":")[0]: s[f"{k}_ms"]
                            for n, s in c["competitors"].items()}, "ms", 1.0))
    bars_figure(result, machine, panels)
