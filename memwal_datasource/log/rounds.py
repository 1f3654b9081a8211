"""Compaction rounds: which commit records each base-table version holds, and since when.

Round ``R`` folds commit records ``after_seq + 1 .. upto_seq`` into the base
table. Three facts describe it, each owned here:

* its **intent** ``_memwal_compaction/rounds/R.json`` (put-if-absent before the
  commit: fixes which records the round folds, so every compactor folds the same);
* the **ledger**: the base table version's MemWAL index records ``R`` as the
  compacted generation of the fixed :data:`LEDGER_SHARD` (Lance's
  compare-and-set, atomic with the data);
* its **done marker** ``_memwal_compaction/done/R.json``, written put-if-absent
  after the commit is seen. Its modification time on the store is when the
  round's records became unnecessary in the WAL: garbage collection counts
  retention from it, on the store's clock, never from a writing driver's.

Readers ask :func:`folded_upto` "base version -> last folded record"; a
version whose intent a collection deleted raises :class:`CollectedError`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..errors import CollectedError, CorruptEntryError
from ..format.lance_manifest import compacted_generations
from ..store import ObjectStore, put_resolved

COMPACTION_DIR = "_memwal_compaction"
# The "shard" whose compacted generation in the base table's MemWAL index is the
# number of the last compaction round committed there (a compare-and-set: Lance
# refuses a generation not above the recorded one, atomically with the data).
LEDGER_SHARD = "6d656d77-616c-4c65-8467-65722d636d70"
# A round's bounds (the CLI, the Python API and the Spark job share them): this many
# commit records at most, and no record that would take the round's rows past this many
# Arrow bytes (they sit in the compactor's memory and in Lance's join, a 300 MiB pool).
DEFAULT_MAX_RECORDS = 256
DEFAULT_MAX_BYTES = 128 << 20


def round_key(number: int) -> str:
    """Key of compaction round ``number``'s intent (which commit records it folds)."""
    return f"{COMPACTION_DIR}/rounds/{number:020d}.json"


def done_key(number: int) -> str:
    """Key of round ``number``'s done marker (its store time starts the retention)."""
    return f"{COMPACTION_DIR}/done/{number:020d}.json"


@dataclass(frozen=True)
class CompactionRound:
    """Round ``number`` folds commit records ``after_seq + 1 .. upto_seq`` into the base."""

    number: int
    after_seq: int
    upto_seq: int
    created_ms: int = 0

    def to_json(self) -> bytes:
        """The intent's storage form."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> CompactionRound:
        """Parse a stored intent; the error names the file."""
        try:
            body = json.loads(data)
            return cls(int(body["number"]), int(body["after_seq"]), int(body["upto_seq"]),
                       int(body.get("created_ms", 0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntryError(f"compaction round {where} is corrupt: {exc}") from None


def read_round(store: ObjectStore, number: int) -> CompactionRound:
    """Round ``number``'s intent (``FileNotFoundError`` if it is not stored)."""
    key = round_key(number)
    return CompactionRound.from_json(store.get(key), store.describe(key))


def recorded_round(store: ObjectStore, base_version: int) -> int:
    """The last round committed in base ``base_version`` (0 if none)."""
    return compacted_generations(store, base_version).get(LEDGER_SHARD, 0)


def folded_upto(store: ObjectStore, base_version: int | None) -> tuple[int, int]:
    """(round, last commit record folded) of a base version; ``(0, 0)`` for none.

    Raises :class:`CollectedError` when the round's intent was garbage-collected
    (only rounds older than every stored base version are; see :mod:`gc`).
    """
    if base_version is None:
        return 0, 0
    try:
        number = recorded_round(store, base_version)
    except FileNotFoundError:
        raise CollectedError(
            f"read a newer version of the table: base version {base_version} is not stored "
            "(Lance's cleanup_old_versions removed it, or it never existed)") from None
    if not number:
        return 0, 0
    try:
        return number, read_round(store, number).upto_seq
    except FileNotFoundError:
        raise CollectedError(
            f"read a newer version of the table: base version {base_version} (compaction "
            f"round {number}) is older than what garbage collection keeps, and the record "
            f"of which commits it holds ({store.describe(round_key(number))}) was "
            "deleted") from None


def oldest_kept_round(store: ObjectStore, dataset) -> int:
    """The round the oldest stored base version records: intents from it on are needed."""
    oldest = min(v["version"] for v in dataset.versions())
    return recorded_round(store, oldest)


def mark_done(store: ObjectStore, number: int, base_version: int | None) -> None:
    """Record that round ``number`` is committed (idempotent; the first marker stays)."""
    body = json.dumps({"number": number, "base_version": base_version}).encode()
    put_resolved(store, done_key(number), body, retries=3, base_delay_ms=50,
                 what=f"compaction round {number} done marker")


def done_ms(store: ObjectStore, number: int) -> int | None:
    """Store time (ms) round ``number``'s done marker was written, or ``None``."""
    return store.modified_ms(done_key(number))
