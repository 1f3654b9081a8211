"""Shard writers that outlive a task, kept by a long-lived process between tasks.

Spark keeps an executor's Python worker alive between tasks
(``spark.python.worker.reuse``, on by default), and a small append's cost is
mostly per-task setup: lease a shard, claim a new epoch (a manifest version
and its hint), drop a fence sentinel, and at the end move the replay position
and release the lease. A writer kept open in this process skips all of it:
the next task's append writes its WAL entry, and the job its commit record.

The rules that keep fencing the guarantee:

* Only a task's **first attempt** may take a kept writer. A retried or
  speculative attempt opens a new one: its claim fences every older writer of
  the shard, kept ones included.
* Only shards whose writers need not commit in epoch order take part: the
  pools of tables without a sharding spec (no primary key), WAL-only. Rows
  there have no key, so two jobs' commit order cannot disagree with WAL order.
* Taking a kept writer re-checks the fence (one manifest read): a writer a
  newer epoch fenced while it sat here is closed, and the task opens anew. A
  claim that lands after the check fails the task at its next append, as it
  would any writer.
* A writer goes back only after a task that **succeeded** made its rows
  durable; a task that failed closes it (its entries stay uncommitted).
* The writer keeps its shard's lease (renewed in the background), and the
  lease says who holds it: once kept, not the finished job whose task opened
  it but this process's kept writer (:func:`kept_holder`), so no wait is
  charged to a finished job and no sibling wait (unbounded) is mistaken for
  one; a writer idle for ``mark_idle_s`` is marked idle (``Holder.kept``), and
  a task of another job then takes the shard over at once (its claim fences
  the idle writer, which is closed when next taken) instead of waiting. Back
  to back appends therefore write no lease at all.
* After ``idle_s`` without a task, or ``max_age_s`` after it opened, a kept
  writer is closed: replay position moved past its entries, lease released.
  The age limit is what lets garbage collection (which skips leased shards)
  reach the shards of a busy worker too. Process exit closes every kept
  writer; a killed process's lease simply expires.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

from .errors import MemWalError
from .leases import HeldLease, Holder
from .writer_base import ShardWriter

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 15.0
DEFAULT_MAX_AGE_S = 60.0  # gc waits at most this long (plus idle_s) for a busy worker's shard
DEFAULT_MARK_IDLE_S = 1.0  # back-to-back appends reuse a writer without marking it idle


@dataclass
class KeptWriter:
    """An open writer on a leased shard, between tasks."""

    shard: str
    writer: ShardWriter
    held: HeldLease
    last_used: float = field(default_factory=time.monotonic)
    opened: float = field(default_factory=time.monotonic)
    idle_marked: bool = False

    def close(self) -> None:
        """Close the writer (durable, replay position moved), then let go of the lease."""
        try:
            self.writer.close()
        except MemWalError as exc:  # fenced meanwhile, say: nothing of a task's is at stake
            log.info("memwal: a kept writer of shard %s closed with: %s", self.shard, exc)
            self.writer.abort()
        finally:
            self.held.release()


def kept_holder(lease_holder: Holder, idle: bool = False) -> Holder:
    """Who a kept writer's lease names: this process's kept writer, idle or in use."""
    return Holder(job_id=f"kept-{lease_holder.host}-{lease_holder.pid}", partition=-1,
                  label=f"{'idle ' if idle else ''}writer kept between tasks",
                  host=lease_holder.host, pid=lease_holder.pid, kept=idle)


class WriterPool:
    """Kept writers of this process, by key (table, writer group, schema, settings)."""

    def __init__(self, idle_s: float = DEFAULT_IDLE_S, max_age_s: float = DEFAULT_MAX_AGE_S,
                 mark_idle_s: float = DEFAULT_MARK_IDLE_S, reaper: bool = True):
        self.idle_s = idle_s
        self.reaper = reaper  # False: the caller calls mark_idle / close_idle (tests)
        self.max_age_s = max_age_s
        self.mark_idle_s = mark_idle_s
        self._kept: dict[Hashable, list[KeptWriter]] = {}
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None
        self._wake = threading.Event()

    def take(self, key: Hashable) -> KeptWriter | None:
        """A kept writer for ``key`` still holding its lease and its epoch, or ``None``.

        A lease marked idle is marked in use again (one lease write); a writer
        past ``max_age_s`` is closed instead.
        """
        while True:
            with self._lock:
                kept = self._kept.get(key)
                if not kept:
                    return None
                candidate = kept.pop()
            if time.monotonic() - candidate.opened >= self.max_age_s:
                candidate.close()
                continue
            try:
                candidate.held.check()
                candidate.writer.check_fence()
                current = candidate.held.lease.holder
                if current.kept:
                    candidate.held.relabel(kept_holder(current))
                    candidate.idle_marked = False
            except MemWalError as exc:
                log.info("memwal: not reusing the writer of shard %s: %s", candidate.shard, exc)
                candidate.close()
                continue
            return candidate

    def give(self, key: Hashable, kept: KeptWriter) -> None:
        """Keep ``kept`` (its rows durable) for the next task with the same ``key``."""
        kept.last_used = time.monotonic()
        current = kept.held.lease.holder
        if current != kept_holder(current):  # the lease still names the task's job
            try:
                kept.held.relabel(kept_holder(current))
            except MemWalError as exc:  # lost meanwhile: not worth keeping
                log.info("memwal: not keeping the writer of shard %s: %s", kept.shard, exc)
                kept.close()
                return
        with self._lock:
            self._kept.setdefault(key, []).append(kept)
            if self._reaper is None and self.reaper:
                self._reaper = threading.Thread(target=self._reap, name="memwal-writer-pool",
                                                daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        while not self._wake.wait(max(0.05, min(self.idle_s, self.mark_idle_s, 1.0))):
            self.close_idle(self.idle_s)
            self.mark_idle()

    def mark_idle(self) -> int:
        """Mark the leases of writers unused for ``mark_idle_s`` idle; returns how many."""
        now = time.monotonic()
        due: list[tuple[Hashable, KeptWriter]] = []
        with self._lock:  # out of the pool while relabelled: no task takes it meanwhile
            for key, kept in self._kept.items():
                for k in [k for k in kept
                          if not k.idle_marked and now - k.last_used >= self.mark_idle_s]:
                    kept.remove(k)
                    due.append((key, k))
        for key, kept in due:
            try:
                kept.held.relabel(kept_holder(kept.held.lease.holder, idle=True))
                kept.idle_marked = True
            except MemWalError as exc:  # taken over, say: closed when next taken
                log.info("memwal: could not mark the kept writer of shard %s idle: %s",
                         kept.shard, exc)
            with self._lock:
                self._kept.setdefault(key, []).append(kept)
        return len(due)

    def close_idle(self, idle_s: float) -> int:
        """Close writers unused for ``idle_s`` or open longer than ``max_age_s``."""
        now = time.monotonic()
        with self._lock:
            stale = [k for kept in self._kept.values() for k in kept
                     if now - k.last_used >= idle_s or now - k.opened >= self.max_age_s]
            for key in list(self._kept):
                self._kept[key] = [k for k in self._kept[key] if k not in stale]
        for kept in stale:
            kept.close()
        return len(stale)

    def close_all(self) -> None:
        """Close every kept writer (process exit, tests)."""
        self.close_idle(0.0)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._kept.values())


POOL = WriterPool()  # this process's kept writers
atexit.register(POOL.close_all)
