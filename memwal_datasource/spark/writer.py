"""Spark write path: one ShardWriter per task, one commit record per job.

The writer object is built on the driver and pickled to executors, so it
holds only plain settings; stores, clients and files are created inside
``write()``.
"""

from __future__ import annotations

import logging
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

from ..commit import (
    APPEND,
    OVERWRITE,
    CommitLog,
    CommitRecord,
    CommittedRange,
    Txn,
    stream_app_id,
)
from ..store import open_store
from ..writer import open_shard_writer
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
class MemWalCommitMessage(WriterCommitMessage):
    """What one task wrote: enough for the driver to commit it."""

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

    def committed_range(self) -> CommittedRange | None:
        """The range to list in the commit record (None for an empty task)."""
        if self.shard_id is None or self.first_position is None:
            return None
        return CommittedRange(self.shard_id, self.epoch, self.first_position,
                              self.last_position or self.first_position, self.rows, self.bytes,
                              self.partition_id, self.attempt, tuple(self.sstables))


def write_task(opts: WriteOptions, schema: pa.Schema,
               batches: Iterator[pa.RecordBatch]) -> MemWalCommitMessage:
    """Stream one task's batches into its shard; runs on an executor."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    pid = ctx.partitionId() if ctx else 0
    attempt = ctx.attemptNumber() if ctx else 0
    shard = opts.shard_for(pid)
    writer = None
    t0 = time.perf_counter()
    open_s = 0.0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if writer is None:  # an empty partition claims nothing
                writer = open_shard_writer(opts.path, shard, schema, opts.config, opts.storage)
                open_s = time.perf_counter() - t0
            writer.put(batch)
        t1 = time.perf_counter()
        if writer is None:
            return MemWalCommitMessage(pid, attempt, None, 0, None, None, 0, 0, 0)
        writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    s = writer.stats()
    return MemWalCommitMessage(
        partition_id=pid, attempt=attempt, shard_id=s.shard_id, epoch=s.epoch,
        first_position=s.first_wal_position, last_position=s.last_wal_position,
        rows=s.rows, bytes=s.bytes, wal_entries=s.wal_entries, sstables=list(s.sstables),
        open_s=open_s, write_s=t1 - t0 - open_s, close_s=time.perf_counter() - t1)


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
    ranges = [r for r in (m.committed_range() for m in msgs) if r is not None]
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
        self.opts = opts
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
        self.opts = opts
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
