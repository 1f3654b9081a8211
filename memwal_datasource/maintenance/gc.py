"""Garbage collection: delete what compaction made unnecessary, safely beside live work.

What goes, per run:

* **WAL entries** of a shard below its *floor*: every committed entry below it
  was folded into the base table by a compaction round that committed at
  least the retention ago, and the rest below it were never committed.
* **Commit records** below the latest checkpoint that such rounds folded.
* **Shard manifest versions** but the newest ``retain_manifest_versions``.
* **Compaction round intents and done markers** older than the oldest base
  version still stored (every stored version can still be read).

**One rule, one clock.** An entry becomes unnecessary when the compaction
round that folded it commits; retention counts from then, as the round's done
marker's modification time on the *store's* clock (:mod:`memwal_datasource.log.rounds`),
compared with the store's clock now. No writer's or driver's clock is
involved. Retention is never below :data:`MIN_RETAIN_SECONDS`, which covers
the longest a commit may take between its checks and its PUT, and between
the listing that showed its number free and its PUT's return (three times
:data:`~memwal_datasource.log.commit.COMMIT_DEADLINE_S`: docs/protocol.md,
invariant 4); asking for less is
refused with a warning and the minimum is used.

**Plan and record are atomic.** The plan is made against commit records
``1..N`` and the ``gc`` record is written at exactly ``N + 1``
(put-if-absent). A commit that lands after the plan takes ``N + 1`` first, so
the collection re-plans and sees it; a commit after the ``gc`` record is
checked against its floors and refused if it names a released position
(:class:`~memwal_datasource.errors.CommitRefused`). No committed row is ever
hidden by a floor.

**Live writers are never fenced.** Before touching a shard, gc takes the
shard's lease (:mod:`memwal_datasource.shard.leases`); a shard a live job holds is
skipped until the next run. Deleting WAL files weakens fencing (a stalled
writer could land in a freed slot), so each shard gc frees is fenced first (a
new epoch and a sentinel at the tip, as a new writer would: only stalled
writers are hit), its manifest is moved past the floor (pylance's replay and
our tip search start there), and the ``gc`` record lists the floors *before*
anything is deleted. Every step is safe to crash after: the fence and the
record only make less committable, deletes are idempotent, and a re-run
recomputes the same floors.

**Live streams keep what they planned.** A stream writes a reader hold
(:mod:`memwal_datasource.log.holds`) before it plans a micro-batch: gc releases no
commit record above a live hold's ``after_seq`` (nor the WAL entries such
records name) and says which stream held them. Holds are read when planning,
again just before the ``gc`` record (a hold that appeared meanwhile means
plan again), and once more after it: a stream that wrote its hold and then
planned before the record landed is kept from deletion, even though the
recorded floors are above it. A stream that holds after the record sees
the floors when it plans, so it never plans what gc is deleting.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import hooks
from ..errors import Fenced, MemWalError
from ..format.commit_format import key_sequence, released_key, released_sequence
from ..format.memwal import manifest_key, parse_bit_reversed_name
from ..log.commit import (
    CHECKPOINTS_DIR,
    COMMIT_DEADLINE_S,
    COMMITS_DIR,
    GC,
    SequenceTaken,
    record_key,
)
from ..log.commit_intents import Intents
from ..log.holds import ReaderHold, ReaderHolds, lowest_held
from ..log.rounds import (
    done_key,
    done_ms,
    mark_done,
    oldest_kept_round,
    read_round,
    recorded_round,
    round_key,
)
from ..shard.leases import Holder, Lease, Leases
from ..shard.manifest import ManifestStore
from ..shard.wal import WalAppender
from ..table.view import TableView

log = logging.getLogger(__name__)

# Never less: a commit re-checks floors when more than COMMIT_DEADLINE_S passed since
# its checks, and a reader gets this long to read what it planned.
MIN_RETAIN_SECONDS = 3 * COMMIT_DEADLINE_S
DEFAULT_RETAIN_SECONDS = 3600.0
MAX_REPLANS = 8  # commits landing while we plan, before giving up for this run
# Checkpoints (and released markers) kept: the newest is all a reader needs; a few more
# serve readers whose hint or listing is a moment old without a second listing.
KEEP_CHECKPOINTS = 3


@dataclass
class ShardPlan:
    """What garbage collection releases of one shard."""

    shard_id: str
    first: int  # lowest WAL position stored
    floor: int  # first position kept
    entries: list[tuple[str, int]] = field(default_factory=list)  # (key, bytes)


@dataclass
class GcPlan:
    """Everything one run would delete, with sizes (``--dry-run`` prints this)."""

    shards: list[ShardPlan] = field(default_factory=list)
    records: list[tuple[str, int]] = field(default_factory=list)
    manifests: list[tuple[str, int]] = field(default_factory=list)
    rounds: list[tuple[str, int]] = field(default_factory=list)
    through_seq: int = 0  # the plan saw commit records 1..through_seq
    retain_seconds: float = DEFAULT_RETAIN_SECONDS  # the retention applied
    releasable_seq: int = 0  # records up to here were compacted at least the retention ago
    pending_seq: int = 0  # compacted records still inside the retention
    skipped_busy: list[str] = field(default_factory=list)  # shards a live job held
    gc_sequence: int | None = None  # the gc record written
    now_ms: int = 0  # the store's clock when planned (retention and holds judged at it)
    held_by: ReaderHold | None = None  # the live stream hold that kept records back
    held_from: int = 0  # ... records held_by.after_seq + 1 .. held_from were kept for it
    holds: list[tuple[str, int]] = field(default_factory=list)  # long-expired stream holds

    def items(self) -> list[tuple[str, int]]:
        """Every ``(key, bytes)`` to delete (commit records in ascending order)."""
        wal = [item for s in self.shards for item in s.entries]
        return wal + self.records + self.manifests + self.rounds + self.holds

    @property
    def bytes(self) -> int:
        """Bytes to be freed."""
        return sum(n for _, n in self.items())

    def kept_reason(self) -> str:
        """Why less than everything compacted was deleted, for people."""
        reasons = []
        retained = self.held_from if self.held_by is not None else self.releasable_seq
        if self.pending_seq > retained:
            reasons.append(
                f"commit records {retained + 1}..{self.pending_seq} were compacted "
                f"less than the retention ({self.retain_seconds:g} s) ago")
        if self.skipped_busy:
            reasons.append(f"{len(self.skipped_busy)} shard(s) are held by a live writer "
                           "(collected on a later run)")
        if self.held_by is not None:
            who = self.held_by.describe(self.now_ms or None)
            reasons.append(f"commit records {self.held_by.after_seq + 1}..{self.held_from} "
                           f"are held by {who}: it has yet to read them")
        return "; ".join(reasons)

    def hold(self, holds: list[ReaderHold]) -> bool:
        """Release nothing above the lowest live hold; ``True`` if that kept anything."""
        low = lowest_held(holds)
        if low is None or low.after_seq >= self.releasable_seq:
            return False
        self.held_by, self.held_from = low, max(self.held_from, self.releasable_seq)
        self.releasable_seq = max(low.after_seq, 0)
        return True


def effective_retention(retain_seconds: float) -> float:
    """``retain_seconds``, raised to :data:`MIN_RETAIN_SECONDS` with a warning."""
    if retain_seconds < MIN_RETAIN_SECONDS:
        log.warning("memwal gc: a retention of %g s is below the minimum of %g s (the longest "
                    "a commit may take); using %g s", retain_seconds, MIN_RETAIN_SECONDS,
                    MIN_RETAIN_SECONDS)
        return MIN_RETAIN_SECONDS
    return float(retain_seconds)


def releasable_through(table: TableView, recorded: int, cutoff_ms: int) -> tuple[int, int]:
    """(last record compacted before ``cutoff_ms``, last record compacted at all).

    Walks rounds down from ``recorded`` to the newest whose done marker is at
    or before the cutoff. A committed round without a marker (its compactor
    died after the commit) gets one now: its retention starts late, never early.
    """
    if not recorded:
        return 0, 0
    pending = read_round(table.store, recorded).upto_seq
    for number in range(recorded, 0, -1):
        stamp = done_ms(table.store, number)
        if stamp is None:
            try:
                read_round(table.store, number)
            except FileNotFoundError:
                return 0, pending  # older rounds were collected: released already
            mark_done(table.store, number, None)
            continue
        if stamp <= cutoff_ms:
            return read_round(table.store, number).upto_seq, pending
    return 0, pending


def _floors(table: TableView, through: int, releasable: int,
            first: int) -> dict[str, int]:
    """Floor per shard: past every range of a releasable record, below every other one."""
    released: dict[str, int] = {}
    kept: dict[str, int] = {}
    for rec in table.commits.records(after=first - 1):
        if rec.sequence > through:
            break
        for r in rec.ranges:
            if rec.sequence <= releasable:
                released[r.shard_id] = max(released.get(r.shard_id, 0), r.last + 1)
            else:
                kept[r.shard_id] = min(kept.get(r.shard_id, r.first), r.first)
    return {s: min(p, kept.get(s, p)) for s, p in released.items()}


def plan(table: TableView, *, retain_seconds: float = DEFAULT_RETAIN_SECONDS,
         retain_manifest_versions: int = 10,
         clock: Callable[[], int] | None = None) -> GcPlan:
    """What a collection would delete now (it writes only a clock probe and missing done
    markers of committed rounds). Nothing a live stream holds is released
    (:mod:`memwal_datasource.log.holds`); stream holds that expired long ago go.

    ``clock`` returns the store's time in ms (default: :meth:`ObjectStore.now_ms`);
    tests pass one that runs ahead to stand for time passing.
    """
    retain = effective_retention(retain_seconds)
    out = GcPlan(retain_seconds=retain)
    out.through_seq = table.commits.next_sequence() - 1
    base = table.dataset()  # after the log: a round committed meanwhile only adds records
    recorded = recorded_round(table.store, base.version)
    now = (clock or table.store.now_ms)()
    releasable, out.pending_seq = releasable_through(table, recorded, now - int(retain * 1000))
    out.releasable_seq = min(releasable, out.through_seq)
    holds = ReaderHolds(table.store)
    out.hold(holds.live(now))  # what a live stream planned stays
    out.holds = holds.forgotten(now)
    releasable = out.releasable_seq
    first = table.commits.first_stored()
    floors = _floors(table, out.through_seq, releasable, first)
    for shard, floor in sorted(floors.items()):
        stored = table.tailer(shard).stored()
        doomed = sorted(p for p in stored if p < floor)
        if doomed:
            out.shards.append(ShardPlan(shard, doomed[0], floor, [
                (stored[p], table.store.head(stored[p]) or 0) for p in doomed]))
    ck = table.commits.latest_checkpoint(refresh=True)
    last_record = min(ck.sequence - 1 if ck else 0, releasable)
    for seq in range(first, last_record + 1):  # ascending: readers rely on the order
        size = table.store.head(record_key(seq))
        if size is not None:
            out.records.append((record_key(seq), size))
    for shard in table.shards():
        ms = ManifestStore(table.store, shard)
        latest = ms.latest_version()
        hint = ms._hint()  # noqa: SLF001
        if hint is None or hint < latest - retain_manifest_versions + 1:
            continue  # readers without a usable hint probe from version 1: keep it
        for version in range(1, latest - retain_manifest_versions + 1):
            key = manifest_key(shard, version)
            size = table.store.head(key)
            if size is not None:
                out.manifests.append((key, size))
    out.rounds = _old_rounds(table, base)
    out.now_ms = now
    return out


def _keep_for_late_holds(table: TableView, todo: GcPlan) -> None:
    """After the ``gc`` record: keep what a hold written since the plan needs.

    A stream that wrote its hold before the record landed may have planned
    records the record releases (it saw no floors yet): their WAL entries and
    records are not deleted, though the recorded floors stay (commits below
    them are refused all the same). Time is the plan's: a hold live then is
    live now.
    """
    if not todo.hold(ReaderHolds(table.store).live(todo.now_ms)):
        return
    floors = _floors(table, todo.through_seq, todo.releasable_seq,
                     table.commits.first_stored())
    for sp in todo.shards:
        keep_from = floors.get(sp.shard_id, 0)
        sp.entries = [(k, n) for k, n in sp.entries if parse_bit_reversed_name(k) < keep_from]
    todo.records = [(k, n) for k, n in todo.records
                    if key_sequence(k) <= todo.releasable_seq]
    hooks.point("gc.held", after_seq=todo.held_by.after_seq)


def _old_rounds(table: TableView, base) -> list[tuple[str, int]]:
    """Intents and done markers of rounds no stored base version records."""
    out = []
    for number in range(1, oldest_kept_round(table.store, base)):
        for key in (round_key(number), done_key(number)):
            size = table.store.head(key)
            if size is not None:
                out.append((key, size))
    return out


def _take_leases(table: TableView, todo: GcPlan, holder: Holder) -> list[Lease]:
    """Lease every shard to free; shards a live job holds are dropped from the plan."""
    leases = Leases(table.store)
    taken, kept = [], []
    for sp in todo.shards:
        try:
            lease = leases.try_acquire(sp.shard_id, holder)
        except MemWalError:
            lease = None
        if lease is None:
            todo.skipped_busy.append(sp.shard_id)
        else:
            taken.append(lease)
            kept.append(sp)
    todo.shards = kept
    return taken


def _fence(table: TableView, sp: ShardPlan) -> bool:
    """Fence one shard and move its manifest past the floor; ``False`` if a writer won."""
    try:
        fence = WalAppender.open(table.store, sp.shard_id)  # claim + sentinel + re-check
        tip = fence.next_position

        def past_floor(m, floor=sp.floor, tip=tip):
            m.replay_after_wal_entry_position = max(m.replay_after_wal_entry_position,
                                                    floor - 1)
            m.wal_entry_position_last_seen = max(m.wal_entry_position_last_seen, tip - 1)

        ManifestStore(table.store, sp.shard_id).commit_update(fence.epoch, past_floor)
    except Fenced:
        return False  # a writer outside our leases claimed it meanwhile: next run
    hooks.point("gc.fenced", shard=sp.shard_id, epoch=fence.epoch)
    return True


def collect(table: TableView, *, retain_seconds: float = DEFAULT_RETAIN_SECONDS,
            retain_manifest_versions: int = 10, dry_run: bool = False,
            clock: Callable[[], int] | None = None,
            progress: Callable[[int, int], None] | None = None) -> GcPlan:
    """Lease, fence, record and delete what :func:`plan` finds; see the module doc.

    ``progress(done, total)`` is called as objects are deleted.
    """
    for _ in range(MAX_REPLANS):
        todo = plan(table, retain_seconds=retain_seconds,
                    retain_manifest_versions=retain_manifest_versions, clock=clock)
        if not dry_run:
            _sweep_intents(table, todo)
        if dry_run or not todo.items():
            return todo
        # The youngest "job": under the writers' wait-die rule a task meeting gc's
        # lease waits for it (briefly: gc lets go before deleting) instead of failing.
        holder = Holder(job_id=f"gc-{uuid.uuid4().hex}", partition=-1, label="memwal gc",
                        job_started_ms=int(time.time() * 1000))
        leases = _take_leases(table, todo, holder) if todo.shards else []
        try:
            fenced = [sp for sp in todo.shards if _fence(table, sp)]
            todo.skipped_busy += [sp.shard_id for sp in todo.shards if sp not in fenced]
            todo.shards = fenced
            if _new_hold(table, todo):
                hooks.point("gc.replan", sequence=todo.through_seq + 1)
                continue  # a stream started holding since the plan: plan again, seeing it
            if todo.shards:
                try:
                    rec = table.commits.append(GC, [], extra={
                        "floors": {sp.shard_id: sp.floor for sp in todo.shards},
                        "through_seq": todo.through_seq, "released_seq": todo.releasable_seq},
                        at_sequence=todo.through_seq + 1).record
                except SequenceTaken:
                    hooks.point("gc.replan", sequence=todo.through_seq + 1)
                    continue  # a commit landed after the plan: plan again, seeing it
                todo.gc_sequence = rec.sequence
                hooks.point("gc.recorded", sequence=rec.sequence)
        finally:
            # The floors are recorded: deleting below them needs no lease, and holding
            # leases longer would keep live writers waiting.
            for lease in leases:
                Leases(table.store).release(lease)
        _keep_for_late_holds(table, todo)
        if todo.records:
            table.commits.checkpoint()
        _release(table, todo)
        _delete(table, todo, progress)
        _collect_checkpoints(table)
        log.info("memwal gc %s: deleted %d WAL entries of %d shard(s), %d commit records, %d "
                 "manifest versions, %d round files (%d bytes)%s", table.uri,
                 sum(len(s.entries) for s in todo.shards), len(todo.shards), len(todo.records),
                 len(todo.manifests), len(todo.rounds), todo.bytes,
                 f"; kept: {todo.kept_reason()}" if todo.kept_reason() else "")
        return todo
    raise MemWalError(f"run gc again: commits kept landing on {table.uri} while it planned "
                      f"({MAX_REPLANS} tries); nothing was deleted")


def _new_hold(table: TableView, todo: GcPlan) -> bool:
    """Whether a live hold keeps back more than the plan knew of (a stream started)."""
    low = lowest_held(ReaderHolds(table.store).live(todo.now_ms))
    return low is not None and low.after_seq < todo.releasable_seq


def _sweep_intents(table: TableView, todo: GcPlan) -> None:
    """Delete commit intents older than the retention: leftovers of drivers that died
    mid-commit. No committer takes an intent that old (docs/protocol.md), and an owner
    still alive holds its own intent in memory, so nothing reads them again."""
    for key in Intents(table.store).stale_keys(todo.now_ms, todo.retain_seconds):
        try:
            table.store.delete(key)
        except FileNotFoundError:
            pass


def _release(table: TableView, todo: GcPlan) -> None:
    """Store the released boundary (the last record this run deletes), then add the
    strays at or below it: objects a committer stalled past an earlier collection put
    into freed numbers, which no reader takes (docs/protocol.md, "Invariants")."""
    if todo.records:
        last = max(key_sequence(k) for k, _ in todo.records)
        table.store.put(released_key(last), b"{}")
    else:
        last = table.commits.boundary(refresh=True)
        if not last:
            return
    planned = {k for k, _ in todo.records}
    for key in table.store.list(COMMITS_DIR + "/"):
        number = key_sequence(key) if key.count("/") == COMMITS_DIR.count("/") + 1 else None
        if number is not None and number <= last and key not in planned:
            todo.records.append((key, table.store.head(key) or 0))
            log.warning("memwal gc %s: deleting stray commit record %d (a committer stalled "
                        "past a collection put it into a freed number)", table.uri, number)
    todo.records.sort()  # ascending, as every collection deletes


def _collect_checkpoints(table: TableView) -> None:
    """Delete all but the newest :data:`KEEP_CHECKPOINTS` checkpoints and released markers:
    a reader needs only the newest (a stale hint falls back to a listing), and every
    commit lists them, so they must not grow with the table's age."""
    checkpoints, markers = [], []
    for key in table.store.list(CHECKPOINTS_DIR + "/"):
        if key_sequence(key) is not None:
            checkpoints.append((key_sequence(key), key))
        elif released_sequence(key) is not None:
            markers.append((released_sequence(key), key))
    for kept in (checkpoints, markers):
        for _, key in sorted(kept)[:-KEEP_CHECKPOINTS]:
            try:
                table.store.delete(key)
            except FileNotFoundError:
                pass


def _delete(table: TableView, todo: GcPlan, progress: Callable[[int, int], None] | None,
            ) -> None:
    items = todo.items()
    for i, (key, _size) in enumerate(items, 1):
        table.store.delete(key)
        if progress is not None:
            progress(i, len(items))
