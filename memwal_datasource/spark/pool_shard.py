"""The one shard a task of a table without a sharding spec writes: leased from its
writer group's pool, continuing a writer its Python worker kept where it may.

A task leases a free shard of the pool before its first row: its partition id's
slot when free (uncontended jobs reuse the same shards), else one this process
keeps a writer on (:mod:`memwal_datasource.write.writer_pool`), else the next free slot;
with ``num_shards`` it waits for one of those. Tables with a sharding spec write
through :mod:`memwal_datasource.spark.shard_turns` instead.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import pyarrow as pa

from .. import hooks
from ..errors import Fenced, WriterPoisoned
from ..shard.leases import HeldLease, Holder, Lease, Leases, NoFreeShard
from ..shard.writer_base import ShardWriter, WriterStats
from ..store import beside, read_both
from ..write.writer_pool import POOL, KeptWriter
from .options import WriteOptions
from .shard_turns import open_shard

log = logging.getLogger(__name__)

# A task without num_shards probes the pool this many slots at a time (no waiting).
POOL_WINDOW = 16
POOL_WINDOWS = 64
# A continuing task keeps the rows it gave an unsettled kept writer (to write them
# again should that writer turn out fenced) up to this many bytes, then settles early.
UNSETTLED_BYTES = 64 << 20


@dataclass
class _Continuing:
    """A kept writer an object store's task continues before its lease is proved.

    ``taking`` is the lease put and, after it, the listing that proves it
    (``True``: the task holds the shard). ``rows``: what the task gave the writer
    meanwhile, written again to a newly leased writer if the kept one was fenced.
    """

    kept: KeptWriter
    record: Lease  # the kept writer's idle record, which the task's lease follows
    taking: Future[bool]
    rows: list[pa.RecordBatch] = field(default_factory=list)
    nbytes: int = 0


class PoolShard:
    """The one shard a task of a table without a sharding spec writes, from its writer group.

    The task leases a free shard of the pool: its partition id's slot when
    free (uncontended jobs reuse the same shards), else one this process
    keeps a writer on (see :mod:`memwal_datasource.write.writer_pool`), else the
    next free slot; with ``num_shards`` it waits for one of those. The lease is renewed in
    the background; a lost one (taken after it expired) fails the task
    before it closes, and Spark retries the task.
    """

    def __init__(self, opts: WriteOptions, holder: Holder, leases: Leases):
        self.opts = opts
        self.holder = holder
        self.leases = leases
        self.held: HeldLease | None = None
        self.writer: ShardWriter | None = None
        self.shard: str | None = None
        self.lease_s = 0.0
        self.open_s = 0.0
        # A first attempt on a WAL-only pool may take a writer a previous task of this
        # process kept (see memwal_datasource.write.writer_pool); retries always claim anew.
        self.keepable = (opts.keep_writers and holder.attempt == 0
                         and not opts.config.enable_memtable and opts.sharding is None)
        self.key: tuple | None = None
        self.before: WriterStats | None = None  # a kept writer's stats when we took it
        self.kept = False  # given back to the pool at close
        self._fenced: tuple[str, str | None] | None = None  # (shard, fence_of's answer)
        self._proof: Future[bool] | None = None  # a kept shard's lease listing, running
        self._going: _Continuing | None = None  # continued, not settled yet (object stores)
        self._schema: pa.Schema | None = None
        self._settled = False  # a continued writer was fenced: this task continues no other

    def open(self, schema: pa.Schema) -> ShardWriter:
        """Take a kept writer, or lease a free shard of the pool and open a writer on it."""
        t0, self._schema = time.perf_counter(), schema
        if self.keepable:
            self.key = (self.opts.path, self.opts.writer_group, self.opts.num_shards,
                        tuple(sorted(self.opts.storage.items())), schema.to_string(),
                        repr(self.opts.config), self.opts.lease_ttl_s)
        for _ in range(2):  # a second time only after a kept shard's lease was not proved
            self.shard = self._lease_from_pool()
            t1 = time.perf_counter()
            self.lease_s += t1 - t0
            if not self.keepable:
                if POOL:
                    POOL.drop_shard(self.shard)  # our claim fences it: never reuse it
                break
            if self._going is not None:  # continued at once: settled after its WAL PUT
                self.writer = self._going.kept.writer
                self.before = self.writer.stats()
                self.open_s += time.perf_counter() - t1
                return self.writer
            checked = self._fenced is not None and self._fenced[0] == self.shard
            kept = POOL.take(self.key, self.shard, self.leases.replaced.get(self.shard),
                             self.held, self.opts.table_stamp, checked=checked,
                             fenced=self._fenced[1] if checked else None)
            if kept is not None:  # the shard any task would take, and our writer holds it
                self.writer, self.before = kept.writer, kept.writer.stats()
                self.open_s += time.perf_counter() - t1
                return self.writer
            # A claim comes next: it must never fence a writer that holds the lease, so a
            # lease taken for the kept writer (not continued after all) is proved first.
            if self._proved():
                break
            self.held.abandon()  # its record was deleted: lease as any task does
            self.held, self._fenced, t0 = None, None, time.perf_counter()
        self.writer = open_shard(self.opts, self.shard, schema)
        self.open_s += time.perf_counter() - t1
        return self.writer

    def stats(self) -> WriterStats:
        """What this task wrote (a kept writer's counters minus what earlier tasks wrote)."""
        s = self.writer.stats()
        b = self.before
        if b is None:
            return s
        first = (b.last_wal_position or 0) + 1 if s.last_wal_position else None
        return replace(s, rows=s.rows - b.rows, bytes=s.bytes - b.bytes,
                       wal_entries=s.wal_entries - b.wal_entries,
                       first_wal_position=first if s.rows > b.rows else None,
                       last_wal_position=s.last_wal_position if s.rows > b.rows else None)

    def _kept_after_home(self, order: list[str], within: bool = False) -> list[str]:
        """``order`` with the shards this process keeps writers on (for this task's
        settings; only those in ``order`` if ``within``) moved right after the first,
        the partition's own slot: an uncontended job keeps its placement, and a task
        whose slot is busy continues a kept writer (no claim) before trying the next."""
        kept = POOL.shards(self.key) if self.keepable and self.key is not None else []
        kept = [s for s in kept if s != order[0] and (s in order or not within)]
        return [order[0], *kept, *(s for s in order[1:] if s not in kept)]

    def _hold(self, lease) -> None:
        self.held = self.leases.hold(lease)

    def _continue_kept(self, shard: str) -> bool:
        """Lease ``shard`` right after the idle record of the writer this process keeps
        there (no read first: :meth:`Leases.take_after`), if that writer is of this
        task's table. ``False``: nothing held, lease as any task does."""
        if not self.keepable or self.key is None or self._settled:
            return False
        record = POOL.kept_record(self.key, shard, self.opts.table_stamp)
        if record is None:
            return False
        key, store = self.key, self.leases.store
        if store.remote:
            # On an object store the writer is continued at once: the lease put (then
            # its listing) runs beside the task's WAL PUT, and both are settled after
            # it (:meth:`_settle`; docs/protocol.md, "Cheaper fence checks and lease
            # writes").
            kept = POOL.take_unproved(key, shard)
            if kept is None:
                return False
            self._going = _Continuing(kept, record, beside(store, lambda: self._take(record)))
            return True
        # Elsewhere the kept writer's fence is checked as the shard is leased.
        lease, fenced = read_both(store, lambda: self.leases.take_after(record, self.holder),
                                  lambda: POOL.fence_of(key, shard))
        if fenced is not None:
            # Fenced for good: gone now, so that no later task checks it again.
            POOL.discard(key, shard, fenced)
        if lease is None:
            return False
        self._fenced = (shard, fenced)
        self._hold(lease)
        return True

    def _take(self, record) -> bool:
        """The continuing task's lease: put right after ``record``, held (renewed) from
        then on, and proved by the listing after it (an unproved one's record is deleted)."""
        lease = self.leases.take_after(record, self.holder, prove_later=True)
        if lease is None:
            return False
        self._hold(lease)
        return self.leases.prove_taken(lease, record)

    def put(self, batch: pa.RecordBatch, schema: pa.Schema) -> None:
        """Write ``batch`` to this task's shard, leased (or continued) at the first one."""
        writer = self.writer or self.open(schema)
        going = self._going
        if going is None:
            writer.put(batch)
            return
        going.rows.append(batch)
        going.nbytes += batch.get_total_buffer_size()
        try:
            writer.put(batch)
        except (Fenced, WriterPoisoned):
            pass  # settled below or at close, where the rows go to a writer opened anew
        if going.nbytes >= UNSETTLED_BYTES:
            self._settle(closing=False)

    def _taken(self, going: _Continuing) -> bool:
        """Whether the continuing task's lease was taken and proved."""
        return self._answer(going.taking)

    def _answer(self, proof: Future[bool]) -> bool:
        """A lease proof's answer; a proof that failed (a store error) proves nothing."""
        try:
            return proof.result()
        except Exception as exc:  # noqa: BLE001 - a store error: the lease is not proved
            log.info("memwal: shard %s: could not take or prove its lease: %s",
                     self.shard, exc)
            return False

    def _settle(self, closing: bool) -> bool:
        """Settle a continued kept writer: its rows durable (a WAL PUT that collides
        means it was fenced while kept), its lease proved or not, and, when
        ``closing``, its fence checked after the PUT, beside the lease's listing.

        ``True``: the task is closed (the writer kept, or let go with its rows
        standing). ``False``: the task goes on with :attr:`writer`: the kept one
        (its proof as :meth:`_proved` answers), or, if another epoch claimed the
        shard before our PUT or before the fence check after it, a writer leased
        anew with the rows written again (what the fenced writer wrote is never
        named by a commit record: uncommitted, as a failed attempt's).
        """
        going, self._going = self._going, None
        writer, store = going.kept.writer, self.leases.store
        try:
            writer.flush()
        except (Fenced, WriterPoisoned) as exc:  # no row of ours stands: write them anew
            collided: Exception | None = exc
        else:
            collided = None
        fence = beside(store, writer.check_fence) if collided is None and closing else None
        proved = self._taken(going)
        if collided is None and not closing:
            self._proof = going.taking  # answered: close() reads it as any proof
            return False
        if fence is not None:
            try:
                fence.result()
            except (Fenced, WriterPoisoned) as exc:
                # A claim came while we wrote: a rival that took the shard as we did (our
                # lease put lost, or not proved yet). Its claim does not fail the task.
                collided = exc
        if collided is None:
            if proved:
                kept = KeptWriter(self.shard, writer, self.held, job_id=self.holder.job_id,
                                  partition=self.holder.partition,
                                  stamp=self.opts.table_stamp, store=store)
                # The idle record goes off the task's path: whoever uses the lease next
                # waits for it.
                POOL.give_labelling(self.key, kept, beside(store, lambda: POOL.label_idle(kept)))
                self.kept = True
            else:
                # Another holder took the shard as we took it. Correctness never rests
                # on a lease: the fence decided that the rows stand; the writer is not
                # kept, and let go without writing.
                if self.held is not None:
                    self.held.abandon()
                self.held = None
                writer.abort()
            return True
        log.info("memwal: the kept writer of shard %s was fenced (%s); writing its rows "
                 "anew", self.shard, collided)
        writer.abort()
        self.before = None
        if proved:  # proved before the claim we met, maybe: a claim follows, so prove it again
            proved = self._still_ours(going.record)
        if not proved:  # leased anew, as a retry does: nothing claims on a lease not proved
            if self.held is not None:
                self.held.abandon()
            self.held, self._settled = None, True
            self.shard = self._lease_from_pool()
            POOL.drop_shard(self.shard)  # our claim fences it: never reuse it
        self.writer = open_shard(self.opts, self.shard, self._schema)
        for batch in going.rows:
            self.writer.put(batch)
        return False

    def _still_ours(self, record: Lease) -> bool:
        """A fresh listing: whether the task's lease, put right after ``record``, still
        holds the shard (a rival that took it over since claimed: we must not fence it)."""
        try:
            return self.held is not None and self.leases.prove_taken(self.held.lease, record)
        except Exception as exc:  # noqa: BLE001 - a store error: the lease is not proved
            log.info("memwal: shard %s: could not list its lease generations: %s",
                     self.shard, exc)
            return False

    def _proved(self) -> bool:
        """Wait for the kept shard's lease listing, if one runs: whether it proved the
        lease (a listing that failed proves nothing)."""
        proof, self._proof = self._proof, None
        return proof is None or self._answer(proof)

    def _lease_kept_instead(self, home: str, pool: list[str] | None = None) -> str | None:
        """Where this process keeps no writer on ``home``, a shard it keeps one on for
        this partition, continued (no claim on either side); else ``None``.

        Spark hands tasks to idle Python workers in turn, so without this two
        workers would take one slot in turns and each claim it anew. Only a shard
        an earlier task of the same partition (of another job) wrote qualifies,
        where it went because this slot was busy (or another worker had taken
        it): never another partition's slot, which that partition's task of this
        job will want, so a job's placement over its partitions' slots is
        unchanged and the table gains no shard. With ``pool`` (``num_shards``),
        only shards in it. ``home``'s lease is not read first: the writer is
        continued right after its own idle record (:meth:`_continue_kept`), so a
        worker stays on its shard while it keeps the writer there, and takes
        ``home`` again once that writer has retired.
        """
        if not self.keepable or self.key is None:
            return None
        for shard in POOL.shards(self.key, not_job=self.holder.job_id,
                                 partition=self.holder.partition):
            if shard != home and (pool is None or shard in pool) and self._continue_kept(shard):
                return shard
        return None

    def _lease_from_pool(self) -> str:
        """Lease a shard of the writer group's pool: the partition's slot first."""
        opts, pid = self.opts, self.holder.partition
        if opts.num_shards:
            return self._lease_from_bounded_pool(opts.num_shards)
        if self._continue_kept(opts.shard_for(pid)):
            return opts.shard_for(pid)
        shard = self._lease_kept_instead(opts.shard_for(pid))
        if shard is not None:
            return shard
        for w in range(POOL_WINDOWS):
            slots = range(pid + w * POOL_WINDOW, pid + (w + 1) * POOL_WINDOW)
            order = [opts.shard_for(s) for s in slots]
            if w == 0:
                order = self._kept_after_home(order)
            try:
                shard, lease = self.leases.pick_free(order, self.holder)
            except NoFreeShard:
                continue
            self._hold(lease)
            return shard
        raise NoFreeShard([opts.shard_for(pid)], [], 0.0, fix=(
            f"Slots {pid}..{pid + POOL_WINDOW * POOL_WINDOWS - 1} of writer group "
            f"'{opts.writer_group}' are all leased by live writers: fewer tasks at once, "
            "or another writer_group"))

    def _lease_from_bounded_pool(self, n: int) -> str:
        """Lease one of the ``n`` shards (``num_shards``), waiting while all are held.

        Waiting for this job's own tasks has no limit: they run and release
        their shards when done (a dead one's lease expires). Only the time
        another job holds part of the pool counts against ``lease_wait_s``.
        """
        opts, holder, leases = self.opts, self.holder, self.leases
        pool = self._kept_after_home([opts.shard_for(holder.partition + i) for i in range(n)],
                                     within=True)
        if self._continue_kept(pool[0]):
            return pool[0]
        shard = self._lease_kept_instead(pool[0], pool)
        if shard is not None:
            return shard
        waited, delay = 0.0, 0.05
        while True:
            try:
                shard, lease = leases.pick_free(pool, holder)
            except NoFreeShard as exc:
                others = [x for x in exc.leases if x.holder.job_id != holder.job_id]
                if others and waited >= opts.lease_wait_s:
                    raise NoFreeShard(exc.shards, exc.leases, waited, fix=(
                        f"Option 'num_shards' is {n}: at most {n} task(s) write writer group "
                        f"'{opts.writer_group}' of the table at {opts.path} at once, and a "
                        f"task waits up to lease_wait_s ({opts.lease_wait_s:g} s) while "
                        "other jobs hold them. Raise num_shards (or drop it), raise "
                        "lease_wait_s, or give the jobs different writer_group values")
                    ) from None
                hooks.point("lease.waiting", shard=pool[0], job_id=holder.job_id,
                            partition=holder.partition, waited_s=waited,
                            blocker_job_id=(others or exc.leases)[0].holder.job_id)
                pause = min(delay, opts.lease_wait_s - waited) if others else delay
                leases.sleep(pause)
                waited += pause if others else 0.0
                delay = min(delay * 2, leases.max_backoff_s)
                continue
            self._hold(lease)
            return shard

    def check(self) -> None:
        """Raise :class:`~memwal_datasource.shard.leases.LeaseLost` if the lease was lost."""
        if self.held is not None:
            self.held.check()

    def close(self) -> None:
        """Check the lease, then make the rows durable: keep the writer for the next
        task of this process where allowed, else close it."""
        self.check()
        if self.writer is None:
            return
        if self._going is not None and self._settle(closing=True):
            return
        if self.keepable:
            self.writer.flush()
            proved = self._proved()
            self.check()
            if not proved:
                # Another holder took the shard as we took it (a retry taking the lease
                # over, say). Correctness never rests on a lease: the fence check decides
                # whether the rows stand. The writer is not kept, and let go without
                # writing (its lease record was deleted; the next claim moves the replay
                # position past its entries).
                try:
                    self.writer.check_fence()
                finally:
                    if self.held is not None:  # None: our put lost to theirs, nothing held
                        self.held.abandon()
                    self.writer.abort()
                return
            kept = KeptWriter(self.shard, self.writer, self.held, job_id=self.holder.job_id,
                              partition=self.holder.partition, stamp=self.opts.table_stamp,
                              store=self.leases.store)
            # The fence check, as close() makes it (a fenced writer reports no success),
            # beside the idle lease record: one round trip on an object store. Either may
            # land first; a fenced writer is not given back, and its lease is released.
            _, lost = read_both(self.leases.store, self.writer.check_fence,
                                lambda: POOL.label_idle(kept))
            POOL.give(self.key, kept, labelled=True, lost=lost)
            self.kept = True
        else:
            self.writer.close()

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()

    def release(self) -> None:
        """Release the lease (best effort: an unreleased one expires by itself); a kept
        writer keeps it."""
        t0 = time.perf_counter()
        going, self._going = self._going, None
        if going is not None and not self._taken(going):  # a task that failed unsettled
            self._proof = None
            if self.held is not None:
                self.held.abandon()
                self.held = None
        if not self._proved() and self.held is not None:
            self.held.abandon()  # its record was deleted: nothing of ours to release
        if self.held is not None and not self.kept:
            self.held.release()
        self.lease_s += time.perf_counter() - t0
