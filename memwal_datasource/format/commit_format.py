"""The commit log's storage forms: ranges, records, checkpoints, and the fold.

A commit record lists, per task, the shard, writer epoch and WAL position
range a job made visible; a checkpoint is records ``1..S`` folded (visible
ranges, idempotency keys, collection floors, each shard's newest committed
epoch). Pure data and pure functions: the I/O that appends and reads them is
:mod:`memwal_datasource.log.commit`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields, replace

from ..errors import CorruptEntryError, MemWalError

COMMITS_DIR = "_memwal_commits"
CHECKPOINTS_DIR = f"{COMMITS_DIR}/_checkpoints"
INTENTS_DIR = f"{COMMITS_DIR}/_intents"  # pending commits waiting to join a group record
LAST_CHECKPOINT_KEY = f"{COMMITS_DIR}/_last_checkpoint.json"
RECORD_FORMAT = 2  # 2: group records (``members``); records of one job are still written as 1
CHECKPOINT_FORMAT = 1
RECENT = 256  # record digests a checkpoint keeps, so a stalled committer can tell its own
APPEND = "append"
OVERWRITE = "overwrite"
# A garbage collection: ``extra["floors"]`` maps shards to the first WAL position it
# keeps. No later record may name a position below a shard's floor.
GC = "gc"
KINDS = (APPEND, OVERWRITE, GC)
COMMITTED, DUPLICATE, REFUSED = "committed", "duplicate", "refused"  # a member's verdict


def record_key(sequence: int) -> str:
    """Key of commit record ``sequence`` (1-based, zero-padded so listings sort)."""
    return f"{COMMITS_DIR}/{sequence:020d}.json"


def checkpoint_key(sequence: int) -> str:
    """Key of the checkpoint that folds records ``1..sequence``."""
    return f"{CHECKPOINTS_DIR}/{sequence:020d}.json"


RELEASED_PREFIX = "released-"


def released_key(sequence: int) -> str:
    """Key of the marker saying records ``1..sequence`` are released: garbage collection
    stores it before it deletes any of them, beside the checkpoints so that the one
    listing a reader makes of those shows it (docs/protocol.md, "Invariants")."""
    return f"{CHECKPOINTS_DIR}/{RELEASED_PREFIX}{sequence:020d}.json"


def key_sequence(key: str) -> int | None:
    """The number a record's or a checkpoint's key names (``.../{n}.json``), else ``None``."""
    name = key.rsplit("/", 1)[-1]
    return int(name[:-5]) if name.endswith(".json") and name[:-5].isdigit() else None


def released_sequence(key: str) -> int | None:
    """The sequence a :func:`released_key` names, else ``None``."""
    name = key.rsplit("/", 1)[-1]
    if name.startswith(RELEASED_PREFIX) and name.endswith(".json"):
        number = name[len(RELEASED_PREFIX):-5]
        if number.isdigit():
            return int(number)
    return None


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
    # The record that committed it; set in checkpoints (a record knows its own).
    sequence: int | None = None


def shallow_dict(obj) -> dict:
    """A dataclass's fields as a dict, values as they are (``asdict`` deep-copies every
    value; on the commit path that copying cost more than the JSON encoding)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _range_to_dict(r: CommittedRange) -> dict:
    body = dict(shallow_dict(r), sstables=list(r.sstables))
    if body["sequence"] is None:
        del body["sequence"]
    return body


def _range_from_dict(d: dict) -> CommittedRange:
    return CommittedRange(**dict(d, sstables=tuple(d.get("sstables", ()))))


@dataclass
class Member:
    """One job's part of a group record (see docs/protocol.md, group commit).

    ``verdict`` is :data:`COMMITTED` (its ranges are in the record's ``ranges``),
    :data:`DUPLICATE` (its idempotency key was already committed by record
    ``prior``) or :data:`REFUSED` (``reason`` says why; nothing of it committed).
    """

    job_id: str
    ranges: list[CommittedRange]
    intent_id: str | None = None
    writer_group: str = ""
    query_id: str | None = None
    batch_id: int | None = None
    txn_app_id: str | None = None
    txn_version: int | None = None
    ordered: bool = False
    verdict: str = COMMITTED
    reason: str = ""
    refusal: dict = field(default_factory=dict)  # CommitRefused's structured fields
    prior: int | None = None

    def to_dict(self) -> dict:
        return dict(shallow_dict(self), ranges=[_range_to_dict(r) for r in self.ranges])

    @classmethod
    def from_dict(cls, d: dict) -> Member:
        return cls(**dict(d, ranges=[_range_from_dict(r) for r in d.get("ranges", [])]))


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
    # Its shards commit in epoch order (sharded tables): a newer committed epoch proves
    # an older uncommitted attempt of that shard dead. See CommitLog.superseded.
    ordered: bool = False
    # The intent this record commits for its own job, if it wrote one first.
    intent_id: str | None = None
    # A group record: every job it commits or answers, its writer's first. Empty for a
    # record of one job, whose fields above are that job's.
    members: list[Member] = field(default_factory=list)

    def to_json(self) -> bytes:
        """The record's storage form."""
        body = shallow_dict(self)
        body["format"] = 2 if self.members else 1
        body["ranges"] = [_range_to_dict(r) for r in self.ranges]
        if self.members:
            body["members"] = [m.to_dict() for m in self.members]
        else:
            del body["members"]
        if self.intent_id is None:
            del body["intent_id"]
        return json.dumps(body, sort_keys=True).encode()

    def parts(self) -> list[Member]:
        """The jobs this record answers: its members, or the one job it is."""
        if self.members:
            return self.members
        return [Member(job_id=self.job_id, ranges=self.ranges, intent_id=self.intent_id,
                       writer_group=self.writer_group, query_id=self.query_id,
                       batch_id=self.batch_id, txn_app_id=self.txn_app_id,
                       txn_version=self.txn_version, ordered=self.ordered)]

    def member_view(self, m: Member) -> CommitRecord:
        """The record as one of its members sees it (its own job, its own ranges)."""
        return CommitRecord(sequence=self.sequence, kind=self.kind, job_id=m.job_id,
                            ranges=list(m.ranges), created_ms=self.created_ms,
                            writer_group=m.writer_group, query_id=m.query_id,
                            batch_id=m.batch_id,
                            # the extra (label, floors) is the leader's own
                            extra=dict(self.extra) if m is self.parts()[0] else {},
                            txn_app_id=m.txn_app_id, txn_version=m.txn_version,
                            ordered=m.ordered, intent_id=m.intent_id)

    def digest(self) -> str:
        """A short fingerprint of the record (checkpoints keep the recent ones).

        Of its storage form: a record read from the store takes it from the bytes read
        (the same bytes :meth:`to_json` wrote; re-encoding a group record cost more than
        the rest of a fold), a record being built from :meth:`to_json`.
        """
        known = self.__dict__.get("_digest")
        return known if known is not None else _digest(self.to_json())

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
            ranges = [_range_from_dict(r) for r in body["ranges"]]
            rec = cls(sequence=int(body["sequence"]), kind=body["kind"], job_id=body["job_id"],
                       ranges=ranges, created_ms=int(body.get("created_ms", 0)),
                       writer_group=body.get("writer_group", ""),
                       query_id=body.get("query_id"), batch_id=body.get("batch_id"),
                       extra=body.get("extra", {}), txn_app_id=body.get("txn_app_id"),
                       txn_version=body.get("txn_version"),
                       ordered=bool(body.get("ordered", False)),
                       intent_id=body.get("intent_id"),
                       members=[Member.from_dict(m) for m in body.get("members", [])])
        except MemWalError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntryError(f"commit record {where} is corrupt: {exc}") from None
        rec.__dict__["_digest"] = _digest(data)  # read, not built: nobody changes it
        return rec


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


STREAM_KEY_PREFIX = "stream:"  # reserved: users' txnAppId may not start with it


def stream_app_id(query_id: str) -> str:
    """The idempotency key under which a stream's micro-batches commit."""
    return f"{STREAM_KEY_PREFIX}{query_id}"


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


@dataclass
class Checkpoint:
    """Records ``1..sequence`` folded: what a reader needs without replaying them."""

    sequence: int = 0
    visible: list[CommittedRange] = field(default_factory=list)  # since the last overwrite
    txn: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # app: version, seq, job
    records: int = 0
    last_overwrite: int | None = None
    created_ms: int = 0
    floors: dict[str, int] = field(default_factory=dict)  # shard: first WAL position kept
    epochs: dict[str, int] = field(default_factory=dict)  # shard: highest committed epoch
    recent: dict[int, str] = field(default_factory=dict)  # sequence: record digest
    last_data: int = 0  # the last record that is not a gc record (compaction's work)
    released: int = 0  # records up to here had their WAL entries collected
    # Intents the records held_from..sequence answered: intent id -> (record, verdict), so
    # an owner that stalled while those records were collected still learns its verdict.
    held: dict[str, tuple[int, str]] = field(default_factory=dict)
    held_from: int = 1

    def fold(self, rec: CommitRecord) -> None:
        """Apply the next record, ``sequence + 1``."""
        self.sequence += 1
        self.records += 1
        self.recent[self.sequence] = rec.digest()
        if rec.kind != GC:
            self.last_data = self.sequence
        if len(self.recent) > RECENT:
            del self.recent[min(self.recent)]
        for part in rec.parts():
            if part.intent_id is not None:
                self.held[part.intent_id] = (self.sequence, part.verdict)
        if self.sequence - self.held_from >= 2 * RECENT:  # keep about RECENT records' worth
            self.held_from = self.sequence - RECENT + 1
            self.held = {i: v for i, v in self.held.items() if v[0] >= self.held_from}
        for part in rec.parts():
            if part.verdict == COMMITTED:
                self.apply(part)
        if rec.kind == GC:
            for shard, floor in rec.extra.get("floors", {}).items():
                self.floors[shard] = max(int(floor), self.floors.get(shard, 0))
            self.released = max(self.released, int(rec.extra.get("released_seq", 0)))
            # Released ranges are in the base table: dropping them keeps checkpoints
            # O(uncompacted ranges), not O(history).
            self.visible = [r for r in self.visible
                            if r.last >= self.floors.get(r.shard_id, 0)]
        if rec.kind == OVERWRITE:
            self.visible = []
            self.last_overwrite = self.sequence
        self.visible.extend(replace(r, sequence=self.sequence) for r in rec.ranges)

    def apply(self, part: Member, sequence: int | None = None) -> None:
        """A committed job's epochs and idempotency key (at ``sequence``, default ours)."""
        for r in part.ranges if part.ordered else ():
            self.epochs[r.shard_id] = max(r.epoch, self.epochs.get(r.shard_id, 0))
        if part.txn_app_id is not None and part.txn_version is not None:
            prior = self.txn.get(part.txn_app_id)
            if prior is None or part.txn_version >= prior[0]:
                self.txn[part.txn_app_id] = (part.txn_version,
                                             self.sequence if sequence is None else sequence,
                                             part.job_id)

    def copy(self) -> Checkpoint:
        """A copy that folding does not share."""
        return replace(self, visible=list(self.visible), txn=dict(self.txn),
                       floors=dict(self.floors), epochs=dict(self.epochs),
                       recent=dict(self.recent), held=dict(self.held))

    def state(self) -> tuple:
        """What two checkpoints of the same records agree on (``created_ms`` aside)."""
        return (self.sequence, self.visible, self.txn, self.records, self.last_overwrite,
                self.floors, self.epochs, self.recent, self.last_data, self.released,
                self.held, self.held_from)

    def to_json(self) -> bytes:
        """The checkpoint's storage form."""
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    def to_dict(self) -> dict:
        """The checkpoint's storage form, before JSON encoding."""
        return {
            "format": CHECKPOINT_FORMAT, "sequence": self.sequence,
            "created_ms": self.created_ms, "records": self.records,
            "last_overwrite": self.last_overwrite,
            "visible": [_range_to_dict(r) for r in self.visible],
            "txn": {app: list(v) for app, v in self.txn.items()},
            "floors": self.floors, "epochs": self.epochs, "last_data": self.last_data,
            "released": self.released,
            "recent": {str(k): v for k, v in self.recent.items()},
            "held": {i: list(v) for i, v in self.held.items()}, "held_from": self.held_from,
        }

    @classmethod
    def from_json(cls, data: bytes, where: str, sequence: int) -> Checkpoint:
        """Parse the checkpoint stored as ``sequence``; errors name ``where``."""
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise CorruptEntryError(f"commit checkpoint {where} is corrupt: {exc}") from None
        return cls.from_dict(body, where, sequence)

    @classmethod
    def from_dict(cls, body: dict, where: str, sequence: int) -> Checkpoint:
        """:meth:`from_json` of JSON already decoded."""
        try:
            if body.get("format", 1) > CHECKPOINT_FORMAT:
                raise MemWalError(
                    f"commit checkpoint {where} has format {body['format']}; this version of "
                    f"memwal_datasource reads up to {CHECKPOINT_FORMAT}: upgrade it")
            last = body["last_overwrite"]
            ck = cls(sequence=int(body["sequence"]),
                     visible=[_range_from_dict(r) for r in body["visible"]],
                     txn={str(app): (int(v[0]), int(v[1]), str(v[2]) if len(v) > 2 else "")
                          for app, v in body["txn"].items()},
                     records=int(body["records"]),
                     last_overwrite=None if last is None else int(last),
                     created_ms=int(body.get("created_ms", 0)),
                     floors={str(k): int(v) for k, v in body.get("floors", {}).items()},
                     epochs={str(k): int(v) for k, v in body.get("epochs", {}).items()},
                     recent={int(k): str(v) for k, v in body.get("recent", {}).items()},
                     last_data=int(body.get("last_data", body["sequence"])),
                     released=int(body.get("released", 0)),
                     held={str(i): (int(v[0]), str(v[1]))
                           for i, v in body.get("held", {}).items()},
                     # a checkpoint written before it kept intents knows none of them
                     held_from=int(body.get("held_from", int(body["sequence"]) + 1)))
        except MemWalError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise CorruptEntryError(f"commit checkpoint {where} is corrupt: {exc}") from None
        if ck.sequence != sequence:
            raise CorruptEntryError(f"commit checkpoint {where} says it folds records "
                                    f"1..{ck.sequence}, but its name says 1..{sequence}")
        return ck
