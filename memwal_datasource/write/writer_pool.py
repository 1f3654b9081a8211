"""Shard writers that outlive a task, kept by a long-lived process between tasks.

Spark keeps an executor's Python worker alive between tasks
(``spark.python.worker.reuse``, on by default), and a small append's cost is
mostly per-task setup: lease a shard, claim a new epoch (a manifest version
and its hint), drop a fence sentinel, and at the end move the replay position
and release the lease. A writer kept open in this process skips the claim,
the sentinel and the replay move: the next task's append writes a lease
generation, its WAL entry, and the job its commit record.

Placement: a task leases as any task does, its partition's slot first (so an
uncontended job keeps its placement), then, where that slot is busy, a shard
this process keeps a writer on before the next free one. Where the slot is
free but another process keeps a writer on it, a shard this process keeps
one on for the same partition (never another partition's slot) comes first:
Spark hands tasks to idle workers in turn, and two workers would otherwise
claim one slot from each other on every turn. A kept writer's lease says it
is idle (``Holder.kept``), so it counts as free for everyone: live jobs still never
share a shard, and repeated jobs still write the same bounded set. Only when
the task's lease replaced this process's kept writer's own lease record,
nobody held the shard in between, and the task takes that writer instead of
claiming anew. A task of this process takes the shard straight after that
record (:meth:`WriterPool.kept_record`, ``Leases.take_after``: one put and a
listing, no read; on an object store, where the kept writer is continued, the
listing runs beside the task's WAL write: a lease it does not prove costs the
writer, never a claim). The rules that keep fencing the guarantee:

* Only a task's **first attempt** may take a kept writer. A retried or
  speculative attempt opens a new one: its claim fences every older writer of
  the shard, kept ones included.
* Only shards whose writers need not commit in epoch order take part: the
  pools of tables without a sharding spec (no primary key), WAL-only. Rows
  there have no key, so two jobs' commit order cannot disagree with WAL order.
* A writer is taken only if the task's new lease replaced the kept writer's
  own lease record: any other holder in between (another job, gc, a retry) may
  have claimed the shard, so the kept writer is dropped and the task claims.
  A claim by something that takes no lease is caught by a fence check when the
  writer is taken (two requests, made while the task leases the shard: on an
  object store one round trip for both), and by the one every task makes
  before it reports success, as for any writer.
* A writer goes back only after a task that **succeeded** made its rows
  durable and re-checked its fence; a task that failed closes it (its entries
  stay uncommitted). Giving it back writes one lease generation (idle, kept),
  as a release would, beside that fence check (:meth:`WriterPool.label_idle`):
  a writer whose check failed is not given back.
* A writer is taken only by a task of the same table: the one its planner
  read (a Lance version and its manifest's modification time,
  :class:`~memwal_datasource.table.table_info.TableStamp`), or a later version of it
  while the writer's version is still there. A table deleted and made anew at
  the same path reuses the shard ids, and a new epoch there may equal the
  kept writer's: its fence check could not tell.
* After ``idle_s`` without a task, or ``max_age_s`` after it opened, a kept
  writer is closed: replay position moved past its entries, lease released.
  Closing checks the table first (a HEAD): a writer whose table was replaced
  lets go without writing. Process exit closes every kept writer; a killed
  process's lease says idle, so the next task takes the shard at once (its
  claim fences the dead writer).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import MemWalError
from ..shard.leases import HeldLease, Holder, Lease
from ..shard.writer_base import ShardWriter

if TYPE_CHECKING:
    from ..store import ObjectStore
    from ..table.table_info import TableStamp

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 15.0
DEFAULT_MAX_AGE_S = 60.0  # gc waits at most this long (plus idle_s) for a busy worker's shard


@dataclass
class KeptWriter:
    """An open writer on a shard whose lease says it is kept (idle), between tasks."""

    shard: str
    writer: ShardWriter
    held: HeldLease
    job_id: str = ""  # the job of the task that gave it back
    partition: int = -1  # and its partition
    stamp: TableStamp | None = None  # the table it writes (None: not checked)
    store: ObjectStore | None = None  # where to check it
    last_used: float = field(default_factory=time.monotonic)
    opened: float = field(default_factory=time.monotonic)
    # The idle lease record being written (WriterPool.give_labelling): its answer, as
    # label_idle's, is taken before the record or the lease is used again.
    labelling: Future[str | None] | None = None

    def labelled(self) -> str | None:
        """Wait for the idle record in flight, if any: why the lease was lost, or None."""
        pending, self.labelling = self.labelling, None
        if pending is None:
            return None
        try:
            return pending.result()
        except Exception as exc:  # noqa: BLE001 - not written: the lease is not ours to use
            return str(exc) or type(exc).__name__

    def _table_check(self, check) -> bool:
        """``check()`` of this writer's table; False when the store cannot tell."""
        try:
            return check()
        except Exception as exc:  # noqa: BLE001 - cannot tell: the safe answer
            log.info("memwal: cannot check the table of the kept writer of shard %s: %s",
                     self.shard, exc)
            return False

    def table_replaced(self) -> bool:
        """Whether the table this writer was opened on is gone (or cannot be told)."""
        if self.stamp is None or self.store is None:
            return False
        return not self._table_check(lambda: self.stamp.still_there(self.store))

    def same_table(self, stamp: TableStamp | None) -> bool:
        """Whether a task whose planner read ``stamp`` writes this writer's table."""
        if self.stamp is None or stamp is None:
            return self.stamp is None and stamp is None  # neither checks (tests, memory)
        return self._table_check(lambda: self.stamp.same_table(stamp, self.store))

    def close(self) -> None:
        """Close the writer (durable, replay position moved), then let go of the lease;
        only let go if its table was deleted (and maybe made anew) meanwhile."""
        self.labelled()  # the release follows the idle record, never races it
        if self.table_replaced():
            log.info("memwal: the table of the kept writer of shard %s was replaced at its "
                     "path; letting go without writing", self.shard)
            self.drop()
            return
        try:
            self.writer.close()
        except MemWalError as exc:  # fenced meanwhile, say: nothing of a task's is at stake
            log.info("memwal: a kept writer of shard %s closed with: %s", self.shard, exc)
            self.writer.abort()
        finally:
            self.held.release()

    def drop(self) -> None:
        """Let go without writing: another lease replaced ours (the writer's entries
        are durable and committed; the next claim moves the replay position past them)."""
        self.labelled()
        self.held.abandon()
        self.writer.abort()


def kept_holder(lease_holder: Holder) -> Holder:
    """Who a kept writer's lease names: this process's kept writer, idle (free to take)."""
    return Holder(job_id=f"kept-{lease_holder.host}-{lease_holder.pid}", partition=-1,
                  label="idle writer kept between tasks", host=lease_holder.host,
                  pid=lease_holder.pid, kept=True)


class WriterPool:
    """Kept writers of this process, by key (table, writer group, schema, settings) and shard."""

    def __init__(self, idle_s: float = DEFAULT_IDLE_S, max_age_s: float = DEFAULT_MAX_AGE_S,
                 reaper: bool = True):
        self.idle_s = idle_s
        self.reaper = reaper  # False: the caller calls close_idle (tests)
        self.max_age_s = max_age_s
        self._kept: dict[tuple[Hashable, str], KeptWriter] = {}
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None
        self._wake = threading.Event()

    def fence_of(self, key: Hashable, shard: str) -> str | None:
        """Check the fence of the writer kept for ``key`` on ``shard`` now, without taking
        it: why it may not be reused (fenced), or ``None`` (unfenced, or none kept).

        A claim that took no lease (a native writer's, say) is seen only here. A
        task runs this while it leases the shard (one round trip for both on an
        object store) and hands the answer to :meth:`take`: as of a moment
        before the task's WAL PUT, and the check every task makes after its
        write still guards the rest.
        """
        with self._lock:
            kept = self._kept.get((key, shard))
        return None if kept is None else _fenced(kept)

    def take(self, key: Hashable, shard: str, replaced: Lease | None,
             held: HeldLease, stamp: TableStamp | None = None, *,
             checked: bool = False, fenced: str | None = None) -> KeptWriter | None:
        """The writer kept for ``key`` on ``shard``, now under ``held``, or ``None``.

        ``held`` is the task's new lease on ``shard`` and ``replaced`` the record
        it replaced: the kept writer is taken only if that was its own (nobody held
        the shard in between) and ``stamp``, the table the task's planner read, is
        of the writer's table; otherwise it is dropped and the task claims anew.
        With ``checked``, ``fenced`` is :meth:`fence_of`'s answer, made while the
        task leased the shard; without, the fence is checked here.
        """
        kept = self._pop(key, shard)
        if kept is None:
            return None
        ours = replaced is not None and replaced.lease_id == kept.held.lease.lease_id
        why = ("another holder came between" if not ours else
               "past its age" if self._past_age(kept) else
               "the table was replaced at its path" if not kept.same_table(stamp)
               else fenced if checked else _fenced(kept))
        if why is not None:
            log.info("memwal: not reusing the kept writer of shard %s (%s)", shard, why)
            kept.drop()
            return None
        kept.held.abandon()  # the task's lease replaced it
        kept.held, kept.stamp = held, stamp
        return kept

    def take_unproved(self, key: Hashable, shard: str) -> KeptWriter | None:
        """The writer kept for ``key`` on ``shard``, taken before the task's lease is
        proved or its fence checked (an object store's continuing task: the caller
        settles both after its WAL PUT, see :mod:`memwal_datasource.spark.pool_shard`);
        ``None`` if none is kept or it is past its age. Its idle lease stops renewing:
        the task's put of the next generation replaces it."""
        kept = self._pop(key, shard)
        if kept is None:
            return None
        if self._past_age(kept):
            log.info("memwal: not reusing the kept writer of shard %s (past its age)", shard)
            kept.drop()
            return None
        kept.held.abandon()
        return kept

    def _pop(self, key: Hashable, shard: str) -> KeptWriter | None:
        """Take the writer kept for ``key`` on ``shard`` out of the pool, its idle record
        landed (or its loss known)."""
        with self._lock:
            kept = self._kept.pop((key, shard), None)
        if kept is not None:
            kept.labelled()
        return kept

    def _past_age(self, kept: KeptWriter) -> bool:
        return time.monotonic() - kept.opened >= self.max_age_s

    def kept_record(self, key: Hashable, shard: str, stamp: TableStamp | None) -> Lease | None:
        """The idle lease record of the writer kept for ``key`` on ``shard``, if it writes
        the table a planner read as ``stamp`` (a task may take the shard right after it)."""
        with self._lock:
            kept = self._kept.get((key, shard))
        if kept is None:
            return None
        lost = kept.labelled()
        if lost is not None:
            self.discard(key, shard, lost)
            return None
        if not kept.same_table(stamp):
            return None
        return kept.held.lease

    def discard(self, key: Hashable, shard: str, why: str) -> None:
        """Drop the writer kept for ``key`` on ``shard``, if any: it may never be reused
        (``why``: fenced, say)."""
        with self._lock:
            kept = self._kept.pop((key, shard), None)
        if kept is not None:
            log.info("memwal: dropping the kept writer of shard %s (%s)", shard, why)
            kept.drop()

    def shards(self, key: Hashable, not_job: str | None = None,
               partition: int | None = None) -> list[str]:
        """Shards with a writer kept for ``key`` (and last given back by a task of a job
        other than ``not_job``, of partition ``partition``), most recently used first."""
        with self._lock:
            kept = [(w.last_used, k[1]) for k, w in self._kept.items()
                    if k[0] == key and (not_job is None or w.job_id != not_job)
                    and (partition is None or w.partition == partition)]
        return [s for _t, s in sorted(kept, reverse=True)]

    def drop_shard(self, shard: str) -> int:
        """Drop every writer kept on ``shard`` (a task of this process claims it anew)."""
        with self._lock:
            gone = [k for k in self._kept if k[1] == shard]
            dropped = [self._kept.pop(k) for k in gone]
        for kept in dropped:
            kept.drop()
        return len(dropped)

    @staticmethod
    def label_idle(kept: KeptWriter) -> str | None:
        """Write ``kept``'s lease record as idle (any task, of any job, may take the
        shard); why not, if its lease was lost meanwhile."""
        try:
            kept.held.relabel(kept_holder(kept.held.lease.holder))
        except MemWalError as exc:
            return str(exc)
        return None

    def give(self, key: Hashable, kept: KeptWriter, *, labelled: bool = False,
             lost: str | None = None) -> None:
        """Keep ``kept`` (its rows durable, its fence checked) for the next task; its
        lease says idle (:meth:`label_idle`, done here unless ``labelled``, with
        ``lost`` its answer)."""
        kept.last_used = time.monotonic()
        lost = lost if labelled else self.label_idle(kept)
        if lost is not None:  # not worth keeping
            log.info("memwal: not keeping the writer of shard %s: %s", kept.shard, lost)
            kept.close()
            return
        with self._lock:
            old = self._kept.pop((key, kept.shard), None)
            self._kept[(key, kept.shard)] = kept
            if self._reaper is None and self.reaper:
                self._reaper = threading.Thread(target=self._reap, name="memwal-writer-pool",
                                                daemon=True)
                self._reaper.start()
        if old is not None and old is not kept:
            old.drop()

    def give_labelling(self, key: Hashable, kept: KeptWriter,
                       labelling: Future[str | None]) -> None:
        """Keep ``kept`` now, its idle record (:meth:`label_idle`) still in flight: the
        record is off the task's path, and whoever uses the lease next waits for it
        (:meth:`KeptWriter.labelled`; a lost lease drops the writer then)."""
        kept.labelling = labelling
        self.give(key, kept, labelled=True)

    def _reap(self) -> None:
        while not self._wake.wait(max(0.05, min(self.idle_s, 1.0))):
            self.close_idle(self.idle_s)

    def close_idle(self, idle_s: float) -> int:
        """Close writers unused for ``idle_s`` or open longer than ``max_age_s``."""
        now = time.monotonic()
        with self._lock:
            stale = [(k, w) for k, w in self._kept.items()
                     if now - w.last_used >= idle_s or now - w.opened >= self.max_age_s]
            for k, _w in stale:
                del self._kept[k]
        for _k, kept in stale:
            kept.close()
        return len(stale)

    def close_all(self) -> None:
        """Close every kept writer (process exit, tests)."""
        self.close_idle(0.0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


def _fenced(kept: KeptWriter) -> str | None:
    """Why ``kept`` may not be reused: fenced (a claim that took no lease, a native
    writer's say), or closed meanwhile; ``None`` if its fence holds. Two requests, at
    once on an object store (``ManifestStore.latest_version``)."""
    try:
        kept.writer.check_fence()
    except Exception as exc:  # noqa: BLE001 - any failure: not reused, the task claims anew
        return str(exc) or type(exc).__name__
    return None


POOL = WriterPool()  # this process's kept writers
atexit.register(POOL.close_all)
