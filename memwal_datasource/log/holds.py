"""Reader holds: what a live stream still has to read, kept from garbage collection.

A stream plans a micro-batch (commit records ``after + 1 .. end``) and reads
it later; gc at a short retention could delete those records' WAL entries in
between. So a stream writes a **hold** before it plans and refreshes it as it
goes: ``_memwal_holds/<hold id>.json`` naming ``after_seq``, the last commit
record it no longer needs (it still has to read every record above it). gc
releases nothing above the lowest ``after_seq`` of a live hold, and says so
("held by stream ...").

A hold is live for ``ttl_s`` after it was last written, judged on the
**store's clock** (the object's modification time against gc's ``now``), as
retention is, so no host's clock matters. A stream that stopped or died stops
refreshing its hold and gc moves on after the TTL: a dead stream never pins
the table for good. Every query run has a hold of its own (a Spark source is
not told its query's identity); holds that expired long ago are deleted by gc.

Shard leases (:mod:`memwal_datasource.shard.leases`) do not fit: they exclude rival
writers of one shard through a chain of generations, while a hold has one
writer, excludes nobody and carries a commit sequence. One overwritten object
is all it needs.

Hook point: ``hold.put`` (hold_id, after_seq) after a hold was written.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from dataclasses import dataclass

from .. import hooks
from ..store import ObjectStore

log = logging.getLogger(__name__)

HOLDS_DIR = "_memwal_holds"
# Longer than a micro-batch takes to plan and read, and than a quick restart;
# short enough that a stream stopped for good keeps gc back only briefly.
DEFAULT_HOLD_TTL_S = 600.0
# gc deletes hold objects that expired this long ago (a crashed run's leftovers).
FORGET_AFTER_S = 24 * 3600.0


def hold_key(hold_id: str) -> str:
    """Key of hold ``hold_id``."""
    return f"{HOLDS_DIR}/{hold_id}.json"


@dataclass(frozen=True)
class ReaderHold:
    """A stream's claim on commit records above ``after_seq`` (and their WAL entries).

    ``written_ms`` is the object's modification time on the store (set when read).
    """

    hold_id: str
    label: str
    after_seq: int
    ttl_s: float = DEFAULT_HOLD_TTL_S
    written_ms: int = 0

    def expires_ms(self) -> int:
        """When the hold stops keeping gc back, on the store's clock."""
        return self.written_ms + int(self.ttl_s * 1000)

    def live(self, now_ms: int) -> bool:
        """Whether gc must still keep what the hold names."""
        return now_ms <= self.expires_ms()

    def describe(self, now_ms: int | None = None) -> str:
        """``stream <label>``, and how long the hold lasts unless refreshed."""
        left = f", for {max(0, self.expires_ms() - now_ms) / 1000:.0f} s unless refreshed" \
            if now_ms is not None else ""
        return f"stream {self.label} (hold {self.hold_id}{left})"

    def encode(self) -> bytes:
        """The hold object's body."""
        return json.dumps({"hold_id": self.hold_id, "label": self.label,
                           "after_seq": self.after_seq, "ttl_s": self.ttl_s}).encode()


def new_hold_id() -> str:
    """A fresh hold id (one per query run)."""
    return uuid.uuid4().hex


def default_label() -> str:
    """Where the holding stream runs, for gc's message."""
    return f"on {socket.gethostname()} pid {os.getpid()}"


class ReaderHolds:
    """The holds of one table."""

    def __init__(self, store: ObjectStore):
        self.store = store

    def put(self, hold: ReaderHold) -> None:
        """Write (or refresh) ``hold``: its TTL starts now, on the store's clock."""
        self.store.put(hold_key(hold.hold_id), hold.encode())
        hooks.point("hold.put", hold_id=hold.hold_id, after_seq=hold.after_seq)

    def drop(self, hold_id: str) -> None:
        """Delete a hold (a stream that stops cleanly). Best effort."""
        try:
            self.store.delete(hold_key(hold_id))
        except Exception as exc:  # noqa: BLE001 - an undeleted hold expires by itself
            log.warning("could not delete stream hold %s (it expires by itself): %s",
                        hold_id, exc)

    def all(self) -> list[tuple[str, ReaderHold]]:
        """Every stored hold with its key; a damaged one is skipped with a warning."""
        out = []
        for key in self.store.list(HOLDS_DIR + "/"):
            if not key.endswith(".json"):
                continue
            try:
                body = json.loads(self.store.get(key))
                stamp = self.store.modified_ms(key)
                if stamp is None:
                    continue  # deleted meanwhile
                out.append((key, ReaderHold(str(body["hold_id"]), str(body.get("label", "")),
                                            int(body["after_seq"]),
                                            float(body.get("ttl_s", DEFAULT_HOLD_TTL_S)),
                                            stamp)))
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring damaged stream hold %s: %s", self.store.describe(key), exc)
        return out

    def live(self, now_ms: int) -> list[ReaderHold]:
        """The holds gc must respect at ``now_ms`` (store clock), lowest ``after_seq`` first."""
        return sorted((h for _, h in self.all() if h.live(now_ms)), key=lambda h: h.after_seq)

    def forgotten(self, now_ms: int) -> list[tuple[str, int]]:
        """``(key, bytes)`` of holds that expired over :data:`FORGET_AFTER_S` ago."""
        cutoff = now_ms - int(FORGET_AFTER_S * 1000)
        return [(key, len(h.encode())) for key, h in self.all() if h.expires_ms() < cutoff]


class HoldKeeper:
    """Keeps one query run's hold written: when it moves, and every quarter TTL from a
    daemon thread, so a live stream's hold never lapses between slow triggers.

    :meth:`hold` says whether the hold stayed live since the previous call
    (written within 0.9 TTL on this host's monotonic clock); when not, gc may
    have moved on meanwhile and the caller checks what it planned again.
    """

    def __init__(self, store: ObjectStore, label: str | None = None,
                 ttl_s: float = DEFAULT_HOLD_TTL_S):
        self.holds = ReaderHolds(store)
        self.hold_id = new_hold_id()
        self.label = label or default_label()
        self.ttl_s = ttl_s
        self._lock = threading.Lock()  # one PUT at a time, so the newest 'after' lands last
        self._after: int | None = None
        self._written: float | None = None  # monotonic time of the last successful write
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, after: int) -> bool:
        """Hold every commit record above ``after``; ``False`` if the hold may have lapsed
        since the previous call (or this is the first)."""
        with self._lock:
            now = time.monotonic()
            kept = self._written is not None and now - self._written < self.ttl_s * 0.9
            if not (kept and after == self._after and now - self._written < self.ttl_s / 4):
                self._put(after)
            self._after = after
        if self._thread is None:
            # The thread holds the keeper weakly: a keeper dropped without stop() (its
            # reader is gone) ends it at the next tick.
            self._thread = threading.Thread(
                target=_refresh, args=(weakref.ref(self), self._stop, self.ttl_s / 4),
                daemon=True, name=f"memwal-hold-{self.hold_id[:8]}")
            self._thread.start()
        return kept

    def _put(self, after: int) -> None:
        self.holds.put(ReaderHold(self.hold_id, self.label, after, self.ttl_s))
        self._written = time.monotonic()

    def refresh(self) -> None:
        """Write the hold again as it stands (its TTL starts now). Never raises."""
        with self._lock:
            if self._stop.is_set() or self._after is None:
                return
            try:
                self._put(self._after)
            except Exception as exc:  # noqa: BLE001 - retried; a lapse is detected
                log.warning("could not refresh stream hold %s (retried in %g s): %s",
                            self.hold_id, self.ttl_s / 4, exc)

    def stop(self) -> None:
        """Stop refreshing; the hold lapses after its TTL (a quick restart still finds
        what it planned)."""
        self._stop.set()


def _refresh(keeper: weakref.ref, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        live = keeper()
        if live is None:
            return
        live.refresh()
        del live


def lowest_held(holds: list[ReaderHold]) -> ReaderHold | None:
    """The live hold that keeps the most (lowest ``after_seq``), or ``None``."""
    return min(holds, key=lambda h: h.after_seq, default=None)
