"""The WAL as a Spark streaming source.

An offset is ``{"commit": S, "positions": {shard: next position}}``: every
commit record up to sequence ``S`` has been served, and ``positions`` says
where each shard stands (for people and progress reports). Progress follows
commit records rather than raw positions on purpose: a job's record can land
after a later job's record for the same shard, and a position-only offset
would skip it. Each micro-batch serves the ranges of the records after the
start offset, so only committed entries are served, each exactly once, and a
restart from the checkpoint resumes exactly where it stopped.

Where a new query starts is ``starting_commit`` / ``starting_timestamp``
(:func:`resolve_start`); with a checkpoint, the checkpoint decides. Every
offset also carries ``origin``, the start resolved for the query's first
micro-batch: Spark asks for the initial offset again when it re-runs batch 0
after a restart, and ``latest`` may have moved by then, so batch 0 is planned
from the ``origin`` its stored end offset carries.

A stream serves committed entries only, in commit order, without end:
:func:`refuse_unsupported` rejects the read options it cannot honour.

**Beside garbage collection.** Each query run keeps a reader hold
(:mod:`memwal_datasource.log.holds`) naming the last commit record it no longer
needs; gc releases nothing above it. The hold is written *before* the run
plans: a new query holds everything, then resolves ``earliest`` (the oldest
record whose entries are still stored, which therefore stays stored until it
is read); every micro-batch holds from its start offset before planning and
reading it, and a commit moves the hold to the batch's end. A hold lapses
:data:`~memwal_datasource.log.holds.DEFAULT_HOLD_TTL_S` after the run last wrote it
(judged on the store's clock), so a stopped query keeps gc back only that long.
A micro-batch this run did not plan under its hold (a restart re-running the
planned batch from the checkpoint, or a hold that lapsed) is checked against
the collection floors first: records gc released meanwhile are skipped, with
a warning naming them and their rows (which are in the base table), and the
rest is served. The query never fails for good on what gc collected.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..errors import CollectedError, ConfigError, MemWalError
from ..log.commit import GC, CommitLog, CommitRecord
from ..log.holds import DEFAULT_HOLD_TTL_S, HoldKeeper
from ..store import open_store
from .options import ReadOptions, StreamStart
from .reader import WalRange, read_partition, split
from .worker_entry import enter, entry_point, plain_error

log = logging.getLogger("memwal_datasource")


def refuse_unsupported(opts: ReadOptions) -> None:
    """Fail on the driver, naming the option, for what a stream cannot honour."""
    if opts.view != "tail":
        raise ConfigError(
            "option 'view=table' is not supported by readStream: a stream serves commits as "
            "they land; use spark.read for the whole table")
    if not opts.committed:
        raise ConfigError(
            "option 'isolation=read_uncommitted' is not supported by readStream: a stream "
            "serves committed entries only, in commit order; use spark.read for the raw log")
    if opts.ending is not None:
        raise ConfigError(
            "option 'ending_positions' is not supported by readStream: a stream has no end; "
            "use spark.read, or .trigger(availableNow=True) to stop once caught up")
    if opts.starting is not None:
        raise ConfigError(
            "option 'starting_positions' (per-shard positions) is not supported by "
            "readStream: a stream starts at a commit record; use 'starting_commit' "
            "(earliest, latest, a sequence number or a time) or 'starting_timestamp'")
    if opts.max_rows_per_trigger and opts.max_entries_per_trigger:
        raise ConfigError(
            "set one of options 'max_rows_per_trigger' and 'max_entries_per_trigger', not "
            "both: Spark passes a source one read limit per micro-batch")


def readable_from(log: CommitLog) -> int:
    """The first commit record a stream can serve: all its WAL entries are stored.

    ``memwal gc`` deletes WAL entries below per-shard floors (their rows are in
    the base table) and, below a checkpoint, the oldest commit records.
    """
    first = log.first_stored()
    records = list(log.records(after=first - 1))
    ck = log.latest_checkpoint()
    floors = dict(ck.floors) if ck is not None else {}
    for rec in records:
        if rec.kind == GC:
            for shard, floor in rec.extra.get("floors", {}).items():
                floors[shard] = max(int(floor), floors.get(shard, 0))
    # One past the *last* record that names a released position: commit order on a
    # shard may differ from WAL order, so a record above a readable one can be gone.
    start = first
    for rec in records:
        if any(r.first < floors.get(r.shard_id, 0) for r in rec.ranges):
            start = rec.sequence + 1
    return start


def resolve_start(log: CommitLog, start: StreamStart | None, path: str) -> int:
    """The sequence of the last commit record a new query treats as already served.

    ``earliest`` is the oldest record whose entries are still stored: records a
    garbage collection released are in the base table only, and a stream cannot
    replay them.
    """
    last = log.next_sequence() - 1
    if start is not None and start.kind == "latest":
        return last
    first = readable_from(log)
    if start is None or start.kind == "earliest":
        return first - 1
    if start.kind == "commit":
        if start.value > last + 1:
            raise ConfigError(
                f"option 'starting_commit' is {start.value} but the commit log of {path} ends "
                f"at record {last}; use 'latest' to start after the last record")
        if start.value < first:
            raise ConfigError(
                f"option 'starting_commit' is {start.value} but records before {first} of "
                f"{path} were compacted and garbage-collected (their rows are in the base "
                f"table); start at {first} or later, or 'earliest'")
        return start.value - 1
    for rec in log.records(after=first - 1):
        if rec.created_ms >= start.value:
            return rec.sequence - 1
    return last


class MemWalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Serves committed WAL entries micro-batch by micro-batch.

    Micro-batch size follows the read limit Spark passes (``max_rows_per_trigger``
    becomes ``ReadMaxRows``, ``max_entries_per_trigger`` ``ReadMaxFiles`` counting
    WAL entries); ``ReadAllAvailable`` means everything. Under
    ``trigger(availableNow=True)`` the last record at query start is the target:
    every record up to it is served, in as many micro-batches as the limit
    makes, and none after it.
    """

    def __init__(self, opts: ReadOptions, table_schema: pa.Schema):
        self.opts = opts
        self.table_schema = table_schema
        self._log: CommitLog | None = None
        self._origin: int | None = None  # the resolved start, once per query run
        self._target: int | None = None  # availableNow: the last record to serve
        self._keeper: HoldKeeper | None = None  # this query run's reader hold (driver only)
        # Every record above this that the floors did not release when it was checked
        # stays stored for this run: checked after the hold was written, and the hold
        # has not lapsed since. None: check a micro-batch before serving it.
        self._secured: int | None = None

    @property
    def log(self) -> CommitLog:
        if self._log is None:  # created lazily: this object is pickled
            self._log = CommitLog(open_store(self.opts.path, self.opts.storage))
        return self._log

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_log"] = None
        state["_keeper"] = None  # a thread and a lock: the driver's alone
        return state

    def _hold(self, after: int) -> None:
        """Hold every commit record above ``after`` (gc keeps them) from now on.

        A hold that may have lapsed since the last call (its refreshes failed
        for most of a TTL) makes this run check its next micro-batch again.
        """
        if self._keeper is None:
            self._keeper = HoldKeeper(self.log.store)
        if not self._keeper.hold(after):
            self._secured = None

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        # Spark asks on every trigger until a first batch is planned: resolve once,
        # or a moving 'latest' would skip records that arrived in between.
        if self._origin is None:
            # Hold first, then resolve: whatever 'earliest' finds stored stays stored.
            self._hold(0)
            origin = resolve_start(self.log, self.opts.stream_start, self.opts.path)
            self._hold(origin)
            self._origin = self._secured = origin
        return {"commit": self._origin, "positions": {}, "origin": self._origin}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self._target = self.log.next_sequence() - 1

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        if self.opts.max_rows_per_trigger:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        if self.opts.max_entries_per_trigger:
            return ReadMaxFiles(self.opts.max_entries_per_trigger)
        return ReadAllAvailable()

    def _bounds(self, limit: ReadLimit | None) -> tuple[int | None, int | None]:
        """(max rows, max WAL entries) of one micro-batch under ``limit``."""
        if limit is None:  # an engine that passes no limit: the options decide
            return self.opts.max_rows_per_trigger, self.opts.max_entries_per_trigger
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, None
        if isinstance(limit, ReadMaxFiles):
            return None, limit.max_files
        return None, None  # ReadAllAvailable, and limits we cannot apply to records

    def latestOffset(self, start: dict | None = None,  # noqa: N802 - Spark's name
                     limit: ReadLimit | None = None) -> dict:
        start = start or self.initialOffset()
        seq = int(start["commit"])
        self._hold(seq)  # before planning: what this plans stays stored until it is read
        positions = dict(start.get("positions", {}))
        max_rows, max_entries = self._bounds(limit)
        rows = entries = 0
        for rec in self._records_after(seq):
            if self._target is not None and rec.sequence > self._target:
                break
            rows += sum(r.rows for r in rec.ranges)
            entries += sum(r.last - r.first + 1 for r in rec.ranges)
            # A micro-batch serves whole records, at least one: a record larger
            # than the limit is served alone rather than never.
            if seq > int(start["commit"]) and (
                (max_rows is not None and rows > max_rows)
                or (max_entries is not None and entries > max_entries)
            ):
                break
            seq = rec.sequence
            for r in rec.ranges:
                positions[r.shard_id] = max(positions.get(r.shard_id, 1), r.last + 1)
        end = {"commit": seq, "positions": positions}
        if "origin" in start:
            end["origin"] = start["origin"]
        return end

    def _records_after(self, seq: int) -> Iterator[CommitRecord]:
        """Records above ``seq``; from the first stored one when gc deleted those after
        ``seq`` (a run resuming behind a lapsed hold: the micro-batch skips them)."""
        last = seq
        try:
            for rec in self.log.records(after=seq):
                last = rec.sequence
                yield rec
        except MemWalError:
            first = self.log.first_stored()
            if first <= last + 1:
                raise  # not collected: something else is wrong
            yield from self.log.records(after=first - 1)

    def reportLatestOffset(self):  # noqa: N802
        return None

    def _released(self, first: int, last: int) -> tuple[list[CommitRecord], list[int]]:
        """(records ``first+1..last`` still served, sequences gc released or deleted).

        A record is released when one of its ranges lies below its shard's
        collection floor (the entries below a floor are deleted).
        """
        floors = self.log.state().floors
        served, gone = [], []
        for seq in range(first + 1, last + 1):
            try:
                rec = self.log.read(seq)
            except FileNotFoundError:
                gone.append(seq)
                continue
            if any(r.first < floors.get(r.shard_id, 0) for r in rec.ranges):
                gone.append(seq)
            else:
                served.append(rec)
        return served, gone

    @entry_point
    def partitions(self, start: dict, end: dict) -> list[WalRange]:
        parts: list[WalRange] = []
        first = int(start["commit"])
        if "origin" in end and start.get("origin") != end["origin"]:
            # Batch 0 re-run after a restart: Spark passes a freshly resolved initial
            # offset; the stored end offset remembers the start it was planned from.
            first = int(end["origin"])
        last = int(end["commit"])
        self._hold(first)
        if self._secured is not None and self._secured <= first:
            records = [self.log.read(seq) for seq in range(first + 1, last + 1)]
        else:
            # Not planned under this run's hold: gc may have released part of it.
            records, gone = self._released(first, last)
            if gone:
                self._warn_skipped(gone, end)
            self._secured = first
        for rec in records:
            # A stream is append-only: an overwrite's new rows are served like
            # any others (the rows it hid were served when they were committed).
            for r in rec.ranges:
                if self.opts.shards is not None and r.shard_id not in self.opts.shards:
                    continue
                parts.extend(split(r.shard_id, r.first, r.last,
                                   self.opts.max_entries_per_partition,
                                   [(r.epoch, r.first, r.last)]))
        return parts

    def _warn_skipped(self, gone: list[int], end: dict) -> None:
        rows = []
        for seq in gone:
            try:
                rows.append(sum(r.rows for r in self.log.read(seq).ranges))
            except FileNotFoundError:
                rows.append(None)
        known = sum(n for n in rows if n is not None)
        unknown = sum(n is None for n in rows)
        log.warning(
            "memwal stream on %s: skipping commit record(s) %s (%d rows%s) of the micro-batch "
            "ending at record %s: garbage collection deleted their WAL entries before this "
            "query read them (its hold lapsed: stopped longer than %g s, or a new hold raced "
            "a collection). Their rows are in the base table (compacted): read them with "
            "spark.read.format('memwal').option('view', 'table'). The stream goes on from "
            "the records still stored.", self.opts.path, spans(gone), known,
            f", plus {unknown} record(s) deleted too" if unknown else "", end["commit"],
            DEFAULT_HOLD_TTL_S)

    def read(self, partition: WalRange) -> Iterator[pa.RecordBatch]:
        enter()  # see memwal_datasource.spark.worker_entry
        try:
            yield from read_partition(self.opts, self.table_schema, partition)
        except CollectedError as exc:
            error = CollectedError(
                "Restart the query from its checkpoint: the micro-batch is planned again from "
                "what is stored, skipping (and logging) the commit records garbage collection "
                f"deleted, whose rows are in the base table. {exc}")
            plain_error(error)
            raise error from None
        except MemWalError as exc:
            plain_error(exc)
            raise

    def commit(self, end: dict) -> None:
        """Move this run's hold past the committed micro-batch (gc may release it)."""
        self._hold(int(end["commit"]))

    def stop(self) -> None:
        # The hold stays until its TTL: a query restarted soon finds its batch stored.
        if self._keeper is not None:
            self._keeper.stop()
        self._log = None


def spans(seqs: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1..3, 7``."""
    runs: list[list[int]] = []
    for s in sorted(seqs):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)
