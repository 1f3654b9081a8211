"""The commit log: which WAL entries a job made visible, recorded atomically.

A job (a Spark write, or one streaming micro-batch) ends with one commit
record listing, per task, the shard, the writer epoch and the WAL position
range that task wrote. Records live at ``_memwal_commits/{sequence}.json``
under the table root (beside ``_mem_wal/``, so Lance never mistakes them for a
shard). Each is written put-if-absent at the next sequence number, so
concurrent jobs serialise and a record is either wholly there or absent.

Readers in ``read_committed`` mode see exactly the entries the records list:
entries from failed, fenced or speculative attempts are never listed, so they
never show. An ``overwrite`` record hides every record before it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

from .errors import CorruptEntryError, MemWalError
from .store import ObjectStore
from .wal import first_missing

log = logging.getLogger(__name__)

COMMITS_DIR = "_memwal_commits"
RECORD_FORMAT = 1
APPEND = "append"
OVERWRITE = "overwrite"


def record_key(sequence: int) -> str:
    """Key of commit record ``sequence`` (1-based, zero-padded so listings sort)."""
    return f"{COMMITS_DIR}/{sequence:020d}.json"


@dataclass(frozen=True)
class CommittedRange:
    """WAL entries ``first..last`` (inclusive) of ``shard_id`` written by ``epoch``."""

    shard_id: str
    epoch: int
    first: int
    last: int
    rows: int = 0
    bytes: int = 0
    task: int | None = None
    attempt: int | None = None
    sstables: tuple[str, ...] = ()


@dataclass
class CommitRecord:
    """One atomic commit of one job or micro-batch."""

    sequence: int
    kind: str
    job_id: str
    ranges: list[CommittedRange]
    created_ms: int = 0
    writer_group: str = ""
    query_id: str | None = None
    batch_id: int | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> bytes:
        """The record's storage form."""
        body = asdict(self)
        body["format"] = RECORD_FORMAT
        body["ranges"] = [dict(asdict(r), sstables=list(r.sstables)) for r in self.ranges]
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> CommitRecord:
        """Parse a stored record; the error names where it came from."""
        try:
            body = json.loads(data)
            if body.get("format", 1) > RECORD_FORMAT:
                raise MemWalError(
                    f"commit record {where} has format {body['format']}; this version of "
                    f"memwal_datasource reads up to {RECORD_FORMAT}: upgrade it"
                )
            ranges = [CommittedRange(**dict(r, sstables=tuple(r.get("sstables", ()))))
                      for r in body["ranges"]]
            return cls(sequence=int(body["sequence"]), kind=body["kind"], job_id=body["job_id"],
                       ranges=ranges, created_ms=int(body.get("created_ms", 0)),
                       writer_group=body.get("writer_group", ""),
                       query_id=body.get("query_id"), batch_id=body.get("batch_id"),
                       extra=body.get("extra", {}))
        except MemWalError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntryError(f"commit record {where} is corrupt: {exc}") from None


class CommitLog:
    """Append and read commit records of one table."""

    def __init__(self, store: ObjectStore):
        self.store = store
        self._cache: dict[int, CommitRecord] = {}

    def _exists(self, sequence: int) -> bool:
        return sequence in self._cache or self.store.exists(record_key(sequence))

    def next_sequence(self) -> int:
        """The first unused sequence number."""
        start = max(self._cache) if self._cache else 1
        return first_missing(self._exists, start)

    def read(self, sequence: int) -> CommitRecord:
        """Read one record (records are immutable, so they are cached)."""
        rec = self._cache.get(sequence)
        if rec is None:
            key = record_key(sequence)
            rec = CommitRecord.from_json(self.store.get(key), self.store.describe(key))
            self._cache[sequence] = rec
        return rec

    def records(self, after: int = 0) -> Iterator[CommitRecord]:
        """Every record with a sequence above ``after``, in order."""
        seq = after + 1
        while self._exists(seq):
            yield self.read(seq)
            seq += 1

    def append(self, kind: str, ranges: Iterable[CommittedRange], *, job_id: str | None = None,
               writer_group: str = "", query_id: str | None = None,
               batch_id: int | None = None, extra: dict | None = None) -> CommitRecord:
        """Write the next record atomically; concurrent appenders take turns."""
        if kind not in (APPEND, OVERWRITE):
            raise ValueError(f"commit kind must be '{APPEND}' or '{OVERWRITE}', got '{kind}'")
        rec = CommitRecord(sequence=0, kind=kind, job_id=job_id or uuid.uuid4().hex,
                           ranges=list(ranges), created_ms=int(time.time() * 1000),
                           writer_group=writer_group, query_id=query_id, batch_id=batch_id,
                           extra=dict(extra or {}))
        while True:
            rec.sequence = self.next_sequence()
            try:
                self.store.put_if_absent(record_key(rec.sequence), rec.to_json())
            except FileExistsError:
                continue  # another job took this number: try the next
            self._cache[rec.sequence] = rec
            return rec

    def find_stream_batch(self, query_id: str, batch_id: int) -> CommitRecord | None:
        """The record of micro-batch ``batch_id`` of ``query_id``, if committed.

        Scans back from the newest record to the stream's most recent one: a
        replayed batch is always that stream's latest or the one after it.
        """
        seq = self.next_sequence() - 1
        while seq >= 1:
            rec = self.read(seq)
            if rec.query_id == query_id:
                return rec if rec.batch_id == batch_id else None
            seq -= 1
        return None

    def visible(self) -> list[CommittedRange]:
        """Ranges visible to a committed reader: all since the last overwrite."""
        out: list[CommittedRange] = []
        for rec in self.records():
            if rec.kind == OVERWRITE:
                out = []
            out.extend(rec.ranges)
        return out


class CommittedView:
    """Fast membership test over committed ranges, per shard."""

    def __init__(self, ranges: Iterable[CommittedRange]):
        self.by_shard: dict[str, list[CommittedRange]] = {}
        for r in ranges:
            if r.last >= r.first:
                self.by_shard.setdefault(r.shard_id, []).append(r)
        for rs in self.by_shard.values():
            rs.sort(key=lambda r: r.first)

    def shards(self) -> list[str]:
        """Shards with at least one committed entry."""
        return sorted(self.by_shard)

    def ranges(self, shard_id: str) -> list[CommittedRange]:
        """Committed ranges of one shard, by first position."""
        return self.by_shard.get(shard_id, [])
