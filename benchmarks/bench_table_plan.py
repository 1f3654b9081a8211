"""What a new reader pays to plan as the commit log grows, with and without checkpoints.

``committed_tail()``, ``visible()`` and ``committed_txn()`` on fresh objects over N
one-range records: a living table (compacted, collected, then 10 more: goal flat in N),
one never compacted, one without checkpoints; local disk and S3; store calls counted.
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
            size = []
            ms = h.seconds(lambda: size.append(_op(op, uris[v], opts))) * 1e3
            expected = 0 if op == OPS[2] else 10 if v == "living table" else n
            assert size == [expected], f"{op} on {v}: {size}, expected {expected}"
            return {"ms": ms}
        return run

    comp = h.stats(h.alternate(ctx, {f"{op} on {v}": timed(op, v) for op in OPS for v in VARIANTS},
                               label=f"{where} N={n:,}: "))
    for name in comp:  # untimed: the calls that reach memwal's store
        op, v = name.split(" on ")
        with h.io_trace() as events:
            _op(op, uris[v], opts)
        comp[name]["requests"] = sum(o != "fsync" for o, _k, _ms in events)
    return {"label": f"{where}, N={n:,}", "where": where, "records": n, "competitors": comp}


def run(ctx: h.Ctx) -> dict[str, Any]:
    sizes = ctx.pick({"local": (10, 100, 300), "s3": (10, 100)},
                     {"local": (10, 1_000, 10_000), "s3": (10, 1_000)},
                     {"local": (10, 1_000, 10_000), "s3": (10, 1_000, 10_000)})
    cases = [_case(ctx, "local", str(ctx.scratch("plan")), {}, n) for n in sizes["local"]]
    with h.s3_bucket(ctx, "memwal-plan") as (server, skipped):
        if server is not None:
            cases += [_case(ctx, "s3", "s3://memwal-plan", server.storage_options(), n)
                      for n in sizes["s3"]]

    def goals(c: dict[str, Any], w: str) -> list[dict[str, Any]]:
        at = [x for x in cases if x["where"] == c["where"]]
        if c is not at[-1] or len(at) < 2:  # one set of goals per store, at its largest N
            return []
        return [h.target(f"{c['where']}, {name}: time at {c['records']:,} records / at "
                         f"{at[0]['records']:,}", h.paired(c["competitors"][name]["ms"]["values"],
                                                          at[0]["competitors"][name]["ms"]["values"]),
                         FLAT if "living" in name else None, at_most=True)
                for name in c["competitors"] if "without" not in name]

    return h.per_case(
        "Read-plan cost vs commit-log size, with and without checkpoints",
        {"records": sizes, "checkpoint_interval": 100, "s3_skipped": skipped}, cases, "case",
        [("ms", "ms", "{:.1f}"), ("requests", "requests", "{}")], goals, [("", "ms", "ms")])
