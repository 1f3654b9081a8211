"""One writer's small appends on S3 with every request delayed 0, 10 and 25 ms.

A cloud store answers in 10-30 ms, so an append's latency is its round trips. Through
``tests/fault_proxy.py``, one writer appends 5,000 rows at a time in-process
(:func:`harness.inproc_append`, its writer kept) vs the Lance append vs ``keep_writers=false``
(each append claims its shard, as a worker's first does), alternated append by append: p50/p99,
requests and sequential round trips (requests in flight together count once) per append.
"""

from __future__ import annotations

import time
from typing import Any

from . import harness as h

NAME = "store_latency"
ROWS, BUCKET = 5_000, "memwal-latency"
MEMWAL, LANCE = "memwal (defaults, in-process)", "Lance append (write_dataset)"
UNKEPT = "memwal (keep_writers=false: every append claims anew)"


def _delay_case(ctx: h.Ctx, server, delay_ms: int, n: int) -> dict[str, Any]:
    import lance

    from tests.fault_proxy import FaultProxy

    with FaultProxy(server.endpoint) as proxy:
        if delay_ms:
            proxy.add_rule(fault="delay", delay_s=delay_ms / 1e3)
        storage = {**server.storage_options(), "aws_endpoint": proxy.endpoint}
        root = f"s3://{BUCKET}/d{delay_ms}-{time.monotonic_ns()}"
        uris = {k: f"{root}/{i}/t.lance" for i, k in enumerate((MEMWAL, LANCE, UNKEPT))}
        comps = {MEMWAL: lambda s: h.inproc_append(uris[MEMWAL], h.arrow_rows(s, ROWS), storage),
                 LANCE: lambda s: lance.write_dataset(h.arrow_rows(s, ROWS), uris[LANCE],
                                                      mode="append", storage_options=storage),
                 UNKEPT: lambda s: h.inproc_append(uris[UNKEPT], h.arrow_rows(s, ROWS), storage,
                                                   keep_writers="false")}
        for fn, s in ((fn, s) for fn in comps.values() for s in (0, ROWS)):
            fn(s)  # the table and a warm writer, untimed
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in comps}
        for r in range(ctx.repeats):  # alternated append by append, the order rotated by r
            order, samples = list(comps)[r % 3:] + list(comps)[:r % 3], {k: [] for k in comps}
            for i in range(n):
                for name in order:
                    proxy.clear_records()
                    ms = h.seconds(lambda f=comps[name], s=(2 + r * n + i) * ROWS: f(s)) * 1e3
                    samples[name].append({"ms": ms, "requests": len(proxy.records()),
                                          "round_trips": proxy.round_trips()})
            for name, ss in samples.items():
                runs[name].append({"p50_ms": h.pct([s["ms"] for s in ss], 50),
                                   "p99_ms": h.pct([s["ms"] for s in ss], 99),
                                   **{f"{k}_per_append": sum(s[k] for s in ss) / n
                                      for k in ("requests", "round_trips")}})
        for name in (MEMWAL, UNKEPT):
            assert h.committed_rows(uris[name], storage) == (2 + ctx.repeats * n) * ROWS
        ctx.log(f"  delay {delay_ms} ms: " + ", ".join(
            f"{k}: p50 {h.cell(h.summarize([x['p50_ms'] for x in v]), '{:.0f}')} ms"
            for k, v in runs.items()))
    return {"label": f"{delay_ms} ms per request", "competitors": h.stats(runs),
            "delay_ms": delay_ms, "p50": h.ratios(runs, MEMWAL, "p50_ms", [LANCE])[LANCE],
            "p99": h.ratios(runs, MEMWAL, "p99_ms", [LANCE])[LANCE],
            "unkept_p50": h.ratios(runs, UNKEPT, "p50_ms", [LANCE])[LANCE]}


def run(ctx: h.Ctx) -> dict[str, Any]:
    n = ctx.pick(5, 30)
    with h.s3_bucket(ctx, BUCKET) as (server, skipped):
        if server is None:
            raise RuntimeError(skipped)
        cases = [_delay_case(ctx, server, delay, n) for delay in (0, 10, 25)]

    def goals(c: dict[str, Any], w: str) -> list[dict[str, Any]]:
        return [h.target(f"{w}: memwal / Lance append p50 per append", c["p50"],
                         0.8 if c["delay_ms"] else 1.0, at_most=True),
                h.target(f"{w}: memwal / Lance append p99 per append", c["p99"]),
                h.target(f"{w}: memwal keep_writers=false / Lance append p50", c["unkept_p50"]),
                h.target(f"{w}: memwal requests per append",
                         c["competitors"][MEMWAL]["requests_per_append"], 10, at_most=True),
                *(h.target(f"{w}: {name} sequential round trips per append",
                           s["round_trips_per_append"], 5 if name == MEMWAL else None,
                           at_most=True) for name, s in c["competitors"].items())]

    return h.per_case(
        f"One writer, {n} x {ROWS:,}-row appends per repeat through a proxy that delays every "
        "request: memwal vs the plain Lance append",
        {"rows_per_append": ROWS, "appends_per_repeat": n, "delays_ms": [0, 10, 25]}, cases,
        "delay", [("p50 ms", "p50_ms", "{:.0f}"), ("p99 ms", "p99_ms", "{:.0f}"),
                  ("requests/append", "requests_per_append", "{:.1f}"),
                  ("round trips/append", "round_trips_per_append", "{:.1f}")],
        goals, [("p50 per append", "p50_ms", "ms")])
