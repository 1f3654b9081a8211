"""Garbage collection: delete what compaction made unnecessary, behind a fence.

What goes, per run (``retain_seconds`` keeps anything younger, like Delta's VACUUM):

* **WAL entries** of a shard below its *floor*: every committed entry below it
  is compacted into the base table and older than the retention, and the
  rest below it were never committed (failed or fenced attempts).
* **Commit records** below the latest checkpoint (which keeps what they said).
* **Shard manifest versions** but the newest ``retain_manifest_versions``.
* **Compaction round intents** below the round the base table records.

Deleting WAL files weakens fencing: a stalled writer can land in a freed slot.
So each shard is fenced first (a claim of a new epoch and a sentinel at the
tip, as a new writer would), its manifest is moved past the floor (so
pylance's replay and our tip discovery start there), and a ``gc`` commit
record lists the floors *before* anything is deleted. A job that commits after
that record and names a position below a floor is refused
(:class:`~memwal_datasource.commit.CommitRefused`), and a writer that wakes
after the fence fails at its next append or at close. Every step is safe to
crash after: the fence and the record only make less committable, deletes are
idempotent, and a re-run recomputes the same floors.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from . import hooks
from .commit import GC, record_key
from .format import manifest_key, parse_bit_reversed_name
from .manifest import ManifestStore
from .table import MemWalTable, TableSnapshot, round_key
from .wal import WalAppender

log = logging.getLogger(__name__)


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
    through_seq: int = 0  # records up to here are wholly below the floors

    def items(self) -> list[tuple[str, int]]:
        """Every ``(key, bytes)`` to delete."""
        wal = [item for s in self.shards for item in s.entries]
        return wal + self.records + self.manifests + self.rounds

    @property
    def bytes(self) -> int:
        """Bytes to be freed."""
        return sum(n for _, n in self.items())


def _floors(table: MemWalTable, snap: TableSnapshot,
            retain_ms: int) -> tuple[dict[str, int], int, int]:
    """(floor per shard, last record wholly released, first stored record)."""
    now = int(time.time() * 1000)
    first = table.commits.first_stored()
    released: dict[str, int] = {}  # shard: positions below are compacted and old
    kept: dict[str, int] = {}  # shard: lowest position a record still needs
    through = first - 1
    prefix = True
    for rec in table.commits.records(after=first - 1):
        old = rec.sequence <= snap.compacted_seq and rec.created_ms <= now - retain_ms
        for r in rec.ranges:
            if old:
                released[r.shard_id] = max(released.get(r.shard_id, 0), r.last + 1)
            else:
                kept[r.shard_id] = min(kept.get(r.shard_id, r.first), r.first)
        prefix = prefix and (old or rec.kind == GC)
        if prefix:
            through = rec.sequence
    floors = {s: min(p, kept.get(s, p)) for s, p in released.items()}
    return floors, through, first


def plan(table: MemWalTable, *, retain_seconds: float = 3600.0,
         retain_manifest_versions: int = 10) -> GcPlan:
    """What a collection would delete now (nothing is changed)."""
    out = GcPlan()
    snap = table.snapshot()
    floors, out.through_seq, first = _floors(table, snap, int(retain_seconds * 1000))
    for shard, floor in sorted(floors.items()):
        stored = table.tailer(shard).stored()
        doomed = sorted(p for p in stored if p < floor)
        if doomed:
            out.shards.append(ShardPlan(shard, doomed[0], floor, [
                (stored[p], table.store.head(stored[p]) or 0) for p in doomed]))
    ck = table.commits.latest_checkpoint()
    now = time.time() * 1000
    if ck is not None:
        for seq in range(first, min(ck.sequence, out.through_seq + 1)):
            key = record_key(seq)
            size = table.store.head(key)
            if size is None:
                continue
            if table.commits.read(seq).created_ms > now - retain_seconds * 1000:
                break  # records are in time order: the rest are younger
            out.records.append((key, size))
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
    for number in range(1, snap.compacted_round):
        size = table.store.head(round_key(number))
        if size is not None:
            out.rounds.append((round_key(number), size))
    return out


def collect(table: MemWalTable, *, retain_seconds: float = 3600.0,
            retain_manifest_versions: int = 10, dry_run: bool = False) -> GcPlan:
    """Fence, record and delete what :func:`plan` finds; see the module doc."""
    todo = plan(table, retain_seconds=retain_seconds,
                retain_manifest_versions=retain_manifest_versions)
    if dry_run or not todo.items():
        return todo
    for sp in todo.shards:
        fence = WalAppender.open(table.store, sp.shard_id)  # claim + sentinel + re-check
        tip = fence.next_position

        def past_floor(m, floor=sp.floor, tip=tip):
            m.replay_after_wal_entry_position = max(m.replay_after_wal_entry_position,
                                                    floor - 1)
            m.wal_entry_position_last_seen = max(m.wal_entry_position_last_seen, tip - 1)

        ManifestStore(table.store, sp.shard_id).commit_update(fence.epoch, past_floor)
        hooks.point("gc.fenced", shard=sp.shard_id, epoch=fence.epoch)
    if todo.shards:
        rec = table.commits.append(GC, [], extra={
            "floors": {sp.shard_id: sp.floor for sp in todo.shards},
            "through_seq": todo.through_seq}).record
        hooks.point("gc.recorded", sequence=rec.sequence)
        _spare_late_commits(table, todo, rec.sequence)
    if todo.records:
        table.commits.checkpoint()
    for key, _size in todo.items():
        table.store.delete(key)
    log.info("memwal gc %s: deleted %d WAL entries of %d shard(s), %d commit records, %d "
             "manifest versions, %d round intents (%d bytes)", table.uri,
             sum(len(s.entries) for s in todo.shards), len(todo.shards), len(todo.records),
             len(todo.manifests), len(todo.rounds), todo.bytes)
    return todo


def _spare_late_commits(table: MemWalTable, todo: GcPlan, gc_seq: int) -> None:
    """Keep entries that a record committed between planning and the ``gc`` record names.

    Such a record passed no floor check (the floors were not recorded yet), so
    the entries it names must stay; deleting less than the floors is always safe.
    """
    for rec in table.commits.records(after=todo.through_seq):
        if rec.sequence >= gc_seq:
            break
        for r in rec.ranges:
            for sp in todo.shards:
                if sp.shard_id == r.shard_id:
                    sp.entries = [(k, n) for k, n in sp.entries
                                  if parse_bit_reversed_name(k) < r.first]

