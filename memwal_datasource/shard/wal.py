"""The fenced WAL appender and the read-only WAL tailer of one shard.

Opening an appender **writes**: it claims a new writer epoch on the shard
manifest (fencing every older writer) and, from epoch 2 on, drops a
data-less fence sentinel at the WAL tip so a stalled older writer collides on
its next append and learns it is fenced. A fenced writer should stop; it
should reopen only if it is meant to take the shard back.

WAL positions are prefix-closed (if entry N is not written, N + 1 must not
exist), which is what lets the tailer find the tip with a galloping search.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from .. import hooks
from ..errors import Fenced, MissingEntryError, OutcomeUnknown, WriterPoisoned, raised_again
from ..format.memwal import (
    MEM_WAL_DIR,
    WalEntry,
    decode_wal_entry,
    encode_sentinel,
    encode_wal_entry,
    parse_bit_reversed_name,
    wal_key,
)
from ..store import ObjectStore, put_resolved
from .manifest import ManifestStore

log = logging.getLogger(__name__)

# Lance's appender limits: give up after this many consecutive position
# conflicts, and re-discover the tip every TIP_REFRESH_EVERY of them.
MAX_POSITION_CONFLICTS = 1024
TIP_REFRESH_EVERY = 16
# An appender idle this long re-checks the fence before its next append: a stall
# that long may have spanned a newer claim or a garbage collection that freed the
# slot it would write (collection retains much longer than this by default).
FENCE_RECHECK_IDLE_S = 5.0


def first_missing(exists: Callable[[int], bool], start: int) -> int:
    """The first ``n >= start`` for which ``exists(n)`` is false.

    Valid for prefix-closed sequences (if ``n`` is missing so is ``n + 1``), such
    as WAL positions and commit sequence numbers. Gallops forward (1, 2, 4, ...
    past ``start``) then bisects, so a long run costs O(log n) probes.
    """
    start = max(1, start)
    if not exists(start):
        return start
    lo, step = start, 1  # lo exists
    while exists(lo + step):
        lo, step = lo + step, step * 2
    hi = lo + step  # hi is missing
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if exists(mid):
            lo = mid
        else:
            hi = mid
    return hi


def find_tip(store: ObjectStore, shard_id: str, start: int) -> int:
    """The first missing WAL position at or after ``start`` (>= 1)."""
    return first_missing(lambda p: store.exists(wal_key(shard_id, p)), start)


@dataclass
class AppendResult:
    """Where an append landed and what it cost."""

    position: int
    nbytes: int
    put_seconds: float


class WalAppender:
    """Appends WAL entries for one claimed epoch of one shard."""

    def __init__(
        self,
        store: ObjectStore,
        shard_id: str,
        epoch: int,
        next_position: int,
        *,
        max_retries: int = 3,
        retry_base_delay_ms: int = 50,
        manifests: ManifestStore | None = None,
    ):
        self.store = store
        # The claim's own store knows the version it wrote: cheaper fence checks.
        self.manifests = manifests or ManifestStore(store, shard_id, retries=max_retries,
                                                    retry_base_delay_ms=retry_base_delay_ms)
        self.shard_id = self.manifests.shard_id
        self.epoch = epoch
        self.next_position = next_position
        self.max_retries = max_retries
        self.retry_base_delay_ms = retry_base_delay_ms
        self.first_position: int | None = None
        self.last_position: int | None = None
        self.sentinel_position: int | None = None
        self._error: Exception | None = None
        self._last_ok = time.monotonic()
        # False: entries are written without per-entry fsync and made durable
        # together by sync() (a writer without durable_write calls it off the put
        # path as entries land, and at flush/close).
        self.sync_each = True
        self._unsynced: list[str] = []
        self._unsynced_lock = threading.Lock()  # guards the list, held briefly
        self._sync_lock = threading.Lock()  # held through a sync: see sync()
        self._sync_error: Exception | None = None
        self._names_pending: list[str] = []  # data synced, directory not yet

    @classmethod
    def open(
        cls,
        store: ObjectStore,
        shard_id: str,
        *,
        schema: pa.Schema | None = None,
        create: bool = True,
        max_retries: int = 3,
        retry_base_delay_ms: int = 50,
        manifests: ManifestStore | None = None,
    ) -> WalAppender:
        """Claim a new epoch on the shard and position at the WAL tip.

        This writes: a new manifest version, and from epoch 2 on a fence
        sentinel entry at the tip. Like Lance's own writer, the sentinel has an
        empty schema; ``schema`` is accepted for symmetry and ignored. Once the
        start position and sentinel are fixed the fence is checked again, as
        Lance does: a writer that stalled between its claim and the tip while a
        newer epoch claimed, wrote and closed fails here with :class:`Fenced`
        instead of appending above the newer epoch's sentinel; the fence is also
        checked before the sentinel, so a stalled opener never leaves its sentinel
        above a newer one's. ``manifests``: the shard's chain as the caller already
        knows it (one open reads it once; see :class:`ManifestStore`).
        """
        manifests = manifests or ManifestStore(store, shard_id, retries=max_retries,
                                               retry_base_delay_ms=retry_base_delay_ms)
        # The tip is found beside the claim's version-hint PUT (neither reads the other).
        m, tip = manifests.claim_then(lambda m: find_tip(
            store, manifests.shard_id,
            max(m.wal_entry_position_last_seen, m.replay_after_wal_entry_position) + 1), create)
        hooks.point("open.tip", shard=manifests.shard_id, epoch=m.writer_epoch, tip=tip)
        appender = cls(store, manifests.shard_id, m.writer_epoch, tip,
                       max_retries=max_retries, retry_base_delay_ms=retry_base_delay_ms,
                       manifests=manifests)
        if m.writer_epoch >= 2:
            # A newer epoch that claimed while we found the tip may already have its
            # sentinel below our tip: ours must not land above it. Its claim came before
            # its sentinel, so this check sees it; a claim after this check finds its tip
            # after ours or collides with our sentinel's slot (then we check again there).
            appender._check_fence()
            res = appender._append_bytes(encode_sentinel(m.writer_epoch))
            appender.sentinel_position = res.position
            hooks.point("open.sentinel", shard=manifests.shard_id, epoch=m.writer_epoch,
                        position=res.position)
        appender._check_fence()
        below = (appender.sentinel_position or appender.next_position) - 1
        if below > m.replay_after_wal_entry_position:
            # Replay debt: entries above the replay position that an older attempt left
            # (it never closed). Uncommitted, or read from the WAL ranges commit records
            # name: a native opener must not replay them into SSTables.
            appender._advance_replay(appender.next_position - 1)
        return appender

    def append(
        self, schema: pa.Schema, batches: Iterable[pa.RecordBatch], generation: int | None = None
    ) -> AppendResult:
        """Write one entry holding ``batches``; returns where it landed."""
        return self.append_encoded(encode_wal_entry(schema, batches, self.epoch, generation))

    def append_encoded(self, data: bytes | pa.Buffer) -> AppendResult:
        """Write a pre-encoded entry, bytes or an Arrow buffer (must carry this
        appender's epoch)."""
        res = self._append_bytes(data)
        if self.first_position is None:
            self.first_position = res.position
        self.last_position = res.position
        return res

    def sync(self, *, names: bool = True) -> None:
        """Make every entry appended so far durable (a no-op when each already is).

        With ``names=False`` only the entries' data is synced (one fsync per
        entry; their directory waits for a later full sync, which then costs
        one more). Safe from any thread, concurrently with appends. Syncs are
        serialised, so when a call returns, every entry appended before it
        started is durable, including those another thread's sync had taken.
        """
        with self._sync_lock:
            if self._sync_error is not None:  # the keys it lost are not durable: never again
                raise raised_again(self._sync_error)
            with self._unsynced_lock:
                keys, self._unsynced = self._unsynced, []
            self._names_pending += keys
            try:
                if keys:
                    self.store.sync(keys, names=False)
                if names and self._names_pending:
                    self.store.sync(self._names_pending, data=False)
                    self._names_pending = []
            except Exception as exc:  # noqa: BLE001 - rows may not be durable: never report them
                self._sync_error = self._poison(
                    f"could not make {len(keys)} WAL entries durable ({exc})")
                raise self._sync_error from exc

    def _fail(self, exc: Exception) -> Exception:
        """Make ``exc`` terminal: every later call raises it again."""
        if self._error is None:
            self._error = exc
        return raised_again(self._error)

    def _poison(self, why: str) -> WriterPoisoned:
        return self._fail(WriterPoisoned(
            f"shard {self.shard_id} epoch {self.epoch}: {why}; no acknowledged row is lost: "
            "reopen the writer (it claims a new epoch) and write the unacknowledged rows again"))

    def check_fence(self) -> None:
        """Raise :class:`Fenced` now if a newer epoch holds the shard (one manifest read)."""
        self._check_fence()
        self._last_ok = time.monotonic()

    def _check_fence(self) -> None:
        """Raise :class:`Fenced` if a newer epoch holds the shard; poison if we cannot tell."""
        try:
            self.manifests.check_fenced(self.epoch)
        except Fenced as exc:
            raise self._fail(exc) from None
        except Exception as exc:  # noqa: BLE001 - an unknowable fence is a poisoned writer
            raise self._poison(
                f"could not read the shard manifest to check the fence ({exc})") from exc

    def release_replay(self) -> None:
        """Move the shard's replay position past this writer's entries (at close).

        A native opener (pylance's writer, LanceDB's ``merge_insert``) replays every
        entry above ``replay_after_wal_entry_position`` into SSTables that no commit
        record names; our readers and the compactor read these entries from the WAL
        ranges commit records name. Also the close's fence check: raises
        :class:`Fenced` if a newer epoch holds the shard.
        """
        if self.last_position is not None:
            self._advance_replay(self.last_position)
        else:
            self._check_fence()

    def _advance_replay(self, position: int) -> None:
        def advance(m) -> None:
            m.replay_after_wal_entry_position = max(m.replay_after_wal_entry_position, position)
            m.wal_entry_position_last_seen = max(m.wal_entry_position_last_seen, position)

        try:
            self.manifests.commit_update(self.epoch, advance)
        except Fenced as exc:
            raise self._fail(exc) from None
        except Exception as exc:  # noqa: BLE001 - an unknowable fence is a poisoned writer
            raise self._poison(
                f"could not move the shard manifest's replay position ({exc})") from exc
        hooks.point("replay.advanced", shard=self.shard_id, epoch=self.epoch, position=position)

    def _append_bytes(self, data: bytes | pa.Buffer) -> AppendResult:
        if self._error is not None:
            raise raised_again(self._error)
        if time.monotonic() - self._last_ok > FENCE_RECHECK_IDLE_S:
            self._check_fence()
        conflicts = 0
        while True:
            pos = self.next_position
            hooks.point("append.before", shard=self.shard_id, epoch=self.epoch, position=pos)
            t0 = time.perf_counter()
            try:
                ours = put_resolved(
                    self.store, wal_key(self.shard_id, pos), data, retries=self.max_retries,
                    base_delay_ms=self.retry_base_delay_ms, sync=self.sync_each,
                    what=f"shard {self.shard_id} epoch {self.epoch} WAL position {pos}")
            except OutcomeUnknown as exc:
                raise self._poison(f"the WAL append at position {pos} has an unknowable "
                                   f"outcome ({exc})") from exc
            except Exception as exc:  # noqa: BLE001 - auth, missing bucket...: stop for good
                raise self._fail(exc) from None
            if ours:
                break
            # Another writer's entry holds this slot: a newer epoch fences us,
            # an older one's in-flight entry is skipped (it is below our entries).
            self._check_fence()
            conflicts += 1
            log.info("shard %s: WAL position %d taken by another writer, moving on",
                     self.shard_id, pos)
            if conflicts >= MAX_POSITION_CONFLICTS:
                raise self._poison(f"{conflicts} consecutive WAL position conflicts")
            if conflicts % TIP_REFRESH_EVERY == 0:
                self.next_position = find_tip(self.store, self.shard_id, pos + 1)
            else:
                self.next_position = pos + 1
        if not self.sync_each:
            with self._unsynced_lock:
                self._unsynced.append(wal_key(self.shard_id, pos))
        hooks.point("append.after", shard=self.shard_id, epoch=self.epoch, position=pos)
        self._last_ok = time.monotonic()
        self.next_position = pos + 1
        return AppendResult(pos, len(data), time.perf_counter() - t0)


class WalTailer:
    """Reads a shard's WAL by position. Never writes."""

    def __init__(self, store: ObjectStore, shard_id: str,
                 manifests: ManifestStore | None = None):
        self.store = store
        self.manifests = manifests or ManifestStore(store, shard_id)
        self.shard_id = self.manifests.shard_id

    def _where(self, position: int) -> str:
        return (f"shard {self.shard_id} position {position} "
                f"({self.store.describe(wal_key(self.shard_id, position))})")

    def read(self, position: int) -> WalEntry | None:
        """The entry at ``position``, or ``None`` if it does not exist."""
        try:
            data = self.store.get(wal_key(self.shard_id, position))
        except FileNotFoundError:
            return None
        return decode_wal_entry(data, self._where(position))

    def stored(self) -> dict[int, str]:
        """``{position: key}`` of every WAL entry stored (one listing)."""
        out: dict[int, str] = {}
        for key in self.store.list(f"{MEM_WAL_DIR}/{self.shard_id}/wal/"):
            if key.endswith(".arrow"):
                try:
                    out[parse_bit_reversed_name(key)] = key
                except ValueError:
                    continue
        return out

    def _lowest_stored(self) -> int | None:
        return min(self.stored(), default=None)

    def first_position(self) -> int:
        """The lowest existing WAL position (the tip if the WAL is empty)."""
        lowest = self._lowest_stored()
        return lowest if lowest is not None else self.next_position()

    def next_position(self) -> int:
        """The WAL tip: the first position with no entry."""
        m = self.manifests.latest()
        seed = 1
        if m is not None:
            seed = max(m.wal_entry_position_last_seen, m.replay_after_wal_entry_position) + 1
            if seed > 1 and not self.store.exists(wal_key(self.shard_id, seed - 1)):
                # Collected below the hint: gallop from the lowest entry still stored
                # (probing from 1 would find the freed slots and call the WAL empty).
                lowest = self._lowest_stored()
                seed = lowest if lowest is not None else seed
        return find_tip(self.store, self.shard_id, seed)

    def entries(
        self, start: int, end: int | None = None, *, include_sentinels: bool = False
    ) -> Iterator[tuple[int, WalEntry]]:
        """Yield ``(position, entry)`` from ``start`` to ``end`` (inclusive) or the tip.

        Holds one entry in memory at a time. Without ``end`` it stops at the tip;
        with ``end`` every position must exist: a missing entry inside a range a
        caller was promised (a committed range, a planned partition) raises
        :class:`MissingEntryError` naming it, never a silently shorter read.
        """
        pos = max(1, start)
        while end is None or pos <= end:
            entry = self.read(pos)
            if entry is None:
                if end is not None:
                    raise MissingEntryError(
                        f"WAL entry {self._where(pos)} is missing, inside the range "
                        f"{start}..{end} being read (deleted by hand, or by a garbage "
                        "collection this reader started before); nothing was returned past it")
                return
            if include_sentinels or not entry.is_sentinel:
                yield pos, entry
            pos += 1
