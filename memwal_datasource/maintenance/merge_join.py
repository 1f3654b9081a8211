"""How a compaction round joins the base table: by scanning its key column or through
the key's BTREE, the BTREE's upkeep, and the join's memory.

``merge_insert`` (the one Lance commit that carries the round's compare-and-set)
joins the round's rows to the base on the merge key, a one-column primary key or
the hidden row key. A base small next to the round is scanned
(:func:`joins_by_scan`); a larger one is probed through a BTREE that the first
round builds and later rounds fold their new rows into when that pays
(:func:`index_due`). Lance 14 charges a join through the BTREE more memory than
the round holds unless its batches own their buffers (:func:`join_source`).
"""

from __future__ import annotations

import logging
import math
import os
import re

import pyarrow as pa

from ..errors import CompactionError
from ..format.table_schema import ROW_KEY, primary_key_of
from ..log.rounds import CompactionRound
from ..table.view import TableView

log = logging.getLogger(__name__)

INDEX_FOLD = 1.6  # when the key's BTREE folds in its missing rows: see index_due
# Up to this many base rows per round row, the merge joins by scanning the base's key
# column (a hash join) instead of probing its BTREE once per round row: on the 2-core
# machine 200k upserts cost 73 ms by scan and 137 ms by index into a 1M-row base, 81 vs
# 123 ms into 3M, 177 vs 142 ms into 10M (scan ~12 ms per million base rows, a probe
# ~0.4 us per round row; they cross near 35 base rows per round row).
SCAN_JOIN_MAX_RATIO = 25
# A join through the BTREE reads the round in slices of this many rows, and DataFusion
# (Lance 14) charges each slice the memory of the whole buffer it is cut from: one
# 300k-row batch was charged ~285 MB and the round failed on Lance's 300 MB pool. Batches
# of this size that own their buffers are charged what they hold (:func:`join_source`).
JOIN_BATCH_ROWS = 8192
LANCE_DEFAULT_POOL = 300 * 2**20
_EXHAUSTED = re.compile(r"Resources exhausted", re.IGNORECASE)


def joins_by_scan(base_rows: int, round_rows: int) -> bool:
    """Whether a round of ``round_rows`` joins a base of ``base_rows`` by scanning it."""
    return base_rows <= SCAN_JOIN_MAX_RATIO * max(1, round_rows)


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
    if round_rows <= 0 or joins_by_scan(indexed_rows + missing_rows, round_rows):
        return False  # nothing merged here, or rounds scan
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
