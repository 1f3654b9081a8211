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
   with the mark ``R``.

Why it is exactly once: a round's rows are a pure function of immutable
records and entries, fixed by its intent; Lance accepts the mark ``R`` only
when ``G = R - 1``, so round ``R`` commits once. A crash between any two
steps leaves either no intent (step 2 redone), an intent without a commit
(the next compactor commits it), or a commit (``G`` moved on). A stalled
compactor that wakes up after another one committed its round gets Lance's
"Stale SSTable compaction" refusal and commits nothing. A plain Lance append
has no such guard (two appends from one stale version both commit), which is
why compaction goes through ``merge_insert`` on the primary key.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from . import hooks
from .commit import OVERWRITE
from .errors import MemWalError
from .store import put_resolved
from .table import (
    LEDGER_SHARD,
    TOMBSTONE,
    CompactionRound,
    MemWalTable,
    data_schema,
    last_per_key,
    primary_key_of,
    round_key,
)

log = logging.getLogger(__name__)

_STALE = re.compile(r"Stale SSTable compaction", re.IGNORECASE)
DEFAULT_MAX_RECORDS = 256


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


@dataclass
class CompactionSummary:
    """What a compaction run did (or, with ``dry_run``, would do)."""

    uri: str
    rounds: list[RoundResult] = field(default_factory=list)
    pending_records: int = 0
    dry_run: bool = False

    @property
    def rows(self) -> int:
        """Rows folded into the base table by this run."""
        return sum(r.rows for r in self.rounds if r.committed)


class CompactionError(MemWalError):
    """Compaction cannot run on this table; the message says why and what to do."""


def _round_rows(table: MemWalTable, rnd: CompactionRound, schema: pa.Schema,
                pk: list[str]) -> tuple[pa.Table, pa.Table, bool]:
    """(upserts, deleted keys, overwrite) for one round, newest row per key."""
    ranges = []
    overwrite = False
    for rec in table.commits.records(after=rnd.after_seq):
        if rec.sequence > rnd.upto_seq:
            break
        if rec.kind == OVERWRITE:
            ranges, overwrite = [], True
        ranges.extend(rec.ranges)
    rows = last_per_key(table.range_rows(ranges, schema), pk)
    deleted = rows.filter(rows.column(TOMBSTONE)).select(pk)
    upserts = rows.filter(pc.invert(rows.column(TOMBSTONE))).drop_columns([TOMBSTONE])
    return upserts.cast(schema), deleted, overwrite


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
    rows = deleted.to_pylist()
    return " OR ".join("(" + " AND ".join(f"{k} = {_sql_literal(r[k])}" for k in pk) + ")"
                       for r in rows)


def _commit_round(table: MemWalTable, rnd: CompactionRound, pk: list[str]) -> RoundResult:
    """Merge one round into the base table with the ledger mark ``rnd.number``."""
    from lance.mem_wal import CompactedSsTable

    t0 = time.perf_counter()
    ds = table.dataset()
    schema = data_schema(ds.schema)
    upserts, deleted, overwrite = _round_rows(table, rnd, schema, pk)
    builder = (ds.merge_insert(pk).when_matched_update_all().when_not_matched_insert_all())
    if overwrite:
        builder = builder.when_not_matched_by_source_delete()
    else:
        predicate = _delete_predicate(deleted, pk)
        if predicate is not None:
            builder = builder.when_not_matched_by_source_delete(predicate)
    builder = builder.mark_sstables_as_compacted([CompactedSsTable(LEDGER_SHARD, rnd.number)])
    hooks.point("compact.before_commit", round=rnd.number)
    try:
        builder.execute(upserts)
        committed = True
    except OSError as exc:
        if not _STALE.search(str(exc)):
            raise
        committed = False  # another compactor (or our own earlier try) committed it
    hooks.point("compact.after_commit", round=rnd.number)
    version = table.dataset().version
    log.info("memwal compaction round %d (records %d..%d): %s %d rows, %d deletes%s",
             rnd.number, rnd.after_seq + 1, rnd.upto_seq,
             "merged" if committed else "already committed by another compactor",
             upserts.num_rows, deleted.num_rows, " (overwrite)" if overwrite else "")
    return RoundResult(rnd.number, rnd.after_seq, rnd.upto_seq, upserts.num_rows,
                       deleted.num_rows, committed, time.perf_counter() - t0, version)


def _next_round(table: MemWalTable, max_records: int) -> CompactionRound | None:
    """The round to run now: the pending intent, or a new one; ``None`` if up to date."""
    recorded = table.compacted_round(table.dataset().version)
    number = recorded + 1
    after = table.round(recorded).upto_seq if recorded else 0
    try:
        return table.round(number)  # an intent whose commit never landed: finish it
    except FileNotFoundError:
        pass
    last = table.commits.next_sequence() - 1
    if last <= after:
        return None
    rnd = CompactionRound(number, after, min(last, after + max_records),
                          int(time.time() * 1000))
    if put_resolved(table.store, round_key(number), rnd.to_json(), retries=3,
                    base_delay_ms=50, what=f"compaction round {number}"):
        hooks.point("compact.intent", round=number)
        return rnd
    return table.round(number)  # another compactor fixed this round's records first


def compact(table: MemWalTable, *, max_records_per_round: int = DEFAULT_MAX_RECORDS,
            max_rounds: int | None = None, dry_run: bool = False,
            progress: Callable[[RoundResult, int], None] | None = None) -> CompactionSummary:
    """Fold every committed, uncompacted record into the base table; see the module doc.

    Safe to run concurrently with writers, readers and other compactors, and
    to kill at any point. ``progress(result, remaining_records)`` is called
    after each round.
    """
    ds = table.dataset()
    pk = primary_key_of(ds.schema)
    if not pk:
        raise CompactionError(
            f"table {table.uri} has no primary key: compaction commits through "
            "merge_insert on the primary key, the only Lance commit that carries the "
            "compare-and-set that makes it exactly once. Create tables you want to "
            "compact with option 'primary_key'")
    summary = CompactionSummary(table.uri, dry_run=dry_run)
    snap = table.snapshot(ds.version)
    summary.pending_records = snap.last_seq - snap.compacted_seq
    if dry_run:
        return summary
    while max_rounds is None or len(summary.rounds) < max_rounds:
        rnd = _next_round(table, max_records_per_round)
        if rnd is None:
            break
        result = _commit_round(table, rnd, pk)
        summary.rounds.append(result)
        summary.pending_records = max(0, table.commits.next_sequence() - 1 - rnd.upto_seq)
        if progress is not None:
            progress(result, summary.pending_records)
    return summary
