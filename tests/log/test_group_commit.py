"""Group commit on the one sequence (docs/protocol.md, "Committing at scale").

Two or more committers racing, forced with hooks and events (never sleeps): an
intent is committed exactly once whoever leads; verdicts reach their owners
(committed, duplicate, refused); a dead leader's intent is taken over; stale
intents are never taken; stalled committers that fill numbers gc freed commit
again at a new number. Every test runs on memory, local disk, the S3 server and
both emulators (``backend``).
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from memwal_datasource import hooks
from memwal_datasource.errors import CommitRefused
from memwal_datasource.format.commit_format import (
    COMMITTED,
    DUPLICATE,
    REFUSED,
    CommitRecord,
    released_key,
)
from memwal_datasource.log import commit as commit_module
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, Txn, record_key
from memwal_datasource.log.commit_intents import Intent, Intents
from memwal_datasource.store import open_store

EVENT_TIMEOUT_S = 60  # a deadline for an event that never comes, not a wait


def rng(shard: str, epoch: int = 1, first: int = 1, last: int = 1) -> CommittedRange:
    return CommittedRange(shard, epoch, first, last, rows=1)


def body(job: str, ranges, txn: Txn | None = None, ordered: bool = False) -> CommitRecord:
    return CommitRecord(sequence=0, kind=APPEND, job_id=job, ranges=list(ranges),
                        txn_app_id=txn.app_id if txn else None,
                        txn_version=txn.version if txn else None, ordered=ordered)


def visible_jobs(store) -> Counter:
    """How often each shard's range is visible (shards are named after their job here)."""
    return Counter(r.shard_id for r in CommitLog(store).visible())


def in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.fixture(autouse=True)
def _clear_hooks():
    yield
    hooks.clear()


def test_many_committers_commit_each_job_once(location):
    """Eight committers (own store clients), four jobs each, started together."""
    barrier = threading.Barrier(8)
    results: dict[str, object] = {}

    def committer(i: int):
        log = CommitLog(open_store(*location), retry_base_delay_ms=1)
        barrier.wait(EVENT_TIMEOUT_S)
        for j in range(4):
            job = f"w{i}j{j}"
            results[job] = log.append(APPEND, [rng(job)], job_id=job)

    threads = [in_thread(lambda i=i: committer(i)) for i in range(8)]
    for t, out in threads:
        t.join(EVENT_TIMEOUT_S * 4)
        assert "error" not in out, out.get("error")
    assert len(results) == 32 and all(r.created for r in results.values())
    assert all(r.record.job_id == job and [x.shard_id for x in r.record.ranges] == [job]
               for job, r in results.items())
    store = open_store(*location)
    assert visible_jobs(store) == Counter({job: 1 for job in results})
    seqs = {r.record.sequence for r in results.values()}
    assert max(seqs) == CommitLog(store).next_sequence() - 1 <= 32
    assert not list(store.list("_memwal_commits/_intents/")), "owners delete their intents"


def _hold_intent(job: str):
    """Pause the committer of ``job`` right after its intent is stored."""
    stored, go = threading.Event(), threading.Event()

    def hook(intent_id, job_id):
        if job_id == job:
            stored.set()
            assert go.wait(EVENT_TIMEOUT_S)

    hooks.register("commit.intent", hook)
    return stored, go


def _contend(store, job: str, ranges, **kw):
    """Make ``job``'s commit meet a pending intent (so it takes the group path)."""
    return CommitLog(store, retry_base_delay_ms=1).append(APPEND, ranges, job_id=job, **kw)


def test_a_paused_owner_finds_its_intent_committed_by_the_leader(location):
    """B stores its intent and stalls; A meets it, waits for B to lead, takes over and
    commits both in one record; B wakes and reads its verdict there (no second record)."""
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("base")], job_id="base")
    stored, go = _hold_intent("b")
    # B loses its first race on purpose: a rival record takes B's number first.
    b_log = CommitLog(open_store(*location), retry_base_delay_ms=1)
    rival = {"done": False}

    def take_number(sequence):
        if not rival["done"]:
            rival["done"] = True
            CommitLog(open_store(*location)).append(APPEND, [rng("rival")], job_id="rival",
                                                    group=False)

    hooks.register("commit.before", take_number)
    tb, out_b = in_thread(lambda: b_log.append(APPEND, [rng("b")], job_id="b"))
    assert stored.wait(EVENT_TIMEOUT_S)
    a = _contend(open_store(*location), "a", [rng("a")])
    go.set()
    tb.join(EVENT_TIMEOUT_S)
    assert "error" not in out_b, out_b.get("error")
    b = out_b["result"]
    assert a.created and b.created and a.record.sequence == b.record.sequence
    assert (a.record.job_id, b.record.job_id) == ("a", "b")
    assert [r.shard_id for r in b.record.ranges] == ["b"]
    group = CommitLog(store).read(a.record.sequence)
    assert [(m.job_id, m.verdict) for m in group.members] == [("a", COMMITTED), ("b", COMMITTED)]
    assert visible_jobs(store) == Counter({"base": 1, "rival": 1, "a": 1, "b": 1})
    # The follower folded through the record that answered it: its process's next commit
    # starts there, not where its own last look left it.
    assert b_log._state.sequence == b.record.sequence


def _orphan_intent(store, job: str, ranges, after: int, txn: Txn | None = None,
                   ordered: bool = False, age_s: float = 0.0) -> Intent:
    """An intent whose owner died after storing it (a marker lost mid-commit)."""
    intent = Intent.new(body(job, ranges, txn, ordered), after)
    if age_s:  # its key carries its time too (gc judges leftovers by name)
        born = intent.created_ms - int(age_s * 1000)
        intent = Intent(f"{born:015d}{intent.intent_id[15:]}", after, born, intent.record)
    Intents(store).write(intent)
    return intent


def test_a_dead_leaders_intent_is_taken_over_once(location):
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("base")], job_id="base")
    _orphan_intent(store, "dead", [rng("dead")], after=1)
    a = _contend(open_store(*location), "a", [rng("a")])
    assert a.created
    rec = CommitLog(store).read(a.record.sequence)
    assert {(m.job_id, m.verdict) for m in rec.members} == {("a", COMMITTED),
                                                            ("dead", COMMITTED)}
    c = _contend(open_store(*location), "c", [rng("c")])
    assert c.created
    assert visible_jobs(store) == Counter({"base": 1, "a": 1, "dead": 1, "c": 1})


def test_a_stale_intent_is_never_taken(location):
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("base")], job_id="base")
    _orphan_intent(store, "old", [rng("old")], after=1,
                   age_s=commit_module.INTENT_MAX_AGE_S + 5)
    a = _contend(open_store(*location), "a", [rng("a")])
    assert a.created and not CommitLog(store).read(a.record.sequence).members
    assert visible_jobs(store) == Counter({"base": 1, "a": 1})


def test_a_members_idempotency_key_is_answered_as_a_duplicate(location):
    store = open_store(*location)
    first = CommitLog(store).append(APPEND, [rng("k1")], job_id="k1", txn=Txn("app", 3))
    intent = _orphan_intent(store, "k2", [rng("k2")], after=1, txn=Txn("app", 3))
    a = _contend(open_store(*location), "a", [rng("a")])
    rec = CommitLog(store).read(a.record.sequence)
    member = next(m for m in rec.members if m.intent_id == intent.intent_id)
    assert (member.verdict, member.prior) == (DUPLICATE, first.record.sequence)
    assert visible_jobs(store) == Counter({"k1": 1, "a": 1})
    assert CommitLog(store).committed_txn(Txn("app", 3)).job_id == "k1"


def test_two_members_with_one_key_commit_it_once(location):
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("base")], job_id="base")
    _orphan_intent(store, "x1", [rng("x1")], after=1, txn=Txn("twice", 1))
    _orphan_intent(store, "x2", [rng("x2")], after=1, txn=Txn("twice", 1))
    _contend(open_store(*location), "a", [rng("a")])
    jobs = visible_jobs(store)
    assert jobs["x1"] + jobs["x2"] == 1 and jobs["a"] == 1


def test_a_refused_member_gets_the_refusal_with_its_fields(location):
    """An older epoch of a primary-key shard, behind a committed newer one: refused in
    the group (so its owner can re-home), while the leader commits."""
    store = open_store(*location)
    CommitLog(store).append(APPEND, [rng("s", epoch=5, first=10, last=10)], job_id="new")
    intent = _orphan_intent(store, "old", [rng("s", epoch=3, first=1, last=2)], after=1,
                            ordered=True)
    a = _contend(open_store(*location), "a", [rng("a")])
    rec = CommitLog(store).read(a.record.sequence)
    member = next(m for m in rec.members if m.intent_id == intent.intent_id)
    assert member.verdict == REFUSED and member.refusal["reason"] == CommitRefused.NEWER_EPOCH
    log = CommitLog(store)
    with pytest.raises(CommitRefused, match="^run the job again") as exc:
        log._answer(rec, member, None)
    assert (exc.value.reason, exc.value.shard_id, exc.value.newer_epoch) == (
        CommitRefused.NEWER_EPOCH, "s", 5)
    assert [r.epoch for r in log.visible() if r.shard_id == "s"] == [5]


def test_two_stalled_committers_on_adjacent_numbers_both_commit_again(location):
    """X picks 7 and Y picks 8; both stall while 7..12 land, checkpoint 10 folds them and
    gc deletes 1..9; both PUTs then fill freed numbers nobody reads. Each is told so
    exactly (its own orphan removed) and commits again at a new number: none is lost,
    none is reported committed while unread."""
    store = open_store(*location)
    filler = CommitLog(store, checkpoint_interval=5)
    for i in range(1, 7):
        filler.append(APPEND, [rng(f"f{i}")], job_id=f"f{i}", group=False)
    y_paused, y_go = threading.Event(), threading.Event()
    state = {"x": False}

    def stall(sequence):
        if threading.current_thread().name == "Y" and sequence == 8 and not y_go.is_set():
            y_paused.set()
            assert y_go.wait(EVENT_TIMEOUT_S)
        elif sequence == 7 and not state["x"]:
            state["x"] = True
            others = CommitLog(open_store(*location), checkpoint_interval=5)
            others.append(APPEND, [rng("f7")], job_id="f7", group=False)
            ty.start()
            assert y_paused.wait(EVENT_TIMEOUT_S)
            for i in range(8, 13):
                others.append(APPEND, [rng(f"f{i}")], job_id=f"f{i}", group=False)
            assert others.latest_checkpoint(refresh=True).sequence == 10
            store.put(released_key(9), b"{}")  # a collector's contract: the boundary first
            for seq in range(1, 10):
                store.delete(record_key(seq))

    out_y: dict = {}

    def run_y():
        out_y["result"] = CommitLog(open_store(*location), checkpoint_interval=5).append(
            APPEND, [rng("y")], job_id="y", group=False)

    ty = threading.Thread(target=run_y, name="Y", daemon=True)
    hooks.register("commit.before", stall)
    x = CommitLog(open_store(*location), checkpoint_interval=5).append(
        APPEND, [rng("x")], job_id="x", group=False)
    y_go.set()
    ty.join(EVENT_TIMEOUT_S)
    y = out_y["result"]
    assert x.created and y.created and {x.record.sequence, y.record.sequence} == {13, 14}
    jobs = visible_jobs(store)
    assert jobs["x"] == 1 and jobs["y"] == 1
    assert all(jobs[f"f{i}"] == 1 for i in range(1, 13))


def test_gc_sweeps_intents_no_committer_takes_any_more(tmp_path):
    """A driver that died mid-commit leaves its intent; gc removes it once it is older
    than the retention (nobody takes it after INTENT_MAX_AGE_S), and keeps fresh ones."""
    from memwal_datasource.maintenance.gc import DEFAULT_RETAIN_SECONDS, collect
    from memwal_datasource.table.view import TableView, create_table
    from tests.helpers import SCHEMA

    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA)
    table = TableView(uri)
    old = _orphan_intent(table.store, "old", [rng("old")], after=0,
                         age_s=DEFAULT_RETAIN_SECONDS + 60)
    fresh = _orphan_intent(table.store, "fresh", [rng("fresh")], after=0)
    collect(table)
    names = {k.rsplit("/", 1)[-1] for k in table.store.list("_memwal_commits/_intents/")}
    assert names == {f"{fresh.intent_id}.json"} and old.intent_id not in str(names)
