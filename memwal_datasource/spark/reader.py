"""Batch reads of the WAL tail: ``spark.read.format("memwal").load(path)``.

One partition per shard, long shards split into position ranges so every
core has work. A partition streams its entries one at a time: it never holds
more than one WAL entry in memory. Sentinels are skipped; in
``read_committed`` only entries listed by commit records are returned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..format.memwal import entry_columns, has_field_ids
from ..format.table_schema import ROW_KEY, data_schema, primary_key_of
from ..log.commit import CommittedRange, CommittedView
from ..shard.manifest import list_shards
from ..shard.wal import WalTailer
from ..shard.writer_base import cast_columns
from ..store import open_store
from ..table.view import TOMBSTONE, TableView, field_ids, last_per_key
from .options import ReadOptions
from .worker_entry import enter, entry_point, plain_errors

METADATA_FIELDS = [
    pa.field("_shard_id", pa.string(), nullable=False),
    pa.field("_wal_position", pa.int64(), nullable=False),
    pa.field("_writer_epoch", pa.int64(), nullable=False),
    pa.field(TOMBSTONE, pa.bool_(), nullable=False),
]


def output_schema(table_schema: pa.Schema, metadata_columns: bool) -> pa.Schema:
    """The rows' schema: the table's columns, then metadata columns if asked."""
    fields = [f.with_metadata(None) for f in table_schema if f.name not in (TOMBSTONE, ROW_KEY)]
    if metadata_columns:
        fields += METADATA_FIELDS
    return pa.schema(fields)


@dataclass(frozen=True)
class WalRange(InputPartition):
    """Positions ``first..last`` of one shard; ``epochs`` maps committed sub-ranges.

    ``allowed`` is ``None`` for read_uncommitted, else a tuple of
    ``(epoch, first, last)`` committed ranges that overlap this partition.
    """

    shard_id: str
    first: int
    last: int
    allowed: tuple[tuple[int, int, int], ...] | None


def split(shard_id: str, first: int, last: int, size: int,
          allowed: list[tuple[int, int, int]] | None) -> list[WalRange]:
    """Cut ``first..last`` into partitions of at most ``size`` positions."""
    out = []
    for lo in range(first, last + 1, size):
        hi = min(last, lo + size - 1)
        sub = None if allowed is None else tuple(
            (e, max(a, lo), min(b, hi)) for e, a, b in allowed if a <= hi and b >= lo)
        if sub == ():
            continue
        out.append(WalRange(shard_id, lo, hi, sub))
    return out


def plan_partitions(opts: ReadOptions, store) -> list[WalRange]:
    """Partitions for a batch read (also used per micro-batch by the stream)."""
    parts: list[WalRange] = []
    if opts.committed:
        # Committed and not yet compacted: compacted records live in the base table.
        view = CommittedView(TableView(opts.path, opts.storage, store=store).committed_tail())
        shards = view.shards()
    else:
        view = None
        shards = list_shards(store)
    for shard in shards:
        if opts.shards is not None and shard not in opts.shards:
            continue
        if view is not None:
            ranges = [(r.epoch, r.first, r.last) for r in view.ranges(shard)]
            first, last = min(r[1] for r in ranges), max(r[2] for r in ranges)
        else:
            ranges = None
            tailer = WalTailer(store, shard)
            first, last = tailer.first_position(), tailer.next_position() - 1
        if opts.starting and shard in opts.starting:
            first = max(first, opts.starting[shard])
        if opts.ending and shard in opts.ending:
            last = min(last, opts.ending[shard])
        if last >= first:
            parts.extend(split(shard, first, last, opts.max_entries_per_partition, ranges))
    return parts


def _visible_epoch(part: WalRange, position: int, epoch: int) -> bool:
    if part.allowed is None:
        return True
    return any(e == epoch and a <= position <= b for e, a, b in part.allowed)


def read_partition(opts: ReadOptions, table_schema: pa.Schema,
                   part: WalRange) -> Iterator[pa.RecordBatch]:
    """Yield the partition's rows as record batches, one WAL entry at a time."""
    schema = output_schema(table_schema, opts.metadata_columns)
    wanted = pa.schema([f for f in table_schema if f.name != TOMBSTONE])
    table = TableView(opts.path, opts.storage)
    ids = None  # the table's field ids: columns renamed since an entry are found by id
    for pos, entry in table.entries(part.shard_id, part.first, part.last):
        if not _visible_epoch(part, pos, entry.writer_epoch):
            continue
        for batch in entry.batches:
            if not batch.num_rows:
                continue
            if ids is None and has_field_ids(batch):
                ids = field_ids(table.dataset())
            *cols, tomb = entry_columns(batch, wanted, ids)
            n = batch.num_rows
            if opts.metadata_columns:
                cols += [pa.repeat(part.shard_id, n), pa.repeat(pos, n),
                         pa.repeat(entry.writer_epoch, n), tomb]
            out = cast_columns(cols, schema)
            if not opts.metadata_columns:
                # Deletes are markers, not rows; with metadata columns they are shown.
                out = out.filter(pc.invert(tomb))
            if out.num_rows:
                yield out


@dataclass(frozen=True)
class BaseFragment(InputPartition):
    """One fragment of the base table at ``version``, minus rows the tail replaces."""

    version: int
    fragment_id: int
    tail: tuple[CommittedRange, ...]


@dataclass(frozen=True)
class MergedTail(InputPartition):
    """The committed tail above ``version``: newest row per key, deletes applied."""

    version: int
    tail: tuple[CommittedRange, ...]


def plan_table(opts: ReadOptions) -> list[InputPartition]:
    """Partitions of the whole-table view, all from one snapshot (so exactly once)."""
    table = TableView(opts.path, opts.storage)
    snap = table.snapshot()
    tail = tuple(snap.tail)
    parts: list[InputPartition] = []
    if not snap.base_hidden and snap.base_version is not None:
        ds = table.dataset(snap.base_version)
        parts += [BaseFragment(snap.base_version, f.fragment_id, tail)
                  for f in ds.get_fragments()]
    parts.append(MergedTail(snap.base_version or 0, tail))
    return parts


def read_table_part(opts: ReadOptions, part: BaseFragment | MergedTail
                    ) -> Iterator[pa.RecordBatch]:
    """Rows of one whole-table partition."""
    table = TableView(opts.path, opts.storage)
    ds = table.dataset(part.version or None)
    schema = data_schema(ds.schema)
    pk = primary_key_of(ds.schema)
    out_schema = output_schema(ds.schema, False)
    tail = table.range_rows(part.tail, schema)
    if pk:
        tail = last_per_key(tail, pk)
    if isinstance(part, MergedTail):
        live = tail.filter(pc.invert(tail.column(TOMBSTONE))).drop_columns([TOMBSTONE])
        for batch in live.to_batches():
            yield cast_columns(batch.columns, out_schema)
        return
    for batch in ds.get_fragment(part.fragment_id).to_batches():
        if pk and tail.num_rows:  # rows the tail replaced or deleted
            kept = pa.Table.from_batches([batch]).join(
                tail.select(pk), keys=pk, join_type="left anti")
            batches = kept.select(schema.names).to_batches()
        else:
            batches = [batch]
        for b in batches:
            if b.num_rows:
                yield cast_columns([b.column(n) for n in schema.names], out_schema)


class MemWalBatchReader(DataSourceReader):
    """Plans shard/position partitions on the driver; reads them on executors."""

    def __init__(self, opts: ReadOptions, table_schema: pa.Schema):
        self.opts = opts
        self.table_schema = table_schema

    @entry_point
    def partitions(self) -> list[InputPartition]:
        if self.opts.view == "table":
            return plan_table(self.opts)
        parts = plan_partitions(self.opts, open_store(self.opts.path, self.opts.storage))
        return parts or [WalRange("", 1, 0, ())]  # Spark wants at least one

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        enter()  # a generator's imports are caught by the worker's next request
        if isinstance(partition, BaseFragment | MergedTail):
            return plain_errors(read_table_part(self.opts, partition))
        if not partition.shard_id:
            return iter(())
        return plain_errors(read_partition(self.opts, self.table_schema, partition))
