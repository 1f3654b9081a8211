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
  lease always says who uses it: the task that takes a kept writer names its
  job there, and a writer idle for ``mark_idle_s`` is marked idle
  (``Holder.kept``), so a task of another job never waits for it, or blames a
  finished job: it takes the shard over, and its claim fences the idle writer
  (which is then closed when next taken).
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


class WriterPool:
    """Kept writers of this process, by key (table, writer group, schema, settings)."""

    def __init__(self, idle_s: float = DEFAULT_IDLE_S, max_age_s: float = DEFAULT_MAX_AGE_S,
                 mark_idle_s: float = DEFAULT_MARK_IDLE_S):
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self.mark_idle_s = mark_idle_s
        self._kept: dict[Hashable, list[KeptWriter]] = {}
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None
        self._wake = threading.Event()

    def take(self, key: Hashable, holder: Holder | None = None) -> KeptWriter | None:
        """A kept writer for ``key`` still holding its lease and its epoch, or ``None``.

        Its lease is relabelled to ``holder`` (the task's job) unless it names
        that job already; one past ``max_age_s`` is closed instead.
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
                if holder is not None and (current.kept or current.job_id != holder.job_id):
                    candidate.held.relabel(holder)
                    candidate.idle_marked = False
            except MemWalError as exc:
                log.info("memwal: not reusing the writer of shard %s: %s", candidate.shard, exc)
                candidate.close()
                continue
            return candidate

    def give(self, key: Hashable, kept: KeptWriter) -> None:
        """Keep ``kept`` (its rows durable) for the next task with the same ``key``."""
        kept.last_used = time.monotonic()
        with self._lock:
            self._kept.setdefault(key, []).append(kept)
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="memwal-writer-pool",
                                                daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        while not self._wake.wait(min(self.idle_s, self.mark_idle_s, 1.0)):
            self.close_idle(self.idle_s)
            self.mark_idle()

    def mark_idle(self) -> int:
        """Mark the leases of writers unused for ``mark_idle_s`` idle; returns how many."""
        now = time.monotonic()
        with self._lock:
            due = [k for kept in self._kept.values() for k in kept
                   if not k.idle_marked and now - k.last_used >= self.mark_idle_s]
        for kept in due:
            lease = kept.held.lease
            try:
                kept.held.relabel(Holder(job_id=f"kept-{lease.holder.host}-{lease.holder.pid}",
                                         partition=-1, label="idle writer kept between tasks",
                                         kept=True))
                kept.idle_marked = True
            except MemWalError as exc:  # taken over, say: closed when next taken
                log.info("memwal: could not mark the kept writer of shard %s idle: %s",
                         kept.shard, exc)
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
