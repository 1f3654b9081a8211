"""Spark write path: one ShardWriter per task, one commit record per job.

The writer object is built on the driver and pickled to executors, so it
holds only plain settings; stores, clients and files are created inside
``write()``.

A task leases each shard (:mod:`memwal_datasource.shard.leases`) before it claims it
and releases it after closing, so live writers never fence each other; the
epoch claim still fences any older writer, so a lost lease costs a retry,
never rows. Without a sharding spec a task writes one shard of its writer
group's pool (:mod:`memwal_datasource.spark.pool_shard`); with one, it writes
every shard its rows select, taking turns with the job's other tasks
(:mod:`memwal_datasource.spark.shard_turns`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..log.commit import (
    APPEND,
    COMMITTED,
    OVERWRITE,
    CommitLog,
    CommitRecord,
    CommittedRange,
    Txn,
    stream_app_id,
)
from ..shard.leases import Holder, Leases
from ..store import open_store
from ..table.table_info import TableInfo
from ..table.view import TableView
from ..write.rehome import DRIVER_PARTITION, Rehomer
from . import looks
from .options import WriteOptions
from .pool_shard import PoolShard
from .prepare import prepare_writer_options
from .shard_turns import ShardResult, ShardTurns, check_job_ranges
from .worker_entry import entry_point
from .worker_socket import prompted

__all__ = ["MemWalBatchWriter", "MemWalCommitMessage", "MemWalStreamWriter", "ShardResult",
           "TaskJob", "commit_job", "write_task"]

log = logging.getLogger("memwal_datasource")

# Spark sets this local property on a micro-batch's tasks.
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class MemWalCommitMessage(WriterCommitMessage):
    """What one task wrote: enough for the driver to commit it.

    A task of a table without a sharding spec writes one shard (the fields
    ``shard_id`` .. ``sstables``); a task of a sharded table may write several,
    listed in ``shards`` (the top-level shard fields are then unset and the
    counters are totals).
    """

    partition_id: int
    attempt: int
    shard_id: str | None
    epoch: int
    first_position: int | None
    last_position: int | None
    rows: int
    bytes: int
    wal_entries: int
    sstables: list[str] = field(default_factory=list)
    open_s: float = 0.0
    write_s: float = 0.0
    close_s: float = 0.0
    shards: list[ShardResult] = field(default_factory=list)
    started: float = 0.0  # time.time() when the task started
    lease_s: float = 0.0  # taking (and waiting for) and releasing shard leases

    def committed_range(self) -> CommittedRange | None:
        """The range to list in the commit record (None for an empty task)."""
        if self.shard_id is None:
            return None
        return ShardResult(self.shard_id, self.epoch, self.first_position, self.last_position,
                           self.rows, self.bytes, self.wal_entries, self.sstables
                           ).committed_range(self.partition_id, self.attempt)

    def committed_ranges(self) -> list[CommittedRange]:
        """Every range this task wrote (one per shard)."""
        ranges = ([s.committed_range(self.partition_id, self.attempt) for s in self.shards]
                  if self.shards else [self.committed_range()])
        return [r for r in ranges if r is not None]


@dataclass(frozen=True)
class TaskJob:
    """The job a task writes for, as its shard leases name it.

    ``started_ms`` is the job's age for wait-die (older jobs wait, younger
    ones yield).
    """

    job_id: str
    label: str
    started_ms: int

    @classmethod
    def new(cls) -> TaskJob:
        """A job of its own (a direct :func:`write_task` call)."""
        job_id = uuid.uuid4().hex
        return cls(job_id, f"job {job_id}", int(time.time() * 1000))


def write_task(opts: WriteOptions, schema: pa.Schema, batches: Iterator[pa.RecordBatch],
               job: TaskJob | None = None, partition: int | None = None,
               attempt: int | None = None) -> MemWalCommitMessage:
    """Stream one task's batches into its shard(s); runs on an executor.

    Without a sharding spec the task leases a free shard of its writer group
    before its first row (an empty partition leases and writes nothing). With
    one, each row goes to the shard of its sharding value, and the task takes
    turns with the job's other tasks on shards they share
    (:class:`~memwal_datasource.spark.shard_turns.ShardTurns`). ``job`` names
    the job in the leases (a job of its own if not given); ``partition`` and
    ``attempt`` default to Spark's task context's (0 outside a task).
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    pid = partition if partition is not None else ctx.partitionId() if ctx else 0
    if attempt is None:
        attempt = ctx.attemptNumber() if ctx else 0
    job = job or TaskJob.new()
    holder = Holder(job.job_id, pid, attempt, label=job.label, job_started_ms=job.started_ms)
    leases = Leases(open_store(opts.path, opts.storage), ttl_s=opts.lease_ttl_s)
    started, t0 = time.time(), time.perf_counter()
    if opts.sharding is not None:
        turns = ShardTurns(opts, schema, holder, leases)
        results = turns.write(batches)
        setup_s = turns.open_s + turns.lease_s
        if turns.spilled_rows:
            log.info("memwal task %d attempt %d: %d rows waited for shards other tasks held "
                     "(spilled to local disk), written in %d turn(s)", pid, attempt,
                     turns.spilled_rows, turns.turns)
        return MemWalCommitMessage(
            partition_id=pid, attempt=attempt, shard_id=None, epoch=0, first_position=None,
            last_position=None, rows=sum(r.rows for r in results),
            bytes=sum(r.bytes for r in results),
            wal_entries=sum(r.wal_entries for r in results), shards=results,
            open_s=setup_s, write_s=turns.input_done - t0 - setup_s,
            close_s=time.perf_counter() - turns.input_done, started=started,
            lease_s=turns.lease_s)
    pool = PoolShard(opts, holder, leases)
    try:
        for batch in batches:
            pool.check()
            if batch.num_rows:  # the pool's shard, leased at the first row
                pool.put(batch, schema)
        t1 = time.perf_counter()
        pool.close()
    except BaseException:
        pool.abort()
        raise
    finally:
        pool.release()
    if pool.writer is None:
        return MemWalCommitMessage(pid, attempt, None, 0, None, None, 0, 0, 0, started=started)
    s = pool.stats()
    setup_s = pool.open_s + pool.lease_s
    return MemWalCommitMessage(pid, attempt, pool.shard, s.epoch, s.first_wal_position,
                               s.last_wal_position, s.rows, s.bytes, s.wal_entries,
                               list(s.sstables), open_s=setup_s, write_s=t1 - t0 - setup_s,
                               close_s=time.perf_counter() - t1, started=started,
                               lease_s=pool.lease_s)


def commit_job(opts: WriteOptions, messages, kind: str, job_id: str, started: float,
               query_id: str | None = None, batch_id: int | None = None,
               txn: Txn | None = None, job_label: str | None = None,
               ahead: looks.Ahead | None = None) -> CommitRecord | None:
    """Write the job's one commit record and log a summary line.

    With ``txn`` (an idempotency key) a job whose key is already committed
    writes nothing and returns the earlier record. A micro-batch that wrote no
    rows writes no record and returns ``None``. On a sharded table a shard
    another writer overtook is re-homed (:mod:`memwal_datasource.write.rehome`);
    ``job_label`` names the job in its record and leases; ``ahead`` is the commit's
    first look, made while the tasks ran (:mod:`memwal_datasource.spark.looks`).
    """
    msgs = [m for m in messages if isinstance(m, MemWalCommitMessage)]
    # Per shard in WAL order: a later turn's rows win (see shard_turns).
    ranges = check_job_ranges(opts.path, [r for m in msgs for r in m.committed_ranges()],
                              kept_writers=opts.keep_writers and opts.sharding is None)
    label = f"{kind}{f' batch {batch_id}' if batch_id is not None else ''}"
    if query_id is not None and not ranges and kind == APPEND:
        log.info("memwal stream %s batch %s wrote no rows; nothing to commit", query_id, batch_id)
        return None
    job_label = job_label or f"job {job_id}"
    commits, look = looks.result(ahead) if opts.sharding is None and kind == APPEND \
        else (None, None)
    table = TableView(opts.path, opts.storage)
    append = commits.append if commits is not None else table.commits.append
    if opts.sharding is not None:
        # Sharded (primary-key) tables: a shard's writers commit in epoch order, so every
        # reader agrees on each key's newest value; an overtaken shard is re-homed.
        # Pools of unkeyed shards need no order.
        append = Rehomer(table, Holder(job_id, DRIVER_PARTITION, label=f"{job_label} (commit)",
                                       job_started_ms=int(started * 1000)),
                         opts.config, opts.lease_wait_s, opts.lease_ttl_s).append
    more = {"look": look} if look is not None else {}
    result = append(kind, ranges, job_id=job_id, writer_group=opts.writer_group,
                    query_id=query_id, batch_id=batch_id, txn=txn, extra={"label": job_label},
                    ordered_epochs=opts.sharding is not None, **more)
    rec = result.record
    if not result.created:
        log.warning("memwal %s: idempotency key %s version %d is already committed as record "
                    "%d (job %s); this run's rows are not committed again", label, txn.app_id,
                    txn.version, rec.sequence, rec.job_id)
        return rec
    # Wall time from the first task's start: a stream sink's writer object (and
    # so ``started``) is built once per query, not per micro-batch.
    starts = [m.started for m in msgs if m.started]
    log.info(
        "memwal commit %d (%s): %d tasks, %d rows, %d bytes, %d WAL entries, %.2fs wall, "
        "%.3fs max leasing, %s", rec.sequence, label, len(msgs), sum(m.rows for m in msgs),
        sum(m.bytes for m in msgs), sum(m.wal_entries for m in msgs),
        time.time() - (min(starts) if starts else started),
        max((m.lease_s for m in msgs), default=0.0), opts.describe())
    if opts.auto_maintain if opts.auto_maintain is not None else query_id is not None:
        # The maintainer's thread (and its first import) starts off the commit's path.
        threading.Thread(target=_wake_maintainer, args=(opts,), daemon=True).start()
    return rec


def _wake_maintainer(opts: WriteOptions) -> None:
    """Option ``auto_maintain``: wake this process's background maintainer of the table
    (:mod:`memwal_datasource.maintenance.auto`); a failure here never reaches a job."""
    try:
        from ..maintenance.auto import nudge

        nudge(opts.path, opts.storage, opts.maintain)
    except Exception as exc:  # noqa: BLE001 - maintenance is retried at the next commit
        log.warning("memwal: could not start automatic maintenance of %s: %s", opts.path, exc)


def _record_of(opts: WriteOptions, job_id: str) -> tuple[CommitRecord | None, bool]:
    """(the record that committed ``job_id``, whether the log could be searched).

    Searched from the newest record down to the oldest one stored (a stray below the
    released boundary is no record); a group record answers only if it committed the
    job's member (a refused or duplicate member committed nothing).
    """
    try:
        log_ = CommitLog(open_store(opts.path, opts.storage))
        for seq in range(log_.next_sequence() - 1, log_.first_stored() - 1, -1):
            rec = log_.read(seq)
            part = next((p for p in rec.parts() if p.job_id == job_id), None)
            if part is not None:
                return (rec if part.verdict == COMMITTED else None), True
            if rec.created_ms and rec.created_ms < (time.time() - 3600) * 1000:
                return None, True  # far older than any job still aborting
    except Exception as exc:  # noqa: BLE001 - only a log line depends on it
        log.debug("could not check the commit log for job %s: %s", job_id, exc)
        return None, False
    return None, True


class MemWalBatchWriter(DataSourceArrowWriter):
    """``df.write.format("memwal")``: tasks write shards, the driver commits once."""

    def __init__(self, opts: WriteOptions, schema: pa.Schema, overwrite: bool,
                 table: TableInfo | None = None):
        self.opts = prepare_writer_options(opts, schema, table)
        self.schema = schema
        self.overwrite = overwrite
        self.job_id = uuid.uuid4().hex
        self.started = time.time()
        if not overwrite:
            looks.start(self.job_id, self.opts)
        self.last_commit: CommitRecord | None = None
        # Built where the job is planned (the driver's host): what leases show others.
        self.job = TaskJob(self.job_id, f"job {self.job_id} from {socket.gethostname()}",
                           int(self.started * 1000))

    @entry_point
    def write(self, iterator: Iterator[pa.RecordBatch]) -> MemWalCommitMessage:
        return write_task(self.opts, self.schema, prompted(iterator), self.job)

    @entry_point
    def commit(self, messages) -> None:
        self.last_commit = commit_job(self.opts, messages, OVERWRITE if self.overwrite else APPEND,
                                      self.job_id, self.started, txn=self.opts.txn,
                                      job_label=self.job.label, ahead=looks.take(self.job_id))

    @entry_point
    def abort(self, messages) -> None:
        looks.take(self.job_id)
        done = [m for m in messages if isinstance(m, MemWalCommitMessage)]
        # Spark also aborts when the commit worker died after the record landed.
        landed, searched = _record_of(self.opts, self.job_id)
        if landed is not None:
            log.warning("memwal job %s: Spark reports the job failed, but its commit record "
                        "%d landed: its rows are committed", self.job_id, landed.sequence)
            return
        if not searched:
            log.warning("memwal job %s aborted after %d task(s) finished; the commit log could "
                        "not be read to check whether it committed: look the job up with "
                        "`memwal history`", self.job_id, len(done))
            return
        log.warning("memwal job %s aborted after %d task(s) finished; nothing committed, "
                    "readers still see the table as before", self.job_id, len(done))


class MemWalStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("memwal")``: one commit record per micro-batch.

    The record carries (query id, batch id); a batch Spark replays after a
    crash finds its record and is not committed twice.
    """

    def __init__(self, opts: WriteOptions, schema: pa.Schema, overwrite: bool, query_id: str,
                 table: TableInfo | None = None):
        self.opts = prepare_writer_options(opts, schema, table)
        self.schema = schema
        self.overwrite = overwrite
        self.query_id = query_id
        self.started = time.time()

    @entry_point
    def write(self, iterator: Iterator[pa.RecordBatch]) -> MemWalCommitMessage:
        return write_task(self.opts, self.schema, prompted(iterator), self.task_job())

    def task_job(self) -> TaskJob:
        """The job a micro-batch's task writes for: one job per batch, as its commit record.

        Its id is ``{query id}:{batch id}`` (the record's job id), so a task of
        a replayed batch takes over its earlier attempt's leases. Its age is
        when this writer object was built: Spark 4.3 builds one per
        micro-batch, so each batch is as old as its planning, like a batch job.
        """
        from pyspark import TaskContext

        ctx = TaskContext.get()
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None
        if batch is None:
            return TaskJob(self.query_id, f"stream {self.query_id}", int(self.started * 1000))
        return TaskJob(f"{self.query_id}:{batch}", f"stream {self.query_id} batch {batch}",
                       int(self.started * 1000))

    @entry_point
    def commit(self, messages, batchId: int) -> None:  # noqa: N803 - Spark's name
        # The key makes a batch Spark replays after a crash (or a record whose
        # acknowledgement was lost) commit once, checked against the whole log.
        commit_job(self.opts, messages, APPEND, f"{self.query_id}:{batchId}", self.started,
                   query_id=self.query_id, batch_id=batchId,
                   txn=Txn(stream_app_id(self.query_id), batchId),
                   job_label=f"stream {self.query_id} batch {batchId}")

    @entry_point
    def abort(self, messages, batchId: int) -> None:  # noqa: N803
        log.warning("memwal stream %s batch %d aborted; nothing committed", self.query_id,
                    batchId)
