"""The WAL-only writer: our asynchronous, batched, fenced pipeline (``enable_memtable=False``).

``put`` enqueues; a background flusher writes one WAL entry when
``max_wal_buffer_size`` bytes are pending or ``max_wal_flush_interval_ms`` has
passed. :func:`memwal_datasource.write.shard_writer.open_shard_writer` opens it (or
pylance's native MemTable writer, :mod:`memwal_datasource.write.native`); both
implement :class:`~memwal_datasource.shard.writer_base.ShardWriter`.

Opening a writer **writes**: it claims a new epoch on the shard manifest,
fencing any older writer, and may drop a fence sentinel at the WAL tip. A
writer that raises :class:`~memwal_datasource.errors.Fenced` must stop; reopen
only to take the shard back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass

import pyarrow as pa

from .. import hooks
from ..config import ShardWriterConfig
from ..errors import Fenced, MemWalError, WriterStalled, raised_again
from ..format.memwal import FieldId, encode_wal_buffer, wal_entry_schema
from .wal import WalAppender
from .writer_base import FlushTiming, ShardWriter, WriterStats, as_batches, check_schema

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    batch: pa.RecordBatch
    nbytes: int
    seq: int
    enqueued: float


class WalOnlyShardWriter(ShardWriter):
    """Our asynchronous, batched, fenced WAL-only writer."""

    def __init__(self, appender: WalAppender, schema: pa.Schema, config: ShardWriterConfig,
                 field_ids: Mapping[str, FieldId] | None = None):
        self._appender = appender
        # What entries carry: the table's Lance field ids and a _tombstone column.
        self._entry_schema = wal_entry_schema(schema, field_ids)
        self._codec = config.wal_codec(appender.store.remote)
        # Without durable_write a put need not be durable when it returns, so the PUT
        # path skips fsyncs: a sync thread makes landed entries durable behind it
        # (so the disk works while the next entry is encoded and written), and
        # flush() and close() return only once everything is durable.
        appender.sync_each = config.durable_write
        self.shard_id = appender.shard_id
        self.epoch = appender.epoch
        self.schema = schema
        self.config = config
        self._cond = threading.Condition()
        self._pending: deque[_Pending] = deque()
        self._pending_bytes = 0
        self._seq = 0  # last sequence number handed to a put
        self._durable_seq = 0  # every put with seq <= this is durable
        self._flush_upto = 0  # a flush() asked for everything up to this seq
        self._error: BaseException | None = None
        self._closing = False
        self._taken = 0  # items at the queue's front already cut into an entry
        self._taken_bytes = 0
        self._inflight: futures.Future | None = None
        self._blocked = False  # a put waits for queue room (backpressure)
        self._putter = futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"memwal-put-{appender.shard_id[:8]}")
        self._syncer = None if config.durable_write else futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"memwal-sync-{appender.shard_id[:8]}")
        self._stats = WriterStats(self.shard_id, self.epoch, "wal_only",
                                  next_wal_entry_position=appender.next_position,
                                  sentinel_position=appender.sentinel_position)
        self._thread = threading.Thread(
            target=self._run, name=f"memwal-flusher-{self.shard_id[:8]}", daemon=True
        )
        self._thread.start()

    # -- public API ---------------------------------------------------------

    def put(self, batches) -> None:
        with self._cond:  # a fenced or poisoned writer refuses every put, even an empty one
            self._raise_if_failed()
        items = [check_schema(self.shard_id, self.schema, b) for b in as_batches(batches)]
        items = [b for b in items if b.num_rows]
        if not items:
            return
        with self._cond:
            self._raise_if_failed()
            if self._closing:
                raise MemWalError(f"shard {self.shard_id}: put after close")
            for batch in items:
                nbytes = batch.get_total_buffer_size()
                self._backpressure(nbytes)
                self._seq += 1
                self._pending.append(_Pending(batch, nbytes, self._seq, time.monotonic()))
                self._pending_bytes += nbytes
                self._stats.rows += batch.num_rows
                self._stats.bytes += nbytes
                self._stats.rows_not_durable += batch.num_rows
            self._stats.puts += 1
            self._cond.notify_all()
            if self.config.durable_write:
                seq = self._seq
                self._wait(lambda: self._durable_seq >= seq, "waiting for a durable WAL entry")

    def flush(self) -> None:
        with self._cond:
            self._raise_if_failed()
            seq = self._seq
            self._flush_upto = max(self._flush_upto, seq)
            self._cond.notify_all()
            self._wait(lambda: self._durable_seq >= seq, "flushing")
        # Every entry up to seq has landed; sync() also waits for a sync in flight.
        self._sync()
        self._raise_if_failed()

    def check_fence(self) -> None:
        """Raise :class:`Fenced` if a newer epoch took the shard since this writer's
        last append (a kept writer checks before another task uses it)."""
        with self._cond:
            self._raise_if_failed()
        self._appender.check_fence()

    def _backpressure(self, nbytes: int) -> None:
        """Wait (holding the condition) until ``nbytes`` more fit in the queue."""
        limit = self.config.max_unflushed_memtable_bytes
        if not self._pending or self._pending_bytes + nbytes <= limit:
            return
        self._blocked = True  # the flusher cuts an entry now rather than at the interval
        self._cond.notify_all()
        try:
            self._wait(lambda: not self._pending or self._pending_bytes + nbytes <= limit,
                       "backpressure: queued bytes at max_unflushed_memtable_bytes")
        finally:
            self._blocked = False

    def _sync_behind(self) -> None:
        """Hand the sync thread the entries that landed (without durable_write): their
        data only, since the directory changes with every entry; flush/close sync it."""
        try:
            self._syncer.submit(self._sync, False)
        except RuntimeError:  # shut down: close() has synced or is syncing them
            pass

    def _sync(self, names: bool = True) -> None:
        try:
            self._appender.sync(names=names)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
            self._fail(exc)

    def close(self) -> None:
        with self._cond:
            if self._closing and not self._thread.is_alive():
                self._raise_if_failed()
                return
            self._closing = True
            self._cond.notify_all()
        self._join()
        self._sync()  # the PUT thread is done: nothing appends any more
        if self._syncer is not None:
            self._syncer.shutdown(wait=False)
        with self._cond:
            self._raise_if_failed()
        if self._stats.rows:
            # A writer that stalled across a newer claim (a retried attempt, a garbage
            # collection that freed the slots it then wrote) must not report success.
            # The same manifest update moves the replay position past our entries, so
            # no native opener replays them (see WalAppender.release_replay).
            self._appender.release_replay()
        hooks.point("writer.closed", shard=self.shard_id, epoch=self.epoch)

    def abort(self) -> None:
        with self._cond:
            self._closing = True
            if self._error is None:
                self._error = MemWalError(f"shard {self.shard_id}: writer aborted")
            self._cond.notify_all()
        self._join()
        if self._syncer is not None:
            self._syncer.shutdown(wait=False)

    def _join(self) -> None:
        """Wait for the flusher, but not forever on a PUT that never returns."""
        deadline = time.monotonic() + self.config.backpressure_timeout_ms / 1000.0
        self._thread.join(self.config.backpressure_timeout_ms / 1000.0)
        inflight = self._inflight
        if inflight is not None:  # let a released PUT land before we report
            futures.wait([inflight], max(0.0, deadline - time.monotonic()))
        self._putter.shutdown(wait=False)
        if self._thread.is_alive() or (inflight is not None and not inflight.done()):
            with self._cond:
                if self._error is None:
                    self._error = WriterStalled(
                        f"shard {self.shard_id}: the WAL flusher did not finish within "
                        "backpressure_timeout_ms; a PUT is hanging")
                raise self._error

    def stats(self) -> WriterStats:
        with self._cond:
            s = self._stats.copy()
            s.next_wal_entry_position = self._appender.next_position
            s.first_wal_position = self._appender.first_position
            s.last_wal_position = self._appender.last_position
            return s

    # -- internals ------------------------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise raised_again(self._error)

    def _wait(self, ready, what: str) -> None:
        """Wait on the condition until ``ready()``; surface errors and stalls."""
        timeout = self.config.backpressure_timeout_ms / 1000.0
        progress = self._durable_seq
        deadline = time.monotonic() + timeout
        while not ready():
            self._raise_if_failed()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # Terminal, like Fenced: a caller retrying the put could
                # otherwise duplicate rows that are still queued.
                self._error = WriterStalled(
                    f"shard {self.shard_id}: no WAL entry became durable for "
                    f"{timeout:.1f}s while {what} (backpressure_timeout_ms); "
                    f"{self._stats.rows_not_durable} queued rows are not durable"
                )
                self._cond.notify_all()
                raise self._error
            self._cond.wait(remaining)
            if self._durable_seq != progress:  # progress resets the stall clock
                progress = self._durable_seq
                deadline = time.monotonic() + timeout
        self._raise_if_failed()

    def _untaken(self) -> int:
        return len(self._pending) - self._taken

    def _due(self, now: float) -> bool:
        """Should the flusher cut the next entry from the untaken queue now?"""
        if not self._untaken():
            return False
        cut = self._pending[self._taken - 1].seq if self._taken else self._durable_seq
        if self._closing or self._flush_upto > cut:
            return True
        if self._pending_bytes - self._taken_bytes >= self.config.max_wal_buffer_size:
            return True
        if self._blocked and not self._taken:
            return True  # a put waits for room and no entry in flight will free any
        if self.config.durable_write and self._inflight is None:
            # Group commit: a put is waiting and the log is idle, so write now;
            # puts that arrive during this PUT are batched into the next entry.
            return True
        oldest = self._pending[self._taken].enqueued
        return now - oldest >= self.config.max_wal_flush_interval_ms / 1000.0

    def _run(self) -> None:
        """Cut, encode and hand entries to the PUT thread, strictly in order.

        Two stages: while one entry's PUT is in flight (fsync and network wait
        release the GIL), the next entry is cut and encoded.
        """
        interval = self.config.max_wal_flush_interval_ms / 1000.0
        while True:
            with self._cond:
                while not self._due(time.monotonic()):
                    if self._error is not None:
                        return
                    if self._closing and not self._untaken():
                        while self._inflight is not None and self._error is None:
                            self._cond.wait()
                        return
                    wait = None
                    if self._untaken():
                        oldest = self._pending[self._taken].enqueued
                        wait = max(0.0, oldest + interval - time.monotonic())
                    self._cond.wait(wait)
                if self._error is not None:
                    return
                # Take (but do not remove) batches until at least one buffer's
                # worth, as Lance cuts entries: a failed append leaves them queued,
                # never dropped.
                take, size = [], 0
                for i in range(self._taken, len(self._pending)):
                    item = self._pending[i]
                    take.append(item)
                    size += item.nbytes
                    if size >= self.config.max_wal_buffer_size:
                        break
                self._taken += len(take)
                self._taken_bytes += size
                previous = self._inflight
            started = time.monotonic()
            try:
                data = encode_wal_buffer(self._entry_schema, [p.batch for p in take],
                                         self.epoch, compression=self._codec)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting put
                self._fail(exc)
                return
            if previous is not None:
                futures.wait([previous])  # appends stay strictly ordered
            with self._cond:
                if self._error is not None:
                    return
                fut = self._putter.submit(self._appender.append_encoded, data)
                self._inflight = fut
                fut.add_done_callback(
                    lambda f, t=take, n=size, st=started: self._landed(f, t, n, st))
            # This thread now waits, perhaps long (a writer kept between tasks): its frame
            # must not hold the entry's rows and bytes (nor the future whose callback
            # does) until the next entry. In a Spark worker they were one task's rows
            # kept per writer, and objects for the daemon's collection to walk.
            take = item = data = fut = previous = None  # noqa: F841

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()
        # A fenced writer is the protocol working (a newer epoch took the shard; its
        # caller decides what that costs): not an error of this writer's.
        (log.info if isinstance(exc, Fenced) else log.error)(
            "shard %s: WAL flush failed: %s", self.shard_id, exc)

    def _landed(self, fut: futures.Future, take: list[_Pending], size: int,
                started: float) -> None:
        """PUT-thread callback: the entry is durable (or the writer has failed)."""
        exc = fut.exception()
        if exc is not None:
            with self._cond:
                if self._inflight is fut:
                    self._inflight = None
            self._fail(exc)
            return
        res = fut.result()
        done = time.monotonic()
        with self._cond:
            if self._inflight is fut:
                self._inflight = None
            for _ in take:
                self._pending.popleft()
            self._taken -= len(take)
            self._taken_bytes -= size
            self._pending_bytes -= size
            self._durable_seq = take[-1].seq
            rows = sum(p.batch.num_rows for p in take)
            self._stats.wal_entries += 1
            self._stats.wal_bytes += res.nbytes
            self._stats.rows_durable += rows
            self._stats.rows_not_durable -= rows
            self._stats.add_flush(FlushTiming(
                queue_wait_s=started - take[0].enqueued,
                put_s=res.put_seconds, total_s=done - take[0].enqueued, rows=rows,
                nbytes=res.nbytes, position=res.position))
            self._cond.notify_all()
        if self._syncer is not None:
            self._sync_behind()
