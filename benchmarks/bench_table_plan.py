"""What a new reader pays to plan as the commit log grows, with and without checkpoints.

``committed_tail()`` (a read plan), ``visible()`` and ``committed_txn()`` (a stream's
duplicate check) on fresh objects, over N one-range records: on a *living* table (the
records compacted and collected, then 10 more: the goal, flat in N), one never compacted
and one without checkpoints; local disk and S3. Store calls counted in an untimed pass.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from memwal_datasource import MemWalTable, compact
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, Txn
from memwal_datasource.maintenance.gc import collect
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.store import open_store

from . import harness as h

NAME = "table_plan"
VARIANTS = {"living table": 100, "with checkpoints": 100, "without": None}
OPS = ("committed_tail()", "visible()", "committed_txn()")
FLAT = 2.0  # the largest log may cost at most this many times the smallest


def _op(op: str, uri: str, opts: dict[str, str]) -> int:
    """One operation on fresh objects: the ranges it sees (1 if the txn is found)."""
    if op == OPS[0]:
        return len(MemWalTable(uri, opts).committed_tail())
    log = CommitLog(open_store(uri, opts))
    return len(log.visible()) if op == OPS[1] else int(log.committed_txn(Txn("x", 1)) is not None)


def _build(uri: str, opts: dict[str, str], n: int, interval: int | None, live: bool) -> None:
    h.create_table(uri, opts)
    store, shard, batch = open_store(uri, opts), str(uuid.uuid4()), h.arrow_rows(0, 10).to_batches()

    def commit(count: int) -> None:
        app = WalAppender.open(store, shard)  # a fresh claim (collection fences the old one)
        pos = [app.append(batch[0].schema, batch).position for _ in range(10)]
        log = CommitLog(store, checkpoint_interval=interval)
        for i in range(count):
            log.append(APPEND, [CommittedRange(shard, app.epoch, pos[i % 10], pos[i % 10],
                                               rows=10, bytes=580, task=i % 8, attempt=0)])

    commit(n)
    if live:
        compact(uri, opts, max_records_per_round=max(n, 1))
        table = MemWalTable(uri, opts)  # a clock an hour ahead: the retention has passed
        collect(table, retain_seconds=0, clock=lambda: table.store.now_ms() + 3_600_000)
        commit(10)


def _case(ctx: h.Ctx, where: str, root: str, opts: dict[str, str], n: int) -> dict[str, Any]:
    uris = {v: f"{root}/n{n}_{v.split()[0]}.lance" for v in VARIANTS}
    t = time.perf_counter()
    for v, interval in VARIANTS.items():
        _build(uris[v], opts, n, interval, live=v == "living table")
    ctx.log(f"  {where} N={n:,}: built in {time.perf_counter() - t:.1f} s")

    def timed(op: str, v: str):
        def run(r: int) -> dict[str, Any]:
            t = time.perf_counter()
            size = _op(op, uris[v], opts)
            expected = 0 if op == OPS[2] else 10 if v == "living table" else n
            assert size == expected, f"{op} on {v}: {size}, expected {expected}"
            return {"ms": (time.perf_counter() - t) * 1e3}
        return run

    comp = h.stats(h.alternate(ctx, {f"{op} on {v}": timed(op, v) for op in OPS for v in VARIANTS},
                           label=f"{where} N={n:,}: "))
    for name in comp:  # untimed: the calls that reach memwal's store
        op, v = name.split(" on ")
        with h.io_trace() as events:
            _op(op, uris[v], opts)
        comp[name]["requests"] = sum(o != "fsync" for o, _k, _ms in events)
    return {"where": where, "records": n, "competitors": comp}


def run(ctx: h.Ctx) -> dict[str, Any]:
    sizes = ctx.pick({"local": (10, 100, 300), "s3": (10, 100)},
                     {"local": (10, 1_000, 10_000), "s3": (10, 1_000)},
                     {"local": (10, 1_000, 10_000), "s3": (10, 1_000, 10_000)})
    cases = [_case(ctx, "local", str(ctx.scratch("plan")), {}, n) for n in sizes["local"]]
    with h.s3_bucket(ctx, "memwal-plan") as (server, skipped):
        if server is not None:
            cases += [_case(ctx, "s3", "s3://memwal-plan", server.storage_options(), n)
                      for n in sizes["s3"]]
    rows = [[*r, str(c["competitors"][r[2]]["requests"])] for c in cases for r in h.rows(
        c["competitors"], [("ms", "{:.1f}")], c["where"], f"{c['records']:,}")]
    targets = []
    for where in ("local", "s3"):
        bc = [c for c in cases if c["where"] == where]
        if len(bc) < 2:
            continue
        lo, hi = bc[0]["competitors"], bc[-1]["competitors"]
        targets += [h.target(f"{where}, {name}: time at {bc[-1]['records']:,} records / at "
                             f"{bc[0]['records']:,}",
                             h.paired(hi[name]["ms"]["values"], lo[name]["ms"]["values"]),
                             FLAT if "living" in name else None, at_most=True)
                    for name in lo if "without" not in name]
    return {"title": "Read-plan cost vs commit-log size, with and without checkpoints",
            "config": {"records": sizes, "checkpoint_interval": 100, "s3_skipped": skipped},
            "cases": cases, "targets": targets,
            "panels": [h.panel(f"{c['where']}, N={c['records']:,}", c["competitors"], "ms", "ms")
                       for c in cases],
            "table": {"columns": ["store", "records", "operation on table", "ms", "requests"],
                      "rows": rows}}

