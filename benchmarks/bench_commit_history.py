"""Commit cost and a new reader's plan cost as the commit log's history grows, no Spark.

Histories of N one-position records (``CommitLog.append``, a checkpoint every 100, a
compaction round and a gc every 1,000), built on local disk, their live objects copied to
S3. On each store: ms and store calls of K appends, and of a cold ``committed_tail()``,
``visible()`` and ``committed_txn()`` on fresh objects (also on a log never compacted and
one without checkpoints). Goal: flat in N (appends <= 1.2x, a new reader <= 2x).
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memwal_datasource import MemWalTable
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, Txn
from memwal_datasource.log.commit_reader import forget_folds
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.store import open_store

from . import harness as h

NAME = "commit_history"
K, GC_EVERY, FLAT, READ_FLAT, BUCKET = 50, 1_000, 1.2, 2.0, "memwal-history"
OPS = ("committed_tail()", "visible()", "committed_txn()")
VARIANTS = ("never compacted", "without checkpoints")


def _claim(store, shard: str) -> tuple[str, int, list[int]]:
    """A fresh claim of ``shard`` (gc fences the last) and its 10 WAL entries' positions."""
    app, batches = WalAppender.open(store, shard), h.arrow_rows(0, 10).to_batches()
    return shard, app.epoch, [app.append(h.SCHEMA, batches).position for _ in range(10)]


def _commit(log: CommitLog, at: tuple[str, int, list[int]], count: int) -> None:
    shard, epoch, pos = at
    for i in range(count):
        log.append(APPEND, [CommittedRange(shard, epoch, pos[i % 10], pos[i % 10], rows=10,
                                           bytes=580, task=0, attempt=0)], group=False)


def _build(uri: str, n: int, variant: str = "") -> tuple[str, int, list[int]]:
    """``n`` records (maintained unless a variant), then 10 more; where more commit."""
    h.create_table(uri)
    store, shard, step = open_store(uri), str(uuid.uuid4()), n if variant else GC_EVERY
    log = CommitLog(store, checkpoint_interval=None if variant == VARIANTS[1] else 100)
    for done in range(0, n, step):
        _commit(log, _claim(store, shard), min(step, n - done))
        if not variant:  # a clock an hour ahead: the retention has passed
            (table := MemWalTable(uri)).compact(max_records_per_round=GC_EVERY)
            table.gc(retain_seconds=0, clock=lambda t=table: t.store.now_ms() + 3_600_000)
    _commit(log, at := _claim(store, shard), 10)
    return at


def _read(op: str, uri: str, opts: dict[str, str]) -> int:
    """One operation on fresh objects: the ranges it sees (1 if the txn is found)."""
    if op == OPS[0]:
        return len(MemWalTable(uri, opts).committed_tail())
    log = CommitLog(open_store(uri, opts))
    return len(log.visible()) if op == OPS[1] else int(log.committed_txn(Txn("x", 1)) is not None)


def _timed(fn, per: int = 1) -> dict[str, float]:
    """ms and store calls (fsyncs aside) per ``per`` of ``fn()``."""
    with h.io_trace() as events:
        secs = h.seconds(fn)
    return {"ms": secs * 1e3 / per, "requests": sum(e != "fsync" for e in events) / per}


def _cases(ctx: h.Ctx, where: str, root: str, opts: dict[str, str], hists) -> list[dict]:
    """A new reader's case, then the commits' (which add records), on one store."""
    uri = {name: f"{root}/{rel}" for name, (rel, _at) in hists.items()}
    living = [name for name in hists if not name.endswith(VARIANTS)]
    small, big = living[0], living[-1]

    def reads(op: str, name: str):
        def run(r: int) -> dict[str, Any]:
            seen = forget_folds() or []  # cold, as a new process: no fold of a commit before
            return {**_timed(lambda: seen.append(_read(op, uri[name], opts))), "ranges": seen[0]}
        return run

    def commits(name: str):
        def run(r: int) -> dict[str, Any]:
            log = CommitLog(open_store(uri[name], opts))
            return _timed(lambda: _commit(log, hists[name][1], K), K)
        return run

    cases, reader = [], {f"{op} at {n}": reads(op, n) for op in OPS for n in hists}
    for what, comps, goal in (("a new reader", reader, READ_FLAT),
                              ("commits", {f"commit at {n}": commits(n) for n in living}, FLAT)):
        runs = h.alternate(ctx, comps, label=f"{where}, {what}: ")
        cases.append({"label": f"{where}, {what}", "competitors": h.stats(runs), "flat": {
            f"{p} {k} at {big} / at {small}": (h.ratios(runs, f"{p} at {big}", k, [
                f"{p} at {small}"])[f"{p} at {small}"], goal)
            for p in dict.fromkeys(c.split(" at ")[0] for c in comps) for k in ("ms", "requests")}})
    return cases


def run(ctx: h.Ctx) -> dict[str, Any]:
    sizes = ctx.pick((100, 1_000, 5_000), (100, 10_000, 100_000))
    root, hists = ctx.scratch("history"), {}
    for n, variant in [*((n, "") for n in sizes), *((sizes[1], v) for v in VARIANTS)]:
        name, t = f"{n:,} records" + (f", {variant}" if variant else ""), time.perf_counter()
        rel = f"n{n}{variant.replace(' ', '_')}.lance"
        hists[name] = rel, _build(str(root / rel), n, variant)
        ctx.log(f"  {name}: built in {time.perf_counter() - t:.1f} s")
    cases = []
    with h.s3_bucket(ctx, BUCKET) as (server, skipped):
        if server is not None:  # copied before the local commits add records
            opts, t = server.storage_options(), time.perf_counter()
            for rel, _at in hists.values():
                local, s3 = open_store(str(root / rel)), open_store(f"s3://{BUCKET}/{rel}", opts)
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(lambda k, a=local, b=s3: b.put(k, a.get(k)), local.list("")))
            ctx.log(f"  copied to S3 in {time.perf_counter() - t:.1f} s")
            cases = _cases(ctx, "S3", f"s3://{BUCKET}", opts, hists)
    return h.per_case(
        f"Commit and read-plan cost vs commit-log history ({sizes[0]:,} to {sizes[-1]:,} "
        "records), compaction and gc running: ms and requests per commit or read",
        {"history": sizes, "commits_timed": K, "gc_every": GC_EVERY, "variants_at": sizes[1],
         "s3": "histories built on local disk, copied", "s3_skipped": skipped},
        [*_cases(ctx, "local disk", str(root), {}, hists), *cases], "store",
        [("ms", "ms", "{:.2f}"), ("requests", "requests", "{:.2f}"),
         ("ranges read", "ranges", "{:.0f}")],
        lambda c, w: [h.target(f"{w}: {what}", s, goal, at_most=True)
                      for what, (s, goal) in c["flat"].items()],
        [("ms", "ms", "ms"), ("requests", "requests", "requests")])
