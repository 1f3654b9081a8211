"""Reading the commit log: records, checkpoints, and the fold.

Checkpoints keep reading cheap as the log grows (like Delta's): a checkpoint
at ``_memwal_commits/_checkpoints/{S}.json`` holds records ``1..S`` folded
(the visible ranges and the idempotency keys), so a reader replays only the
records after the latest one. ``_memwal_commits/_last_checkpoint.json`` is a
hint to it; a missing or stale hint costs a LIST, never correctness.

Contract for the garbage collector: delete records in ascending order, only
at or below the **released boundary**, only below a stored checkpoint, and only
after storing the boundary's marker (``_checkpoints/released-{n}.json``); keep the
newest checkpoints and markers. Then no stored object at or below the boundary is a record:
a committer stalled past a collection can put a *stray* into a freed number,
and every reader here refuses it (docs/protocol.md, "Invariants"). A fold that
read records from the store ends by listing the checkpoints: one that releases
what the fold read, or is ahead of it, replaces the fold's base. The collector
must also leave a grace period longer than any commit takes (as Delta's log
retention does). Appending is :mod:`memwal_datasource.log.commit`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..errors import CorruptEntryError, MemWalError
from ..format.commit_format import (
    APPEND,
    CHECKPOINTS_DIR,
    COMMITS_DIR,
    COMMITTED,
    INTENTS_DIR,
    LAST_CHECKPOINT_KEY,
    Checkpoint,
    CommitRecord,
    CommittedRange,
    Txn,
    checkpoint_key,
    key_sequence,
    record_key,
    released_sequence,
    stream_app_id,
)
from ..shard.wal import first_missing
from ..store import ObjectStore, put_resolved, read_all
from . import commit_folds, commit_intents

log = logging.getLogger(__name__)

MAX_RELOADS = 8  # newer checkpoints to chase while a collector runs, before giving up
SCAN_AHEAD = 8  # records past our fold a look GETs one by one before it gallops
# A read found no object (an empty object is not "missing": it is a damaged record).
MISSING = object()


def parse_record(data: bytes, where: str, sequence: int) -> CommitRecord:
    """Record ``sequence`` from its stored bytes; a damaged one raises, naming the file.

    An empty object is refused like any other damage: read as "no record" it would
    end the log there and hide every record after it.
    """
    if not data:
        raise CorruptEntryError(
            f"restore commit record {where} from a backup or the store's object versions: "
            "it is empty (0 bytes, a damaged or truncated upload), and reading past it "
            "would hide this job's rows and every record after it")
    rec = CommitRecord.from_json(data, where)
    if rec.sequence != sequence:
        raise CorruptEntryError(
            f"restore commit record {where} from a backup or the store's object versions: "
            f"it holds record {rec.sequence}, not {sequence}")
    return rec


def remember_fold(store: ObjectStore, state: Checkpoint, ckpt: Checkpoint | None,
                  etag: str | None = None) -> None:
    """Keep ``state`` (a copy the caller no longer folds) as the newest fold of
    ``store``'s log: a new reader, here or (a remote store) in another process on this
    host, starts there (:mod:`memwal_datasource.log.commit_folds`). ``etag``: record
    ``state.sequence``'s, when the store said it is the MD5 of the bytes folded."""
    commit_folds.remember(store.uri, state, ckpt, host=store.remote, etag=etag)


def forget_folds() -> None:
    """Drop every remembered fold, this process's and this host's, and the intents this
    process has read (tests; a process that wants cold reads)."""
    commit_folds.forget_all()
    commit_intents.forget()


class CommitLogReader:
    """Read and fold the commit records of one table, from the latest checkpoint.

    Reads start from the latest checkpoint, so they cost O(records since it).
    :class:`~memwal_datasource.log.commit.CommitLog` adds appending on top.
    """

    def __init__(self, store: ObjectStore, *, retries: int = 3, retry_base_delay_ms: int = 50,
                 checkpoint_interval: int | None = 100):
        self.store = store
        self.retries = retries
        self.retry_base_delay_ms = retry_base_delay_ms
        self.checkpoint_interval = checkpoint_interval
        self._cache: dict[int, CommitRecord] = {}
        self._ckpt: Checkpoint | None = None  # the newest checkpoint seen
        self._ckpt_looked = False
        self._state: Checkpoint | None = None  # our own fold: records 1..sequence
        self._base_seq = 0  # ... folded onto the checkpoint (or seed) at this sequence
        self._released = 0  # the released boundary our listings showed (never lower)
        self._holders: dict[str, int] = {}  # intent id: the record that answered it
        self._listed: int | None = None  # the newest checkpoint our last LIST showed
        # Records fetched from the store since our last checkpoint LIST began: any of
        # them may be a stray (a number freed and filled again) until a LIST shows the
        # boundary below it. A fold that uses one checks, whoever fetched it.
        self._unverified: set[int] = set()
        # Answers a seeded reader's first look read at once (see _read_ahead); each is
        # used once, by the read it stands for, and dropped when that look ends.
        self._ahead: dict[tuple[str, str], Any] = {}
        # The intents that look's one listing showed (a store that lists after a key).
        self.intents_seen: list[str] | None = None
        # (n, t): a listing begun at time.monotonic() t showed record n missing and the
        # released boundary below it (see clear_since).
        self._clear: tuple[int, float] | None = None
        seed = commit_folds.seed(store.uri, host=store.remote)
        self._seed = seed  # what we were seeded with: forgotten if it proves stale
        self._seeded = self._by_list = seed is not None  # see _check_seed
        self._seed_etag: str | None = None
        if seed is not None:
            self._state, self._ckpt, self._seed_etag = seed[0].copy(), seed[1], seed[2]
            self._base_seq = self._state.sequence

    # --- reading records -------------------------------------------------------------

    def _exists(self, sequence: int) -> bool:
        if sequence in self._cache:
            return True
        key = record_key(sequence)
        ahead = self._ahead.pop(("exists", key), None)
        return ahead if ahead is not None else self.store.exists(key)

    def _fetch(self, sequence: int) -> tuple[CommitRecord | None, bool]:
        """Record ``sequence`` or ``None`` if absent, and whether the store was asked.

        One GET, not HEAD + GET: a missing key is simply the end of the log.
        """
        rec = self._cache.get(sequence)
        if rec is not None:
            return rec, False
        key = record_key(sequence)
        data = self._ahead.pop(("get", key), None)
        try:
            data = data if data is not None else self.store.get(key)
        except FileNotFoundError:
            data = MISSING
        if data is MISSING:  # read ahead or now, and not stored
            return None, True
        rec = parse_record(data, self.store.describe(key), sequence)
        self._remember(rec)
        self._unverified.add(sequence)
        return rec, True

    def _collected(self, sequence: int) -> bool:
        """Record ``sequence``, which we relied on, is no longer stored (a collector ran)."""
        return sequence >= 1 and not self.store.exists(record_key(sequence))

    def read(self, sequence: int) -> CommitRecord:
        """Read one record (records are immutable, so they are cached)."""
        rec, _ = self._fetch(sequence)
        if rec is None:
            raise FileNotFoundError(self.store.describe(record_key(sequence)))
        return rec

    def records(self, after: int = 0) -> Iterator[CommitRecord]:
        """Every record with a sequence above ``after``, in order.

        Raises when records after ``after`` were garbage-collected below a
        checkpoint (a stream that far behind must restart), rather than stopping.
        """
        if after < self.boundary(refresh=True):
            raise self._released_before(after)
        seq, fresh = after + 1, False
        while True:
            rec, asked = self._fetch(seq)
            if rec is None:
                break
            yield rec
            seq, fresh = seq + 1, asked
        # Listed after the reads: a stray among them (a number freed and filled again
        # since the first look) is at or below the boundary this finds. Records above
        # the boundary are never collected, so the first missing one is the tip.
        if after < self.boundary(refresh=True):
            raise self._released_before(after)
        if self._released:
            return
        # A log collected before collections stored their boundary: the log ends at
        # ``seq`` only if record ``seq - 1`` is still stored (collections went in order).
        last = seq - 1
        if (last > after and fresh) or (last >= 1 and not self._collected(last)):
            return
        if last == 0 and self.latest_checkpoint() is None:
            return  # an empty log
        ck = self._relist()
        if after < self._released:
            raise self._released_before(after)
        # Collected, not merely written since our read (the log grows while we read).
        if (not self._released and ck is not None and ck.sequence >= seq
                and not self.store.exists(record_key(seq))):
            raise self._released_before(after)

    def _released_before(self, after: int) -> MemWalError:
        ck = self._ckpt
        upto = max(self.boundary(), ck.sequence if ck is not None else 0)
        return MemWalError(
            f"restart the reader from a later commit: garbage collection released commit "
            f"records of {self.store.describe(COMMITS_DIR)} (up to record {upto}), so "
            f"records after {after} can no longer be replayed")

    def boundary(self, refresh: bool = False) -> int:
        """The released boundary: no stored object numbered at or below it is a record.

        Garbage collection stores it (a marker beside the checkpoints, after a
        checkpoint above it) before it deletes a record. ``refresh`` lists the
        checkpoints first, so the answer covers every collection before this call.
        """
        if refresh:
            self._relist()
        return self._released

    # --- checkpoints -----------------------------------------------------------------

    def latest_checkpoint(self, refresh: bool = False) -> Checkpoint | None:
        """The newest checkpoint (looked up once, then cached; ``refresh`` looks again)."""
        if refresh or not self._ckpt_looked:
            # A seeded reader LISTs: one request, and no GET unless a newer one exists.
            self._ready()
            self._adopt(self._find_checkpoint(use_hint=not self._by_list))
        return self._ckpt

    def _adopt(self, ck: Checkpoint | None) -> None:
        self._ckpt_looked = True
        if ck is not None and (self._ckpt is None or ck.sequence > self._ckpt.sequence):
            self._ckpt = ck

    def _relist(self) -> Checkpoint | None:
        """Find the newest checkpoint by LIST (the hint may be stale) and adopt it."""
        self._adopt(self._find_checkpoint(use_hint=False))
        return self._ckpt

    def _chase(self, missing: int, past: int) -> None:
        """Record ``missing`` was collected: move to a checkpoint beyond ``past``."""
        ck = self._relist()
        if ck is None or ck.sequence <= past:
            raise MemWalError(f"commit record {self.store.describe(record_key(missing))} is "
                              "missing and no checkpoint covers it: the commit log is damaged")

    def _read_checkpoint(self, sequence: int) -> Checkpoint | None:
        key = checkpoint_key(sequence)
        try:
            data = self.store.get(key)
        except FileNotFoundError:
            return None
        return Checkpoint.from_json(data, self.store.describe(key), sequence)

    def _hinted(self) -> int | None:
        try:
            seq = int(json.loads(self.store.get(LAST_CHECKPOINT_KEY))["sequence"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unusable %s (%s): it is only a hint",
                        self.store.describe(LAST_CHECKPOINT_KEY), exc)
            return None
        return seq if seq >= 1 else None

    def _find_checkpoint(self, use_hint: bool) -> Checkpoint | None:
        """The newest checkpoint: the hinted one, else the highest listed.

        A damaged checkpoint raises (a silent full replay would hide it); only a
        missing one makes us look further.
        """
        hint = self._hinted() if use_hint else None
        best = self._read_checkpoint(hint) if hint is not None else None
        if best is None:
            listed = sorted(self._checkpoint_sequences(), reverse=True)
            self._listed = listed[0] if listed else 0
            for seq in listed:
                known = self._ckpt
                if known is not None and seq <= known.sequence:
                    return known  # immutable: the one we hold (or a newer) needs no GET
                best = self._read_checkpoint(seq)
                if best is not None:
                    return best
            return None
        # A hint can lag (its PUT is best effort): probe the next automatic ones.
        while self.checkpoint_interval:
            step = self.checkpoint_interval
            newer = self._read_checkpoint((best.sequence // step + 1) * step)
            if newer is None:
                break
            best = newer
        return best

    def _checkpoint_sequences(self) -> list[int]:
        out = []
        keys = self._ahead.pop(("list", CHECKPOINTS_DIR + "/"), None)
        if keys is None:  # a LIST now: it shows every boundary stored before it began
            fetched = set(self._unverified)
            keys = list(self.store.list(CHECKPOINTS_DIR + "/"))
            self._unverified -= fetched
        for key in keys:
            sequence = key_sequence(key)
            if sequence is not None:
                out.append(sequence)
            else:
                released = released_sequence(key)
                if released is not None and released > self._released:
                    self._released = released
        return out

    def checkpoint(self) -> Checkpoint | None:
        """Checkpoint every record so far (``None`` for an empty log)."""
        state = self._fold()
        return self._write_checkpoint(state) if state.sequence else None

    def _write_checkpoint(self, state: Checkpoint) -> Checkpoint:
        ck = replace(state.copy(), created_ms=int(time.time() * 1000))
        key = checkpoint_key(ck.sequence)
        if not put_resolved(self.store, key, ck.to_json(), retries=self.retries,
                            base_delay_ms=self.retry_base_delay_ms,
                            what=f"commit checkpoint {ck.sequence}"):
            # A concurrent checkpointer folded the same immutable records: fine if
            # its state agrees (its created_ms differs, so bytes cannot be compared).
            theirs = self._read_checkpoint(ck.sequence)
            if theirs is None or theirs.state() != ck.state():
                raise CorruptEntryError(f"commit checkpoint {self.store.describe(key)} does "
                                        f"not match records 1..{ck.sequence} it claims to fold")
            ck = theirs
        self._adopt(ck)
        try:  # only a hint: readers LIST without it
            hint = self._hinted()
            if hint is None or hint < ck.sequence or not self.store.exists(checkpoint_key(hint)):
                self.store.put(LAST_CHECKPOINT_KEY, json.dumps({"sequence": ck.sequence}).encode())
        except Exception as exc:  # noqa: BLE001 - a lost hint costs readers one LIST
            log.warning("could not update %s to checkpoint %d: %s",
                        self.store.describe(LAST_CHECKPOINT_KEY), ck.sequence, exc)
        return ck

    # --- folding ---------------------------------------------------------------------

    def _check_seed(self) -> None:
        """Trust a remembered fold only if its last record is still the one it folded.

        One GET (a cold reader pays one for the hint), or none when the look's listing
        showed the record with the ETag the fold knew (:meth:`_listed_seed`). A table
        deleted and made again at the same place, or a log collected past the seed,
        starts cold.
        """
        self._seeded = False
        state = self._state
        if state is None or not state.sequence:
            return
        rec, _ = self._fetch(state.sequence)
        if rec is None or rec.digest() != state.recent.get(state.sequence):
            # Stale for every reader on this host: forget it, or each would start
            # cold until the new log passed its sequence (and none would remember).
            commit_folds.forget(self.store.uri, self._seed, host=self.store.remote)
            self._state, self._ckpt, self._listed = None, None, None
            self._by_list = False
            self._ahead.clear()
            self._cache.clear()
            self._holders.clear()

    def _ready(self) -> None:
        if self._seeded:
            self._check_seed()

    def _base(self) -> Checkpoint:
        """Our fold, moved up to the latest checkpoint when that is further along."""
        self._ready()
        ck = self.latest_checkpoint()
        if self._state is None or (ck is not None and (
                ck.sequence > self._state.sequence or self._released > self._base_seq)):
            self._rebase(ck)
        return self._state

    def _rebase(self, ck: Checkpoint | None) -> None:
        """Fold from ``ck`` on; forget what we read at or below its boundary (a stray
        read there is not a record)."""
        self._state = ck.copy() if ck is not None else Checkpoint()
        self._base_seq = self._state.sequence
        released = self._released
        self._cache = {n: r for n, r in self._cache.items() if n > released}
        self._holders = {i: n for i, n in self._holders.items() if n > released}

    def _stray_free(self, read: bool) -> bool:
        """After a fold that ``read`` records from the store: ``True`` when the newest
        checkpoint, listed now, releases none of them and is not ahead of the fold;
        else the fold is moved onto it (``False``: fold again)."""
        state = self._state
        if not read and self._listed is not None and self._listed <= state.sequence:
            return True  # read nothing since a listing that showed no newer checkpoint
        ck = self._relist()
        if ck is None or (self._released <= self._base_seq and ck.sequence <= state.sequence):
            return True
        self._rebase(ck)
        return False

    def _fold(self, upto: int | None = None) -> Checkpoint:
        """Fold the records up to (at least) ``upto``, or to the end of the log.

        Costs O(records since the latest checkpoint or our previous fold). A
        record we need that is gone was collected: move to the newer checkpoint.
        """
        for _ in range(MAX_RELOADS):
            state, read = self._base(), False
            while upto is None or state.sequence < upto:
                rec, asked = self._fetch(state.sequence + 1)
                if rec is None:
                    break
                # Fetched now, or earlier by another look (a follower's holder search)
                # since our last listing: either way not yet checked against a boundary.
                read = read or asked or rec.sequence in self._unverified
                state.fold(rec)
            else:
                # A committer decides on this fold (keys, floors, epochs): a record it read
                # may be a stray if a collection passed since its listing. Nothing read
                # from the store: nothing to check.
                if not read or self._stray_free(True):
                    return state
                continue
            if upto is not None:
                self._chase(state.sequence + 1, past=state.sequence)
            elif self._stray_free(read):
                return state  # record n + 1 missing, and no collection passed n: n is last
        raise self._moving()

    def _state_at(self, upto: int) -> Checkpoint:
        """Records ``1..upto`` folded exactly (for the checkpoint at ``upto``)."""
        state = self._fold(upto)
        if not self._stray_free(True):  # a checkpoint is forever: never fold a stray into one
            state = self._fold(upto)
        if state.sequence != upto:  # our fold went past upto: refold from below it
            ck = self._ckpt
            state = ck.copy() if ck is not None and ck.sequence <= upto else Checkpoint()
            while state.sequence < upto:
                state.fold(self.read(state.sequence + 1))
        return state

    def _moving(self) -> MemWalError:
        return MemWalError(f"{self.store.describe(COMMITS_DIR)}: checkpoints kept moving while "
                           "reading the commit log; try again")

    # --- writing ---------------------------------------------------------------------

    def next_sequence(self) -> int:
        """The first unused sequence number; never one at or below a checkpoint."""
        try:
            self._read_ahead()
            return self._next_sequence()
        finally:
            self._ahead.clear()  # an answer not used now is too old for any later look

    def reads_ahead(self) -> bool:
        """Whether the next :meth:`next_sequence` makes the first look of :meth:`_read_ahead`."""
        state = self._state
        return bool(self._seeded and (self.store.remote or self.store.lists_after)
                    and not self._ckpt_looked and state is not None and state.sequence)

    def _read_ahead(self) -> None:
        """A seeded reader's first look on an object store: its reads at once.

        The seed check (GET of the seed's last record ``s``), the checkpoint LIST and
        the probe of ``s + 1`` are independent, and each is used by the code that would
        have made it, so nothing else changes: any order of three reads is one a
        sequential reader could meet, and what they decide is checked again after the
        PUT as always (docs/protocol.md, "Committing at scale"). One round trip
        instead of three.

        A store that lists after a key (S3) answers the LIST and the probe, and the
        intents' LIST a committer makes beside them, with one listing of the log
        after ``s``: records sort first, then ``_checkpoints/`` and ``_intents/``
        (``_`` sorts after every digit). One snapshot stands for three reads that
        could each have seen the store at any moment of the call.
        """
        if not self.reads_ahead():
            return
        state = self._state
        rec_key, next_key = record_key(state.sequence), record_key(state.sequence + 1)

        def get() -> bytes | object:
            try:
                return self.store.get(rec_key)
            except FileNotFoundError:
                return MISSING

        if self.store.lists_after:
            began = time.monotonic()
            if self._seed_etag is not None:
                got, after = self._listed_seed(rec_key)
            else:
                got, after = read_all(self.store, get,
                                      lambda: self.store.list_after(COMMITS_DIR + "/", rec_key))
            listed = [k for k in after if k.startswith(CHECKPOINTS_DIR + "/")]
            following = next_key in after
            self.intents_seen = [k for k in after if k.startswith(INTENTS_DIR + "/")]
            released = max((released_sequence(k) or 0 for k in listed), default=0)
            if not following and released <= state.sequence:
                self._clear = (state.sequence + 1, began)
        else:
            got, listed, following = read_all(
                self.store, get, lambda: list(self.store.list(CHECKPOINTS_DIR + "/")),
                lambda: self.store.exists(next_key))
        self._ahead = {("get", rec_key): got, ("list", CHECKPOINTS_DIR + "/"): listed,
                       ("exists", next_key): following}

    def _listed_seed(self, rec_key: str) -> tuple[object | None, list[str]]:
        """The seed check and the look in one listing, starting at the seed's record
        ``s`` (a fold that knows ``s``'s ETag): ``s`` listed with that ETag holds the very
        bytes folded (the ETag is their MD5), so the seed stands without a GET. Returns
        (``MISSING`` if ``s`` is gone, else ``None``: a GET decides, as without an ETag;
        the keys after ``s``)."""
        tags = self.store.list_after_etags(COMMITS_DIR + "/",
                                           record_key(self._state.sequence - 1))
        got = MISSING if rec_key not in tags else None
        if tags.get(rec_key) == self._seed_etag:
            self._seeded = False  # checked
        return got, [k for k in tags if k > rec_key]

    def clear_since(self, sequence: int) -> float | None:
        """When (``time.monotonic()``) a listing began that showed record ``sequence``
        missing and no boundary at or above it, if one did (``None``: not known).

        A collector releases a number only :data:`~memwal_datasource.maintenance.gc.
        MIN_RETAIN_SECONDS` after a compaction round folded a record there, and such a
        record was stored after that listing began: so a PUT at ``sequence`` that
        returns within a third of that (``COMMIT_DEADLINE_S``) filled no freed number
        (docs/protocol.md, "Invariants"). The record's absence was read no later than
        the boundary, in one listing: a fold that went stale meanwhile cannot hide a
        collection.
        """
        clear = self._clear
        return clear[1] if clear is not None and clear[0] == sequence else None

    def _next_sequence(self) -> int:
        self._ready()
        for _ in range(MAX_RELOADS):
            ck = self.latest_checkpoint()
            floor = max([*self._cache, self._state.sequence if self._state else 0,
                         ck.sequence if ck else 0])
            # A collector deletes only below a checkpoint: at or above the newest one our
            # LIST showed, floor is stored (a later collection is caught after the PUT,
            # see CommitLog._verify_landed).
            listed = self._listed is not None and floor >= self._listed
            if listed or not self._collected(floor):  # nothing above floor is gone
                return self._tip(floor + 1)
            self._chase(floor, past=floor)
        raise self._moving()

    def _tip(self, start: int) -> int:
        """The first missing record number at or after ``start`` (records below it stored).

        The next few by GET: a committer folds (or a follower searches) exactly these
        records next, so each probe is a read it would make anyway. Further on, a
        gallop of HEADs (a reader far behind folds from a newer checkpoint instead).
        """
        seq = start
        if self._ahead.get(("exists", record_key(seq))) is False:
            return seq  # this look's one listing showed it missing
        while seq < start + SCAN_AHEAD:
            if self._fetch(seq)[0] is None:
                return seq
            seq += 1
        return first_missing(self._exists, seq)

    def committed_txn(self, txn: Txn, upto: int | None = None) -> CommitRecord | None:
        """The record that already committed ``txn`` (same app, version >= it), if any."""
        state = self._fold(self.next_sequence() - 1 if upto is None else upto)
        prior = state.txn.get(txn.app_id)
        if prior is None or prior[0] < txn.version:
            return None
        version, seq, job_id = prior
        try:
            rec = self.read(seq)
            for part in rec.members:  # a group record: the member that committed the key
                if part.txn_app_id == txn.app_id and part.verdict == COMMITTED:
                    return rec.member_view(part)
            return rec
        except FileNotFoundError:  # collected below a checkpoint, which kept what matters
            return CommitRecord(sequence=seq, kind=APPEND, job_id=job_id, ranges=[],
                                txn_app_id=txn.app_id, txn_version=version,
                                extra={"garbage_collected": True})

    def _remember(self, rec: CommitRecord) -> None:
        self._cache[rec.sequence] = rec
        for part in rec.parts():
            if part.intent_id is not None:
                self._holders[part.intent_id] = rec.sequence

    def find_stream_batch(self, query_id: str, batch_id: int) -> CommitRecord | None:
        """The record that committed micro-batch ``batch_id`` of ``query_id`` (or a later one)."""
        return self.committed_txn(Txn(stream_app_id(query_id), batch_id))

    def superseded(self, shard_id: str, epoch: int) -> bool:
        """Whether attempt ``epoch`` of ``shard_id`` can never commit, if not committed yet.

        The one rule for "this uncommitted attempt is dead", used by maintenance
        and by what Lance's readers are shown: on shards whose writers commit in
        epoch order (sharded, primary-key tables), a committed newer epoch
        refuses every older one. Shards of unordered pools never answer yes.
        """
        return self._fold().epochs.get(shard_id, 0) > epoch

    def visible(self) -> list[CommittedRange]:
        """Ranges visible to a committed reader: all since the last overwrite.

        Each carries the ``sequence`` of the record that committed it.
        """
        return list(self._fold().visible)

    def first_stored(self) -> int:
        """The oldest record: one past the released boundary (a collection deletes only
        at or below it, oldest first)."""
        released = self.boundary(refresh=True)
        if released:
            return released + 1  # collected only up to it; a stray below is no record
        if self.store.exists(record_key(1)):
            return 1
        ck = self._ckpt
        if ck is None:
            return 1  # an empty log
        # A log collected before collections named their boundary: bisect.
        lo, hi = 1, ck.sequence  # record lo is gone, record hi is kept
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.store.exists(record_key(mid)):
                hi = mid
            else:
                lo = mid
        return hi

    def state(self) -> Checkpoint:
        """Every record folded (from the latest checkpoint on): a copy to read."""
        return self._fold().copy()
