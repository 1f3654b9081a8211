"""The store the simulation's actors use: every call waits for the scheduler,
then meets the fault it drew (an error, a lost acknowledgement, a stall, a crash,
a damaged object), and what landed is kept for the checks."""

from __future__ import annotations

import json
from collections.abc import Callable

from memwal_datasource.errors import TransientStoreError
from memwal_datasource.format.commit_format import (
    CHECKPOINTS_DIR,
    COMMITS_DIR,
    INTENTS_DIR,
    record_key,
    released_sequence,
)
from tests.helpers import DelegatingStore

from .scheduler import STALE_S, Scheduler


def released_now(store) -> int:
    """The released boundary stored now (read outside the schedule)."""
    return max((released_sequence(k) or 0 for k in store.list(CHECKPOINTS_DIR + "/")),
               default=0)


class SimStore(DelegatingStore):
    """A store whose every call waits for the scheduler, then meets the fault drawn."""

    def __init__(self, inner, sched: Scheduler, lists_after: bool = False):
        super().__init__(inner)
        self.sched = sched
        # As S3 (start-after): a seeded commit's first look is one listing, and a PUT
        # soon after it takes no verdict listing (CommitLogReader.clear_since).
        self.lists_after = lists_after
        self.landed: dict[str, list[bytes]] = {}  # record key: every body that landed there
        self.landed_at: dict[str, float] = {}  # record key: when its first body landed
        self.damaged: dict[str, bytes] = {}  # key stored damaged: the bytes it should hold
        self.puts: list[tuple[int, str]] = []  # (step, key) of every landed PUT

    def _write(self, op: str, key: str, data, write: Callable[[bytes], str | None]
               ) -> str | None:
        data = bytes(data)
        actor = self.sched.current()
        if key.startswith(INTENTS_DIR + "/") and actor is not None:
            body = json.loads(data)  # when the job's intent may first be stored, and what
            job_id = body["record"]["job_id"]  # it saw: its ``after``, the boundary then
            if f"intent:{job_id}" not in actor.marks:
                actor.marks[f"intent:{job_id}"] = self.sched.now
                actor.marks[f"after:{job_id}"] = body["after"]
                # Stale: its window begins at a number released or stored long ago.
                following = record_key(body["after"] + 1)
                actor.marks[f"stale:{job_id}"] = released_now(self.inner) > body["after"] or (
                    following in self.landed_at
                    and self.sched.now - self.landed_at[following] > STALE_S)
        fault = self.sched.enter(op, key)
        if fault == "error":
            raise self._error(f"injected failure writing {key}")
        body = data
        if fault == "damage":
            body = b"" if self.sched.rng.random() < 0.5 else data[:len(data) // 2]
        etag = write(body)
        self.puts.append((self.sched.step, key))
        if key.startswith(COMMITS_DIR + "/0"):
            self.landed.setdefault(key, []).append(data)
            self.landed_at.setdefault(key, self.sched.now)
            actor = self.sched.current()
            if actor is not None:
                actor.landed = True
        if fault == "damage":
            self.damaged[key] = data
        else:
            self.damaged.pop(key, None)
        if fault == "lost":
            raise TransientStoreError(f"injected lost acknowledgement writing {key}")
        return etag

    def _read(self, op: str, key: str) -> None:
        if self.sched.enter(op, key) == "error":
            raise self._error(f"injected failure: {op} {key}")

    def _error(self, message: str) -> Exception:
        """An error after the client's retries: the store's, or a bare OSError."""
        if self.sched.rates.oserror and self.sched.rng.random() < 0.3:
            return OSError(message)
        return TransientStoreError(message)

    def put_if_absent(self, key, data):
        return self._write("put_if_absent", key, data,
                           lambda b: self.inner.put_if_absent(key, b))

    def put(self, key, data):
        self._write("put", key, data, lambda b: self.inner.put(key, b))

    def get(self, key):
        self._read("get", key)
        return self.inner.get(key)

    def head(self, key):
        self._read("head", key)
        return self.inner.head(key)

    def list(self, prefix):
        self._read("list", prefix)
        return iter(list(self.inner.list(prefix)))  # one snapshot, at this moment

    def list_after_etags(self, prefix, after):
        self._read("list", prefix)
        return self.inner.list_after_etags(prefix, after)  # one snapshot, at this moment

    def list_dirs(self, prefix):
        self._read("list", prefix)
        return self.inner.list_dirs(prefix)

    def modified_ms(self, key):
        self._read("head", key)
        return self.inner.modified_ms(key)

    def delete(self, key):
        if self.sched.enter("delete", key) == "error":
            raise TransientStoreError(f"injected failure deleting {key}")
        self.inner.delete(key)
        self.damaged.pop(key, None)
