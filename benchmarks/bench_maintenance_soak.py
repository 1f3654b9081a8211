"""A stream soaking a primary-key table, automatic maintenance on vs off.

A 1 s trigger upserts 5,000-row micro-batches (ids cycle over 50k keys: only the
uncompacted tail can grow) for 20 minutes (2 with ``--quick``), ``auto_maintain`` on (gc
retention 30 s) vs ``false``, alternated. Every ~10 s: pending commit records, WAL
objects, a ``view=table`` read of the whole table; ``addBatch`` of every micro-batch.
"""

from __future__ import annotations

import time
from typing import Any

from memwal_datasource import MemWalTable

from . import harness as h

NAME = "maintenance_soak"
ROWS, KEYS, EVERY_S = 5_000, 50_000, 10.0
ON, OFF = "memwal, auto_maintain on (default)", "memwal, auto_maintain=false"
OPTIONS = {ON: {"maintain_gc_retain_s": "30"}, OFF: {"auto_maintain": "false"}}


def _soak(ctx: h.Ctx, spark, name: str, seconds: float) -> dict[str, Any]:
    # A new path per run: a worker's maintainer of a deleted path keeps that table's view.
    root = ctx.scratch(f"soak-{time.monotonic_ns()}")
    uri, ck, samples, batches = str(root / "t.lance"), str(root / "ck"), [], {}
    h.create_table(uri)  # primary key id, untimed
    q = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS)
         .option("numPartitions", 1).load().selectExpr(*h.columns(f"value % {KEYS}"))
         .writeStream.format("memwal").options(**OPTIONS[name])
         .option("checkpointLocation", ck).trigger(processingTime="1 second").start(uri))
    t0 = time.monotonic()
    try:
        while not samples or samples[-1][0] < seconds:
            time.sleep(max(0.0, t0 + len(samples) * EVERY_S - time.monotonic()))
            if q.exception() is not None or not q.isActive:
                raise RuntimeError(f"query stopped: {q.exception()}")
            batches.update({p.batchId: p.durationMs["addBatch"] for p in q.recentProgress
                            if p.numInputRows > 0 and "addBatch" in (p.durationMs or {})})
            b = MemWalTable(uri).stats()
            read_s = h.seconds(lambda: spark.read.format("memwal").option("view", "table").load(
                uri).write.format("noop").mode("overwrite").save())
            samples.append((time.monotonic() - t0, b.pending_records, b.wal_objects, read_s))
    finally:
        q.stop()
    window = min(300.0, seconds / 4)  # the first and the last 5 minutes (quick: quarters)
    first = [s for s in samples if s[0] <= window] or samples[:1]
    last = [s[3] for s in samples if s[0] >= samples[-1][0] - window]
    add = [ms for _b, ms in sorted(batches.items())][2:]  # the query's first two: warm-up
    return {"p50_ms": h.pct(add, 50), "p99_ms": h.pct(add, 99), "batches": len(add),
            "max_pending": max(s[1] for s in samples), "wal_first": first[-1][2],
            "wal_last": samples[-1][2],
            "read_last_first": h.pct(last, 50) / h.pct([s[3] for s in first], 50),
            "samples": samples}


def run(ctx: h.Ctx) -> dict[str, Any]:
    seconds = ctx.pick(120.0, 1200.0)
    with h.spark_session(ctx) as spark:
        runs = h.alternate(ctx, {n: lambda r, n=n: _soak(ctx, spark, n, seconds if r >= 0 else 20)
                                 for n in (ON, OFF)})
    comp = h.stats(runs)
    rt = {k: h.ratios(runs, ON, k, [OFF]) for k in ("p50_ms", "p99_ms")}
    series = {f"{n}, repeat {r + 1}": x["samples"] for n, rs in runs.items()
              for r, x in enumerate(rs)}
    out = h.local_case(
        f"A {seconds / 60:.0f}-minute stream of {ROWS:,}-row micro-batches at a 1 s trigger "
        "into a primary-key table: automatic maintenance on vs off",
        {"seconds": seconds, "rows_per_batch": ROWS, "keys": KEYS, "sample_every_s": EVERY_S,
         "options": OPTIONS, "thresholds": "defaults (64 pending records, 64 MB, 300 s)"}, comp,
        [("addBatch p50 ms", "p50_ms", "{:.0f}"), ("addBatch p99 ms", "p99_ms", "{:.0f}"),
         ("max pending records", "max_pending", "{:.0f}"),
         ("WAL objects first", "wal_first", "{:.0f}"), ("WAL objects last", "wal_last", "{:.0f}"),
         ("view=table read last / first", "read_last_first", "{:.2f}")],
        [h.target("maintenance on: most pending commit records (threshold 64)",
                  comp[ON]["max_pending"]),
         h.target("maintenance on: WAL objects last / at the first window's end", h.paired(
             [x["wal_last"] for x in runs[ON]], [max(x["wal_first"], 1) for x in runs[ON]])),
         h.target("maintenance on: view=table read, last / first window", comp[ON][
             "read_last_first"], 1.2, at_most=True),
         *(h.target(f"on / off addBatch {k[:3]}", rt[k][OFF], 1.1, at_most=True) for k in rt)],
        [("addBatch p50", "p50_ms", "ms"), ("addBatch p99", "p99_ms", "ms")],
        {f"on / it {k[:3]}": v for k, v in rt.items()}, competitors=comp, series=series)
    out["panels"].append(["pending commit records over time", series, "s"])
    return out
