"""Re-home a refused commit: the driver's retry when a newer epoch of a shard committed first.

On a sharded (primary-key) table a shard's writers commit in epoch order
(:meth:`~memwal_datasource.log.commit.CommitLog.append` with ``ordered_epochs``):
readers and compaction keep each key's newest value by commit order, and a
committed newer epoch is what proves an older uncommitted attempt dead. A
task releases its shard's lease when its turn ends, not when its job
commits, so another writer may claim the shard later and commit first; the
job's commit is then refused (:class:`~memwal_datasource.errors.CommitRefused`,
reason ``NEWER_EPOCH``).

Instead of failing, :class:`Rehomer` moves the job's rows of each such shard
to the tip, under an epoch newer than every committed one:

1. take the shard's lease (as a task does: waiting up to ``lease_wait_s``
   for another job, holding no shard it has not re-homed yet, in shard order);
2. open a writer on it (a new epoch claim; it fences nobody live, because it
   holds the lease);
3. read the job's own durable entries of every range it wrote there (only
   its epochs' entries, in WAL order, deletes included) and append them
   again: WAL-only ranges byte for byte but for the epoch (schema, field ids
   and ``_tombstone`` kept); MemTable ranges (they name SSTables) through
   pylance's writer, so the new range names SSTables of a newer generation
   and Lance's LSM view (``committed_lsm_scanner``) agrees with commit order;
4. commit the job with the new ranges in place of the refused shards' ones
   (other shards' ranges unchanged), all in its one record, still holding the
   re-homed shards' leases (so no other writer can claim them meanwhile), then
   release them.

The commit re-checks the job's idempotency key (``txnAppId`` or a stream's
batch key) every round. A refusal that comes again (a writer that claimed
another shard before this job took it, committing meanwhile) is re-homed
again, at most ``rounds`` times, then the job fails with ``CommitRefused``
naming the writer that overtook it. A refusal because garbage collection
released the positions stays a refusal. The old attempt's entries stay
uncommitted; a newer committed epoch makes them dead for garbage collection
(:meth:`~memwal_datasource.log.commit.CommitLog.superseded`).

Spark-free: the Spark driver (``spark/writer.py``) and any other committer
call :meth:`Rehomer.append` where they would call ``CommitLog.append``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc

from .. import hooks
from ..config import ShardWriterConfig
from ..errors import CollectedError, CommitRefused, MemWalError
from ..format.memwal import (
    FENCE_SENTINEL_KEY,
    GENERATION_KEY,
    WRITER_EPOCH_KEY,
    encode_wal_buffer,
    entry_columns,
    has_field_ids,
)
from ..format.table_schema import without_row_key
from ..log.commit import CommitLog, CommitRecord, CommitResult, CommittedRange
from ..shard.leases import DEFAULT_TTL_S, HeldLease, Holder, LeaseHeld, Leases
from ..shard.wal import WalAppender
from ..shard.writer_base import cast_columns
from ..table.view import TableView, field_ids
from .shard_writer import open_shard_writer

log = logging.getLogger(__name__)

MAX_ROUNDS = 3  # re-homes of one commit before it gives up naming the overtaker
# The lease partition of a driver re-homing its job's ranges (tasks use theirs, >= 0).
DRIVER_PARTITION = -1
RECENT_RECORDS = 256  # records searched (newest first) for an overtaker no longer visible


@dataclass
class RehomedShard:
    """One shard's ranges of a job moved to the tip: what the log line and tests show."""

    shard_id: str
    old: list[CommittedRange]
    new: CommittedRange | None  # None: none of the old ranges held a data entry
    overtaken_by: str = ""


@dataclass
class Rehomer:
    """Commit a job, re-homing the ranges a newer committed epoch overtook (see the module).

    ``holder`` names the job in the leases it takes (job id, label; its
    partition should be :data:`DRIVER_PARTITION`). ``config`` is the job's
    writer configuration (its MemTable settings re-home MemTable ranges).
    """

    table: TableView
    holder: Holder
    config: ShardWriterConfig = field(default_factory=ShardWriterConfig)
    lease_wait_s: float = 60.0
    lease_ttl_s: float = DEFAULT_TTL_S
    rounds: int = MAX_ROUNDS
    leases: Leases | None = None
    rehomed: list[RehomedShard] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.leases is None:
            self.leases = Leases(self.table.store, ttl_s=self.lease_ttl_s)

    @property
    def log(self) -> CommitLog:
        return self.table.commits

    # -- the commit ----------------------------------------------------------------------

    def append(self, kind: str, ranges: Iterable[CommittedRange], **append) -> CommitResult:
        """``CommitLog.append(kind, ranges, **append)``, re-homing refused shards first."""
        ranges = list(ranges)
        held: dict[str, HeldLease] = {}
        refusals: list[CommitRefused] = []
        try:
            while True:
                try:
                    result = self.log.append(kind, ranges, **append)
                except CommitRefused as exc:
                    if exc.reason != CommitRefused.NEWER_EPOCH:
                        raise
                    refusals.append(exc)
                    if len(refusals) > self.rounds:
                        raise self._gave_up(refusals) from exc
                    ranges = self._rehome(ranges, exc, held, len(refusals))
                    continue
                if self.rehomed and result.created:
                    log.info("memwal commit %d (%s): re-homed %s", result.record.sequence,
                             self.holder.label or self.holder.job_id,
                             "; ".join(_describe(r) for r in self.rehomed))
                return result
        finally:
            for lease in held.values():
                lease.release()

    def _rehome(self, ranges: list[CommittedRange], exc: CommitRefused,
                held: dict[str, HeldLease], round_: int) -> list[CommittedRange]:
        """Move the job's ranges of every overtaken shard to the tip; the new range list."""
        state = self.log.state()
        stale = {r.shard_id for r in ranges if r.epoch < state.epochs.get(r.shard_id, 0)}
        stale.add(exc.shard_id)
        order = sorted(stale)
        hooks.point("rehome.refused", job_id=self.holder.job_id, shards=order, round=round_)
        # Leases are taken in shard order by every re-homing driver, and tasks never wait
        # holding one, so no cycle of waits can form: a shard below one we hold means
        # letting go of everything first (those shards are checked again at the commit).
        if held and order[0] < max(held):
            for shard in list(held):
                held.pop(shard).release()
        for shard in order:
            if shard not in held:
                held[shard] = self._take(shard, exc)
            mine = sorted((r for r in ranges if r.shard_id == shard), key=lambda r: r.first)
            self._check_floor(shard, mine)
            moved = RehomedShard(shard, mine, None, overtaken_by=self.overtaker(
                shard, state.epochs.get(shard, 0), search_back=0))
            moved.new = self._move(shard, mine)
            self.rehomed.append(moved)
            ranges = [r for r in ranges if r.shard_id != shard]
            if moved.new is not None:
                ranges.append(moved.new)
                hooks.point("rehome.written", shard=shard, job_id=self.holder.job_id,
                            epoch=moved.new.epoch, first=moved.new.first, last=moved.new.last)
        return ranges

    def _take(self, shard: str, exc: CommitRefused) -> HeldLease:
        """The shard's lease (waiting as a task does), renewed until the commit is done."""
        try:
            lease = self.leases.acquire(shard, self.holder, wait_s=self.lease_wait_s)
        except LeaseHeld as held:
            raise CommitRefused(
                f"run the job again, or raise lease_wait_s (now {self.lease_wait_s:g} s): "
                f"shard {shard} was overtaken by {self.overtaker(shard, exc.newer_epoch or 0)} "
                f"and moving this job's rows there to the tip needs the shard, but {held}. "
                "Nothing was committed", reason=CommitRefused.NEWER_EPOCH, shard_id=shard,
                epoch=exc.epoch, newer_epoch=exc.newer_epoch) from held
        return self.leases.hold(lease)

    def _check_floor(self, shard: str, mine: list[CommittedRange]) -> None:
        floor = self.log.state().floors.get(shard, 0)
        low = [r for r in mine if r.first < floor]
        if low:
            raise self._collected(shard, low[0], floor)

    def _collected(self, shard: str, r: CommittedRange, floor: int) -> CommitRefused:
        return CommitRefused(
            f"run the job again: garbage collection released WAL positions below {floor} of "
            f"shard {shard} while this job waited to commit (a newer writer of the shard "
            f"committed first), so positions {r.first}..{r.last} (epoch {r.epoch}) can be "
            "neither committed nor moved to the tip. Nothing was committed",
            reason=CommitRefused.GC_FLOOR, shard_id=shard, epoch=r.epoch, first=r.first,
            last=r.last, floor=floor)

    # -- moving one shard's entries ------------------------------------------------------

    def _entries(self, mine: list[CommittedRange]) -> Iterator:
        """The job's own entries of ``mine`` in WAL order (each range's epoch only)."""
        for r in mine:
            try:
                for _pos, entry in self.table.entries(r.shard_id, r.first, r.last):
                    if entry.writer_epoch == r.epoch:
                        yield entry
            except CollectedError:
                floor = self.log.state().floors.get(r.shard_id, 0)
                raise self._collected(r.shard_id, r, floor) from None

    def _move(self, shard: str, mine: list[CommittedRange]) -> CommittedRange | None:
        """Write ``mine``'s entries again at the tip under a new epoch; the new range."""
        nbytes = sum(r.bytes for r in mine)
        if any(r.sstables for r in mine) and all(r.sstables for r in mine):
            return self._move_native(shard, mine, nbytes)
        appender = WalAppender.open(self.table.store, shard, create=False,
                                    max_retries=self.config.max_wal_persist_retries,
                                    retry_base_delay_ms=self.config.wal_persist_retry_base_delay_ms)
        rows, codec = 0, self.config.wal_codec(self.table.store.remote)
        for entry in self._entries(mine):
            appender.append_encoded(encode_wal_buffer(_plain(entry.schema), entry.batches,
                                                      appender.epoch, compression=codec))
            rows += entry.num_rows
        appender.sync()
        # Our close: the replay position moves past our entries (no native opener
        # replays them) and the fence is checked once more.
        appender.release_replay()
        if appender.first_position is None:
            return None
        return CommittedRange(shard, appender.epoch, appender.first_position,
                              appender.last_position, rows, nbytes)

    def _move_native(self, shard: str, mine: list[CommittedRange],
                     nbytes: int) -> CommittedRange | None:
        """MemTable ranges: through pylance's writer, so the rows get SSTables again."""
        ds = self.table.dataset()
        schema = without_row_key(ds.schema)
        ids = None
        writer = open_shard_writer(self.table.uri, shard, schema,
                                   replace(self.config, enable_memtable=True),
                                   self.table.storage_options, store=self.table.store)
        try:
            for entry in self._entries(mine):
                for batch in entry.batches:
                    if not batch.num_rows:
                        continue
                    if ids is None and has_field_ids(batch):
                        ids = field_ids(ds)
                    cols = entry_columns(batch, schema, ids)
                    if pc.any(cols[-1]).as_py():
                        raise MemWalError(
                            f"shard {shard}: a MemTable range holds delete markers, which "
                            "pylance's writer cannot write again; run the job again")
                    writer.put(cast_columns(cols[:-1], schema))
            writer.close()
        except BaseException:
            writer.abort()
            raise
        s = writer.stats()
        if s.first_wal_position is None:
            return None
        return CommittedRange(shard, s.epoch, s.first_wal_position,
                              s.last_wal_position or s.first_wal_position, s.rows, nbytes,
                              sstables=tuple(s.sstables))

    # -- naming the overtaker ------------------------------------------------------------

    def overtaker(self, shard: str, epoch: int, search_back: int = RECENT_RECORDS) -> str:
        """The committed writer of ``shard`` at ``epoch``, as people know it."""
        rec = find_epoch_record(self.log, shard, epoch, search_back)
        return describe_record(rec) if rec else f"a writer of epoch {epoch}"

    def _gave_up(self, refusals: list[CommitRefused]) -> CommitRefused:
        last = refusals[-1]
        who = self.overtaker(last.shard_id, last.newer_epoch or 0)
        return CommitRefused(
            f"run the job again when {who} is not writing the same keys (nothing was "
            f"committed): this job's commit was overtaken {len(refusals)} times; the last "
            f"time on shard {last.shard_id}, whose epoch {last.newer_epoch} by {who} committed "
            f"before this job's epoch {last.epoch}. A shard's writers commit in epoch order so "
            "that every reader agrees on each key's newest value; each time this job moved its "
            f"rows to the tip ({self.rounds} times), another writer committed first",
            reason=CommitRefused.NEWER_EPOCH, shard_id=last.shard_id, epoch=last.epoch,
            first=last.first, last=last.last, newer_epoch=last.newer_epoch)


def _plain(schema: pa.Schema) -> pa.Schema:
    """An entry's schema without the MemWAL keys the new epoch's entry sets itself."""
    meta = {k: v for k, v in (schema.metadata or {}).items()
            if k not in (WRITER_EPOCH_KEY, GENERATION_KEY, FENCE_SENTINEL_KEY)}
    return schema.with_metadata(meta)


def find_epoch_record(log: CommitLog, shard: str, epoch: int,
                      search_back: int = RECENT_RECORDS) -> CommitRecord | None:
    """The record that committed ``epoch`` of ``shard`` (best effort: ``None`` if gone).

    Looked up among the visible ranges, then (no longer visible: compacted and
    collected, or overwritten) among the ``search_back`` newest records.
    """
    state = log.state()
    seqs = sorted({r.sequence for r in state.visible
                   if r.shard_id == shard and r.epoch == epoch and r.sequence}, reverse=True)
    seqs += [s for s in range(state.sequence, max(0, state.sequence - search_back), -1)
             if s not in seqs]
    for seq in seqs:
        try:
            rec = log.read(seq)
        except FileNotFoundError:
            continue
        for part in rec.parts():  # a group record: the member that wrote the shard
            if any(r.shard_id == shard and r.epoch == epoch for r in part.ranges):
                return rec.member_view(part) if rec.members else rec
    return None


def describe_record(rec: CommitRecord) -> str:
    """A commit record's writer: label, job id, writer group, query and batch."""
    label = rec.extra.get("label") if isinstance(rec.extra, dict) else None
    parts = [f"job {rec.job_id}"]
    if rec.query_id is not None:
        parts.append(f"query {rec.query_id} batch {rec.batch_id}")
    if rec.writer_group:
        parts.append(f"writer group '{rec.writer_group}'")
    if rec.txn_app_id is not None and rec.query_id is None:
        parts.append(f"txnAppId {rec.txn_app_id} version {rec.txn_version}")
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(rec.created_ms / 1000))
    return (f"'{label}' " if label else "") + f"(commit record {rec.sequence} at {when}: " \
        + ", ".join(parts) + ")"


def _describe(r: RehomedShard) -> str:
    old = ", ".join(f"{x.first}..{x.last}@{x.epoch}" for x in r.old)
    new = f"{r.new.first}..{r.new.last}@{r.new.epoch}" if r.new else "nothing"
    return f"shard {r.shard_id} {old} -> {new} (overtaken by {r.overtaken_by})"
