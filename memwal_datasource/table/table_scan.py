"""Pieces of the whole-table view for parallel readers: base fragments in groups, read
through Lance's scanner (with a pushed filter), and the committed tail.

Every piece comes from one :class:`~.view.TableSnapshot` (a base version and the
committed tail above it), so together they are :meth:`TableView.to_table`'s
rows exactly once. With a primary key the tail's newest row of a key replaces
(or, as a tombstone, deletes) the base's: base pieces drop every row whose key
the tail holds, and the tail's rows are merged, newest per key, in commit order
across shards, so with a key the tail is one piece. A predicate applies to rows
after that merge: a base row hidden by a tail row that fails the predicate
stays hidden.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.table_schema import data_schema, primary_key_of
from .predicate import Pred, apply, arrow_filter, lance_filter
from .tail_scan import Slice, tail_table
from .view import TOMBSTONE, TableView, field_ids, last_per_key

# Rows per batch asked of Lance's scanner (its default is 8,192: small for Spark).
SCAN_BATCH_ROWS = 64 * 1024
# The tail's keys, per Python worker: every base piece of one read needs the same ones.
_KEYS: dict[tuple, Any] = {}
_KEYS_LOCK = threading.Lock()


def fragment_groups(ds, target: int) -> list[tuple[int, ...]]:
    """The base dataset's fragment ids in groups of about ``target`` bytes of data files."""
    groups: list[list[int]] = []
    room = 0
    for frag in ds.get_fragments():
        size = sum(f.file_size_bytes or 0 for f in frag.metadata.files)
        if not groups or size > room + target // 20:  # 5% over is close enough
            groups.append([])
            room = target
        groups[-1].append(frag.fragment_id)
        room -= size
    return [tuple(g) for g in groups]


def index_answers(ds, preds: Sequence[Pred]) -> bool:
    """Whether a scalar index of ``ds`` answers ``preds``: an equality or ``IN`` on an
    indexed column (a point lookup: few rows, one task reads them best)."""
    cols = {p.column for p in preds if p.op in ("eq", "in") and not p.negated}
    if not cols:
        return False
    try:
        indexed = {d.field_names[0] for d in ds.describe_indices() if len(d.field_names) == 1}
    except (OSError, ValueError, AttributeError):
        return False
    return bool(cols & indexed)


def base_bytes(ds) -> int:
    """Bytes of the dataset's data files (from its manifest: no request per file)."""
    return sum(f.file_size_bytes or 0 for frag in ds.get_fragments() for f in frag.metadata.files)


def scan_base(ds, fragment_ids: Sequence[int], columns: Sequence[str], preds: Sequence[Pred],
              stats: list | None = None) -> Iterator[pa.RecordBatch]:
    """``columns`` of the rows of fragments ``fragment_ids`` that ``preds`` select, as
    Lance's scanner reads them: the filter goes to Lance (scalar indices, statistics,
    late materialisation), so only what it needs is read. ``stats`` collects the
    scan's :class:`lance.ScanStatistics`."""
    scanner = ds.scanner(columns=list(columns), filter=lance_filter(preds),
                         fragments=[ds.get_fragment(i) for i in fragment_ids],
                         batch_size=SCAN_BATCH_ROWS,
                         scan_stats_callback=stats.append if stats is not None else None)
    yield from scanner.to_batches()


def _ids_of(table: TableView):
    return lambda: field_ids(table.dataset())


def tail_keys(table: TableView, version: int, tail: Sequence[Slice], schema: pa.Schema,
              pk: Sequence[str]) -> pa.Table:
    """The distinct primary keys of the tail's rows (upserts and deletes alike), read
    once per Python worker for one snapshot."""
    key = (table.uri, version, tuple(tail), tuple(pk))
    with _KEYS_LOCK:
        hit = _KEYS.get(key)
        if hit is None:
            hit = _remember_keys(key, tail_table(table, tail, schema, _ids_of(table)), pk)
    return hit


def _remember_keys(key: tuple, rows: pa.Table, pk: Sequence[str]) -> pa.Table:
    keys = rows.select(list(pk)).group_by(list(pk), use_threads=False).aggregate([])
    _KEYS.clear()  # one read at a time is kept
    _KEYS[key] = keys
    return keys


class _KeyFilter:
    """Drops rows whose primary key is in ``keys``: a sorted-array probe for one integer
    key column, else a hash anti-join."""

    def __init__(self, keys: pa.Table, pk: Sequence[str]):
        self.keys, self.pk = keys, list(pk)
        self.sorted = None
        if len(pk) == 1 and pa.types.is_integer(keys.schema.field(0).type):
            self.sorted = np.sort(keys.column(0).to_numpy())

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch | pa.Table:
        if not self.keys.num_rows or not batch.num_rows:
            return batch
        if self.sorted is not None:
            col = batch.column(self.pk[0]).to_numpy(zero_copy_only=False)
            at = np.minimum(np.searchsorted(self.sorted, col), len(self.sorted) - 1)
            return batch.filter(pa.array(self.sorted[at] != col))
        return pa.Table.from_batches([batch]).join(self.keys, keys=self.pk,
                                                   join_type="left anti")


def read_base(table: TableView, version: int, fragment_ids: Sequence[int],
              tail: Sequence[Slice], preds: Sequence[Pred] = (),
              stats: list | None = None) -> Iterator[pa.RecordBatch]:
    """Rows of base fragments ``fragment_ids`` at ``version`` the tail does not replace,
    that ``preds`` select; columns as :func:`data_schema` (no hidden row key)."""
    ds = table.dataset(version)
    schema = data_schema(ds.schema)
    pk = primary_key_of(ds.schema)
    drop = _KeyFilter(tail_keys(table, version, tail, schema, pk), pk) if pk and tail else None
    for batch in scan_base(ds, fragment_ids, schema.names, preds, stats):
        kept = drop(batch) if drop is not None else batch
        for b in kept.to_batches() if isinstance(kept, pa.Table) else [kept]:
            if b.num_rows:
                yield pa.RecordBatch.from_arrays([b.column(n) for n in schema.names],
                                                 schema=schema)


def read_merged_tail(table: TableView, version: int, tail: Sequence[Slice],
                     preds: Sequence[Pred] = ()) -> Iterator[pa.RecordBatch]:
    """The tail's rows with a primary key: the newest row of each key (commit order,
    then WAL order), deletes applied, then ``preds``."""
    ds = table.dataset(version)
    schema = data_schema(ds.schema)
    pk = primary_key_of(ds.schema)
    rows = tail_table(table, tail, schema, _ids_of(table))
    if pk:
        with _KEYS_LOCK:  # base pieces this worker reads next need these keys
            _remember_keys((table.uri, version, tuple(tail), tuple(pk)), rows, pk)
        rows = last_per_key(rows, pk)
    live = rows.filter(pc.invert(rows.column(TOMBSTONE))).drop_columns([TOMBSTONE])
    yield from apply(live, arrow_filter(preds)).to_batches(max_chunksize=SCAN_BATCH_ROWS)


def partition_target(total: float, min_partitions: int, max_bytes: int,
                     floor: int) -> int:
    """Bytes per partition: the read over ``min_partitions`` tasks, at least ``floor``,
    at most ``max_bytes``."""
    return min(max_bytes, max(floor, math.ceil(total / max(1, min_partitions))))
