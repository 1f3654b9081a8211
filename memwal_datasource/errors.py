"""Typed errors raised by memwal_datasource.

Every error names the thing it is about (option, file, shard, position) so a
user can act on the message without reading a stack trace.
"""

from __future__ import annotations

import re
from typing import TypeVar


class MemWalError(Exception):
    """Base class for every error this package raises on purpose."""


class StoreError(MemWalError):
    """An object-store operation failed for a reason that retrying will not fix."""


class UnsupportedStoreError(StoreError):
    """The URI names a storage backend that cannot do put-if-absent."""


class TransientStoreError(StoreError):
    """An object-store operation failed in a way that may succeed if retried."""


class StoreAuthError(StoreError):
    """The object store rejected our credentials."""


class StoreNotFoundError(StoreError):
    """The bucket or container named by the URI does not exist."""


class CorruptEntryError(MemWalError):
    """A WAL entry or manifest on storage could not be decoded."""


class MissingEntryError(CorruptEntryError):
    """A WAL entry that a committed range or a planned read names does not exist."""


class ShardSealedError(MemWalError):
    """The shard manifest is SEALED: a drop is in flight and claims are refused."""


class Fenced(MemWalError):
    """A newer writer epoch has claimed the shard; this writer must stop.

    A fenced writer should stop writing. Reopen (which claims a new epoch) only
    if this process should take the shard back from the newer writer.
    """

    def __init__(self, shard_id: str, local_epoch: int, stored_epoch: int, detail: str = ""):
        self.shard_id = shard_id
        self.local_epoch = local_epoch
        self.stored_epoch = stored_epoch
        msg = (
            f"shard {shard_id}: writer epoch {local_epoch} is fenced by epoch {stored_epoch}"
            + (f" ({detail})" if detail else "")
            + "; stop writing, reopen only to take the shard back"
        )
        super().__init__(msg)


class OutcomeUnknown(StoreError):
    """A conditional write may or may not have landed and reading back could not tell."""


class WriterPoisoned(MemWalError):
    """A WAL append had an outcome we cannot know; the writer must be reopened.

    Nothing acknowledged is lost. Reopening claims a new epoch, fences this
    writer and resumes at the WAL tip; rows whose put raised were not
    acknowledged and must be written again by the caller.
    """


class WriterStalled(MemWalError):
    """The WAL-only pipeline made no progress for ``backpressure_timeout_ms``."""


class NotInThisMode(MemWalError):
    """The statistic or call exists only in the other writer mode."""


class ConfigError(MemWalError, ValueError):
    """A configuration value or option is invalid; the message names it."""


class CommitRefused(MemWalError):
    """A commit names WAL entries it may no longer commit; nothing was committed.

    The message starts with the fix (run the job again) and says why: garbage
    collection released the positions, a newer writer of the shard committed
    first, or the commit stalled past a collection of the commit log.
    ``reason`` says which (:data:`GC_FLOOR`, :data:`NEWER_EPOCH`, :data:`STALLED`;
    empty if unknown); ``shard_id``, ``epoch``, ``first`` and ``last`` name the
    refused range, ``newer_epoch`` the committed epoch that overtook it, ``floor``
    the first position gc kept. A driver re-homes a :data:`NEWER_EPOCH` refusal
    (:mod:`memwal_datasource.write.rehome`) instead of failing.
    """

    GC_FLOOR = "gc_floor"
    NEWER_EPOCH = "newer_epoch"
    STALLED = "stalled"

    def __init__(self, message: str, *, reason: str = "", shard_id: str | None = None,
                 epoch: int | None = None, first: int | None = None, last: int | None = None,
                 newer_epoch: int | None = None, floor: int | None = None):
        super().__init__(message)
        self.reason = reason
        self.shard_id = shard_id
        self.epoch = epoch
        self.first = first
        self.last = last
        self.newer_epoch = newer_epoch
        self.floor = floor

    def details(self) -> dict:
        """The structured fields, as keyword arguments that rebuild this error."""
        return {k: v for k, v in (("reason", self.reason), ("shard_id", self.shard_id),
                                  ("epoch", self.epoch), ("first", self.first),
                                  ("last", self.last), ("newer_epoch", self.newer_epoch),
                                  ("floor", self.floor)) if v not in (None, "")}


class CollectedError(MissingEntryError):
    """What a read needed was garbage-collected after it planned (plan again)."""


class CompactionError(MemWalError):
    """Compaction cannot run on this table now; the message says why and what to do."""


# A source location pylance appends to messages: ", /home/.../rust/lance/src/x.rs:12:5".
_NATIVE_LOCATION = re.compile(r",?\s*[^\s,]*\brust/[^\s,]*\.rs:\d+(?::\d+)?")


def without_native_locations(text: str) -> str:
    """``text`` without the Rust source paths pylance appends (``.../rust/lance/src/...rs:1:2``)."""
    return _NATIVE_LOCATION.sub("", str(text)).strip()


E = TypeVar("E", bound=BaseException)


def raised_again(exc: E) -> E:
    """``exc``, a stored terminal error, ready to be raised once more: its traceback cleared.

    A failed writer or lease raises its first error from every later call. Raising
    one exception object again chains that raise's frames onto its traceback, so
    every earlier caller's frames (and their locals: a task's rows, its writer)
    would stay alive as long as the error does, and the collector would walk them
    all after every request of a Spark worker.
    """
    return exc.with_traceback(None)
