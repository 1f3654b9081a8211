"""Compaction as a Spark job: ``memwal_datasource.spark.compact(spark, path)``.

For tables whose commit records name more shards and WAL entries than one
process reads quickly. The guarantees are the core's
(:mod:`memwal_datasource.maintenance.compact`), because the steps that make compaction
exactly once stay on the driver and are the very same functions:

* **driver**: fixes round ``R``'s intent (which commit records it folds,
  put-if-absent, :func:`~memwal_datasource.maintenance.compact.next_round`) and lists
  the round's committed ranges in commit order;
* **one Spark task per shard** (the shard's ranges in the round): reads and
  decodes its WAL entries (only each range's epoch), and on a table with a
  primary key keeps the newest row per key within the shard; it returns the
  rows as Arrow IPC bytes, each row tagged with its place in commit order;
* **driver**: merges the tasks' rows in commit order (newest row per key
  across shards), and commits them with the one ``merge_insert`` that carries
  the ledger mark ``R`` (:func:`~memwal_datasource.maintenance.compact.commit_round`).

What is parallel: the WAL reads, decoding and per-shard deduplication (the
object-store round trips, which dominate on S3 with many shards). What is
not: the base-table commit, a single ``merge_insert`` on the driver (it
joins the round's keys against the base table and writes the new data
files). Lance's ``merge_insert`` takes rows, not pre-written fragments, and it
is the only Lance commit that checks the mark; ``write_fragments`` plus a
``LanceOperation`` commit would lose the mark, and with it exactly-once. A
round's rows therefore pass through the driver: bound them with
``max_records_per_round``.

A task that fails is retried by Spark (reads are idempotent); a driver that
dies leaves an intent or a committed round, which the next run (Spark or
not) finishes or skips, exactly as in the core.

**Classic and Spark Connect alike.** The tasks are DataFrame operations a
Connect client can send (``spark.range`` with one partition per shard, then
``mapInArrow``), not ``sparkContext.parallelize``; the "driver" steps run in
the calling process, the user's driver or Connect client, which must reach
the table's storage (an object store, or local disk shared with the server).
Each round's job carries the tag :data:`COMPACTION_TAG`
(``spark.interruptTag(COMPACTION_TAG)`` cancels it) and, in a classic session,
a job description for Spark's UI; Connect has no per-job description.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa

from ..format.table_schema import data_schema, primary_key_of
from ..log.commit import CommittedRange
from ..log.rounds import DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS
from ..maintenance.compact import (
    CompactionSummary,
    RoundResult,
    commit_round,
    fold_rows,
    round_ranges,
    sstable_marks,
)
from ..maintenance.compact import compact as core_compact
from ..table.view import CompactionRound, TableView, last_per_key
from .connect import client_path, is_connect

log = logging.getLogger("memwal_datasource")
ORDER = "__memwal_order"  # a row's place in the round's commit order
COMPACTION_TAG = "memwal-compaction"  # every compaction job's Spark job tag
ROWS = "rows"  # the tasks' one column: a shard's rows as Arrow IPC


def shard_tasks(ranges: list[CommittedRange]) -> list[list[tuple[int, CommittedRange]]]:
    """The round's ranges grouped per shard, each with its index in commit order."""
    groups: dict[str, list[tuple[int, CommittedRange]]] = {}
    for i, r in enumerate(ranges):
        groups.setdefault(r.shard_id, []).append((i, r))
    return list(groups.values())


def read_task(uri: str, storage_options: dict[str, str], schema: pa.Schema, pk: list[str],
              group: list[tuple[int, CommittedRange]]) -> bytes:
    """One shard's rows of a round (runs on an executor): Arrow IPC with :data:`ORDER`."""
    table = TableView(uri, storage_options)
    pieces = []
    for index, rng in group:
        rows = table.range_rows([rng], schema)
        order = (index << 32) | np.arange(rows.num_rows, dtype=np.int64)
        pieces.append(rows.append_column(ORDER, pa.array(order, pa.int64())))
    rows = pa.concat_tables(pieces)
    if pk:  # the newest row per key within the shard; across shards on the driver
        rows = last_per_key(rows, pk)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return sink.getvalue().to_pybytes()


@contextlib.contextmanager
def _job_labelled(spark, description: str) -> Iterator[None]:
    """Label the Spark jobs started inside: :data:`COMPACTION_TAG` always, and in a
    classic session ``description`` (Spark's UI); the thread's earlier labels return."""
    spark.addTag(COMPACTION_TAG)
    sc = None if is_connect(spark) else spark.sparkContext
    before = sc.getLocalProperty("spark.job.description") if sc is not None else None
    try:
        if sc is not None:
            sc.setJobDescription(description)
        yield
    finally:
        if sc is not None:
            sc.setJobDescription(before)
        spark.removeTag(COMPACTION_TAG)


def read_on_executors(spark, uri: str, storage_options: dict[str, str], schema: pa.Schema,
                      pk: list[str], groups: list[list[tuple[int, CommittedRange]]]
                      ) -> list[pa.Buffer]:
    """Each group's :func:`read_task` in a Spark task of its own; their IPC streams.

    ``spark.range(n)`` in ``n`` partitions gives task ``i`` exactly the index
    ``i``; the groups travel in the function's closure (bounded by the round).
    """
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i in batch.column(0).to_pylist():
                data = read_task(uri, storage_options, schema, pk, groups[i])
                yield pa.record_batch([pa.array([data], pa.binary())], names=[ROWS])

    n = len(groups)
    parts = spark.range(0, n, 1, n).mapInArrow(read, f"{ROWS} binary").toArrow()
    return [value.as_buffer() for value in parts.column(ROWS) if value.is_valid]


def _round_on_spark(spark, storage_options: dict[str, str]):
    """A ``run_round`` for the core loop: read on executors, fold and commit on the driver."""

    def run(table: TableView, rnd: CompactionRound) -> RoundResult:
        t0 = time.perf_counter()
        ds = table.dataset()
        schema = data_schema(ds.schema)
        pk = primary_key_of(ds.schema)
        ranges, overwrite = round_ranges(table, rnd)
        groups = shard_tasks(ranges)
        uri = table.uri
        if groups:
            with _job_labelled(spark, f"memwal compaction round {rnd.number}: read "
                               f"{len(ranges)} range(s) of {len(groups)} shard(s) of {uri}"):
                parts = read_on_executors(spark, uri, storage_options, schema, pk, groups)
            if len(parts) != len(groups):  # Spark returns every task's row, or fails
                raise RuntimeError(f"memwal compaction round {rnd.number}: {len(groups)} "
                                   f"task(s) returned {len(parts)} result(s)")
            rows = pa.concat_tables(pa.ipc.open_stream(p).read_all() for p in parts)
            rows = rows.sort_by(ORDER).drop_columns([ORDER])
        else:
            rows = table.range_rows([], schema)
        read_s = time.perf_counter() - t0
        live, deleted = fold_rows(rows, pk)
        result = commit_round(table, rnd, live, deleted, overwrite, sstable_marks(ranges),
                              ds=ds, started=t0)
        log.info("memwal spark compaction round %d: %d task(s) read %d range(s) in %.1fs, "
                 "%s %d rows in %.1fs total (%.1fs in Lance's merge_insert)", rnd.number,
                 len(groups), len(ranges), read_s,
                 "committed" if result.committed else "another compactor had committed",
                 result.rows, result.seconds, result.merge_seconds)
        return result

    return run


def compact(spark, path: str, storage_options: Mapping[str, str] | None = None, *,
            max_records_per_round: int = DEFAULT_MAX_RECORDS,
            max_bytes_per_round: int = DEFAULT_MAX_BYTES, max_rounds: int | None = None,
            dry_run: bool = False) -> CompactionSummary:
    """Fold committed WAL entries into the base table with Spark tasks reading the WAL.

    Same rounds, intents and compare-and-set as :func:`memwal_datasource.compact`
    (see the module doc for what runs where); safe against concurrent and
    crashed compactors of either kind. Logs a line per round and a summary.
    ``spark`` is a classic or a Spark Connect session; from a Connect client,
    ``path`` must be absolute or a URI (the client's working directory is not
    the server's).
    """
    opts = dict(storage_options or {})
    path = client_path(spark, path, "the path argument of compact()")
    table = TableView(path, opts)
    t0 = time.perf_counter()
    done = 0

    def progress(result: RoundResult, left: int) -> None:
        nonlocal done
        done += result.upto_seq - result.after_seq
        log.info("memwal spark compaction %s: %d commit record(s) done, %d pending",
                 path, done, left)

    summary = core_compact(table, max_records_per_round=max_records_per_round,
                           max_bytes_per_round=max_bytes_per_round, max_rounds=max_rounds,
                           dry_run=dry_run, progress=progress,
                           run_round=_round_on_spark(spark, opts))
    mine = [r for r in summary.rounds if r.committed]
    log.info("memwal spark compaction %s: %s%d round(s) (%d committed here), %d rows merged, "
             "%d record(s) pending, %.1fs", path, "dry run: " if dry_run else "",
             len(summary.rounds), len(mine), summary.rows, summary.pending_records,
             time.perf_counter() - t0)
    return summary
