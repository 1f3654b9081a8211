"""The S3 server's CPU per request kind, through memwal's store (SeaweedFS ``weed mini``).

In the benchmarks' S3 cases the server runs on the same 2 cores as Spark, so each
request a writer sends costs the run the server's CPU too. Per request kind a small
append makes (a 300-byte and a 400 KB conditional PUT, a GET, a HEAD of an absent key,
a LIST of a 10-key and of an empty directory): the server process tree's CPU and this
client's, per call, with the kinds alternated. ``small_writes`` reports the server's CPU
per append (``cpu_s_per_append other``); this says which requests it is made of.
"""

from __future__ import annotations

import time
from typing import Any

from memwal_datasource.store import open_store

from . import harness as h

NAME = "s3_server_cpu"
BUCKET = "memwal-server-cpu"
SMALL, ENTRY = 300, 400_000  # a lease or commit record; a 5,000-row WAL entry


def run(ctx: h.Ctx) -> dict[str, Any]:
    calls = ctx.pick(50, 300)
    with h.s3_bucket(ctx, BUCKET) as (server, skipped):
        if server is None:
            return {"title": "S3 server CPU per request", "skipped": skipped, "targets": []}
        store = open_store(f"s3://{BUCKET}/t", server.storage_options())
        for i in range(10):
            store.put_if_absent(f"ten/k{i}", b"x" * SMALL)
        entry = b"y" * ENTRY
        kinds = {
            "conditional PUT, 300 B": lambda r, i: store.put_if_absent(f"s/{r}/{i}", b"x" * SMALL),
            "conditional PUT, 400 KB": lambda r, i: store.put_if_absent(f"e/{r}/{i}", entry),
            "GET, 300 B": lambda r, i: store.get("ten/k1"),
            "HEAD, absent": lambda r, i: store.exists(f"none/{r}/{i}"),
            "LIST, 10 keys": lambda r, i: list(store.list("ten/")),
            "LIST, empty": lambda r, i: list(store.list("empty/")),
        }

        def competitor(call):
            def run(r: int) -> dict[str, Any]:
                # The server: what this process's tree holds besides itself and Python.
                s0, c0, t0 = h.cpu_tree()["other"], time.process_time(), time.perf_counter()
                for i in range(calls):
                    call(r, i)
                return {"server_ms": (h.cpu_tree()["other"] - s0) / calls * 1e3,
                        "client_ms": (time.process_time() - c0) / calls * 1e3,
                        "wall_ms": (time.perf_counter() - t0) / calls * 1e3}
            return run

        runs = h.alternate(ctx, {k: competitor(c) for k, c in kinds.items()})
    comp = h.stats(runs)
    return {"title": "S3 server (SeaweedFS) CPU per request kind, through memwal's store",
            "config": {"calls_per_repeat": calls, "server": "weed mini on 127.0.0.1",
                       "cpu": "psutil, the server's process tree; the client's process_time"},
            "competitors": comp,
            "targets": [h.target(f"server CPU ms per call: {k}", comp[k]["server_ms"])
                        for k in kinds],
            "panels": [h.panel("server CPU per call", comp, "server_ms", "ms"),
                       h.panel("client CPU per call", comp, "client_ms", "ms")],
            "table": {"columns": ["request", "server CPU ms", "client CPU ms", "wall ms"],
                      "rows": h.rows(comp, [("server_ms", "{:.2f}"), ("client_ms", "{:.2f}"),
                                            ("wall_ms", "{:.2f}")])}}
