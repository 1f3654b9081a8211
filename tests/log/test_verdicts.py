"""Commit answers stay exact in the log's corners: damaged records, strays, followers.

Every test runs on memory, local disk, the S3 server and both emulators (``backend``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from memwal_datasource import hooks
from memwal_datasource.errors import CorruptEntryError, TransientStoreError
from memwal_datasource.format.commit_format import CommitRecord, released_key
from memwal_datasource.log import commit as commit_module
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, record_key
from memwal_datasource.log.commit_intents import Intent, Intents
from memwal_datasource.log.commit_reader import forget_folds
from memwal_datasource.store import open_store
from tests.helpers import DelegatingStore, stall_record_puts


def _commit(log: CommitLog, shard: str, first: int, last: int):
    return log.append(APPEND, [CommittedRange(shard, 1, first, last, rows=last - first + 1)],
                      group=False)


@pytest.mark.parametrize("damage", [b"", b"{\"sequence\": 2", b"not json"])
def test_a_damaged_record_is_refused_naming_it_never_read_as_the_end(any_store, damage):
    log = CommitLog(any_store, checkpoint_interval=None)
    for i in range(3):
        _commit(log, "s", 10 * i + 1, 10 * i + 5)
    good = any_store.get(record_key(2))
    any_store.delete(record_key(2))
    any_store.put(record_key(2), damage)
    forget_folds()
    for read in (lambda c: c.visible(), lambda c: list(c.records()),
                 lambda c: c.read(2)):
        with pytest.raises(CorruptEntryError, match=record_key(2).split("/")[-1]):
            read(CommitLog(any_store, checkpoint_interval=None))
    # A committer never writes past it either: nothing was committed meanwhile.
    with pytest.raises(CorruptEntryError):
        _commit(CommitLog(any_store, checkpoint_interval=None), "s", 100, 101)
    any_store.delete(record_key(2))
    any_store.put(record_key(2), good)
    forget_folds()
    assert [r.first for r in CommitLog(any_store).visible()] == [1, 11, 21]


def test_an_empty_record_error_leads_with_the_fix(memory_store):
    log = CommitLog(memory_store)
    _commit(log, "s", 1, 2)
    memory_store.delete(record_key(1))
    memory_store.put(record_key(1), b"")
    forget_folds()
    with pytest.raises(CorruptEntryError) as err:
        CommitLog(memory_store).visible()
    assert str(err.value).startswith("restore commit record")
    assert "empty (0 bytes" in str(err.value)


def test_a_record_stored_under_another_number_is_refused(memory_store):
    log = CommitLog(memory_store)
    _commit(log, "s", 1, 2)
    _commit(log, "s", 3, 4)
    memory_store.delete(record_key(2))
    memory_store.put(record_key(2), memory_store.get(record_key(1)))
    forget_folds()
    with pytest.raises(CorruptEntryError, match="holds record 1, not 2"):
        CommitLog(memory_store).visible()


@pytest.fixture
def memory_store():
    import uuid

    from memwal_datasource.store import MemoryStore, open_store

    name = uuid.uuid4().hex
    yield open_store(f"memory://{name}", {})
    MemoryStore.reset(name)


def test_a_stray_below_the_released_boundary_is_never_a_record(any_store):
    """A committer stalled past a collection put its record into a freed number: no
    reader takes it, whatever it holds (the first stored record, a stream from the
    start, the fold, a new committer)."""
    log = CommitLog(any_store, checkpoint_interval=None)
    for i in range(6):
        _commit(log, "s", 10 * i + 1, 10 * i + 5)
    stray = any_store.get(record_key(2))
    log.checkpoint()
    any_store.put(released_key(3), b"{}")  # a collection: the boundary, then deletes
    for seq in (1, 2, 3):
        any_store.delete(record_key(seq))
    any_store.put(record_key(3), stray.replace(b'"sequence": 2', b'"sequence": 3'))
    forget_folds()
    fresh = CommitLog(any_store, checkpoint_interval=None)
    assert fresh.first_stored() == 4
    assert [r.sequence for r in fresh.records(after=fresh.first_stored() - 1)] == [4, 5, 6]
    assert [r.first for r in fresh.visible()] == [1, 11, 21, 31, 41, 51]
    assert _commit(fresh, "s", 61, 65).record.sequence == 7
    with pytest.raises(Exception, match="released commit records"):
        list(CommitLog(any_store).records(after=2))


def test_gc_keeps_only_the_newest_checkpoints_and_markers(any_store):
    from types import SimpleNamespace

    from memwal_datasource.format.commit_format import CHECKPOINTS_DIR
    from memwal_datasource.maintenance.gc import KEEP_CHECKPOINTS, _collect_checkpoints

    table = SimpleNamespace(store=any_store)
    log = CommitLog(any_store, checkpoint_interval=2)
    for i in range(12):
        _commit(log, "s", i + 1, i + 1)
    for n in (2, 4, 6, 8):
        any_store.put(released_key(n), b"{}")
    _collect_checkpoints(table)
    names = sorted(k.rsplit("/", 1)[-1] for k in any_store.list(CHECKPOINTS_DIR + "/"))
    assert len([n for n in names if n.startswith("released-")]) == KEEP_CHECKPOINTS
    kept = [int(n[:-5]) for n in names if n[:-5].isdigit()]
    assert kept == [8, 10, 12]
    assert CommitLog(any_store).boundary(refresh=True) == 8
    forget_folds()
    assert [r.first for r in CommitLog(any_store).visible()] == list(range(1, 13))


# --- followers: exact answers once an intent is stored ------------------------------------

class OutageStore(DelegatingStore):
    """A store that fails its next ``down`` calls of any kind (after the client's
    retries); with ``land`` a failing plain PUT still stores the object (a lost ack)."""

    def __init__(self, inner, land: bool = False):
        super().__init__(inner)
        self.down = 0
        self.land = land
        self.failed = 0

    def _fail(self, what: str) -> None:
        if self.down > 0:
            self.down -= 1
            self.failed += 1
            raise TransientStoreError(f"injected outage: {what}")

    def get(self, key):
        self._fail(f"GET {key}")
        return super().get(key)

    def head(self, key):
        self._fail(f"HEAD {key}")
        return super().head(key)

    def list(self, prefix):
        self._fail(f"LIST {prefix}")
        return super().list(prefix)

    def put(self, key, data):
        if self.down > 0 and self.land:
            super().put(key, data)
        self._fail(f"PUT {key}")
        super().put(key, data)

    def put_if_absent(self, key, data):
        self._fail(f"PUT {key}")
        super().put_if_absent(key, data)


@pytest.fixture(autouse=True)
def _clear_hooks():
    yield
    hooks.clear()


def _pending_intent(store, after: int) -> None:
    """A young intent of a stalled owner: the next committer takes the group path."""
    Intents(store).write(Intent.new(CommitRecord(
        sequence=0, kind=APPEND, job_id="stalled", ranges=[rng("stalled")]), after))


def rng(shard: str) -> CommittedRange:
    return CommittedRange(shard, 1, 1, 1, rows=1)


def _on_intent(job: str, fn) -> None:
    hooks.register("commit.intent", lambda intent_id, job_id: fn(intent_id)
                   if job_id == job else None)


def test_a_follower_whose_reads_fail_reads_on_to_its_verdict(location):
    """B's intent is stored; the leader A commits it; then B's store fails six calls in a
    row: B reads on and answers committed (it used to fail while its rows committed)."""
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("base")], job_id="base", group=False)
    _pending_intent(store, after=1)
    b_store = OutageStore(open_store(*location))

    def lead_then_fail(_intent_id):
        a = CommitLog(open_store(*location)).append(APPEND, [rng("a")], job_id="a")
        assert a.created
        b_store.down = 6

    _on_intent("b", lead_then_fail)
    b = CommitLog(b_store, retry_base_delay_ms=1).append(APPEND, [rng("b")], job_id="b")
    assert b.created and b_store.failed == 6
    seen = [r.shard_id for r in CommitLog(open_store(*location)).visible()]
    assert sorted(seen) == ["a", "b", "base", "stalled"]


def test_an_intent_put_whose_ack_was_lost_commits_once(location):
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("base")], job_id="base", group=False)
    _pending_intent(store, after=1)
    b_store = OutageStore(open_store(*location), land=True)
    real_write = Intents.write

    def failing_write(self, intent):
        b_store.down = 1
        return real_write(self, intent)

    Intents.write = failing_write
    try:
        b = CommitLog(b_store, retry_base_delay_ms=1).append(APPEND, [rng("b")], job_id="b")
    finally:
        Intents.write = real_write
    assert b.created and b_store.failed == 1
    seen = [r.shard_id for r in CommitLog(open_store(*location)).visible()]
    assert sorted(seen) == ["b", "base", "stalled"]


def test_a_follower_never_takes_its_verdict_from_a_stray(location):
    """A stalled leader's record holding B's intent lands in a number gc had released:
    B must not answer 'committed' from it (nobody reads that record)."""
    store = open_store(*location)
    for job in ("base1", "base2"):
        CommitLog(store).append(APPEND, [rng(job)], job_id=job, group=False)
    _pending_intent(store, after=2)

    def stray_holds_it(intent_id):
        others = CommitLog(open_store(*location))
        real3 = others.append(APPEND, [rng("c")], job_id="c", group=False).record
        others.append(APPEND, [rng("d")], job_id="d", group=False)
        others.checkpoint()
        stray = replace(real3, job_id="leader", members=[
            replace(real3.parts()[0], job_id="leader"),
            replace(real3.parts()[0], job_id="b", intent_id=intent_id,
                    ranges=[rng("b")])])
        store.put(released_key(3), b"{}")
        store.delete(record_key(3))
        store.put(record_key(3), stray.to_json())

    _on_intent("b", stray_holds_it)
    b = CommitLog(open_store(*location), retry_base_delay_ms=1).append(
        APPEND, [rng("b")], job_id="b")
    # The checkpoint remembers which intents its records answered: not B's, so B leads
    # and commits itself, once.
    assert b.created and b.record.sequence > 4
    forget_folds()
    assert [r.shard_id for r in CommitLog(open_store(*location)).visible()].count("b") == 1


def test_a_stray_in_a_released_number_does_not_hide_the_record_that_held_an_intent(
        location):
    """Record 3, a leader's group record, committed B's intent; a collection released it
    and a stalled committer's PUT left a stray (another body) at 3. B, reading its
    window, finds no record holding its intent there: it lists the boundary and the
    checkpoint answers committed at 3 (it used to lead and commit its rows again)."""
    store = open_store(*location)
    for job in ("base1", "base2"):
        CommitLog(store).append(APPEND, [rng(job)], job_id=job, group=False)
    _pending_intent(store, after=2)

    def held_then_released(intent_id):
        forget_folds()
        real3 = CommitLog(open_store(*location)).append(
            APPEND, [rng("c")], job_id="c", group=False).record
        part = real3.parts()[0]
        group3 = replace(real3, job_id="leader", ranges=[rng("b"), rng("c")], members=[
            replace(part, job_id="c"),
            replace(part, job_id="b", intent_id=intent_id, ranges=[rng("b")])])
        store.delete(record_key(3))
        store.put(record_key(3), group3.to_json())  # as the leader stored it
        forget_folds()
        others = CommitLog(open_store(*location))
        others.append(APPEND, [rng("d")], job_id="d", group=False)
        others.checkpoint()  # folds record 3: remembers that it answered B's intent
        store.put(released_key(3), b"{}")
        store.delete(record_key(3))
        store.put(record_key(3), real3.to_json())  # the stray: B's intent is not in it

    _on_intent("b", held_then_released)
    b = CommitLog(open_store(*location), retry_base_delay_ms=1).append(
        APPEND, [rng("b")], job_id="b")
    assert b.created and b.record.sequence == 3
    forget_folds()
    assert [r.shard_id for r in CommitLog(open_store(*location)).visible()].count("b") == 1


def test_a_commit_that_filled_a_freed_number_then_lost_a_race_commits_once(location,
                                                                           monkeypatch):
    """X stalls before its PUT while others commit, a checkpoint and a collection free its
    number; its PUT fills the freed number (a stray: deleted), then it loses the race at
    the tip. Its intent must start after the number it lost, not the freed one: it
    commits once (this used to answer OutcomeUnknown, its window crossing freed records)."""
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("base")], job_id="base", group=False)
    stall_record_puts(monkeypatch, store)  # as long as a collection needs
    calls = {"n": 0, "inside": False}

    def world(sequence):
        if calls["inside"]:
            return  # the others' own commits
        calls["n"] += 1
        calls["inside"] = True
        try:
            move(calls["n"])
        finally:
            calls["inside"] = False

    def move(n):
        others = CommitLog(open_store(*location), checkpoint_interval=None)
        if n == 1:  # X is about to put at 2: the log moves on and is collected
            for job in ("o2", "o3", "o4"):
                others.append(APPEND, [rng(job)], job_id=job, group=False)
            others.checkpoint()
            store.put(released_key(3), b"{}")
            for seq in (1, 2, 3):
                store.delete(record_key(seq))
        elif n == 2:  # X is about to put at the tip: a rival takes it first
            others.append(APPEND, [rng("rival")], job_id="rival", group=False)

    hooks.register("commit.before", world)
    x = CommitLog(open_store(*location), retry_base_delay_ms=1).append(
        APPEND, [rng("x")], job_id="x")
    assert x.created and x.record.sequence == 6
    forget_folds()
    seen = [r.shard_id for r in CommitLog(open_store(*location)).visible()]
    assert seen.count("x") == 1 and "rival" in seen


def test_a_stalled_leader_learns_its_verdict_from_the_checkpoint(location, monkeypatch):
    """L leads a group but stalls before its PUT; M takes over and commits L's intent in
    record 2; records pass and a collection frees 1..3. L's PUT fills the freed number 2
    (a stray, deleted); the window around its intent is gone, but the newest checkpoint
    remembers record 2 answered it: L answers committed, once (it used to be
    OutcomeUnknown, and never a second commit)."""
    monkeypatch.setattr(commit_module, "LEADER_WAIT_S", 0.05)
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("base")], job_id="base", group=False)
    _pending_intent(store, after=1)
    state = {"done": False, "inside": False}

    def stall(sequence):
        if state["done"] or state["inside"]:
            return
        state["done"] = state["inside"] = True
        try:
            m = CommitLog(open_store(*location), retry_base_delay_ms=1).append(
                APPEND, [rng("m")], job_id="m")
            assert m.created and m.record.sequence == 2
            others = CommitLog(open_store(*location), checkpoint_interval=None)
            for job in ("o3", "o4"):
                others.append(APPEND, [rng(job)], job_id=job, group=False)
            others.checkpoint()
            store.put(released_key(3), b"{}")
            for seq in (1, 2, 3):
                store.delete(record_key(seq))
        finally:
            state["inside"] = False

    hooks.register("commit.before", stall)
    lead = CommitLog(open_store(*location), retry_base_delay_ms=1).append(
        APPEND, [rng("l")], job_id="l")
    assert state["done"] and lead.created and lead.record.sequence == 2
    forget_folds()
    seen = [r.shard_id for r in CommitLog(open_store(*location)).visible()]
    assert sorted(seen) == ["base", "l", "m", "o3", "o4", "stalled"]
