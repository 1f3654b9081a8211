"""Spark write path: one ShardWriter per task, one commit record per job.

The writer object is built on the driver and pickled to executors, so it
holds only plain settings; stores, clients and files are created inside
``write()``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..commit import (
    APPEND,
    OVERWRITE,
    CommitLog,
    CommitRecord,
    CommittedRange,
    Txn,
    stream_app_id,
)
from ..errors import ConfigError, Fenced
from ..sharding import (
    PARTITION_FIX,
    ShardConflict,
    check_requested,
    initialize_shard,
    table_sharding,
)
from ..store import open_store
from ..table import TOMBSTONE, open_table, primary_key_of
from ..writer import ShardWriter, open_shard_writer
from .options import WriteOptions

log = logging.getLogger("memwal_datasource")


def _ensure_visible_logging() -> None:
    """Show our INFO summary lines where nobody configured logging.

    The driver's commit runs in a Python worker Spark starts, where Python
    logging is unconfigured and INFO lines would be dropped. An application
    that configures logging (any handler on root or on us) is left alone.
    """
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


@dataclass
class ShardResult:
    """What a task wrote to one shard of a sharded table."""

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


def _open_shard(opts: WriteOptions, shard_id: str, schema: pa.Schema,
                value: Any = None) -> ShardWriter:
    """Open one shard for this task: the one place a task opens a shard.

    On a sharded table the shard first records its sharding identity (spec id
    and field entries, as Lance's format defines them).
    """
    if opts.sharding is not None:
        initialize_shard(open_store(opts.path, opts.storage), opts.sharding, shard_id, value)
    return open_shard_writer(opts.path, shard_id, schema, opts.config, opts.storage)


def _close_shards(writers: dict[str, ShardWriter]) -> None:
    """Close every shard writer this task opened: the one place a task closes shards.

    Closing makes every row durable; if one close fails, the others are
    aborted and the error propagates (the task commits nothing).
    """
    pending = list(writers.values())
    try:
        while pending:
            pending[0].close()
            pending.pop(0)
    except BaseException:
        _abort_shards(pending[1:])
        raise


def _abort_shards(writers) -> None:
    """Abort shard writers after a failure: the one place a task abandons shards."""
    for w in writers:
        w.abort()


def placeholder(t: pa.DataType, n: int) -> pa.Array:
    """``n`` zero values of ``t``: what a delete marker holds in a non-nullable non-key column.

    Readers ignore a marker's non-key values; a null would break the column's
    declared nullability (and pylance's replay), so a zero value stands in.
    Raises ``ValueError`` for types without an obvious zero (nested types).
    """
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.array([""] * n, t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([b""] * n, t)
    if pa.types.is_boolean(t):
        return pa.array([False] * n, t)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return pa.array([0] * n, t)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.array([0] * n, pa.int32()).cast(t)
    if pa.types.is_temporal(t):
        return pa.array([0] * n, pa.int64()).cast(t)
    raise ValueError(f"no zero value for type {t}")


def tombstones(batch: pa.RecordBatch, schema: pa.Schema, keys: tuple[str, ...]) -> pa.RecordBatch:
    """Delete markers for the keys in ``batch``: key columns, then ``_tombstone=true``.

    ``schema`` is the writer's schema (the table's columns, then ``_tombstone``).
    Other columns hold nulls (zero values where the table declares them
    non-nullable); the DataFrame's other columns are ignored, as pylance's
    ``ShardWriter.delete`` ignores them.
    """
    n = batch.num_rows
    cols = []
    for f in schema:
        if f.name == TOMBSTONE:
            cols.append(pa.repeat(True, n))
        elif f.name in keys:
            col = batch.column(f.name)
            cols.append(col if col.type.equals(f.type) else col.cast(f.type))
        else:
            cols.append(pa.nulls(n, f.type) if f.nullable else placeholder(f.type, n))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def tombstone_schema(table: pa.Schema) -> pa.Schema:
    """The writer schema of delete markers: the table's columns, then ``_tombstone``."""
    return table.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))


def write_task(opts: WriteOptions, schema: pa.Schema,
               batches: Iterator[pa.RecordBatch]) -> MemWalCommitMessage:
    """Stream one task's batches into its shard(s); runs on an executor.

    Without a sharding spec the task writes the shard of its partition. With
    one, each row goes to the shard of its sharding value, one writer per
    shard, opened when the first row for it arrives.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    pid = ctx.partitionId() if ctx else 0
    attempt = ctx.attemptNumber() if ctx else 0
    if opts.sharding is not None or opts.delete:
        return _write_routed(opts, schema, batches, pid, attempt)
    shard = opts.shard_for(pid)
    writer = None
    t0 = time.perf_counter()
    open_s = 0.0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if writer is None:  # an empty partition claims nothing
                writer = _open_shard(opts, shard, schema)
                open_s = time.perf_counter() - t0
            writer.put(batch)
        t1 = time.perf_counter()
        if writer is None:
            return MemWalCommitMessage(pid, attempt, None, 0, None, None, 0, 0, 0)
        _close_shards({shard: writer})
    except BaseException:
        _abort_shards([writer] if writer is not None else [])
        raise
    s = writer.stats()
    return MemWalCommitMessage(
        partition_id=pid, attempt=attempt, shard_id=s.shard_id, epoch=s.epoch,
        first_position=s.first_wal_position, last_position=s.last_wal_position,
        rows=s.rows, bytes=s.bytes, wal_entries=s.wal_entries, sstables=list(s.sstables),
        open_s=open_s, write_s=t1 - t0 - open_s, close_s=time.perf_counter() - t1)


def _router(opts: WriteOptions, pid: int) -> Callable[[pa.RecordBatch], dict]:
    """``batch -> {shard: (value, rows)}`` for this task."""
    if opts.sharding is not None:
        return opts.sharding.route
    shard = opts.shard_for(pid)
    return lambda batch: {shard: (None, batch)}


def _write_routed(opts: WriteOptions, schema: pa.Schema, batches: Iterator[pa.RecordBatch],
                  pid: int, attempt: int) -> MemWalCommitMessage:
    """A task of a sharded table (or a delete): one shard writer per sharding value."""
    route = _router(opts, pid)
    keys = tuple(primary_key_of(schema))
    wschema = tombstone_schema(schema) if opts.delete else schema
    writers: dict[str, ShardWriter] = {}
    values: dict[str, Any] = {}
    t0 = time.perf_counter()
    open_s = 0.0
    try:
        for batch in batches:
            for shard, (value, part) in route(batch).items():
                writer = writers.get(shard)
                if writer is None:
                    t_open = time.perf_counter()
                    writer = writers[shard] = _open_shard(opts, shard, wschema, value)
                    values[shard] = value
                    open_s += time.perf_counter() - t_open
                writer.put(tombstones(part, wschema, keys) if opts.delete else part)
        t1 = time.perf_counter()
        _close_shards(writers)
    except Fenced as exc:
        _abort_shards(writers.values())
        if opts.sharding is None:
            raise
        raise ShardConflict(f"{exc}. A newer writer took this shard over: another attempt of "
                            f"this task, another job, or another partition of this job holding "
                            f"rows of the same sharding value; in the last case {PARTITION_FIX}"
                            ) from exc
    except BaseException:
        _abort_shards(writers.values())
        raise
    results = []
    for shard, writer in writers.items():
        s = writer.stats()
        results.append(ShardResult(shard, s.epoch, s.first_wal_position, s.last_wal_position,
                                   s.rows, s.bytes, s.wal_entries, list(s.sstables),
                                   repr(values[shard])))
    return MemWalCommitMessage(
        partition_id=pid, attempt=attempt, shard_id=None, epoch=0, first_position=None,
        last_position=None, rows=sum(r.rows for r in results),
        bytes=sum(r.bytes for r in results), wal_entries=sum(r.wal_entries for r in results),
        open_s=open_s, write_s=t1 - t0 - open_s, close_s=time.perf_counter() - t1,
        shards=results)


def check_one_task_per_shard(opts: WriteOptions, msgs: list[MemWalCommitMessage]) -> None:
    """Refuse a job in which two partitions wrote one shard of a sharded table.

    Lance's rule is one key, one shard, one writer: two tasks writing one
    shard fence each other, and the order of their rows would be arbitrary.
    Nothing is committed, so the table is unchanged.
    """
    if opts.sharding is None:
        return
    owners: dict[str, dict[int, str]] = {}
    for m in msgs:
        for s in m.shards:
            owners.setdefault(s.shard_id, {})[m.partition_id] = s.value
    shared = {shard: parts for shard, parts in owners.items() if len(parts) > 1}
    if shared:
        shard, parts = sorted(shared.items())[0]
        raise ShardConflict(
            f"{len(shared)} shard(s) of the table at {opts.path} (sharded by "
            f"{opts.sharding.describe()}) were written by more than one task of this job, e.g. "
            f"shard {shard} (value {next(iter(parts.values()))}) by partitions "
            f"{sorted(parts)}; {PARTITION_FIX}. Nothing was committed: the table is unchanged")


def prepare_writer_options(opts: WriteOptions, schema: pa.Schema) -> WriteOptions:
    """Driver: checks that need the table, and its sharding spec for the tasks.

    ``schema`` is the table's (after :func:`~memwal_datasource.spark.source.prepare_table`).
    """
    pk = primary_key_of(schema)
    if opts.config.enable_memtable and not pk:
        raise ConfigError(
            f"option 'enable_memtable' is true (the default) but the table at {opts.path} has no "
            "primary key: Lance's LSM reads (LsmScanner, point lookups) and MemTable replay are "
            "exactly once only as upserts by key. Set option 'primary_key' when creating the "
            "table, or write with enable_memtable=false")
    if opts.delete:
        if not pk:
            raise ConfigError(f"option 'operation=delete' needs a primary key, and the table at "
                              f"{opts.path} has none: deletes are markers for keys")
    sharding = table_sharding(open_table(opts.path, opts.storage))
    check_requested(sharding, opts.shard_by, opts.path)
    if sharding is not None and opts.num_shards:
        raise ConfigError(f"option 'num_shards' does not apply: the table at {opts.path} is "
                          f"sharded by {sharding.describe()}, which decides the shards")
    return replace(opts, sharding=sharding)


def commit_job(opts: WriteOptions, messages, kind: str, job_id: str, started: float,
               query_id: str | None = None, batch_id: int | None = None,
               txn: Txn | None = None) -> CommitRecord | None:
    """Write the job's one commit record and log a summary line.

    With ``txn`` (an idempotency key) a job whose key is already committed
    writes nothing and returns the earlier record. A micro-batch that wrote no
    rows writes no record and returns ``None``.
    """
    _ensure_visible_logging()
    msgs = [m for m in messages if isinstance(m, MemWalCommitMessage)]
    check_one_task_per_shard(opts, msgs)
    ranges = [r for m in msgs for r in m.committed_ranges()]
    label = f"{kind}{f' batch {batch_id}' if batch_id is not None else ''}"
    if query_id is not None and not ranges and kind == APPEND:
        log.info("memwal stream %s batch %s wrote no rows; nothing to commit", query_id, batch_id)
        return None
    log_ = CommitLog(open_store(opts.path, opts.storage))
    result = log_.append(kind, ranges, job_id=job_id, writer_group=opts.writer_group,
                         query_id=query_id, batch_id=batch_id, txn=txn)
    rec = result.record
    if not result.created:
        log.warning("memwal %s: idempotency key %s version %d is already committed as record "
                    "%d (job %s); this run's rows are not committed again", label, txn.app_id,
                    txn.version, rec.sequence, rec.job_id)
        return rec
    log.info(
        "memwal commit %d (%s): %d tasks, %d rows, %d bytes, %d WAL entries, %.2fs wall, %s",
        rec.sequence, label, len(msgs), sum(m.rows for m in msgs), sum(m.bytes for m in msgs),
        sum(m.wal_entries for m in msgs), time.time() - started, opts.describe())
    return rec


def _record_of(opts: WriteOptions, job_id: str) -> CommitRecord | None:
    """The commit record of ``job_id``, searched from the newest (best effort)."""
    try:
        log_ = CommitLog(open_store(opts.path, opts.storage))
        for seq in range(log_.next_sequence() - 1, 0, -1):
            rec = log_.read(seq)
            if rec.job_id == job_id:
                return rec
            if rec.created_ms and rec.created_ms < (time.time() - 3600) * 1000:
                return None  # far older than any job still aborting
    except Exception as exc:  # noqa: BLE001 - only a log line depends on it
        log.debug("could not check the commit log for job %s: %s", job_id, exc)
    return None


class MemWalBatchWriter(DataSourceArrowWriter):
    """``df.write.format("memwal")``: tasks write shards, the driver commits once."""

    def __init__(self, opts: WriteOptions, schema: pa.Schema, overwrite: bool):
        self.opts = prepare_writer_options(opts, schema)
        self.schema = schema
        self.overwrite = overwrite
        self.job_id = uuid.uuid4().hex
        self.started = time.time()
        self.last_commit: CommitRecord | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MemWalCommitMessage:
        return write_task(self.opts, self.schema, iterator)

    def commit(self, messages) -> None:
        self.last_commit = commit_job(self.opts, messages, OVERWRITE if self.overwrite else APPEND,
                                      self.job_id, self.started, txn=self.opts.txn)

    def abort(self, messages) -> None:
        done = [m for m in messages if isinstance(m, MemWalCommitMessage)]
        # Spark also aborts when the commit worker died after the record landed.
        landed = _record_of(self.opts, self.job_id)
        if landed is not None:
            log.warning("memwal job %s: Spark reports the job failed, but its commit record "
                        "%d landed: its rows are committed", self.job_id, landed.sequence)
            return
        log.warning("memwal job %s aborted after %d task(s) finished; nothing committed, "
                    "readers still see the table as before", self.job_id, len(done))


class MemWalStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("memwal")``: one commit record per micro-batch.

    The record carries (query id, batch id); a batch Spark replays after a
    crash finds its record and is not committed twice.
    """

    def __init__(self, opts: WriteOptions, schema: pa.Schema, overwrite: bool, query_id: str):
        self.opts = prepare_writer_options(opts, schema)
        self.schema = schema
        self.overwrite = overwrite
        self.query_id = query_id
        self.started = time.time()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MemWalCommitMessage:
        return write_task(self.opts, self.schema, iterator)

    def commit(self, messages, batchId: int) -> None:  # noqa: N803 - Spark's name
        # The key makes a batch Spark replays after a crash (or a record whose
        # acknowledgement was lost) commit once, checked against the whole log.
        commit_job(self.opts, messages, APPEND, f"{self.query_id}:{batchId}", self.started,
                   query_id=self.query_id, batch_id=batchId,
                   txn=Txn(stream_app_id(self.query_id), batchId))

    def abort(self, messages, batchId: int) -> None:  # noqa: N803
        log.warning("memwal stream %s batch %d aborted; nothing committed", self.query_id,
                    batchId)
