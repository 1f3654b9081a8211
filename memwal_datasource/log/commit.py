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

Concurrent jobs do not race for numbers: a committer meeting contention
writes an intent and the oldest pending one's owner puts one group record for
all of them (docs/protocol.md, "Committing at scale"). After its PUT a
committer checks that no collector had freed its number, so its verdict is
exact or :class:`OutcomeUnknown`.

Reading, checkpoints and the collector's contract are in
:mod:`memwal_datasource.log.commit_reader`.

    Spark driver commit()          other drivers, same moment
          |                                 |
     LIST _intents/ --- none ---> PUT {n}.json (put-if-absent) --> committed
          | some / lost race
     PUT _intents/{id}.json  (unique key)
          |
     oldest intent leads: PUT {n}.json holding every pending intent
     the others wait for {n}.json and read their verdict in it
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace

from .. import hooks
from ..errors import (  # noqa: F401 - re-exported
    CommitRefused,
    CorruptEntryError,
    MemWalError,
    OutcomeUnknown,
    StoreError,
)
from ..format.commit_format import (  # noqa: F401 - the log's public names, re-exported
    APPEND,
    CHECKPOINT_FORMAT,
    CHECKPOINTS_DIR,
    COMMITS_DIR,
    COMMITTED,
    DUPLICATE,
    GC,
    KINDS,
    LAST_CHECKPOINT_KEY,
    OVERWRITE,
    RECENT,
    RECORD_FORMAT,
    REFUSED,
    STREAM_KEY_PREFIX,
    Checkpoint,
    CommitRecord,
    CommitResult,
    CommittedRange,
    Member,
    Txn,
    checkpoint_key,
    record_key,
    stream_app_id,
)
from ..store import ObjectStore, put_resolved, read_both
from . import commit_intents
from .commit_intents import Intent, Intents
from .commit_reader import MAX_RELOADS, CommitLogReader, remember_fold  # noqa: F401

log = logging.getLogger(__name__)

# A commit re-checks its sequence number, floors and epochs when more than this passed
# since it last checked (a stalled committer), and a PUT returning within this of a
# listing that showed its number free needs no verdict listing. Garbage collection never
# deletes a record compacted less than three times this ago (gc.MIN_RETAIN_SECONDS).
COMMIT_DEADLINE_S = 10.0
# Group commit (docs/protocol.md): others' intents older than this are never taken; a
# follower takes over from a leader silent this long; followers poll the tip this often.
INTENT_MAX_AGE_S = COMMIT_DEADLINE_S
LEADER_WAIT_S = 2.0
POLL_S, POLL_MAX_S = 0.002, 0.025
# Once a commit's intent or record may be stored, store errors do not end it: it reads
# on until it knows its verdict, and answers OutcomeUnknown only when the store kept
# failing this long.
UNREACHABLE_S = 3 * COMMIT_DEADLINE_S
# Record PUTs of this process that lost their number to another commit (benchmarks read it).
LOST_RACES = 0


@dataclass(frozen=True)
class Look:
    """A commit's first look (:meth:`CommitLog.look`)."""

    sequence: int  # the first number missing after the log's fold
    contended: bool  # intents were pending
    at: float  # time.monotonic() when the look began
    # The process's remembered fold was the tip: nobody else committed since its last
    # commit, so a look made ahead is likely still the tip when the job commits.
    quiet: bool = False
    # When a listing began that showed ``sequence`` missing and unreleased
    # (CommitLogReader.clear_since): a PUT there returning within the deadline needs no
    # verdict listing.
    clear_at: float | None = None


class CommitLog(CommitLogReader):
    """Append and read commit records of one table.

    Appending is serialisable: a record is written put-if-absent at the first
    free sequence number, after every record below it has been folded, so an
    idempotency key is checked against the complete history that precedes it.
    A collision is read back (a lost acknowledgement is ours, not a rival's)
    and the rival's record is checked before moving on.

    Reads start from the latest checkpoint, so they cost O(records since it).
    Every ``checkpoint_interval``-th record's appender writes one (``None``: never).
    """

    def __init__(self, store: ObjectStore, *, retries: int = 3, retry_base_delay_ms: int = 50,
                 checkpoint_interval: int | None = 100):
        super().__init__(store, retries=retries, retry_base_delay_ms=retry_base_delay_ms,
                         checkpoint_interval=checkpoint_interval)
        self._intents = Intents(store)

    def append(self, kind: str, ranges: Iterable[CommittedRange], *, job_id: str | None = None,
               writer_group: str = "", query_id: str | None = None,
               batch_id: int | None = None, extra: dict | None = None,
               txn: Txn | None = None, ordered_epochs: bool = True,
               at_sequence: int | None = None, group: bool = True,
               look: Look | None = None) -> CommitResult:
        """Commit one job: its record at the next number, or its part of a group record.

        With ``txn``, a key already committed returns that record with
        ``created=False`` instead of committing the rows a second time.
        ``ordered_epochs`` refuses a range whose shard already has a newer
        epoch committed (per shard, epochs commit in order: the rule that makes
        an uncommitted older attempt provably dead and keeps every reader's
        newest-value-per-key the same). ``at_sequence`` writes exactly that
        record number or raises :class:`SequenceTaken` (a caller that planned
        against records below it re-plans). Appends meeting contention join a
        group record (``group=False`` never does; overwrites and gc records never
        do): see docs/protocol.md, "Committing at scale". ``look`` is this log's
        :meth:`look`, made while the job's tasks ran.
        """
        if kind not in KINDS:
            raise ValueError(f"commit kind must be one of {KINDS}, got '{kind}'")
        if look is not None and (kind != APPEND or at_sequence is not None or not group):
            raise ValueError("pass look= only to a grouped append (kind append, group=True, no "
                             "at_sequence): a look made ahead serves no other commit")
        ranges = sorted(ranges, key=lambda r: (r.shard_id, r.first))
        rec = CommitRecord(sequence=0, kind=kind, job_id=job_id or uuid.uuid4().hex,
                           ranges=ranges,
                           created_ms=int(time.time() * 1000),
                           writer_group=writer_group, query_id=query_id, batch_id=batch_id,
                           extra=dict(extra or {}),
                           txn_app_id=txn.app_id if txn else None,
                           txn_version=txn.version if txn else None,
                           ordered=ordered_epochs and bool(ranges))
        if kind != APPEND or at_sequence is not None or not group:
            return self._append_alone(rec, txn, at_sequence)
        if look is not None and look.quiet and not look.contended:
            # Made while the tasks ran: a PUT at its number is exact whenever it lands (the
            # fold below it is the look's, the deadline counts from the look). Lost: the
            # look was stale, not necessarily contended; look again.
            result = self._append_alone(rec, txn, look.sequence, once=True, since=look.at,
                                        clear_at=look.clear_at)
            if result is not None:
                return result
        look = self.look()  # others committed lately: a look made ahead is likely stale
        if not look.contended:  # no contention seen: no intent, one PUT
            result = self._append_alone(rec, txn, look.sequence, once=True, since=look.at,
                                        clear_at=look.clear_at)
            if result is not None:
                return result
            after = rec.sequence  # the number we lost: stored, so it cannot hold our intent
        else:
            after = look.sequence - 1
        return self._append_grouped(rec, txn, after)

    def look(self) -> Look:
        """A commit's first look: the next number, and whether intents are pending.

        A driver makes it while the job's tasks run (one round trip off the commit's
        path) and passes it to :meth:`append`; any look is as good as a fresh one for
        exactness (the PUT at its number collides, or lands on the fold below it, and
        its verdict is checked as always), only staler.
        """
        at = time.monotonic()
        # The remembered fold this log was seeded with, if it has not looked yet.
        seed = self._state.sequence if self._state is not None and not self._ckpt_looked \
            else None
        # Whether intents are stored only picks the path (a PUT alone is exact either way),
        # so on an object store that listing goes at once with finding the next number,
        # or is part of that look's one listing (a store that lists after a key).
        if self.store.lists_after and self.reads_ahead():
            self.intents_seen = None
            seq = self.next_sequence()
            seen, self.intents_seen = self.intents_seen, None
            contended = self._intents.any_pending(seen)
        else:
            seq, contended = read_both(self.store, self.next_sequence,
                                       self._intents.any_pending)
        return Look(seq, contended, at, quiet=seed is not None and seq == seed + 1,
                    clear_at=self.clear_since(seq))

    def _append_alone(self, rec: CommitRecord, txn: Txn | None, at_sequence: int | None,
                      once: bool = False, since: float | None = None,
                      clear_at: float | None = None) -> CommitResult | None:
        """Put ``rec`` alone at the first free number (exactly ``at_sequence`` if set;
        with ``once``, start there and return ``None`` after losing one race; ``since``:
        when the look that found ``at_sequence`` began; ``clear_at``: its
        :meth:`clear_since`)."""
        global LOST_RACES
        fixed = at_sequence is not None and not once
        seq = self.next_sequence() if at_sequence is None else at_sequence
        while True:
            checked, since = (time.monotonic() if since is None else since), None
            clear, clear_at = clear_at, None  # about the first number tried only
            floor = self._ckpt.sequence if self._ckpt else 0
            if seq <= floor:  # collected numbers below a checkpoint are never reused
                if fixed:
                    raise SequenceTaken(seq)
                raise MemWalError(f"refusing to write commit record {seq}: checkpoint {floor} "
                                  "already folds the records up to it")
            if txn is not None:
                done = self.committed_txn(txn, upto=seq - 1)
                if done is not None:
                    return CommitResult(done, False)
            state = self._fold(seq - 1)
            if state.sequence >= seq:  # the log moved past ``seq`` while we looked
                if fixed:
                    raise SequenceTaken(seq)
                seq = self.next_sequence()
                continue
            if rec.ranges:
                check_ranges(state, rec.ranges, rec.ordered)
            rec.sequence = seq
            hooks.point("commit.before", sequence=seq)
            if time.monotonic() - checked > COMMIT_DEADLINE_S:
                # Stalled since the checks: a collector may have moved on. Look again,
                # from the newest checkpoint, at a number that is free now.
                self._relist()
                if not fixed:
                    seq = self.next_sequence()
                continue
            failed: list[int] = []
            etag: list[str | None] = []
            body = rec.to_json()
            if put_resolved(self.store, record_key(seq), body, retries=self.retries,
                            base_delay_ms=self.retry_base_delay_ms,
                            what=f"commit record {seq}", failed=failed, etag=etag):
                if self._landed_clear(clear) or self._verify_landed(rec):
                    return self._landed(rec, etag_of(body, etag[0]))
                if fixed:
                    raise SequenceTaken(seq)
                seq = self.next_sequence()
                continue  # our PUT filled a number gc had freed: commit again
            if failed[0] and not self._lost(rec):
                return self._landed(rec)  # our earlier attempt's record, released since
            LOST_RACES += 1
            if fixed:
                raise SequenceTaken(seq)
            if once:
                return None
            seq += 1  # another job took this number; it is checked on the next pass

    def _landed(self, rec: CommitRecord, etag: str | None = None) -> CommitResult:
        """``rec`` committed (``etag``: its stored ETag, the MD5 of its bytes)."""
        self._remember(rec)
        hooks.point("commit.after", sequence=rec.sequence)
        self._auto_checkpoint(rec.sequence)
        state = self._state  # the next commit of this process starts from here
        if state is not None and rec.sequence - 1 <= state.sequence <= rec.sequence:
            seed = state.copy()
            if seed.sequence < rec.sequence:
                seed.fold(rec)
            remember_fold(self.store, seed, self._ckpt,
                          etag if seed.sequence == rec.sequence else None)
        return CommitResult(rec, True)

    def _append_grouped(self, rec: CommitRecord, txn: Txn | None, after: int) -> CommitResult:
        """Write an intent, then lead a group record or wait for one holding it."""
        intent = Intent.new(rec, after)
        rec.intent_id = intent.intent_id
        waited: dict[str, float] = {}  # leader's intent id: when we began waiting for it
        failing: float | None = None  # since when the store has failed us
        stored = False
        try:
            while True:
                try:
                    if not stored:  # a failed PUT may have stored it: read on either way
                        stored = True
                        self._intents.write(intent)
                        hooks.point("commit.intent", intent_id=intent.intent_id,
                                    job_id=rec.job_id)
                    result = self._group_step(rec, intent, txn, waited)
                except OutcomeUnknown:
                    raise  # a verdict (a StoreError by type), not a failing store
                except (StoreError, OSError) as exc:  # OSError: local disk (EIO, ESTALE)
                    failing = self._store_failed(exc, failing, rec.job_id)
                    continue
                failing = None
                if result is not None:
                    return result
        finally:
            try:
                self._intents.delete(intent)
            except Exception as exc:  # noqa: BLE001 - gc sweeps stale intents
                log.warning("could not delete commit intent %s: %s", intent.intent_id, exc)

    def _group_step(self, rec: CommitRecord, intent: Intent, txn: Txn | None,
                    waited: dict[str, float]) -> CommitResult | None:
        """One look of a grouped commit: our verdict if a record holds our intent, else
        lead or wait once; ``None`` to look again."""
        seq = self.next_sequence()
        checked = time.monotonic()
        held = self._holder(intent, seq - 1)
        if held is None:
            raise self._unknown(intent)
        if held:
            result = self._answer(*held, txn)
            if self._cache.get(held[0].sequence) is held[0]:  # a stored record, not a memory
                self._remember_through(held[0].sequence)
            return result
        others = []  # the pending intents no record holds yet, oldest first
        # An intent that a record this log read holds is passed over unread: its owner
        # learns its verdict itself, and leaving an intent out of a group is always
        # safe (taking one in is what _holder decides, exactly).
        for other in self._intents.pending(int(time.time() * 1000), INTENT_MAX_AGE_S,
                                           skip=self._holders.__contains__):
            if other.intent_id == intent.intent_id or self._holder(other, seq - 1) != ():
                continue
            if not others and other.order() < intent.order():  # the leader: not us
                since = waited.setdefault(other.intent_id, time.monotonic())
                if time.monotonic() - since < LEADER_WAIT_S:
                    # Younger intents are not read: the leader takes them, not us.
                    self._await_record(seq, since + LEADER_WAIT_S)
                    return None
            others.append(other)  # we lead (or take over from a silent leader)
        return self._put_group(rec, intent, others, txn, seq, checked)

    def _remember_through(self, seq: int) -> None:
        """A follower's verdict is in record ``seq``: fold through it (from records this
        look has read, checked by one listing) so this process's next commit starts
        there, not where its last lead left it. Best effort: the verdict is known."""
        try:
            state = self._fold(seq)
        except Exception as exc:  # noqa: BLE001 - the next commit folds from further back
            log.debug("not remembering the fold through commit record %d: %s", seq, exc)
            return
        remember_fold(self.store, state.copy(), self._ckpt)

    def _store_failed(self, exc: Exception, since: float | None, job_id: str,
                      stored: str = "may have stored its intent or record") -> float:
        """A store error after our intent or record may be stored: back off and read on,
        or :class:`OutcomeUnknown` once the store has failed for :data:`UNREACHABLE_S`."""
        now = time.monotonic()
        since = now if since is None else since
        if now - since >= UNREACHABLE_S:
            raise OutcomeUnknown(
                f"look the job up by its txnAppId or in the table's history (job {job_id}): "
                f"the object store kept failing for {now - since:.0f} s after this commit "
                f"{stored}, so whether it committed is unknown (last error: {exc})") from exc
        log.warning("commit of job %s: the object store failed (%s); reading on until its "
                    "verdict is known", job_id, exc)
        time.sleep(min(POLL_MAX_S * 8, 0.05 + (now - since) / 10))
        return since

    def _put_group(self, rec: CommitRecord, intent: Intent, others: list[Intent],
                   txn: Txn | None, seq: int, checked: float) -> CommitResult | None:
        """Lead: put a record at ``seq`` holding ours and ``others``; ``None`` to go again."""
        global LOST_RACES
        state = self._fold(seq - 1)
        if state.sequence >= seq:
            return None  # the log moved past ``seq`` (maybe holding our intent): look again
        if txn is not None:
            done = self.committed_txn(txn, upto=seq - 1)
            if done is not None:
                # The record that committed the key may be one holding our own intent
                # (a leader took it while we stalled): then that is our verdict.
                held = self._holder(intent, done.sequence) if done.sequence > intent.after \
                    else ()
                if held is None:
                    raise self._unknown(intent)
                return self._answer(*held, txn) if held else CommitResult(done, False)
            state = self._fold(seq - 1)
            if state.sequence >= seq:
                return None
        state = state.copy()
        if rec.ranges:
            check_ranges(state, rec.ranges, rec.ordered)
        rec.sequence = seq
        out = rec
        if others:
            own = rec.parts()[0]
            state.apply(own, seq)
            members = [own] + [judge(state, replace(o.record.parts()[0], intent_id=o.intent_id),
                                     seq) for o in others]
            out = replace(rec, created_ms=int(time.time() * 1000), members=members, ranges=sorted(
                (r for m in members if m.verdict == COMMITTED for r in m.ranges),
                key=lambda r: (r.shard_id, r.first)))
        hooks.point("commit.before", sequence=seq)
        if time.monotonic() - checked > COMMIT_DEADLINE_S:
            self._relist()
            return None  # stalled since the checks: check again
        failed: list[int] = []
        etag: list[str | None] = [None]
        body = out.to_json()
        if put_resolved(self.store, record_key(seq), body, retries=self.retries,
                        base_delay_ms=self.retry_base_delay_ms, what=f"commit record {seq}",
                        failed=failed, etag=etag):
            if not self._verify_landed(out):
                return None
        elif not failed[0] or self._lost(out):
            LOST_RACES += 1
            return None
        # Ours: landed now, or our earlier attempt's record (its acknowledgement lost),
        # released since.
        self._landed(out, etag_of(body, etag[0]))
        return CommitResult(out.member_view(out.members[0]) if out.members else out, True)

    def _await_record(self, seq: int, until: float) -> None:
        """Wait (reading, not writing) for record ``seq`` to appear, or until ``until``.

        A GET, not a HEAD: the record found is the one the next look reads. Paced by
        how long recent leaders took, so many followers do not flood the store.
        """
        start = time.monotonic()
        for delay in commit_intents.poll_delays(self.store.uri, POLL_S, POLL_MAX_S):
            if time.monotonic() >= until:
                return
            if self._fetch(seq)[0] is not None:
                commit_intents.waited(self.store.uri, time.monotonic() - start)
                return
            time.sleep(delay)

    def _holder(self, intent: Intent, upto: int) -> tuple | None:
        """The record among ``intent.after + 1 .. upto`` holding ``intent``, as ``(record,
        member)``; ``()`` when none does; ``None`` when that cannot be known (records of
        the window were collected, and no stored checkpoint remembers their intents)."""
        for seq in range(intent.after + 1, upto + 1):
            if seq not in self._cache and self._fetch(seq)[0] is None:
                return self._holder_remembered(intent, upto)
        at = self._holders.get(intent.intent_id)
        if at is None or not intent.after < at <= upto:
            # A record of the window read since the last listing may be a stray that a
            # stalled PUT left in a number gc released, where the record holding the
            # intent was: when the window reaches the released boundary (listed now),
            # the checkpoints say which intents its records held.
            window = range(intent.after + 1, upto + 1)
            if any(s in self._unverified for s in window) and \
                    intent.after < self.boundary(refresh=True):
                return self._holder_remembered(intent, upto)
            return ()
        if at <= self.boundary(refresh=True):
            # A stray (never a record), or a record gc has since released.
            return self._holder_remembered(intent, upto)
        rec = self._cache[at]
        return rec, next(p for p in rec.parts() if p.intent_id == intent.intent_id)

    def _holder_remembered(self, intent: Intent, upto: int) -> tuple | None:
        """:meth:`_holder` when records of the window were collected: the newest
        checkpoint remembers which intents its recent records answered, and records
        above it are never collected."""
        ck = self._relist()
        if ck is None or intent.after + 1 < ck.held_from:
            return None
        held = ck.held.get(intent.intent_id)
        if held is not None and intent.after < held[0] <= upto:
            part = replace(intent.record.parts()[0], intent_id=intent.intent_id,
                           verdict=held[1])
            rec = CommitRecord(sequence=held[0], kind=APPEND, job_id=part.job_id,
                               ranges=list(part.ranges) if held[1] == COMMITTED else [],
                               extra={"garbage_collected": True}, members=[part],
                               intent_id=intent.intent_id)
            return rec, part
        for seq in range(max(ck.sequence, intent.after) + 1, upto + 1):
            rec, _ = self._fetch(seq)
            if rec is None:
                return None
            part = next((p for p in rec.parts() if p.intent_id == intent.intent_id), None)
            if part is not None:
                return rec, part
        return ()

    def _answer(self, rec: CommitRecord, part: Member, txn: Txn | None) -> CommitResult:
        """Our verdict, as the record holding our intent gives it."""
        if part.verdict == COMMITTED:
            return CommitResult(rec.member_view(part), True)
        if part.verdict == DUPLICATE and txn is not None:
            done = self.committed_txn(txn, upto=rec.sequence)
            if done is not None:
                return CommitResult(done, False)
        raise CommitRefused(part.reason or f"run the job again: commit record {rec.sequence} "
                            "refused it. Nothing was committed", **part.refusal)

    def _unknown(self, intent: Intent) -> OutcomeUnknown:
        return OutcomeUnknown(
            f"look the job up by its txnAppId or in the table's history (job "
            f"{intent.record.job_id}): this commit stalled so long that garbage collection "
            f"removed commit records after {intent.after} before it could check whether one of "
            "them committed it")

    @staticmethod
    def _landed_clear(clear: float | None) -> bool:
        """Whether a PUT that just landed did so within :data:`COMMIT_DEADLINE_S` of a
        listing begun at ``clear`` that showed its number free and unreleased: then no
        collector can have freed the number (:meth:`clear_since`), and the verdict
        needs no listing of its own."""
        return clear is not None and time.monotonic() - clear < COMMIT_DEADLINE_S

    def _verify_landed(self, rec: CommitRecord) -> bool:
        """Whether our record, just stored at its number, is a record of the log (see
        docs/protocol.md, "Invariants").

        Its number above the released boundary listed after the PUT: yes, always. At or
        below it, either our PUT filled a number a collector had freed (a stray: no
        reader takes it, so it is deleted and the caller commits again), or we stalled
        after a fresh PUT while our record was folded, compacted and released: the
        checkpoints' digests of their recent records tell the two apart, and
        :class:`OutcomeUnknown` when none still knows the number. Store errors while
        finding out are retried as :meth:`_store_failed` says.
        """
        seq = rec.sequence
        ours = self._released_verdict(rec, f"stored its commit record {seq}",
                                      f"its commit record {seq} stalled so long")
        if ours is None:
            return True  # no collector freed ``seq``: every fold will read ours
        released = self._released
        if ours:
            return True  # folded, compacted and released while we stalled: committed
        try:  # a stray: no reader takes it (readers refuse every number <= released)
            self.store.delete(record_key(seq))
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001 - a stray is never read; gc deletes it
            log.warning("could not delete stray commit record %d: %s", seq, exc)
        hooks.point("commit.stray", sequence=seq)
        log.warning("commit record %d filled a number garbage collection had released (up "
                    "to %d); committing again at a new number", seq, released)
        return False

    def _lost(self, rec: CommitRecord) -> bool:
        """After our PUT at ``rec.sequence``, retried after a failed attempt, met another
        body there: whether another commit holds the number (``True``: we lost the race).

        Not when the number was released since: a PUT of ours whose acknowledgement was
        lost may have landed there and been folded, compacted and released while our
        retry stalled, and the body we met is a stray a stalled rival put into the freed
        number. The checkpoints' digests then decide, as for :meth:`_verify_landed`.
        """
        ours = self._released_verdict(
            rec, f"may have stored its commit record {rec.sequence}",
            f"its commit record {rec.sequence} may have landed before a stall so long")
        return not ours  # None: above the boundary, so another commit holds it

    def _released_verdict(self, rec: CommitRecord, stored: str, stalled: str) -> bool | None:
        """``None`` when ``rec.sequence`` is above the released boundary (listed now);
        at or below it, whether the checkpoints folded *our* record there, or
        :class:`OutcomeUnknown` when none still knows. Store errors are retried as
        :meth:`_store_failed` says (``stored`` and ``stalled`` finish its messages)."""
        failing = None
        while True:
            try:
                if rec.sequence > self.boundary(refresh=True):
                    return None
                ours = self._digest_verdict(rec)
                break
            except (StoreError, OSError) as exc:
                failing = self._store_failed(exc, failing, rec.job_id, stored)
        if ours is None:
            raise OutcomeUnknown(
                f"look the job up by its txnAppId or in the table's history (job "
                f"{rec.job_id}): {stalled} that garbage collection released the records "
                f"around it, and no stored checkpoint still says whose record it folded there")
        return ours

    def _digest_verdict(self, rec: CommitRecord) -> bool | None:
        """Whether the stored checkpoints folded *our* record at its number (``None``: no
        stored checkpoint's recent records reach back to it)."""
        for ck_seq in sorted(s for s in self._checkpoint_sequences() if s >= rec.sequence):
            ck = self._read_checkpoint(ck_seq)
            digest = ck.recent.get(rec.sequence) if ck is not None else None
            if digest is not None:
                return digest == rec.digest()
        return None

    def _auto_checkpoint(self, seq: int) -> None:
        if not self.checkpoint_interval or seq % self.checkpoint_interval:
            return
        try:
            self._write_checkpoint(self._state_at(seq))
        except Exception as exc:  # noqa: BLE001 - the commit is durable; readers replay more
            log.warning("commit record %d is durable, but its checkpoint was not written: %s",
                        seq, exc)


def etag_of(body: bytes, etag: str | None) -> str | None:
    """``etag`` when it is the MD5 of ``body`` (S3's ETag of a plain single-part object):
    the store holds exactly these bytes, so a seed check may trust a listing's ETag
    (``CommitLogReader._listed_seed``); else ``None`` (KMS-encrypted objects, other
    stores: the seed check GETs)."""
    if etag is None or hashlib.md5(body, usedforsecurity=False).hexdigest() != etag:
        return None
    return etag


def check_ranges(state: Checkpoint, ranges: list[CommittedRange], ordered_epochs: bool) -> None:
    """Refuse ranges a garbage collection folded into ``state`` released, or (with
    ``ordered_epochs``) that a newer committed epoch of their shard superseded."""
    for r in ranges:
        floor = state.floors.get(r.shard_id, 0)
        if r.first < floor:
            raise CommitRefused(
                f"run the job again: garbage collection released WAL positions below "
                f"{floor} of shard {r.shard_id} while this job ran (its writer, epoch "
                f"{r.epoch}, was fenced), so positions {r.first}..{r.last} cannot be "
                "committed. Nothing was committed", reason=CommitRefused.GC_FLOOR,
                shard_id=r.shard_id, epoch=r.epoch, first=r.first, last=r.last, floor=floor)
        newer = state.epochs.get(r.shard_id, 0)
        if ordered_epochs and r.epoch < newer:
            raise CommitRefused(
                f"run the job again: shard {r.shard_id} already has a commit of a newer "
                f"writer (epoch {newer}) than this job's (epoch {r.epoch}), and a shard's "
                "writers commit in epoch order so that every reader agrees on each key's "
                "newest value. Nothing was committed", reason=CommitRefused.NEWER_EPOCH,
                shard_id=r.shard_id, epoch=r.epoch, first=r.first, last=r.last,
                newer_epoch=newer)


def judge(state: Checkpoint, part: Member, sequence: int) -> Member:
    """Another job's verdict in a group record at ``sequence``, applied to ``state``.

    The same checks its owner would make (idempotency key, floors, epochs); all
    of them only grow with the log, so owner and leader always agree.
    """
    if part.txn_app_id is not None and part.txn_version is not None:
        prior = state.txn.get(part.txn_app_id)
        if prior is not None and prior[0] >= part.txn_version:
            return replace(part, verdict=DUPLICATE, prior=prior[1])
    try:
        check_ranges(state, part.ranges, part.ordered)
    except CommitRefused as exc:
        return replace(part, verdict=REFUSED, reason=str(exc), refusal=exc.details())
    state.apply(part, sequence)
    return part


class SequenceTaken(MemWalError):
    """``append(at_sequence=n)`` found record ``n`` taken: re-plan against it."""

    def __init__(self, sequence: int):
        super().__init__(f"commit record {sequence} was taken by another commit")
        self.sequence = sequence


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
