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

from . import hooks
from .errors import CorruptEntryError, MemWalError
from .store import ObjectStore, put_resolved
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
    txn_app_id: str | None = None
    txn_version: int | None = None

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
                       extra=body.get("extra", {}), txn_app_id=body.get("txn_app_id"),
                       txn_version=body.get("txn_version"))
        except MemWalError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntryError(f"commit record {where} is corrupt: {exc}") from None


def stream_app_id(query_id: str) -> str:
    """The idempotency key under which a stream's micro-batches commit."""
    return f"stream:{query_id}"


@dataclass(frozen=True)
class Txn:
    """An idempotency key, like Delta's ``txnAppId`` / ``txnVersion``.

    A commit carrying ``(app_id, version)`` is skipped when the log already
    holds a record of ``app_id`` with a version at least as high.
    """

    app_id: str
    version: int


@dataclass
class CommitResult:
    """What :meth:`CommitLog.append` did: the record, and whether it is new."""

    record: CommitRecord
    created: bool


class CommitLog:
    """Append and read commit records of one table.

    Appending is serialisable: a record is written put-if-absent at the first
    free sequence number, after every record below it has been read, so an
    idempotency key is checked against the complete history that precedes it.
    A collision is read back (a lost acknowledgement is ours, not a rival's)
    and the rival's record is checked before moving on.
    """

    def __init__(self, store: ObjectStore, *, retries: int = 3, retry_base_delay_ms: int = 50):
        self.store = store
        self.retries = retries
        self.retry_base_delay_ms = retry_base_delay_ms
        self._cache: dict[int, CommitRecord] = {}
        self._txn: dict[str, tuple[int, int]] = {}  # app id -> (version, sequence)
        self._txn_scanned = 0  # records 1..this have been folded into _txn

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

    def _fold_txn(self, upto: int) -> None:
        """Fold records ``1..upto`` into the idempotency-key index."""
        for seq in range(self._txn_scanned + 1, upto + 1):
            rec = self.read(seq)
            if rec.txn_app_id is not None and rec.txn_version is not None:
                prior = self._txn.get(rec.txn_app_id)
                if prior is None or rec.txn_version >= prior[0]:
                    self._txn[rec.txn_app_id] = (rec.txn_version, seq)
            self._txn_scanned = seq

    def committed_txn(self, txn: Txn, upto: int | None = None) -> CommitRecord | None:
        """The record that already committed ``txn`` (same app, version >= it), if any."""
        self._fold_txn(self.next_sequence() - 1 if upto is None else upto)
        prior = self._txn.get(txn.app_id)
        if prior is not None and prior[0] >= txn.version:
            return self.read(prior[1])
        return None

    def append(self, kind: str, ranges: Iterable[CommittedRange], *, job_id: str | None = None,
               writer_group: str = "", query_id: str | None = None,
               batch_id: int | None = None, extra: dict | None = None,
               txn: Txn | None = None) -> CommitResult:
        """Write the next record atomically; concurrent appenders take turns.

        With ``txn``, a key already committed returns that record with
        ``created=False`` instead of committing the rows a second time.
        """
        if kind not in (APPEND, OVERWRITE):
            raise ValueError(f"commit kind must be '{APPEND}' or '{OVERWRITE}', got '{kind}'")
        rec = CommitRecord(sequence=0, kind=kind, job_id=job_id or uuid.uuid4().hex,
                           ranges=list(ranges), created_ms=int(time.time() * 1000),
                           writer_group=writer_group, query_id=query_id, batch_id=batch_id,
                           extra=dict(extra or {}),
                           txn_app_id=txn.app_id if txn else None,
                           txn_version=txn.version if txn else None)
        seq = self.next_sequence()
        while True:
            if txn is not None:
                done = self.committed_txn(txn, upto=seq - 1)
                if done is not None:
                    return CommitResult(done, False)
            rec.sequence = seq
            key = record_key(seq)
            hooks.point("commit.before", sequence=seq)
            if put_resolved(self.store, key, rec.to_json(), retries=self.retries,
                            base_delay_ms=self.retry_base_delay_ms,
                            what=f"commit record {seq}"):
                self._cache[seq] = rec
                hooks.point("commit.after", sequence=seq)
                return CommitResult(rec, True)
            seq += 1  # another job took this number; it is checked on the next pass

    def find_stream_batch(self, query_id: str, batch_id: int) -> CommitRecord | None:
        """The record that committed micro-batch ``batch_id`` of ``query_id`` (or a later one)."""
        return self.committed_txn(Txn(stream_app_id(query_id), batch_id))

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
