"""Requests and milliseconds per commit as the commit log's history grows, no Spark.

History: real ``CommitLog.append`` calls (a range each, ``group=False``; a checkpoint
every 100), gc's log steps every 1,000 (its record, checkpoint and released marker, the
records below deleted, old checkpoints collected). Then K appends per repeat in this warm
process, store calls counted; local disk and S3. Goal: flat in history (<= 1.2x).
"""

from __future__ import annotations

import time
import types
from typing import Any

from memwal_datasource.format.commit_format import record_key, released_key
from memwal_datasource.log.commit import APPEND, CHECKPOINTS_DIR, GC, CommitLog, CommittedRange
from memwal_datasource.maintenance.gc import _collect_checkpoints
from memwal_datasource.store import open_store

from . import harness as h

NAME = "commit_history"
K, GC_EVERY, RETAIN, FLAT = 50, 1_000, 100, 1.2  # RETAIN: records kept below the checkpoint
CKPTS = CHECKPOINTS_DIR + "/"


class _Log:
    """One table's log and its WAL positions (one per record, shard ``s0``)."""

    def __init__(self, uri: str, opts: dict[str, str]):
        self.store, self.pos, self.at, self.released = open_store(uri, opts), 0, {}, 0
        self.log = CommitLog(self.store)

    def append(self, log: CommitLog) -> None:
        self.pos += 1
        seq = log.append(APPEND, [CommittedRange("s0", 1, self.pos, self.pos, rows=10,
                                                 bytes=580, task=0, attempt=0)],
                         group=False).record.sequence
        self.at[seq] = self.pos

    def collect(self, log: CommitLog) -> None:
        """gc's steps for the log, releasing up to RETAIN records below the newest checkpoint."""
        ck = log.latest_checkpoint(refresh=True)
        upto = (ck.sequence if ck else 0) - RETAIN
        if upto <= self.released:
            return
        floor, nxt = min(p for s, p in self.at.items() if s > upto), log.next_sequence()
        log.append(GC, [], extra={"floors": {"s0": floor}, "through_seq": nxt - 1,
                                  "released_seq": upto}, at_sequence=nxt)
        log.checkpoint()
        self.store.put(released_key(upto), b"{}")
        self.store.delete_many([record_key(s) for s in range(self.released + 1, upto + 1)])
        self.at = {s: p for s, p in self.at.items() if s > upto}
        self.released = upto
        _collect_checkpoints(types.SimpleNamespace(store=self.store))

    def checkpoints(self) -> int:
        return sum(k.rsplit("/", 1)[-1][:-5].isdigit() for k in self.store.list(CKPTS))


def _case(ctx: h.Ctx, where: str, root: str, opts: dict[str, str], sizes) -> dict[str, Any]:
    logs = {}
    for n in sizes:
        name, t = f"{n:,} records of history", time.perf_counter()
        logs[name] = lg = _Log(f"{root}/n{n}.lance", opts)
        for i in range(1, n + 1):
            lg.append(lg.log)
            if i % GC_EVERY == 0 or i == n:
                lg.collect(lg.log)
        ctx.log(f"  {where}: {name} built in {time.perf_counter() - t:.1f} s")

    def timed(lg: _Log):
        def run(r: int) -> dict[str, Any]:
            log, ck = CommitLog(lg.store), lg.checkpoints()
            with h.io_trace() as events:
                secs = h.seconds(lambda: [lg.append(log) for _ in range(K)])
            return {"ms_per_commit": secs * 1e3 / K, "checkpoints": ck,
                    "requests_per_commit": sum(e[0] != "fsync" for e in events) / K}
        return run

    runs = h.alternate(ctx, {n: timed(lg) for n, lg in logs.items()}, label=f"{where}: ")
    big, small = list(logs)[-1], list(logs)[0]
    return {"label": where, "competitors": h.stats(runs),
            "flat": {k: h.ratios(runs, big, k, [small])[small]
                     for k in ("ms_per_commit", "requests_per_commit")}}


def run(ctx: h.Ctx) -> dict[str, Any]:
    sizes = ctx.pick((100, 1_000, 5_000), (100, 10_000, 100_000))
    cases = [_case(ctx, "local disk", str(ctx.scratch("history")), {}, sizes)]
    with h.s3_bucket(ctx, "memwal-history") as (server, skipped):
        if server is not None:
            cases.append(_case(ctx, "S3", "s3://memwal-history", server.storage_options(), sizes))
    return h.per_case(
        f"Commit cost vs commit-log history ({sizes[0]:,} to {sizes[-1]:,} records), "
        "checkpoints and gc running", {"history": sizes, "appends_timed": K,
                                       "gc_every": GC_EVERY, "s3_skipped": skipped},
        cases, "store", [("ms/commit", "ms_per_commit", "{:.2f}"),
                         ("requests/commit", "requests_per_commit", "{:.2f}"),
                         ("checkpoints kept", "checkpoints", "{:.0f}")],
        lambda c, w: [h.target(f"{w}: {k.replace('_per_', '/')} at {sizes[-1]:,} records / at "
                               f"{sizes[0]:,}", c["flat"][k], FLAT, at_most=True)
                      for k in c["flat"]],
        [("ms per commit", "ms_per_commit", "ms"),
         ("requests per commit", "requests_per_commit", "requests")])
