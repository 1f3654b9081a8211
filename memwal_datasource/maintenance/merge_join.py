"""How a compaction round joins the base table: by scanning its key column or through
the key's BTREE, the BTREE's upkeep, and the join's memory.

``merge_insert`` (the one Lance commit that carries the round's compare-and-set)
joins the round's rows to the base on the merge key, a one-column primary key or
the hidden row key: by scanning the base's key column, or by probing a BTREE that
the first round builds and later rounds fold their new rows into when that pays
(:func:`index_due`). Which one is cheaper depends on the base's size and on where
the round's keys fall in the BTREE (:func:`round_joins_by_scan`): keys clustered in
a few of its pages are found there, keys spread over the whole base are cheaper to
find by one scan. Lance 14 charges a join through the BTREE more memory than the
round holds unless its batches own their buffers (:func:`join_source`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CompactionError
from ..format.table_schema import ROW_KEY, primary_key_of
from ..log.rounds import CompactionRound
from ..table.view import TableView

log = logging.getLogger(__name__)

INDEX_FOLD = 1.6  # when the key's BTREE folds in its missing rows: see index_due
# What a join costs (the 2-core machine, Lance 14, 20k and 200k upserts into 1M and 10M
# rows, the updated keys clustered or spread uniformly). A scan: ~20 ms, ~10 ns per base
# row and ~0.3 us per round row. A probe of the BTREE: ~0.7 us per round row and ~0.5 ms
# per BTREE page the round's keys fall in (Lance reads the page and takes the matched
# rows from wherever they lie). 200k upserts into 10M rows: keys in 26 pages, 0.15 s by
# the BTREE vs 0.16 s by scan; in 245 pages, 0.35 vs 0.21 s; spread over all 2,442,
# 1.78 vs 0.20 s. So spread keys scan at every base size, clustered ones probe a large base.
SCAN_S = 0.02
SCAN_S_PER_BASE_ROW = 10e-9
SCAN_S_PER_ROUND_ROW = 0.3e-6
PROBE_S_PER_ROUND_ROW = 0.7e-6
PROBE_S_PER_PAGE = 0.5e-3
BTREE_PAGE_ROWS = 4096  # Lance's BTREE page (its page lookup's ``batch_size``)
_pages_cache: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
_pages_lock = threading.Lock()
_PAGES_CACHE_SIZE = 16
# A join through the BTREE reads the round in slices of this many rows, and DataFusion
# (Lance 14) charges each slice the memory of the whole buffer it is cut from: one
# 300k-row batch was charged ~285 MB and the round failed on Lance's 300 MB pool. Batches
# of this size that own their buffers are charged what they hold (:func:`join_source`).
JOIN_BATCH_ROWS = 8192
LANCE_DEFAULT_POOL = 300 * 2**20
_EXHAUSTED = re.compile(r"Resources exhausted", re.IGNORECASE)


def joins_by_scan(base_rows: int, round_rows: int, pages: int | None = None,
                  unindexed_rows: int = 0) -> bool:
    """Whether a round of ``round_rows`` joins a base of ``base_rows`` by scanning it:
    when that costs no more than probing ``pages`` pages of the key's BTREE (``None``,
    not known: as many as spread keys would touch) and scanning the ``unindexed_rows``
    the BTREE lacks, which a probe scans too."""
    if pages is None:
        pages = min(round_rows, -(-base_rows // BTREE_PAGE_ROWS))
    scan = SCAN_S + SCAN_S_PER_BASE_ROW * base_rows + SCAN_S_PER_ROUND_ROW * round_rows
    probe = (PROBE_S_PER_ROUND_ROW * round_rows + PROBE_S_PER_PAGE * pages
             + SCAN_S_PER_BASE_ROW * unindexed_rows)
    return scan <= probe


def round_joins_by_scan(table: TableView, ds, source: pa.Table, key: list[str]) -> bool:
    """Whether a round merging ``source`` on ``key`` joins the base ``ds`` by scanning
    it: see :func:`joins_by_scan`. The pages its keys fall in are counted on the key's
    BTREE page lookup (only when a probe could pay at all); a key without a BTREE, or
    a lookup that cannot be read, counts as spread keys."""
    base_rows, round_rows = ds.count_rows(), source.num_rows
    if len(key) != 1 or joins_by_scan(base_rows, round_rows, pages=0):
        return True  # a probe would not pay even for keys in no page at all
    keys = source[key[0]]
    try:
        index = next((i for i in ds.describe_indices()
                      if i.index_type == "BTree" and i.field_names == key), None)
        if index is not None:
            covered = set().union(*(seg.fragment_ids for seg in index.segments))
            unindexed = sum(f.metadata.physical_rows for f in ds.get_fragments()
                            if f.fragment_id not in covered)
            pages = sum(_pages_touched(_page_bounds(table, seg.uuid), keys)
                        for seg in index.segments)
            return joins_by_scan(base_rows, round_rows, pages, unindexed)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, pa.ArrowException) as exc:
        # Only the join's speed depends on it (keys numpy cannot order, a changed layout).
        log.info("memwal compaction: could not read the key index's pages of %s (the round "
                 "scans the key column instead): %s", table.uri, exc)
    return joins_by_scan(base_rows, round_rows, None)


def _page_bounds(table: TableView, uuid: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``(min, max)`` key of every page of BTREE segment ``uuid`` (immutable: kept)."""
    from lance.file import LanceFileReader

    from ..options import lance_storage_options

    with _pages_lock:
        got = _pages_cache.get((table.uri, uuid))
    if got is not None:
        return got
    path = f"{table.uri.rstrip('/')}/_indices/{uuid}/page_lookup.lance"
    lookup = LanceFileReader(path, storage_options=lance_storage_options(
        table.storage_options), columns=["min", "max"]).read_all().to_table()
    lookup = lookup.filter(pc.is_valid(lookup["min"]))  # an all-null page holds no key
    got = (lookup["min"].to_numpy(), lookup["max"].to_numpy())
    with _pages_lock:
        if len(_pages_cache) >= _PAGES_CACHE_SIZE:
            _pages_cache.pop(next(iter(_pages_cache)))
        _pages_cache[(table.uri, uuid)] = got
    return got


def _pages_touched(bounds: tuple[np.ndarray, np.ndarray], keys) -> int:
    """How many pages ``[min, max]`` hold at least one of ``keys`` (nulls match none)."""
    mins, maxs = bounds
    valid = pc.drop_null(keys)
    ordered = pc.take(valid, pc.sort_indices(valid)).to_numpy(zero_copy_only=False)
    if not len(ordered) or not len(mins):
        return 0
    first = np.searchsorted(ordered, mins, side="left")
    past = np.searchsorted(ordered, maxs, side="right")
    return int(np.count_nonzero(past > first))


def lance_pool_bytes() -> int:
    """Lance's query memory pool: ``LANCE_MEM_POOL_SIZE`` or its 300 MiB default."""
    try:
        return int(os.environ.get("LANCE_MEM_POOL_SIZE", ""))
    except ValueError:
        return LANCE_DEFAULT_POOL


def join_source(rows: pa.Table) -> pa.Table:
    """``rows`` as the BTREE join should get them: re-cut into :data:`JOIN_BATCH_ROWS`-row
    batches that own their buffers (a copy) when Lance would charge their slices more than
    half its pool; else as they are (the copy costs ~5% of the merge)."""
    charged = sum(-(-b.num_rows // JOIN_BATCH_ROWS) * b.get_total_buffer_size()
                  for b in rows.to_batches())
    if charged <= lance_pool_bytes() // 2:
        return rows
    return pa.Table.from_batches(
        [pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in b.columns], schema=b.schema)
         for b in rows.to_batches(max_chunksize=JOIN_BATCH_ROWS)], schema=rows.schema)


def out_of_memory(exc: OSError) -> bool:
    """Lance refused the join for its query memory pool."""
    return bool(_EXHAUSTED.search(str(exc)))


def too_large(exc: OSError, rnd: CompactionRound, source: pa.Table) -> CompactionError:
    """The error for a round too large for Lance's query pool (``LANCE_MEM_POOL_SIZE``)."""
    pool = os.environ.get("LANCE_MEM_POOL_SIZE")
    want = max(2 * lance_pool_bytes(), 4 * source.nbytes)
    return CompactionError(
        f"Set the environment variable LANCE_MEM_POOL_SIZE to {want} (bytes; now "
        f"{pool or 'unset: 300 MiB'}) in the compacting process and run compaction again: "
        f"round {rnd.number} (records {rnd.after_seq + 1}..{rnd.upto_seq}, "
        f"{source.num_rows} rows, {source.nbytes / 2**20:.0f} MiB) does not fit Lance's "
        f"query memory pool. Nothing was committed. Lance said: {exc}")


def index_due(indexed_rows: int, missing_rows: int, round_rows: int) -> bool:
    """Whether to fold the ``missing_rows`` the key's BTREE lacks into it now.

    Folding rewrites the index, O(base); until then every round's join scans the rows
    it lacks. Folding once they reach ``INDEX_FOLD * sqrt(indexed * round rows)`` balances
    the two (measured: 10M rows, 100k new per round, best near every 16th round). No
    folding while rounds join by scanning the base, which does not use the index.
    """
    if round_rows <= 0 or joins_by_scan(indexed_rows + missing_rows, round_rows, pages=0):
        return False  # nothing merged here, or rounds scan even with their keys clustered
    return missing_rows > 0 and missing_rows >= INDEX_FOLD * math.sqrt(indexed_rows * round_rows)


def maintain_key_index(table: TableView, round_rows: int) -> None:
    """A BTREE on the merge key (a one-column primary key, else the hidden row key),
    built by the first round and its new rows folded in when :func:`index_due`.

    ``merge_insert`` joins through it, so an insert-mostly round costs what its
    rows cost, not a scan of the whole key column (rows appended since the
    last fold are scanned). Best effort: a failure only costs speed, and is logged.
    """
    ds = table.dataset()
    pk = primary_key_of(ds.schema) or ([ROW_KEY] if ROW_KEY in ds.schema.names else [])
    if len(pk) != 1:
        return
    try:
        index = next((i for i in ds.describe_indices()
                      if i.field_names == pk and i.index_type == "BTree"), None)
        if index is None:
            ds.create_scalar_index(pk[0], "BTREE")
            log.info("memwal compaction: created a BTREE index on key %s of %s",
                     pk[0], table.uri)
        else:
            # The rows of fragments it does not cover, from the manifest (Lance's
            # index_stats reads the index files: 33 ms cold at 10M rows, every round).
            covered = set().union(*(seg.fragment_ids for seg in index.segments))
            missing = sum(f.metadata.physical_rows for f in ds.get_fragments()
                          if f.fragment_id not in covered)
            if index_due(index.num_rows_indexed, missing, round_rows):
                ds.optimize.optimize_indices()
    except (OSError, ValueError) as exc:
        log.warning("memwal compaction: could not maintain the index on %s (compaction stays "
                    "correct, only slower): %s", pk[0], exc)
