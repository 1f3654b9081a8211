"""Batch reads: ``spark.read.format("memwal").load(path)`` (the WAL tail) and
``option("view", "table")`` (the whole table).

**The tail** is planned by bytes, not entries (:mod:`memwal_datasource.table.tail_scan`):
the shards' committed ranges (commit records carry their rows and bytes) are cut
at entry bounds into about ``min_partitions`` tasks of about equal size, so many
small entries are a few partitions and a long shard is split over every core.
A task fetches its entries in position order a bounded window ahead (with a few
threads on an object store), decodes a writer's consecutive entries as one
Arrow stream and yields Spark-sized batches. ``max_entries_per_partition``, when
set, splits a shard's positions into partitions of that many entries instead.
Sentinels are skipped; in ``read_committed`` only the positions commit records
list are read, and only their epoch's entries count.

**The whole table** (``view=table``) is planned from one snapshot (a base
version and the committed tail above it), so every row is read exactly once:
groups of base fragments, read through Lance's scanner, and the tail. Without
a primary key the tail is split like a tail read (by shard and bytes). With
one, the newest row of a key must be chosen among every shard's rows (a key may
have moved shards, e.g. under identity sharding on another column), so the tail
stays one partition, read concurrently; base partitions drop the rows whose
key the tail holds (the tail's keys are read once per Python worker).

**Filters** Spark pushes (``spark.sql.python.filterPushdown.enabled=true``):
comparisons, ``IN`` and null tests on integer, string and boolean columns go to
Lance's scanner as a filter on base fragments and are applied to tail rows in
Arrow, after the newest row per key is chosen; other filters are returned to
Spark. With the setting off, Spark keeps every filter and reads work as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
)

from ..format.memwal import FieldId
from ..format.table_schema import ROW_KEY, data_schema, primary_key_of
from ..log.commit import CommittedRange
from ..shard.manifest import list_shards
from ..shard.wal import WalTailer
from ..shard.writer_base import cast_columns
from ..store import open_store
from ..table.predicate import Pred, apply, arrow_filter
from ..table.table_scan import (
    base_bytes,
    fragment_groups,
    index_answers,
    partition_target,
    read_base,
    read_merged_tail,
)
from ..table.tail_scan import (
    MIN_PARTITION_BYTES,
    Segment,
    Slice,
    clip,
    commit_order_slices,
    cost,
    merged,
    plan_slices,
    tail_batches,
)
from ..table.view import TOMBSTONE, TableSnapshot, TableView, field_ids
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


# --- the WAL tail --------------------------------------------------------------------------

@dataclass(frozen=True)
class WalRange(InputPartition):
    """Positions ``first..last`` of one shard; ``allowed`` lists the committed sub-ranges.

    ``allowed`` is ``None`` for read_uncommitted, else a tuple of
    ``(epoch, first, last)`` committed ranges that overlap this partition: only
    their positions are read. ``nbytes`` estimates the entries' bytes.
    """

    shard_id: str
    first: int
    last: int
    allowed: tuple[tuple[int, int, int], ...] | None
    nbytes: int = 0

    def as_slice(self) -> Slice:
        spans = ((None, self.first, self.last),) if self.allowed is None else self.allowed
        return Slice(self.shard_id, tuple(spans), self.nbytes)


@dataclass(frozen=True)
class TailSlices(InputPartition):
    """A task's share of the WAL tail: slices of one or more shards, read in order.
    ``version`` is set in ``view=table`` reads (that base version's schema applies)."""

    slices: tuple[Slice, ...]
    version: int | None = None


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


def _segments(opts: ReadOptions, store, tail: list[CommittedRange] | None
              ) -> dict[str, list[Segment]]:
    """Each shard's ranges to read: committed ranges of ``tail`` (read_committed) or
    the whole WAL (``None``: read_uncommitted), cut to the position options."""
    by_shard: dict[str, list] = {}
    if tail is not None:
        for r in tail:
            if r.last >= r.first:
                by_shard.setdefault(r.shard_id, []).append((r.epoch, r.first, r.last, r.bytes))
        # A kept writer's one-entry commits are one span: joined before anything else.
        by_shard = {shard: merged(rs) for shard, rs in by_shard.items()}
    else:
        for shard in list_shards(store):
            if opts.shards is None or shard in opts.shards:
                t = WalTailer(store, shard)
                by_shard[shard] = [Segment(None, t.first_position(), t.next_position() - 1)]
    out = {}
    for shard, segs in by_shard.items():
        if opts.shards is not None and shard not in opts.shards:
            continue
        segs = clip(segs, (opts.starting or {}).get(shard), (opts.ending or {}).get(shard))
        if segs:
            out[shard] = merged(segs)
    return out


def _cost(segs: dict[str, list[Segment]]) -> float:
    return sum(cost(ss) for ss in segs.values())


def min_partitions(opts: ReadOptions) -> int:
    """About how many tasks a batch read is spread over (twice the planner's cores)."""
    return opts.min_partitions or 2 * (os.cpu_count() or 1)


def tail_groups(opts: ReadOptions, segs: dict[str, list[Segment]],
                target: int | None = None) -> list[list[Slice]]:
    """The tail's slices, a group per task: by bytes (``target`` per group, default
    from the options), or ``max_entries_per_partition`` positions each when it is set."""
    if opts.split_by_entries:
        out = []
        for shard in sorted(segs):
            ss = segs[shard]
            for part in split(shard, ss[0].first, max(s.last for s in ss),
                              opts.max_entries_per_partition, None):
                cut = clip(ss, part.first, part.last)
                if cut:
                    out.append([Slice(shard, tuple((s.epoch, s.first, s.last) for s in cut),
                                      round(sum(s.entry_bytes() * s.entries for s in cut)))])
        return out
    if target is None:
        target = partition_target(_cost(segs), min_partitions(opts),
                                  opts.max_bytes_per_partition, MIN_PARTITION_BYTES)
    return plan_slices(segs, target=target)


def plan_partitions(opts: ReadOptions, store) -> list[WalRange]:
    """The tail's slices as one-shard partitions (tools, tests; a batch read groups
    them: :meth:`MemWalBatchReader.partitions`)."""
    return [_as_range(s) for g in _plan_tail(opts, store) for s in g]


def _plan_tail(opts: ReadOptions, store) -> list[list[Slice]]:
    tail = None
    if opts.committed:
        # Committed and not yet compacted: compacted records live in the base table.
        tail = TableView(opts.path, opts.storage, store=store).committed_tail()
    return tail_groups(opts, _segments(opts, store, tail))


def _as_range(s: Slice) -> WalRange:
    first, last = min(a for _e, a, _b in s.spans), max(b for _e, _a, b in s.spans)
    allowed = None if s.spans[0][0] is None else s.spans
    return WalRange(s.shard_id, first, last, allowed, s.nbytes)


def _metadata(runs: list[tuple[str, int, int, int]]) -> list[pa.Array]:
    counts = np.fromiter((r[3] for r in runs), np.int64, len(runs))
    which = pa.array(np.repeat(np.arange(len(runs)), counts))
    return [pa.array([r[0] for r in runs], pa.string()).take(which),
            pa.array(np.repeat(np.fromiter((r[1] for r in runs), np.int64, len(runs)), counts)),
            pa.array(np.repeat(np.fromiter((r[2] for r in runs), np.int64, len(runs)), counts))]


def read_slices(opts: ReadOptions, table_schema: pa.Schema, slices: Iterable[Slice],
                preds: tuple[Pred, ...] = (), ids: Mapping[str, FieldId] | None = None
                ) -> Iterator[pa.RecordBatch]:
    """Rows of the tail ``slices``, coalesced, deletes dropped (shown with metadata
    columns), ``preds`` applied. Entries' columns are found by the field ids ``ids``
    (the table's when the read was planned; unset: the table's now)."""
    schema = output_schema(table_schema, opts.metadata_columns)
    wanted = pa.schema([f for f in table_schema if f.name != TOMBSTONE])
    table = TableView(opts.path, opts.storage)
    expr = arrow_filter(preds)
    for tb in tail_batches(table, list(slices), wanted,
                           (lambda: ids) if ids is not None else
                           (lambda: field_ids(table.dataset())),
                           threads=opts.read_threads, whose=opts.metadata_columns):
        *cols, tomb = tb.rows.columns
        if opts.metadata_columns:
            cols += [*_metadata(tb.runs), tomb]
        out = cast_columns(cols, schema)
        if not opts.metadata_columns and pc.any(tomb).as_py():
            # Deletes are markers, not rows; with metadata columns they are shown.
            out = out.filter(pc.invert(tomb))
        out = apply(out, expr)
        if out.num_rows:
            yield out


def read_partition(opts: ReadOptions, table_schema: pa.Schema, part: WalRange | TailSlices,
                   preds: tuple[Pred, ...] = (), ids: Mapping[str, FieldId] | None = None
                   ) -> Iterator[pa.RecordBatch]:
    """Yield a tail partition's rows (a stream's micro-batch partitions too)."""
    slices = part.slices if isinstance(part, TailSlices) else (part.as_slice(),)
    return read_slices(opts, table_schema, slices, preds, ids)


# --- the whole table ---------------------------------------------------------------------

@dataclass(frozen=True)
class BaseFragments(InputPartition):
    """Fragments of the base table at ``version``, minus rows the tail replaces
    (``tail``: the committed tail in commit order, with a primary key only)."""

    version: int
    fragment_ids: tuple[int, ...]
    tail: tuple[Slice, ...]


@dataclass(frozen=True)
class MergedTail(InputPartition):
    """The committed tail above ``version`` with a primary key: newest row per key,
    deletes applied (``tail`` in commit order)."""

    version: int
    tail: tuple[Slice, ...]


def plan_table(opts: ReadOptions, preds: tuple[Pred, ...] = ()) -> list[InputPartition]:
    """Partitions of the whole-table view, all from one snapshot (so exactly once).
    ``preds`` (pushed filters) that an index answers read the base in one task."""
    table = TableView(opts.path, opts.storage)
    snap: TableSnapshot = table.snapshot()
    version = snap.base_version or 0
    ds = None if snap.base_version is None else table.dataset(snap.base_version)
    pk = bool(ds is not None and primary_key_of(ds.schema))
    base = ds is not None and not snap.base_hidden
    segs = {} if pk else _segments(opts, table.store, snap.tail)
    target = partition_target((base_bytes(ds) if base else 0) + _cost(segs),
                              min_partitions(opts), opts.max_bytes_per_partition,
                              MIN_PARTITION_BYTES)
    ordered = tuple(commit_order_slices(snap.tail)) if pk else ()
    # With a key the tail is one task, the longest: first, and its worker keeps its keys.
    parts: list[InputPartition] = [MergedTail(version, ordered)] if pk and ordered else []
    if base:
        if preds and index_answers(ds, preds):  # a point lookup: no task finds nothing
            groups = [tuple(f.fragment_id for f in ds.get_fragments())]
        else:
            groups = fragment_groups(ds, target)
        parts += [BaseFragments(version, ids, ordered) for ids in groups if ids]
    if not pk:
        parts += [TailSlices(tuple(g), version) for g in tail_groups(opts, segs, target)]
    return parts or [TailSlices((), version)]  # Spark wants at least one


def read_table_part(opts: ReadOptions, part: BaseFragments | MergedTail | TailSlices,
                    preds: tuple[Pred, ...] = ()) -> Iterator[pa.RecordBatch]:
    """Rows of one whole-table partition."""
    table = TableView(opts.path, opts.storage)
    ds = table.dataset(part.version or None)
    out_schema = output_schema(ds.schema, False)
    if isinstance(part, TailSlices):
        yield from read_slices(opts, data_schema(ds.schema), part.slices, preds, field_ids(ds))
        return
    if isinstance(part, MergedTail):
        rows = read_merged_tail(table, part.version or None, part.tail, preds)
    else:
        rows = read_base(table, part.version, part.fragment_ids, part.tail, preds)
    for b in rows:
        if b.num_rows:
            yield cast_columns([b.column(n) for n in out_schema.names], out_schema)


# --- filters Spark pushes ---------------------------------------------------------------

_OPS = {EqualTo: "eq", GreaterThan: "gt", GreaterThanOrEqual: "ge", LessThan: "lt",
        LessThanOrEqual: "le", In: "in", IsNull: "is_null", IsNotNull: "is_not_null"}


def to_pred(f: Filter, schema: pa.Schema) -> Pred | None:
    """Spark's filter as a :class:`Pred` on a top-level column, or ``None``."""
    negated = isinstance(f, Not)
    leaf = f.child if negated else f
    op = _OPS.get(type(leaf))
    if op is None or len(leaf.attribute) != 1:
        return None
    return Pred.make(schema, leaf.attribute[0], op, getattr(leaf, "value", None), negated)


class _PushFilters:
    """The reader's ``pushFilters``, usable whether or not Spark pushes filters.

    Spark calls ``pushFilters`` only with ``spark.sql.python.filterPushdown.enabled``,
    and refuses to plan a read whose reader overrides it while the setting is off
    (``DATA_SOURCE_PUSHDOWN_DISABLED``): every memwal read would then need the
    setting. Spark tells an override by the bound method's ``__func__``; this
    callable names ``DataSourceReader.pushFilters`` there, so with the setting off
    the read plans as if nothing were pushed (Spark keeps every filter), and with
    it on Spark calls it and the filters are pushed.
    """

    __func__ = staticmethod(DataSourceReader.pushFilters)

    def __init__(self, reader: MemWalBatchReader):
        self.reader = reader

    def __call__(self, filters: list[Filter]) -> Iterable[Filter]:
        return self.reader.push_filters(filters)


class MemWalBatchReader(DataSourceReader):
    """Plans partitions on the driver; reads them on executors."""

    def __init__(self, opts: ReadOptions, table_schema: pa.Schema,
                 field_ids: Mapping[str, FieldId] | None = None):
        self.opts = opts
        self.table_schema = table_schema
        # The table's field ids as planned: tasks then never open the Lance table.
        self.field_ids = field_ids
        self.filters: tuple[Pred, ...] = ()

    pushFilters = property(_PushFilters)  # noqa: N815 - Spark's name

    def push_filters(self, filters: list[Filter]) -> list[Filter]:
        """Keep the filters applied exactly here; return the others to Spark."""
        schema = output_schema(self.table_schema, False)
        kept, rest = [], []
        for f in filters:
            p = to_pred(f, schema)
            if p is None:
                rest.append(f)
            else:
                kept.append(p)
        self.filters = tuple(kept)
        return rest

    @entry_point
    def partitions(self) -> list[InputPartition]:
        if self.opts.view == "table":
            return plan_table(self.opts, self.filters)
        groups = _plan_tail(self.opts, open_store(self.opts.path, self.opts.storage))
        return [TailSlices(tuple(g)) for g in groups] or [TailSlices(())]  # at least one

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        enter()  # a generator's imports are caught by the worker's next request
        if isinstance(partition, BaseFragments | MergedTail) or (
                isinstance(partition, TailSlices) and partition.version is not None):
            return plain_errors(read_table_part(self.opts, partition, self.filters))
        if isinstance(partition, TailSlices) and not partition.slices:
            return iter(())
        return plain_errors(read_partition(self.opts, self.table_schema, partition,
                                           self.filters, self.field_ids))
