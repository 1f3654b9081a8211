"""Any DataFrame writes a sharded (primary-key) table: route, spill, take turns.

Spark's Python writers cannot ask Spark for a distribution, so the tasks of
an unprepared DataFrame each hold rows of shards their siblings (the job's
other tasks) hold too. Lance's rule is one key, one shard, one writer at a
time, so the tasks of a job **take turns per shard**:

* **Streaming.** Each batch is split by the table's sharding spec
  (:meth:`~memwal_datasource.table.sharding.Sharding.route`). A task writes a
  shard directly when it holds its lease or can take it now (never
  waiting). Rows of a shard a sibling or another job holds go to an
  executor-local Arrow IPC file, one per shard (:class:`SpillFiles`), not to
  memory; once a shard spills, its later rows spill too, so a shard's rows
  keep their order.
* **Turns.** When the input ends, the task closes the shards it wrote
  (rows durable) and releases them. Then it writes each spilled shard in
  turn: take its lease (waiting, holding nothing, while a sibling or
  another job has it), open a writer (**a new epoch claim**, which fences
  every older writer of the shard), write the spilled rows, close, release,
  next. A task never waits while it holds a shard, so no two tasks (of one
  job or of two) can wait for each other. Waiting for a sibling is bounded
  by the job's own progress (the sibling releases the shard when its turn
  ends; a dead one's lease expires after ``lease_ttl_s``); waiting for
  another job by ``lease_wait_s``. Each task goes round its spilled shards
  from its own starting point (:func:`stagger`), and takes whichever is free
  first, so tasks do not queue behind one another.
* **Results.** One :class:`ShardResult` per turn: (shard, epoch, WAL
  range). On one shard a later turn has a higher epoch and higher WAL
  positions (it claimed after the earlier turn closed), and in MemTable mode
  newer SSTable generations. So within one job a key several tasks wrote
  keeps the row of the **last turn on its shard**: the highest WAL position,
  the newest generation, as Lance's LSM readers decide.

A prepared DataFrame (:func:`~memwal_datasource.spark.routing.partition_for_table`)
never spills: each task's shards are its own. Exactly once is unchanged:
every turn is a claim, an older attempt is fenced by a newer one's claim,
and the driver commits one attempt's ranges per task
(:func:`check_job_ranges` refuses a job whose ranges could only come from a
broken fence).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .. import hooks
from ..errors import Fenced
from ..format.table_schema import primary_key_of
from ..log.commit import CommittedRange
from ..shard.leases import HeldLease, Holder, Lease, LeaseHeld, Leases
from ..shard.manifest import ManifestStore
from ..shard.writer_base import ShardWriter, check_schema
from ..store import open_store
from ..table.sharding import ShardConflict, initialize_shard
from ..write.shard_writer import open_shard_writer
from .deletes import tombstone_schema, tombstones
from .options import WriteOptions

log = logging.getLogger("memwal_datasource")

SPILL_BUFFER = 256 << 10  # write buffer per open spill file
SPILL_OPEN_FILES = 64  # open spill files per task, at most


@dataclass
class ShardResult:
    """What a task wrote to one shard of a sharded table in one turn (one epoch)."""

    shard_id: str
    epoch: int
    first_position: int | None
    last_position: int | None
    rows: int
    bytes: int
    wal_entries: int
    sstables: list[str] = field(default_factory=list)
    value: str = ""  # the sharding value, for messages

    def committed_range(self, partition_id: int, attempt: int) -> CommittedRange | None:
        """The range to list in the commit record (None if nothing was written)."""
        if self.first_position is None:
            return None
        return CommittedRange(self.shard_id, self.epoch, self.first_position,
                              self.last_position or self.first_position, self.rows, self.bytes,
                              partition_id, attempt, tuple(self.sstables))


def open_shard(opts: WriteOptions, shard_id: str, schema: pa.Schema,
               value: Any = None) -> ShardWriter:
    """Open one shard for this task: the one place a task opens a shard (a new epoch claim).

    On a sharded table the shard first records its sharding identity (spec id
    and field entries, as Lance's format defines them).
    """
    # One chain object for the whole open: after the first read, each step re-checks
    # the version it knows (one round trip) instead of reading the chain anew.
    manifests = ManifestStore(open_store(opts.path, opts.storage), shard_id,
                              retries=opts.config.max_wal_persist_retries,
                              retry_base_delay_ms=opts.config.wal_persist_retry_base_delay_ms)
    if opts.sharding is not None:
        initialize_shard(manifests.store, opts.sharding, shard_id, value, manifests)
    return open_shard_writer(opts.path, shard_id, schema, opts.config, opts.storage,
                             field_ids=opts.field_ids, manifests=manifests)


def stagger(shards, partition: int) -> list[str]:
    """``shards`` sorted, rotated to start at index ``partition`` mod their count.

    Every task sees the same order, each from its own starting point, so
    tasks of one job start on different shards instead of queueing on one.
    """
    order = sorted(shards)
    if not order:
        return order
    k = partition % len(order)
    return order[k:] + order[:k]


def spill_root(partition: int) -> str | None:
    """Where a task spills: one of Spark's local dirs (as pyspark's own spills), else tempdir."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    return dirs[partition % len(dirs)] if dirs else None


class SpillFiles:
    """Rows waiting for a shard, in Arrow IPC stream files on executor-local disk.

    The directory is made at the first spilled row and deleted by
    :meth:`close` (the task's end, success or not). Rows are written as they
    come and read back batch by batch. At most :data:`SPILL_OPEN_FILES` files
    are open at once (a table may have 1,024 buckets): a shard whose file was
    closed to make room continues in a new segment file, read after the
    earlier ones, so memory (a small write buffer per open file) and file
    descriptors stay bounded.
    """

    def __init__(self, schema: pa.Schema, partition: int = 0):
        self.schema = schema
        self.partition = partition
        self.dir: str | None = None
        self._open: OrderedDict[str, tuple[Any, Any]] = OrderedDict()  # LRU: sink, writer
        self._segments: dict[str, list[str]] = {}
        self.rows: dict[str, int] = {}
        self.bytes = 0

    def __contains__(self, shard: str) -> bool:
        return shard in self.rows

    def add(self, shard: str, batch: pa.RecordBatch) -> None:
        """Append ``batch`` (of :attr:`schema`) to ``shard``'s rows."""
        if shard in self._open:
            self._open.move_to_end(shard)
        else:
            if self.dir is None:
                self.dir = tempfile.mkdtemp(prefix="memwal-spill-",
                                            dir=spill_root(self.partition))
            if len(self._open) >= SPILL_OPEN_FILES:
                self._close_file(next(iter(self._open)))
            segments = self._segments.setdefault(shard, [])
            segments.append(os.path.join(self.dir, f"{shard}.{len(segments)}.arrows"))
            sink = pa.BufferedOutputStream(pa.OSFile(segments[-1], "wb"), SPILL_BUFFER)
            self._open[shard] = (sink, pa.ipc.new_stream(sink, self.schema))
            self.rows.setdefault(shard, 0)
        self._open[shard][1].write_batch(batch)
        self.rows[shard] += batch.num_rows
        self.bytes += batch.get_total_buffer_size()

    def _close_file(self, shard: str) -> None:
        sink, writer = self._open.pop(shard)
        writer.close()
        sink.close()

    def shards(self) -> list[str]:
        """Shards with spilled rows."""
        return list(self.rows)

    def read(self, shard: str, chunk_bytes: int) -> Iterator[list[pa.RecordBatch]]:
        """``shard``'s rows in order, in chunks of about ``chunk_bytes``; deletes its files."""
        if shard in self._open:
            self._close_file(shard)
        chunk, size = [], 0
        for path in self._segments.pop(shard):
            with pa.OSFile(path) as f:
                for batch in pa.ipc.open_stream(f):
                    chunk.append(batch)
                    size += batch.get_total_buffer_size()
                    if size >= chunk_bytes:
                        yield chunk
                        chunk, size = [], 0
            os.remove(path)
        if chunk:
            yield chunk
        del self.rows[shard]

    def close(self) -> None:
        """Close and delete every file (best effort: it is scratch space)."""
        for sink, writer in self._open.values():
            for closable in (writer, sink):
                try:
                    closable.close()
                except Exception:  # noqa: BLE001 - deleted next anyway
                    pass
        self._open.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class ShardTurns:
    """One task's writes to a sharded table: direct where it can, spilled and in turns where not.

    :meth:`write` runs the whole task (see the module docstring); the
    counters (``lease_s``, ``open_s``, ``input_done``, ``spilled_rows``,
    ``turns``) are for the commit message and logs.
    """

    def __init__(self, opts: WriteOptions, schema: pa.Schema, holder: Holder, leases: Leases):
        assert opts.sharding is not None
        self.opts = opts
        self.holder = holder
        self.leases = leases
        self.keys = tuple(primary_key_of(schema))
        self.schema = tombstone_schema(schema) if opts.delete else schema
        self.held: dict[str, HeldLease] = {}
        self.writers: dict[str, ShardWriter] = {}
        self.values: dict[str, Any] = {}
        self.spill = SpillFiles(self.schema, holder.partition)
        self.results: list[ShardResult] = []
        self.lease_s = 0.0
        self.open_s = 0.0
        self.input_done = 0.0  # perf_counter() when the input ended
        self.spilled_rows = 0
        self.turns = 0

    # -- the task ------------------------------------------------------------------------

    def write(self, batches) -> list[ShardResult]:
        """Write every batch, then the spilled shards in turns; one result per turn."""
        try:
            for batch in batches:
                self.check()
                self.put(batch)
            self.input_done = time.perf_counter()
            self.close_direct()
            self.take_turns()
        except Fenced as exc:
            self.abort()
            raise ShardConflict(
                f"Let Spark retry the task (it does by itself): {exc}. A newer writer claimed "
                "this shard while this task wrote it, which only another attempt of this task "
                "or a writer without a lease (a lease lost for a whole lease_ttl_s) does; "
                "this attempt's rows are not committed") from exc
        except BaseException:
            self.abort()
            raise
        finally:
            self.release_all()
            self.spill.close()
        return self.results

    def put(self, batch: pa.RecordBatch) -> None:
        """Route ``batch``: rows of held (or free) shards are written, the rest spill."""
        routed = self.opts.sharding.route(batch)
        for shard in stagger(routed, self.holder.partition):
            value, part = routed[shard]
            self.values.setdefault(shard, value)
            rows = tombstones(part, self.schema, self.keys) if self.opts.delete else part
            writer = self.writers.get(shard)
            if writer is None and shard not in self.spill and self._take_now(shard):
                writer = self.writers[shard]
            if writer is not None:
                writer.put(rows)
            else:
                self.spill.add(shard, check_schema(shard, self.schema, rows))
                self.spilled_rows += rows.num_rows

    def _take_now(self, shard: str) -> bool:
        """Lease and open ``shard`` if nobody else holds it; never waits."""
        t0 = time.perf_counter()
        lease, _blocker = self.leases.try_take(shard, self.holder)
        self.lease_s += time.perf_counter() - t0
        if lease is None:
            return False
        self._open(shard, lease)
        return True

    def _open(self, shard: str, lease: Lease) -> ShardWriter:
        self.held[shard] = self.leases.hold(lease)
        t0 = time.perf_counter()
        writer = self.writers[shard] = open_shard(self.opts, shard, self.schema,
                                                  self.values[shard])
        self.open_s += time.perf_counter() - t0
        return writer

    def _close(self, shard: str) -> None:
        """Close ``shard``'s writer (rows durable), record its turn, release its lease."""
        self.held[shard].check()
        writer = self.writers[shard]
        writer.close()
        del self.writers[shard]
        s = writer.stats()
        self.results.append(ShardResult(
            shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows, s.bytes,
            s.wal_entries, list(s.sstables), repr(self.values[shard])))
        self._release(shard)

    def close_direct(self) -> None:
        """End of input: close every shard written directly, releasing each at once."""
        for shard in list(self.writers):
            self._close(shard)

    def take_turns(self) -> None:
        """Write each spilled shard in turn, holding one shard at a time (see the module doc)."""
        order = stagger(self.spill.shards(), self.holder.partition)
        i, waited, delay = 0, 0.0, 0.05
        while order:
            blockers: list[tuple[str, Lease]] = []
            for n in range(len(order)):
                shard = order[(i + n) % len(order)]
                t0 = time.perf_counter()
                lease, blocker = self.leases.try_take(shard, self.holder)
                self.lease_s += time.perf_counter() - t0
                if lease is not None:
                    i = (i + n) % len(order)
                    order.pop(i)
                    self._turn(shard, lease)
                    delay = 0.05
                    break
                assert blocker is not None
                blockers.append((shard, blocker))
            else:
                waited += self._wait(blockers, waited, delay)
                delay = min(delay * 2, self.leases.max_backoff_s)

    def _wait(self, blockers: list[tuple[str, Lease]], waited: float, delay: float) -> float:
        """Every remaining shard is held: wait a little (holding nothing). Returns the time
        that counts against ``lease_wait_s`` (waiting for other jobs only)."""
        others = [(s, b) for s, b in blockers if b.holder.job_id != self.holder.job_id]
        limit = self.opts.lease_wait_s
        if others and waited >= limit:
            shard, blocker = others[0]
            raise LeaseHeld(shard, blocker, waited, detail=f"value {self.values[shard]!r}", fix=(
                "Jobs on one primary-key table take turns per shard: run this job after "
                f"'{job_name(blocker)}' finishes, or raise lease_wait_s (now {limit:g} s)"))
        shard, blocker = (others or blockers)[0]
        hooks.point("lease.waiting", shard=shard, job_id=self.holder.job_id,
                    partition=self.holder.partition, waited_s=waited,
                    blocker_job_id=blocker.holder.job_id)
        pause = min(delay, limit - waited) if others else delay
        t0 = time.perf_counter()
        self.leases.sleep(pause)
        self.lease_s += time.perf_counter() - t0
        return pause if others else 0.0

    def _turn(self, shard: str, lease: Lease) -> None:
        """One turn: open (a new epoch), write the spilled rows, close, release."""
        writer = self._open(shard, lease)
        self.turns += 1
        for chunk in self.spill.read(shard, self.opts.config.max_wal_buffer_size):
            self.held[shard].check()
            writer.put(chunk)
        hooks.point("turn.written", shard=shard, epoch=writer.epoch, job_id=self.holder.job_id,
                    partition=self.holder.partition, attempt=self.holder.attempt)
        self._close(shard)

    # -- leases and failures ---------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`~memwal_datasource.shard.leases.LeaseLost` if a held lease was lost."""
        for held in self.held.values():
            held.check()

    def _release(self, shard: str) -> None:
        t0 = time.perf_counter()
        self.held.pop(shard).release()
        self.lease_s += time.perf_counter() - t0

    def release_all(self) -> None:
        """Release every lease still held (best effort: an unreleased one expires)."""
        for shard in list(self.held):
            self._release(shard)

    def abort(self) -> None:
        """Abandon every open writer (the task is failing; nothing it wrote is committed)."""
        for writer in self.writers.values():
            writer.abort()
        self.writers.clear()


def job_name(lease: Lease | None) -> str:
    """The job holding ``lease``, as people know it."""
    if lease is None:
        return "the other job"
    return lease.holder.label or f"job {lease.holder.job_id}"


def check_job_ranges(path: str, ranges: list[CommittedRange], *,
                     kept_writers: bool = False) -> list[CommittedRange]:
    """The job's ranges in WAL order per shard, or a refusal of what fencing rules out.

    Several tasks may write one shard (in turns), each turn with its own
    epoch. On one shard the ranges must not overlap and their epochs must
    not fall as their positions rise: a later turn claimed after the earlier
    one closed (or, on unsharded pools, is the same kept writer: same epoch).
    Anything else means a writer wrote after a newer claim, so the job is
    refused and nothing is committed. Returned sorted by (shard,
    first position), the order readers apply.
    """
    ordered = sorted(ranges, key=lambda r: (r.shard_id, r.first))
    for a, b in zip(ordered, ordered[1:], strict=False):
        # With ``kept_writers`` (unsharded pools) the same epoch twice is one writer
        # serving two tasks in turn (memwal_datasource.write.writer_pool): positions still rise.
        older = b.epoch < a.epoch if kept_writers else b.epoch <= a.epoch
        if a.shard_id == b.shard_id and (b.first <= a.last or older):
            raise ShardConflict(
                f"Run the job again (nothing was committed; the table at {path} is unchanged): "
                f"two of its writes to shard {a.shard_id} break the fencing order, positions "
                f"{a.first}..{a.last} with epoch {a.epoch} (task {a.task}, attempt {a.attempt}) "
                f"and {b.first}..{b.last} with epoch {b.epoch} (task {b.task}, attempt "
                f"{b.attempt}); a later write must have a higher epoch and higher positions")
    return ordered
