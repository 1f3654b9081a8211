"""16 processes appending to one table without Spark, memwal vs Lance.

Each worker process (started once: imports untimed) runs, per round, what a Spark
append runs in-process (:func:`harness.inproc_append`: ``writer(schema, False)``,
``write()``, ``commit([msg])``, defaults) or ``lance.write_dataset(rows, mode="append")``,
all at once on a fresh table. Appends/s, p50/p99, CPU s per append, commit-record races
lost per append (``commit.LOST_RACES``), and one traced append's store calls and fsyncs.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from . import harness as h

NAME = "concurrency_no_spark"
PROCS, ROWS = 16, 5_000
MEMWAL, LANCE = "memwal (in-process Spark append path)", "Lance append (write_dataset)"


def _appends(kind: str, uri: str, n: int, first: int, barrier) -> dict[str, Any]:
    """In a pool process (its imports untimed): ``n`` appends once every process is ready."""
    import lance

    import memwal_datasource.log.commit as commit

    tables = [h.arrow_rows(first + i * ROWS, ROWS) for i in range(n)]
    lost0, lat = getattr(commit, "LOST_RACES", None), []
    barrier.wait()
    start, cpu = time.monotonic(), time.process_time()
    for t in tables:
        t0 = time.perf_counter()
        h.inproc_append(uri, t) if kind == MEMWAL else lance.write_dataset(t, uri, mode="append")
        lat.append((time.perf_counter() - t0) * 1e3)
    lost1 = getattr(commit, "LOST_RACES", None)
    return {"start": start, "end": time.monotonic(), "lat": lat, "cpu": time.process_time() - cpu,
            "lost": None if None in (lost0, lost1) else lost1 - lost0}


def run(ctx: h.Ctx) -> dict[str, Any]:
    import lance

    n, mp = ctx.pick(2, 10, 20), multiprocessing.get_context("spawn")

    def one_round(kind: str) -> dict[str, Any]:
        """A fresh table (created untimed), then every process's ``n`` appends at once (a
        process blocked at the barrier takes no second task: one task each)."""
        uri = str(ctx.scratch("conc") / "t.lance")
        h.inproc_append(uri, h.arrow_rows(0, ROWS)) if kind == MEMWAL else lance.write_dataset(
            h.arrow_rows(0, ROWS), uri)
        res = pool.starmap(_appends, [(kind, uri, n, (1 + i * n) * ROWS, barrier)
                                      for i in range(PROCS)], chunksize=1)
        lat, lost = [v for x in res for v in x["lat"]], [x["lost"] for x in res]
        out = {"appends_s": PROCS * n / (max(x["end"] for x in res)
                                         - min(x["start"] for x in res)),
               "p50_ms": h.pct(lat, 50), "p99_ms": h.pct(lat, 99),
               "cpu_s_per_append": sum(x["cpu"] for x in res) / (PROCS * n)}
        if kind == MEMWAL and None not in lost:
            out["lost_races_per_append"] = sum(lost) / (PROCS * n)
        return out

    with mp.Manager() as manager, mp.Pool(PROCS) as pool:
        barrier = manager.Barrier(PROCS, timeout=900)
        runs = h.alternate(ctx, {k: lambda r, k=k: one_round(k) for k in (MEMWAL, LANCE)})
    comp, io = h.stats(runs), h.io_per_append(str(ctx.scratch("traced") / "t.lance"))
    rt = {k: h.ratios(runs, MEMWAL, k, [LANCE])[LANCE] for k in ("appends_s", "p99_ms")}
    lost = comp[MEMWAL].get("lost_races_per_append")
    return {"title": f"{PROCS} processes x {n} appends x {ROWS:,} rows into one table, no Spark: "
                     "memwal's append path vs the Lance append",
            "config": {"processes": PROCS, "appends_per_process": n, "rows_per_append": ROWS},
            "competitors": comp, "ratios": rt, "io_per_append": io,
            "panels": [h.panel("appends/s", comp, "appends_s", "appends/s"),
                       h.panel("p99 per append", comp, "p99_ms", "ms")],
            "table": {"columns": ["competitor", "appends/s", "p50 ms", "p99 ms",
                                  "CPU s / append", "lost commit races / append"],
                      "rows": h.rows(comp, [("appends_s", "{:.1f}"), ("p50_ms", "{:.0f}"),
                                            ("p99_ms", "{:.0f}"), ("cpu_s_per_append", "{:.3f}"),
                                            ("lost_races_per_append", "{:.2f}")])},
            "targets": [h.target("memwal / Lance append appends/s", rt["appends_s"], 2.0),
                        h.target("memwal / Lance append p99 per append", rt["p99_ms"], 1.0,
                                 at_most=True),
                        {"what": "memwal's lost put-if-absent races on the commit record per "
                                 "append (goal <= 0.5)",
                         "met": None if lost is None else lost["median"] <= 0.5,
                         "value": h.cell(lost, "{:.2f}") if lost else "null (no LOST_RACES)"},
                        {"what": "store calls and fsyncs per in-process append (reported)",
                         "met": None, "value": ", ".join(f"{k} {v:.1f}" for k, v in
                                                         io["per_append"].items())}]}
