"""What the commands report: each shard's WAL and commit coverage, the stored records."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..log.commit import OVERWRITE, Checkpoint, CommitLog, CommitRecord, CommittedRange
from ..shard.manifest import ManifestStore, list_shards
from ..shard.wal import WalTailer
from ..store import ObjectStore

# Uncommitted WAL positions read per shard to tell fence sentinels from data.
SENTINEL_SCAN_LIMIT = 256


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _gaps(covered: list[tuple[int, int]], first: int, last: int) -> Iterable[int]:
    """Positions in ``first..last`` outside ``covered`` (merged, sorted)."""
    pos = first
    for lo, hi in covered:
        if hi < pos:
            continue
        yield from range(pos, min(lo, last + 1))
        pos = max(pos, hi + 1)
        if pos > last:
            return
    yield from range(pos, last + 1)


@dataclass
class ShardInfo:
    """One shard as the CLI reports it (``--json`` emits these keys)."""

    shard_id: str
    status: str
    writer_epoch: int | None
    manifest_version: int | None
    wal_first: int
    wal_last: int
    wal_entries: int
    committed_entries: int
    visible_entries: int
    uncommitted_entries: int
    sentinel_entries: int
    uncommitted_exact: bool
    committed_rows: int
    committed_bytes: int
    sstables: int

    def wal_span(self) -> str:
        """``first..last`` of the existing positions, ``-`` when the WAL is empty."""
        return f"{self.wal_first}..{self.wal_last}" if self.wal_entries else "-"


def status_name(sealed: bool) -> str:
    """A manifest status as people read it."""
    return "SEALED" if sealed else "ACTIVE"


def _clipped(spans: list[tuple[int, int]], first: int, last: int) -> int:
    """How many positions of ``first..last`` the merged ``spans`` cover."""
    return sum(max(0, min(hi, last) - max(lo, first) + 1) for lo, hi in spans)


def shard_info(store: ObjectStore, shard: str, ranges: list[tuple[int, CommittedRange]],
               visible_from: int) -> ShardInfo:
    """Manifest, WAL range and commit coverage of one shard.

    ``ranges`` are ``(record sequence, range)`` of every known commit;
    ``visible_from`` is the sequence of the last overwrite record (0 if none):
    records before it are committed but hidden. Entry counts are of the WAL
    entries stored now (committed + uncommitted + sentinels = entries, when
    exact). Positions no record covers are read (up to
    :data:`SENTINEL_SCAN_LIMIT`) to tell fence sentinels, which carry no rows,
    from uncommitted data entries.
    """
    m = ManifestStore(store, shard).latest()
    tailer = WalTailer(store, shard)
    first, nxt = tailer.first_position(), tailer.next_position()
    mine = [(seq, r) for seq, r in ranges if r.shard_id == shard]
    covered = _merge((r.first, r.last) for _, r in mine)
    visible = _merge((r.first, r.last) for seq, r in mine if seq >= visible_from)
    sentinels = uncommitted = scanned = 0
    exact = True
    for pos in _gaps(covered, first, nxt - 1):
        if scanned >= SENTINEL_SCAN_LIMIT:
            exact = False
            uncommitted += 1
            continue
        scanned += 1
        entry = tailer.read(pos)
        if entry is not None and entry.is_sentinel:
            sentinels += 1
        else:
            uncommitted += 1
    return ShardInfo(
        shard_id=shard, status=status_name(bool(m and m.sealed)),
        writer_epoch=m.writer_epoch if m else None, manifest_version=m.version if m else None,
        wal_first=first, wal_last=nxt - 1, wal_entries=max(0, nxt - first),
        committed_entries=_clipped(covered, first, nxt - 1),
        visible_entries=_clipped(visible, first, nxt - 1),
        uncommitted_entries=uncommitted, sentinel_entries=sentinels, uncommitted_exact=exact,
        committed_rows=sum(r.rows for _, r in mine),
        committed_bytes=sum(r.bytes for _, r in mine),
        sstables=len(m.sstables) if m else 0)


@dataclass
class StoredLog:
    """The commit records still stored, and the checkpoint standing for collected ones."""

    records: list[CommitRecord]
    checkpoint: Checkpoint | None  # set when a garbage collection removed records
    first: int  # sequence of the first stored record

    @property
    def collected(self) -> int:
        """Records ``1..collected`` were garbage-collected (0: none)."""
        return self.first - 1


def stored_records(log: CommitLog) -> StoredLog:
    """Every stored commit record, from the first one a garbage collection kept."""
    first = log.first_stored()
    ck = log.latest_checkpoint() if first > 1 else None
    return StoredLog(list(log.records(after=first - 1)), ck, first)


def survey(store: ObjectStore) -> tuple[StoredLog, list[ShardInfo]]:
    """The stored commit records and every shard's :class:`ShardInfo`."""
    log = stored_records(CommitLog(store))
    ranges = [(rec.sequence, r) for rec in log.records for r in rec.ranges]
    visible_from = max((r.sequence for r in log.records if r.kind == OVERWRITE), default=0)
    if log.checkpoint is not None:  # what the collected records made visible
        ranges += [(log.checkpoint.sequence, r) for r in log.checkpoint.visible]
        visible_from = max(visible_from, log.checkpoint.last_overwrite or 0)
    return log, [shard_info(store, s, ranges, visible_from) for s in list_shards(store)]


def record_json(rec: CommitRecord) -> dict:
    """A commit record's summary with stable keys."""
    return {"sequence": rec.sequence, "kind": rec.kind, "created_ms": rec.created_ms,
            "job_id": rec.job_id, "writer_group": rec.writer_group,
            "query_id": rec.query_id, "batch_id": rec.batch_id,
            "txn_app_id": rec.txn_app_id, "txn_version": rec.txn_version,
            "ranges": len(rec.ranges), "shards": len({r.shard_id for r in rec.ranges}),
            "rows": sum(r.rows for r in rec.ranges), "bytes": sum(r.bytes for r in rec.ranges)}
