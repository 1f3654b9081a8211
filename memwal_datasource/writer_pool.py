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
* The writer keeps its shard's lease (renewed in the background), so other
  jobs pick other shards of the pool. After ``idle_s`` without a task it is
  closed: replay position moved past its entries, lease released (so garbage
  collection, which skips leased shards, gets to it). Process exit closes
  every kept writer too; a killed process's lease simply expires.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

from .errors import MemWalError
from .leases import HeldLease
from .writer_base import ShardWriter

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 15.0


@dataclass
class KeptWriter:
    """An open writer on a leased shard, between tasks."""

    shard: str
    writer: ShardWriter
    held: HeldLease
    last_used: float = field(default_factory=time.monotonic)

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

    def __init__(self, idle_s: float = DEFAULT_IDLE_S):
        self.idle_s = idle_s
        self._kept: dict[Hashable, list[KeptWriter]] = {}
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None
        self._wake = threading.Event()

    def take(self, key: Hashable) -> KeptWriter | None:
        """A kept writer for ``key`` still holding its lease and its epoch, or ``None``."""
        while True:
            with self._lock:
                kept = self._kept.get(key)
                if not kept:
                    return None
                candidate = kept.pop()
            try:
                candidate.held.check()
                candidate.writer.check_fence()
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
        while not self._wake.wait(min(self.idle_s, 1.0)):
            self.close_idle(self.idle_s)

    def close_idle(self, idle_s: float) -> int:
        """Close writers unused for ``idle_s``; returns how many."""
        now = time.monotonic()
        with self._lock:
            stale = [k for kept in self._kept.values() for k in kept
                     if now - k.last_used >= idle_s]
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
