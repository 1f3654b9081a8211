"""The backlog: what compaction and gc have yet to do, and what they did last.

:func:`backlog` answers ``MemWalTable.stats()``, ``memwal inspect`` and the
automatic maintainer's threshold checks. The cheap part (``full=False``: the
commit log's fold and one base-table version) is what the maintainer checks
every time; the full part adds one listing per shard's WAL (and a HEAD per WAL
object for its size), the checkpoints, stream holds and commit intents.

Ages are judged on this host's clock (records carry their writer's clock,
holds the store's): a report for people and thresholds, never a decision
about what is safe to delete (gc judges that on the store's clock alone).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import MemWalError
from ..format.commit_format import CHECKPOINTS_DIR, INTENTS_DIR
from ..format.memwal import MEM_WAL_DIR
from ..log.holds import ReaderHolds
from ..log.rounds import read_round
from ..table.view import TableView
from .status import read_status


@dataclass
class ShardBacklog:
    """One shard's stored WAL."""

    shard_id: str
    wal_objects: int
    wal_bytes: int


@dataclass
class HoldInfo:
    """A stream's reader hold (gc keeps the records above ``after_seq``)."""

    hold_id: str
    label: str
    after_seq: int
    age_s: float  # since the stream last wrote it
    live: bool


@dataclass
class Backlog:
    """Pending work and the last maintenance; ``to_json()`` is ``memwal inspect --json``'s
    ``backlog`` object (fields documented in docs/operations.md)."""

    pending_records: int
    pending_rows: int
    pending_bytes: int
    oldest_pending_ms: int | None  # when the oldest pending commit record was written
    oldest_pending_age_s: float | None
    last_sequence: int
    compacted_through: int
    compacted_round: int
    base_version: int | None
    round_in_progress: int | None  # a round intent whose commit has not landed yet
    full: bool = False  # whether the fields below were gathered
    wal_objects: int = 0
    wal_bytes: int = 0
    shards: list[ShardBacklog] = field(default_factory=list)
    checkpoints: int = 0
    latest_checkpoint: int | None = None
    stream_holds: list[HoldInfo] = field(default_factory=list)
    pending_intents: int = 0
    maintenance: dict[str, Any] = field(default_factory=dict)  # maintenance/status.py

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form."""
        return asdict(self)

    def describe(self) -> str:
        """One line for logs and progress."""
        age = ("-" if self.oldest_pending_age_s is None
               else f"{self.oldest_pending_age_s:.0f}s")
        text = (f"{self.pending_records} commit record(s) pending ({self.pending_rows:,} rows, "
                f"{self.pending_bytes:,} bytes, oldest {age})")
        if self.full:
            text += f"; {self.wal_objects:,} WAL objects ({self.wal_bytes:,} bytes)"
        return text


def backlog(table: TableView, *, full: bool = True, workers: int = 8) -> Backlog:
    """The table's backlog now; ``full`` adds the WAL, checkpoints, holds and intents."""
    now_ms = int(time.time() * 1000)
    snap = table.snapshot()
    oldest = None
    if snap.pending_records:
        first = min((r.sequence for r in snap.tail if r.sequence), default=snap.compacted_seq + 1)
        try:
            oldest = table.commits.read(first).created_ms or None
        except (FileNotFoundError, MemWalError):
            oldest = None
    in_progress = None
    try:
        read_round(table.store, snap.compacted_round + 1)
        in_progress = snap.compacted_round + 1
    except FileNotFoundError:
        pass
    except MemWalError:  # a damaged intent: still a round nobody finished (status says why)
        in_progress = snap.compacted_round + 1
    out = Backlog(
        pending_records=snap.pending_records, pending_rows=sum(r.rows for r in snap.tail),
        pending_bytes=sum(r.bytes for r in snap.tail), oldest_pending_ms=oldest,
        oldest_pending_age_s=None if oldest is None else max(0.0, (now_ms - oldest) / 1000),
        last_sequence=snap.last_seq, compacted_through=snap.compacted_seq,
        compacted_round=snap.compacted_round, base_version=snap.base_version,
        round_in_progress=in_progress, maintenance=read_status(table.store))
    if full:
        _add_stored(table, out, now_ms, workers)
    return out


def _add_stored(table: TableView, out: Backlog, now_ms: int, workers: int) -> None:
    """The full backlog's listings: WAL objects per shard, checkpoints, holds, intents."""
    out.full = True
    store = table.store
    listed = {s: [k for k in store.list(f"{MEM_WAL_DIR}/{s}/wal/") if k.endswith(".arrow")]
              for s in table.shards()}
    keys = [k for ks in listed.values() for k in ks]
    # One HEAD per object (no store lists sizes): in parallel, as gc's plan does serially.
    with ThreadPoolExecutor(max(1, min(workers, len(keys) or 1))) as pool:
        sizes = dict(zip(keys, pool.map(lambda k: store.head(k) or 0, keys), strict=True))
    out.shards = [ShardBacklog(s, len(ks), sum(sizes[k] for k in ks))
                  for s, ks in sorted(listed.items())]
    out.wal_objects = len(keys)
    out.wal_bytes = sum(sizes.values())
    checkpoints = sorted(int(k.rsplit("/", 1)[-1][:-5]) for k in store.list(CHECKPOINTS_DIR + "/")
                         if k.endswith(".json") and k.rsplit("/", 1)[-1][:-5].isdigit())
    out.checkpoints = len(checkpoints)
    out.latest_checkpoint = checkpoints[-1] if checkpoints else None
    out.stream_holds = [
        HoldInfo(h.hold_id, h.label, h.after_seq, max(0.0, (now_ms - h.written_ms) / 1000),
                 h.live(now_ms))
        for _, h in sorted(ReaderHolds(store).all(), key=lambda kh: kh[1].after_seq)]
    out.pending_intents = sum(1 for k in store.list(INTENTS_DIR + "/") if k.endswith(".json"))
