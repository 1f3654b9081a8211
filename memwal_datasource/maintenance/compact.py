"""Compaction: fold committed WAL entries into the base Lance table, exactly once.

The work is cut into numbered **rounds**. Round ``R`` folds commit records
``after_seq + 1 .. upto_seq`` (in commit order) and commits them to the base
table with one ``merge_insert`` that also marks the ledger shard's compacted
generation as ``R`` (``mark_sstables_as_compacted``). Lance checks that mark
at commit time against the latest table version and refuses a generation
that is not above the recorded one, atomically with the data: that is the
compare-and-set every compactor goes through.

1. Read the base table's recorded round ``G`` (from its MemWAL index).
2. Round ``R = G + 1``: its intent ``_memwal_compaction/rounds/R.json`` fixes
   which records it folds. The first compactor to write it (put-if-absent)
   decides; every other compactor, and every later retry, folds the same records.
3. Build the rows from the WAL entries those records name and commit them
   with the mark ``R`` (plus, per shard whose MemTable SSTables the records
   name, the highest such generation, so pylance's LSM readers that filter
   by ``compacted_sstables`` stop counting those SSTables).

**With a primary key** the merge is keyed on it: the newest row per key wins,
tombstones delete, an ``overwrite`` record replaces the table.

**Without a primary key** the base table gets a hidden ``int64`` column
:data:`~memwal_datasource.format.table_schema.ROW_KEY` (added, null for existing rows, by the
first compaction: a schema-only commit; a compactor that loses that race to
another gets Lance's commit conflict, re-reads and finds the column). Round
``R`` gives its ``i``-th row the key ``R << 32 | i`` and merges keyed on it
with only ``when_not_matched_insert_all``: keys are new, so it is a pure
append, but one that carries the compare-and-set. A plain Lance append has
no conflict guard (two appends from one stale version both commit), and
``merge_insert`` is the only Lance commit that checks the mark; the keys are
also deterministic, so even a merge re-run against a version that already
holds round ``R`` would match every row and insert none. Our readers and
writers hide the column (``data_schema``, ``without_row_key``); a Lance reader
sees it as a nullable column. MemTable mode needs a primary key, so pylance's
native writer (which puts the base table's full schema) never meets it.
No design without a visible column was found: ``merge_insert`` cannot key on
``_rowid``, pylance's ``LanceOperation.Update`` carries no mark, and
``execute_uncommitted()`` + ``commit()`` drops it.

Why it is exactly once: a round's rows are a pure function of immutable
records and entries, fixed by its intent; Lance accepts the mark ``R`` only
when ``G = R - 1``, so round ``R`` commits once. A crash between any two
steps leaves either no intent (step 2 redone), an intent without a commit
(the next compactor commits it), or a commit (``G`` moved on). A stalled
compactor that wakes up after another one committed its round gets Lance's
"Stale SSTable compaction" refusal and commits nothing.

The pieces (:func:`next_round`, :func:`round_ranges`, :func:`fold_rows`,
:func:`commit_round`) are public so that :func:`memwal_datasource.spark.compact`
can read a round's WAL entries in Spark tasks and commit on the driver.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import hooks
from ..errors import CollectedError, CompactionError, MemWalError
from ..format.lance_manifest import compacted_generations
from ..format.table_schema import ROW_KEY, data_schema, primary_key_of
from ..log.commit import OVERWRITE, CommittedRange
from ..log.rounds import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_RECORDS,
    LEDGER_SHARD,
    CompactionRound,
    mark_done,
    oldest_kept_round,
    round_key,
)
from ..store import put_resolved
from ..table.view import TOMBSTONE, TableView, last_per_key
from .merge_join import (
    join_source,
    maintain_key_index,
    out_of_memory,
    round_joins_by_scan,
    too_large,
)

log = logging.getLogger(__name__)

_STALE = re.compile(r"Stale SSTable compaction", re.IGNORECASE)
_GENERATION = re.compile(r"_gen_(\d+)/?$")
ROUND_ROWS_LIMIT = 1 << 32  # rows of one round on a table without a primary key


@dataclass
class RoundResult:
    """What one round did."""

    number: int
    after_seq: int
    upto_seq: int
    rows: int
    deletes: int
    committed: bool  # False: another compactor had committed this round
    seconds: float
    base_version: int | None = None
    sstables: dict[str, int] = field(default_factory=dict)  # shard: generation marked
    # Of ``seconds``, the time inside Lance's merge_insert (join, write and the commit
    # carrying the round's mark); the rest is reading, folding and the round's markers.
    merge_seconds: float = 0.0


@dataclass
class CompactionSummary:
    """What a compaction run did (or, with ``dry_run``, would do)."""

    uri: str
    rounds: list[RoundResult] = field(default_factory=list)
    pending_records: int = 0
    dry_run: bool = False
    pending_rows: int = 0  # rows the pending records name (tombstones included)
    pending_bytes: int = 0  # their Arrow bytes (what bounds a round besides its records)
    primary_key: list[str] = field(default_factory=list)  # empty: keyed by the hidden ROW_KEY

    @property
    def rows(self) -> int:
        """Rows folded into the base table by this run."""
        return sum(r.rows for r in self.rounds if r.committed)


# --- one round's inputs ------------------------------------------------------------

def round_ranges(table: TableView, rnd: CompactionRound) -> tuple[list[CommittedRange], bool]:
    """(committed ranges in commit order, overwrite) of the records round ``rnd`` folds.

    An ``overwrite`` record drops the ranges before it: the round replaces the table.
    """
    ranges: list[CommittedRange] = []
    overwrite = False
    for rec in table.commits.records(after=rnd.after_seq):
        if rec.sequence > rnd.upto_seq:
            break
        if rec.kind == OVERWRITE:
            ranges, overwrite = [], True
        ranges.extend(rec.ranges)
    return ranges, overwrite


def sstable_marks(ranges: list[CommittedRange]) -> dict[str, int]:
    """``{shard: highest MemTable SSTable generation}`` the ranges name."""
    out: dict[str, int] = {}
    for r in ranges:
        for path in r.sstables:
            m = _GENERATION.search(path)
            if m is None:
                raise CompactionError(f"shard {r.shard_id}: SSTable path {path!r} in a commit "
                                      "record has no '_gen_N' suffix")
            out[r.shard_id] = max(out.get(r.shard_id, 0), int(m.group(1)))
    return out


def fold_rows(rows: pa.Table, pk: list[str]) -> tuple[pa.Table, pa.Table]:
    """(rows to write, deleted keys) of rows in commit order with a ``_tombstone`` column.

    With a primary key the newest row per key wins and tombstones delete it;
    without one every live row is kept, in order.
    """
    if pk:
        rows = last_per_key(rows, pk)
    if not pc.any(rows.column(TOMBSTONE)).as_py():  # no deletes: no copy of every row
        return rows.drop_columns([TOMBSTONE]), rows.select(pk).slice(0, 0)
    deleted = rows.filter(rows.column(TOMBSTONE)).select(pk)
    live = rows.filter(pc.invert(rows.column(TOMBSTONE))).drop_columns([TOMBSTONE])
    return live, deleted


def _sql_literal(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _delete_predicate(deleted: pa.Table, pk: list[str]) -> str | None:
    if not deleted.num_rows:
        return None
    if len(pk) == 1:
        values = ", ".join(_sql_literal(v) for v in deleted.column(pk[0]).to_pylist())
        return f"{pk[0]} IN ({values})"
    # A composite key as one struct IN a list, not an OR of ANDs: a merge deleting 10k
    # keys took 0.35 s instead of 2.1, 50k 2.0 s instead of 13.7 (the OR grew worse than
    # linearly); the struct's fields coerce to the key's types (int32, large_string).
    def struct(values) -> str:
        return "named_struct(" + ", ".join(f"'{k}', {v}" for k, v in zip(pk, values,
                                                                          strict=True)) + ")"

    keys = ", ".join(struct(_sql_literal(r[k]) for k in pk) for r in deleted.to_pylist())
    return f"{struct(pk)} IN ({keys})"


# --- the commit --------------------------------------------------------------------

def _is_conflict(exc: OSError) -> bool:
    from lance.commit import CommitConflictError

    return isinstance(exc, CommitConflictError) or "conflict" in str(exc).lower()


def ensure_row_key(table: TableView, attempts: int = 5):
    """The base dataset with the hidden :data:`ROW_KEY` column (added if missing).

    Adding it is a schema-only commit; two compactors may race: the loser gets
    Lance's commit conflict, re-reads and finds the winner's column.
    """
    for _ in range(attempts):
        ds = table.dataset()
        if ROW_KEY in ds.schema.names:
            return ds
        try:
            hooks.point("compact.row_key", version=ds.version)
            ds.add_columns(pa.field(ROW_KEY, pa.int64()))
            log.info("memwal compaction: added hidden column %s to %s (a table without a "
                     "primary key)", ROW_KEY, table.uri)
        except OSError as exc:
            if not _is_conflict(exc):
                raise
    ds = table.dataset()
    if ROW_KEY not in ds.schema.names:
        raise CompactionError(f"could not add column {ROW_KEY} to {table.uri}: every try "
                              "conflicted with another commit; run compaction again")
    return ds


def _keyed(rows: pa.Table, number: int, ds_schema: pa.Schema) -> pa.Table:
    """``rows`` in the base table's column order with round ``number``'s row keys."""
    if rows.num_rows >= ROUND_ROWS_LIMIT:
        raise CompactionError(f"compaction round {number} has {rows.num_rows} rows, more than "
                              f"{ROUND_ROWS_LIMIT - 1}: use a smaller --max-records-per-round")
    keys = pa.array((number << 32) | np.arange(rows.num_rows, dtype=np.int64), pa.int64())
    schema = data_schema(ds_schema)
    cols, fields = [], []
    for f in ds_schema:
        if f.name == ROW_KEY:
            cols.append(keys)
            fields.append(pa.field(ROW_KEY, pa.int64()))
        else:
            want = schema.field(f.name)
            col = rows.column(f.name)
            cols.append(col if col.type.equals(want.type) else col.cast(want.type))
            fields.append(want)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def commit_round(table: TableView, rnd: CompactionRound, rows: pa.Table, deleted: pa.Table,
                 overwrite: bool, marks: dict[str, int], *, ds=None,
                 started: float | None = None) -> RoundResult:
    """Merge one round's folded rows into the base with the ledger mark ``rnd.number``.

    ``rows``/``deleted`` come from :func:`fold_rows`, ``marks`` from
    :func:`sstable_marks`. Lance's stale-mark refusal means another compactor
    (or an earlier try of ours) committed this round: the result says so.
    """
    from lance.mem_wal import CompactedSsTable

    t0 = time.perf_counter() if started is None else started
    ds = ds if ds is not None else table.dataset()
    pk = primary_key_of(ds.schema)
    if pk:
        builder = ds.merge_insert(pk).when_matched_update_all().when_not_matched_insert_all()
        source = rows.cast(data_schema(ds.schema))
        if overwrite:
            builder = builder.when_not_matched_by_source_delete()
        else:
            predicate = _delete_predicate(deleted, pk)
            if predicate is not None:
                builder = builder.when_not_matched_by_source_delete(predicate)
    else:
        if ROW_KEY not in ds.schema.names:
            ds = ensure_row_key(table)
        # New keys never match: a pure insert that still carries the compare-and-set.
        builder = ds.merge_insert(ROW_KEY).when_not_matched_insert_all()
        source = _keyed(rows, rnd.number, ds.schema)
        if overwrite:
            builder = builder.when_not_matched_by_source_delete()
    if round_joins_by_scan(table, ds, source, pk or [ROW_KEY]):
        builder = builder.use_index(False)  # cheaper than probing the key's BTREE
    else:
        source = join_source(source)
    recorded = compacted_generations(table.store, ds.version)
    # Per shard the highest generation, never one already recorded (that would be
    # refused as stale); the ledger mark last. Ascending generation order.
    fresh = {s: g for s, g in marks.items() if g > recorded.get(s, 0)}
    sstables = [CompactedSsTable(s, g) for s, g in sorted(fresh.items(), key=lambda x: x[1])]
    builder = builder.mark_sstables_as_compacted(
        sstables + [CompactedSsTable(LEDGER_SHARD, rnd.number)])
    hooks.point("compact.before_commit", round=rnd.number)
    merge_t0 = time.perf_counter()
    try:
        builder.execute(source)
        committed = True
    except OSError as exc:
        if out_of_memory(exc):
            raise too_large(exc, rnd, source) from None
        if not _STALE.search(str(exc)):
            raise
        committed = False  # another compactor (or our own earlier try) committed it
    merge_seconds = time.perf_counter() - merge_t0
    hooks.point("compact.after_commit", round=rnd.number)
    version = table.dataset().version
    # The round is in the base either way: from now its records' WAL entries are
    # unnecessary, and gc counts their retention from this marker's store time.
    mark_done(table.store, rnd.number, version if committed else None)
    log.info("memwal compaction round %d (records %d..%d): %s %d rows, %d deletes "
             "(%.2fs in Lance's merge_insert)%s%s",
             rnd.number, rnd.after_seq + 1, rnd.upto_seq,
             "merged" if committed else "already committed by another compactor",
             source.num_rows, deleted.num_rows, merge_seconds,
             " (overwrite)" if overwrite else "",
             f", SSTables compacted {fresh}" if fresh else "")
    return RoundResult(rnd.number, rnd.after_seq, rnd.upto_seq, source.num_rows,
                       deleted.num_rows, committed, time.perf_counter() - t0, version, fresh,
                       merge_seconds)


def _run_round(table: TableView, rnd: CompactionRound) -> RoundResult:
    """Read, fold and commit one round in this process."""
    t0 = time.perf_counter()
    ds = table.dataset()
    ranges, overwrite = round_ranges(table, rnd)
    try:
        rows = table.range_rows(ranges, data_schema(ds.schema))
    except CollectedError:
        # We stalled: another compactor committed this round and gc collected its entries.
        if table.compacted_round(table.dataset().version) < rnd.number:
            raise
        log.info("memwal compaction round %d: already committed by another compactor",
                 rnd.number)
        return RoundResult(rnd.number, rnd.after_seq, rnd.upto_seq, 0, 0, False,
                           time.perf_counter() - t0, table.dataset().version)
    live, deleted = fold_rows(rows, primary_key_of(ds.schema))
    return commit_round(table, rnd, live, deleted, overwrite, sstable_marks(ranges), ds=ds,
                        started=t0)


def round_end(table: TableView, after: int, upto: int, max_bytes: int) -> int:
    """The last record of a new round after record ``after``: ``upto`` at most, and none
    past where the round's rows would pass ``max_bytes`` (one record with rows at least:
    a larger record makes a round of its own)."""
    total = 0
    try:
        for rec in table.commits.records(after=after):
            size = sum(r.bytes for r in rec.ranges)
            if rec.kind == OVERWRITE:
                total = 0  # the round drops the ranges before an overwrite
            elif total and total + size > max_bytes:
                return rec.sequence - 1
            total += size
            if rec.sequence >= upto:
                break
    except MemWalError:
        # Collected: we stalled while other compactors folded these records and gc
        # freed them. The intent's put finds that out (next_round); no bound is needed.
        pass
    return upto


def next_round(table: TableView, max_records: int,
               max_bytes: int = DEFAULT_MAX_BYTES) -> CompactionRound | None:
    """The round to run now: the pending intent, or a new one; ``None`` if up to date."""
    recorded = table.compacted_round(table.dataset().version)
    number = recorded + 1
    after = table.round(recorded).upto_seq if recorded else 0
    try:
        return table.round(number)  # an intent whose commit never landed: finish it
    except FileNotFoundError:
        pass
    last = table.commits.next_sequence() - 1
    if table.commits.state().last_data <= after:
        return None  # nothing new, or only gc records: a round would commit an empty version
    upto = round_end(table, after, min(last, after + max_records), max_bytes)
    rnd = CompactionRound(number, after, upto, int(time.time() * 1000))
    if put_resolved(table.store, round_key(number), rnd.to_json(), retries=3,
                    base_delay_ms=50, what=f"compaction round {number}"):
        hooks.point("compact.intent", round=number)
        ds = table.dataset()
        if (table.compacted_round(ds.version) >= number
                and number < oldest_kept_round(table.store, ds)):
            # We stalled: round ``number`` was committed long ago and its intent
            # collected. No stored version can need ours (rounds only grow): remove it.
            table.store.delete(round_key(number))
            return next_round(table, max_records, max_bytes)
        return rnd
    return table.round(number)  # another compactor fixed this round's records first


def planned_rounds(pending_records: int, max_records_per_round: int, pending_bytes: int = 0,
                   max_bytes_per_round: int = DEFAULT_MAX_BYTES) -> int:
    """How many rounds a run folds ``pending_records`` (of ``pending_bytes``) in: a dry
    run's estimate (a record larger than the byte bound is a round of its own)."""
    return max(-(-pending_records // max_records_per_round),
               min(pending_records, -(-pending_bytes // max_bytes_per_round)))


def compact(table: TableView, *, max_records_per_round: int = DEFAULT_MAX_RECORDS,
            max_bytes_per_round: int = DEFAULT_MAX_BYTES,
            max_rounds: int | None = None, dry_run: bool = False,
            progress: Callable[[RoundResult, int], None] | None = None,
            run_round: Callable[[TableView, CompactionRound], RoundResult] | None = None,
            ) -> CompactionSummary:
    """Fold every committed, uncompacted record into the base table; see the module doc.

    Safe to run concurrently with writers, readers and other compactors, and
    to kill at any point. A round folds ``max_records_per_round`` records at most,
    and stops before the record that would take its rows past
    ``max_bytes_per_round`` Arrow bytes (a larger record is a round of its own).
    ``progress(result, remaining_records)`` is called after each round;
    ``run_round`` replaces the in-process read-fold-commit of one round (the
    Spark job passes its own).
    """
    ds = table.dataset()
    snap = table.snapshot(ds.version)
    summary = CompactionSummary(table.uri, pending_records=snap.pending_records,
                                dry_run=dry_run, pending_rows=sum(r.rows for r in snap.tail),
                                pending_bytes=sum(r.bytes for r in snap.tail),
                                primary_key=primary_key_of(ds.schema))
    if dry_run:
        return summary
    run_round = run_round or _run_round
    while max_rounds is None or len(summary.rounds) < max_rounds:
        rnd = next_round(table, max_records_per_round, max_bytes_per_round)
        if rnd is None:
            break
        result = run_round(table, rnd)
        summary.rounds.append(result)
        maintain_key_index(table, result.rows)
        state = table.commits.state()
        summary.pending_records = (max(0, state.sequence - rnd.upto_seq)
                                   if state.last_data > rnd.upto_seq else 0)
        if progress is not None:
            progress(result, summary.pending_records)
        if not summary.pending_records:
            break  # the fold we just read has nothing past this round: no second look
    return summary
