"""Pending commits (intents): how concurrent jobs share one commit record.

A committer that meets contention on the commit sequence writes an intent,
``_memwal_commits/_intents/{intent_id}.json``, under a key nobody else uses (a
plain PUT that cannot collide), and the oldest fresh intent's owner puts one
group record holding every pending intent it can validate. The argument for
why this is exactly once is in docs/protocol.md ("Committing at scale").

This module is the intents' storage form and the few decisions about them
(who leads, which are fresh); :mod:`memwal_datasource.log.commit` does the rest.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import CorruptEntryError
from ..format.commit_format import INTENTS_DIR, CommitRecord
from ..store import ObjectStore

log = logging.getLogger(__name__)

INTENT_FORMAT = 1
# Intents read by this process, by table and id (immutable: read once per process, not
# once per commit; a new commit log of the table finds them here). Oldest dropped first.
_READ: dict[tuple[str, str], Intent] = {}
_READ_MAX = 4096


# How long followers of each table waited for a leader's record lately (an average):
# a follower polls a few times per leader cycle, not every few milliseconds.
_CYCLE_S: dict[str, float] = {}


def forget() -> None:
    """Drop every intent this process has read and what it learned of leaders' pace
    (tests: worlds that reuse ids)."""
    _READ.clear()
    _CYCLE_S.clear()


def poll_delays(uri: str, first_s: float, most_s: float) -> Iterator[float]:
    """Pauses between a follower's looks for a leader's record of table ``uri``: a
    third of the recent wait first, then growing to it (never below ``first_s``, nor
    above ``most_s`` longer than a recent wait took)."""
    cycle = _CYCLE_S.get(uri, 0.0)
    delay, cap = max(first_s, cycle / 3), max(most_s, cycle)
    while True:
        yield delay
        delay = min(delay * 1.5, cap)


def waited(uri: str, seconds: float) -> None:
    """A follower of ``uri`` saw the record it waited for after ``seconds``."""
    _CYCLE_S[uri] = 0.7 * _CYCLE_S.get(uri, seconds) + 0.3 * seconds


def intent_key(intent_id: str) -> str:
    """Where intent ``intent_id`` is stored."""
    return f"{INTENTS_DIR}/{intent_id}.json"


@dataclass(frozen=True)
class Intent:
    """A job's record body waiting for a group record to commit it.

    ``after`` is a sequence number that was stored before the intent was
    written, so no record at or below it can hold the intent.
    """

    intent_id: str
    after: int
    created_ms: int
    record: CommitRecord

    @classmethod
    def new(cls, record: CommitRecord, after: int) -> Intent:
        # The time prefix makes keys list in age order; the uuid makes them unique.
        now = int(time.time() * 1000)
        return cls(f"{now:015d}-{uuid.uuid4().hex}", after, now, record)

    def to_json(self) -> bytes:
        return json.dumps({"format": INTENT_FORMAT, "intent_id": self.intent_id,
                           "after": self.after, "created_ms": self.created_ms,
                           "record": json.loads(self.record.to_json())},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Intent:
        try:
            body = json.loads(data)
            rec = CommitRecord.from_json(json.dumps(body["record"]).encode(), where)
            return cls(str(body["intent_id"]), int(body["after"]), int(body["created_ms"]), rec)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntryError(f"commit intent {where} is corrupt: {exc}") from None

    def fresh(self, now_ms: int, max_age_s: float) -> bool:
        """Young enough for another committer to take (see docs/protocol.md)."""
        return now_ms - self.created_ms < max_age_s * 1000

    def order(self) -> tuple[int, str]:
        """Leaders are chosen oldest first; the id breaks ties."""
        return (self.created_ms, self.intent_id)


class Intents:
    """The table's pending intents; each is read once (intents are immutable)."""

    def __init__(self, store: ObjectStore):
        self.store = store

    def _remember(self, intent: Intent) -> None:
        if len(_READ) >= _READ_MAX:
            del _READ[next(iter(_READ))]
        _READ[(self.store.uri, intent.intent_id)] = intent

    def write(self, intent: Intent) -> None:
        """Store ``intent`` (a unique key: a plain PUT, nothing to race)."""
        self.store.put(intent_key(intent.intent_id), intent.to_json())
        self._remember(intent)

    def delete(self, intent: Intent) -> None:
        """Best effort: a leftover intent only costs listings until gc removes it."""
        _READ.pop((self.store.uri, intent.intent_id), None)
        try:
            self.store.delete(intent_key(intent.intent_id))
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001 - gc removes stale intents
            log.debug("could not delete commit intent %s: %s", intent.intent_id, exc)

    def any_pending(self, listed: list[str] | None = None) -> bool:
        """Whether any intent is stored: one LIST, or ``listed`` (keys under
        ``_intents/`` a listing just showed)."""
        keys = listed if listed is not None else self.store.list(INTENTS_DIR + "/")
        return any(k.endswith(".json") for k in keys)

    def pending(self, now_ms: int, max_age_s: float,
                skip: Callable[[str], bool] | None = None) -> Iterator[Intent]:
        """The stored intents young enough to take, oldest first, each read (once per
        process) only when the caller gets to it: a follower stops at its leader's.
        Ids for which ``skip(id)`` is true are passed over unread.

        One LIST; an intent's age and order are in its name. An intent that vanished
        between LIST and GET was answered and deleted by its owner; a damaged one is
        skipped with a warning (its owner, if alive, commits it itself).
        """
        named = []
        for key in self.store.list(INTENTS_DIR + "/"):
            name = key.rsplit("/", 1)[-1]
            if not name.endswith(".json"):
                continue
            iid = name[:-5]
            if skip is not None and skip(iid):
                continue
            if iid[:15].isdigit():
                if now_ms - int(iid[:15]) >= max_age_s * 1000:
                    continue  # stale by its name: no GET needed
                named.append(((int(iid[:15]), iid), key, iid))
            else:  # not a name Intent.new gives: its order is in its body
                intent = self._read(key, iid)
                if intent is not None:
                    named.append((intent.order(), key, iid))
        for _order, key, iid in sorted(named):
            intent = self._read(key, iid)
            if intent is not None and intent.fresh(now_ms, max_age_s):
                yield intent

    def _read(self, key: str, iid: str) -> Intent | None:
        intent = _READ.get((self.store.uri, iid))
        if intent is None:
            try:
                intent = Intent.from_json(self.store.get(key), self.store.describe(key))
            except FileNotFoundError:
                return None
            except CorruptEntryError as exc:
                log.warning("skipping %s", exc)
                return None
            self._remember(intent)
        return intent

    def stale_keys(self, now_ms: int, older_than_s: float) -> list[str]:
        """Keys of intents older than ``older_than_s`` (for gc; judged by their names)."""
        out = []
        for key in self.store.list(INTENTS_DIR + "/"):
            name = key.rsplit("/", 1)[-1]
            if name[:15].isdigit() and now_ms - int(name[:15]) >= older_than_s * 1000:
                out.append(key)
        return out
