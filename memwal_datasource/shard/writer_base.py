"""What both writer modes share: the :class:`ShardWriter` interface, its statistics
and the checks a put makes on its batches.

The WAL-only writer (:mod:`memwal_datasource.shard.writer`) and pylance's native
MemTable writer (:mod:`memwal_datasource.write.native`) implement the interface;
:func:`memwal_datasource.write.shard_writer.open_shard_writer` picks one.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import pyarrow as pa

from ..errors import ConfigError, NotInThisMode
from ..format.table_schema import same_logical_type, with_table_columns

log = logging.getLogger(__name__)


@dataclass
class FlushTiming:
    """One WAL flush: how long its batches queued, the PUT took, and in total."""

    queue_wait_s: float
    put_s: float
    total_s: float
    rows: int
    nbytes: int
    position: int


# A writer remembers the timings of this many of its latest WAL flushes (a writer kept
# between tasks may live for thousands of them).
MAX_FLUSH_TIMINGS = 1024


@dataclass
class WriterStats:
    """What a writer has done; also what a Spark task reports in its commit message.

    ``flushes`` holds the timings of the latest flushes, at least the last
    :data:`MAX_FLUSH_TIMINGS` of them.
    """

    shard_id: str
    epoch: int
    mode: str
    puts: int = 0
    rows: int = 0
    bytes: int = 0
    wal_entries: int = 0
    wal_bytes: int = 0
    rows_durable: int = 0
    rows_not_durable: int = 0
    next_wal_entry_position: int = 0
    first_wal_position: int | None = None
    last_wal_position: int | None = None
    sentinel_position: int | None = None
    sstables: list[str] = field(default_factory=list)
    flushes: list[FlushTiming] = field(default_factory=list)
    memtable: dict | None = None

    def add_flush(self, timing: FlushTiming) -> None:
        """Record one flush, forgetting the oldest beyond twice :data:`MAX_FLUSH_TIMINGS`."""
        self.flushes.append(timing)
        if len(self.flushes) > 2 * MAX_FLUSH_TIMINGS:
            del self.flushes[:MAX_FLUSH_TIMINGS]

    def copy(self) -> WriterStats:
        """An independent snapshot."""
        return replace(self, flushes=list(self.flushes), sstables=list(self.sstables))

    def memtable_stats(self) -> dict:
        """MemTable statistics; only MemTable mode has them."""
        if self.memtable is None:
            raise NotInThisMode(
                f"shard {self.shard_id}: MemTable statistics exist only with "
                "enable_memtable=true; this writer runs in WAL-only mode"
            )
        return self.memtable


class ShardWriter(ABC):
    """The interface both modes share. Use as a context manager."""

    shard_id: str
    epoch: int

    @abstractmethod
    def put(self, batches: pa.RecordBatch | pa.Table | Iterable[pa.RecordBatch]) -> None:
        """Write batches. With ``durable_write`` it returns once they are durable."""

    @abstractmethod
    def flush(self) -> None:
        """Make everything put so far durable."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release resources; raises if rows could not be made durable."""

    @abstractmethod
    def stats(self) -> WriterStats:
        """A snapshot of the writer's statistics."""

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def abort(self) -> None:
        """Stop without flushing (used when the caller is failing anyway)."""
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - the original error matters more
            log.warning("shard %s: error while aborting writer: %s", self.shard_id, exc)


def as_batches(data: pa.RecordBatch | pa.Table | Iterable[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """Normalise a put argument to a list of record batches."""
    if isinstance(data, pa.RecordBatch):
        return [data]
    if isinstance(data, pa.Table):
        return data.to_batches()
    return list(data)


def cast_columns(columns: list[pa.Array], schema: pa.Schema) -> pa.RecordBatch:
    """A batch of ``columns`` with ``schema``, casting columns whose type differs."""
    return pa.RecordBatch.from_arrays(
        [c if c.type.equals(f.type) else c.cast(f.type)
         for c, f in zip(columns, schema, strict=True)], schema=schema)


def check_schema(shard_id: str, expected: pa.Schema, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Return ``batch`` with the writer's schema, or raise naming the mismatch.

    The one place both modes prepare a batch for the WAL: nullable columns of
    the table the batch leaves out (added by Lance's ``add_columns``, say) are
    filled with nulls here, so every entry carries the table's whole schema.
    """
    got = batch.schema
    if got.equals(expected, check_metadata=False):
        return batch
    if got.names != expected.names:
        batch = with_table_columns(batch, expected)
        got = batch.schema
    if got.names != expected.names:
        required = [f.name for f in expected if f.name not in got.names and not f.nullable]
        extra = [n for n in got.names if n not in expected.names]
        fix = (f"Add column(s) {extra} to the table first (pylance's add_columns), or drop "
               "them" if extra else f"Add the non-nullable column(s) {required}" if required
               else "Put the columns in the table's order")
        raise ConfigError(
            f"{fix}: shard {shard_id}: batch columns {got.names} do not match the table's "
            f"{expected.names}"
        )
    for g, e in zip(got, expected, strict=True):
        if not g.type.equals(e.type) and not same_logical_type(g.type, e.type):
            raise ConfigError(
                f"shard {shard_id}: column '{e.name}' has type {g.type}, table has {e.type}"
            )
    # Nullability differs only in the declared schema: the data decides.
    for name, col in zip(expected.names, batch.columns, strict=True):
        if not expected.field(name).nullable and col.null_count:
            what = ("Primary key column" if (expected.field(name).metadata or {}).get(
                b"lance-schema:unenforced-primary-key") == b"true" else "Column")
            raise ConfigError(
                f"{what} '{name}' must not be null: drop or fill those rows before writing "
                f"({col.null_count} null(s) in a batch for shard {shard_id}; nothing of that "
                "batch was written)")
    return cast_columns(batch.columns, expected)
