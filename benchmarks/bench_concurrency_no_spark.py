"""16 processes appending to one table without Spark, memwal vs Lance.

Each process (imports untimed) runs at once, per round on a fresh table, what a Spark
append runs (:func:`harness.inproc_append`) or ``lance.write_dataset(mode="append")``:
appends/s, p50/p99, CPU s, lost commit races and memwal's store requests per append.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import lance  # a pool process imports it with this module, before the timed appends

from memwal_datasource.log import commit

from . import harness as h

NAME = "concurrency_no_spark"
PROCS, ROWS = 16, 5_000
MEMWAL, LANCE = "memwal (in-process Spark append path)", "Lance append (write_dataset)"


def _append(kind: str, uri: str, rows) -> None:
    h.inproc_append(uri, rows) if kind == MEMWAL else lance.write_dataset(rows, uri, mode="append")


def _appends(kind: str, uri: str, n: int, first: int, barrier) -> dict[str, Any]:
    """In a pool process (its imports untimed): ``n`` appends once every process is ready."""
    tables = [h.arrow_rows(first + i * ROWS, ROWS) for i in range(n)]
    lost0 = commit.LOST_RACES
    barrier.wait()
    start, cpu = time.monotonic(), time.process_time()
    with h.io_trace() as events:  # memwal's store calls (the Lance append makes none)
        lat = [1e3 * h.seconds(lambda t=t: _append(kind, uri, t)) for t in tables]
    return {"start": start, "end": time.monotonic(), "lat": lat, "cpu": time.process_time() - cpu,
            "lost": commit.LOST_RACES - lost0, "requests": sum("sync" not in e for e in events)}


def run(ctx: h.Ctx) -> dict[str, Any]:
    n, mp = ctx.pick(2, 10, 20), multiprocessing.get_context("spawn")

    def one_round(kind: str) -> dict[str, Any]:
        """A fresh table (created untimed), then every process's ``n`` appends at once (a
        process blocked at the barrier takes no second task: one task each)."""
        _append(kind, uri := str(ctx.scratch("conc") / "t.lance"), h.arrow_rows(0, ROWS))
        res = pool.starmap(_appends, [(kind, uri, n, (1 + i * n) * ROWS, barrier)
                                      for i in range(PROCS)], chunksize=1)
        lat, per = [v for x in res for v in x["lat"]], {k: sum(x[k] for x in res) / (PROCS * n)
                                                        for k in ("cpu", "lost", "requests")}
        wall = max(x["end"] for x in res) - min(x["start"] for x in res)
        ours = {"lost_races_per_append": per["lost"], "requests_per_append": per["requests"]}
        return {"appends_s": PROCS * n / wall, "p50_ms": h.pct(lat, 50), "p99_ms": h.pct(lat, 99),
                "cpu_s_per_append": per["cpu"], **(ours if kind == MEMWAL else {})}

    with mp.Manager() as manager, mp.Pool(PROCS) as pool:
        barrier = manager.Barrier(PROCS, timeout=900)
        runs = h.alternate(ctx, {k: lambda r, k=k: one_round(k) for k in (MEMWAL, LANCE)})
    comp = h.stats(runs)
    rt = {k: h.ratios(runs, MEMWAL, k, [LANCE])[LANCE] for k in ("appends_s", "p99_ms")}
    return h.local_case(
        f"{PROCS} processes x {n} appends x {ROWS:,} rows into one table, no Spark: memwal's "
        "append path vs the Lance append",
        {"processes": PROCS, "appends_per_process": n, "rows_per_append": ROWS}, comp,
        [("appends/s", "appends_s", "{:.1f}"), ("p50 ms", "p50_ms", "{:.0f}"),
         ("p99 ms", "p99_ms", "{:.0f}"), ("CPU s / append", "cpu_s_per_append", "{:.3f}"),
         ("lost commit races / append", "lost_races_per_append", "{:.2f}"),
         ("store requests / append", "requests_per_append", "{:.1f}")],
        [h.target("memwal / Lance append appends/s", rt["appends_s"], 2.0),
         h.target("memwal / Lance append p99 per append", rt["p99_ms"], 1.0, at_most=True),
         h.target("memwal's lost put-if-absent races on the commit record per append",
                  comp[MEMWAL]["lost_races_per_append"], 0.5, at_most=True)],
        [("appends/s", "appends_s", "appends/s"), ("p99 per append", "p99_ms", "ms")],
        competitors=comp, ratios=rt)
