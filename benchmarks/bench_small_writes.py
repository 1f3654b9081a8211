"""Concurrent Spark writers (4, and 16) x N appends x 5,000 rows, one job each.

memwal (kept writers; ``keep_writers=false``) vs ``lance.write_dataset(df.toArrow(),
mode="append")`` (on local disk also fsynced) vs the no-op Python sink vs ``durable_sink``;
local disk and S3, TCP and Unix sockets; 16 writers: local disk, TCP. rows/s, p50/p99, CPU
s by process, objects per append; one append's store calls and fsyncs, in-process.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memwal_datasource.store import open_store

from . import durable_sink
from . import harness as h

NAME = "small_writes"
WRITERS, MANY, ROWS, BUCKET = 4, 16, 5_000, "memwal-small"
MEMWAL, UNKEPT = "memwal (defaults)", "memwal (keep_writers=false)"
LANCE, LANCE_SYNC = "Lance append (toArrow + write_dataset)", "durable Lance append (+ fsync)"
NOOP = "no-op Python sink (ceiling)"
DURABLE = "durable Python sink (ceiling of a durable sink)"
DIRS = ("data", "_versions", "_transactions", "")
CPU = ("driver", "jvm", "python workers", "other")  # other: in practice the local S3 server


def case(ctx: h.Ctx, spark, n: int, storage: dict[str, str] | None, warm: int = 2,
         writers: int = WRITERS, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """One store's competitors (``only`` these), alternated: ``writers`` threads x ``n``
    appends (warm-up: ``warm``); all of them: with traced store calls."""
    import lance

    prefixed = {f"storage.{k}": v for k, v in (storage or {}).items()}  # as Spark takes them

    def sink(fmt: str, **opts: str):
        return lambda uri: lambda start: h.frame(spark, start, ROWS).write.format(fmt).mode(
            "append").options(**prefixed, **opts).save(uri)

    def lance_append(uri: str, durable: bool = False):
        def listing() -> set[str]:  # what Lance's local store leaves to the OS to sync
            dirs = [os.path.join(uri, d) for d in DIRS[:3]] if durable else []
            return {os.path.join(d, f) for d in dirs if os.path.isdir(d) for f in os.listdir(d)}

        def append(start: int) -> None:
            before = listing()
            lance.write_dataset(h.frame(spark, start, ROWS).toArrow(), uri, mode="append",
                                storage_options=storage)
            if durable:  # new files, then the names
                h.fsync_path(*sorted(listing() - before), *(os.path.join(uri, d) for d in DIRS))
        return append

    def competitor(make, count):
        def run(r: int) -> dict[str, Any]:
            uri = (f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/t.lance" if storage
                   else str(ctx.scratch("small") / "t.lance"))
            append, m, lat, gate = make(uri), n if r >= 0 else warm, [], threading.Barrier(writers)
            append(0)  # the table, untimed

            def writer(w: int) -> None:
                # A new JVM thread has no active session; Python sources are found through it.
                spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
                gate.wait()
                for i in range(m):
                    lat.append(h.seconds(lambda i=i: append((1 + w * m + i) * ROWS)) * 1e3)

            store, per = open_store(uri, storage or {}), writers * m
            objects = lambda: sum(1 for _ in store.list(""))  # noqa: E731
            before, cpu0, t0 = objects(), h.cpu_tree(), time.perf_counter()
            with ThreadPoolExecutor(writers) as pool:
                list(pool.map(writer, range(writers)))
            wall, cpu1, after = time.perf_counter() - t0, h.cpu_tree(), objects()
            assert (got := count(uri, storage)) in (None, (per + 1) * ROWS), f"{got} rows visible"
            return {"seconds": wall, "rows_s": per * ROWS / wall, "appends_s": per / wall,
                    "p50_ms": h.pct(lat, 50), "p99_ms": h.pct(lat, 99), "lat_ms": lat,
                    **{f"cpu_s_per_append {k}": (cpu1[k] - cpu0[k]) / per for k in CPU},
                    "objects_per_append": (after - before) / per}
        return run

    lance_rows = lambda u, s: lance.dataset(u, storage_options=s).count_rows()  # noqa: E731
    comps = {MEMWAL: competitor(sink("memwal"), h.committed_rows),  # count(uri, storage)
             UNKEPT: competitor(sink("memwal", keep_writers="false"), h.committed_rows),
             LANCE: competitor(lance_append, lance_rows),
             LANCE_SYNC: competitor(lambda u: lance_append(u, True), lance_rows),
             NOOP: competitor(sink("noop_arrow"), lambda u, s: None),
             DURABLE: competitor(sink(durable_sink.NAME), durable_sink.committed_rows)}
    comps = {k: v for k, v in comps.items() if k in (only or comps) and not (
        storage and k == LANCE_SYNC)}
    where = ("S3" if storage else "local disk") + (f", {writers} writers" if only else "")
    runs = h.alternate(ctx, comps, label=f"{where}: ")
    rt = {a: h.ratios(runs, a, "rows_s", [b for b in comps if b != a]) for a in comps}
    out = {"where": where, "writers": writers, "competitors": h.stats(runs), "ratios": rt,
           "rows_s": rt[MEMWAL], "p99": h.ratios(runs, MEMWAL, "p99_ms", [LANCE])[LANCE]}
    if only is None:
        traced = (f"s3://{BUCKET}/traced/t.lance" if storage else str(ctx.scratch("traced") / "t"))
        out["io"] = {k: h.io_per_append(traced + k, storage, **o)
                     for k, o in (("", {}), ("-unkept", {"keep_writers": "false"}))}
    return out


def run(ctx: h.Ctx) -> dict[str, Any]:
    # 16 writers: 10 appends each (with 5, ~3 s a round, a round ended before the Lance
    # append's commit retries, 1-4 s, showed).
    n, n_many, cases = ctx.pick(5, 50, 200), ctx.pick(1, 10, 20), []
    for socket, conf in h.WORKER_SOCKETS.items():  # every competitor in each session
        with h.spark_session(ctx, master=os.environ.get("MEMWAL_BENCH_MASTER", "local[2]"),
                             **{"spark.scheduler.mode": "FAIR", **conf}) as spark:
            # One JVM for the whole run: its first case warms the JIT up with two rounds'
            # appends (JVM CPU per append: 60-97 ms in repeat 1 without, 37-43 by 3).
            here = [case(ctx, spark, n, None, warm=2 * n if not cases else 2)]
            with h.s3_bucket(ctx, BUCKET) as (server, skipped):
                here += [case(ctx, spark, n, server.storage_options())] if server else []
            if not cases:  # the same warm-up: two rounds' appends
                here.append(case(ctx, spark, n_many, None, warm=2 * n_many, writers=MANY,
                                 only=(MEMWAL, LANCE, NOOP, DURABLE)))
        cases += [{**c, "label": f"{c['where']}, {socket}"} for c in here]

    def goals(c: dict[str, Any], w: str) -> list[dict[str, Any]]:
        rt, io = c["ratios"], c.get("io")
        out = [h.target(f"{w}: memwal / Lance append rows/s", rt[MEMWAL][LANCE], 1.0),
               h.target(f"{w}: memwal / Lance append p99 per append", c["p99"],
                        1.0 if c["writers"] == MANY else 1.2, at_most=True),
               *(h.target(f"{w}: {k} / Lance append rows/s", rt[k][LANCE])
                 for k in (NOOP, DURABLE)),
               h.target(f"{w}: durable / no-op Python sink rows/s", rt[DURABLE][NOOP])]
        return out if io is None else [
            *out, h.target(f"{w}: memwal / no-op Python sink rows/s", rt[MEMWAL][NOOP], 0.9),
            *([h.target(f"{w}: memwal / durable Lance append rows/s", rt[MEMWAL][LANCE_SYNC], 1.0)]
              if LANCE_SYNC in rt else []),
            h.target(f"{w}: memwal keep_writers=false / Lance append rows/s", rt[UNKEPT][LANCE]),
            h.target(f"{w}: memwal objects written per append",
                     c["competitors"][MEMWAL]["objects_per_append"], 3, at_most=True),
            {"what": f"{w}: store calls and fsyncs per in-process append (reported)", "met": None,
             "value": f"defaults: {io['']['line']}; keep_writers=false: {io['-unkept']['line']}"}]

    return h.per_case(
        f"{WRITERS} (and {MANY}) concurrent Spark writers x {n} ({n_many}) appends x {ROWS:,} "
        "rows: memwal vs the plain Lance append",
        {"writers": WRITERS, "appends_per_writer": n, "many_writers": MANY,
         "appends_per_many_writer": n_many, "rows_per_append": ROWS, "s3_skipped": skipped,
         "options": "defaults (no primary key: WAL-only)"},
        cases, "where", [("rows/s", "rows_s", "{:,.0f}"), ("p50 ms", "p50_ms", "{:.0f}"),
                         ("p99 ms", "p99_ms", "{:.0f}"),
                         *((f"{k} CPU s/append", f"cpu_s_per_append {k}", "{:.3f}")
                           for k in CPU),
                         ("objects/append", "objects_per_append", "{:.2f}")],
        goals, [("rows/s", "rows_s", "rows/s"), ("p99 per append", "p99_ms", "ms")],
        {"memwal / it": "rows_s"})
