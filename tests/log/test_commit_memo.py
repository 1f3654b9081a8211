"""A process remembers its newest fold of a table's commit log (commit_folds._FOLDS).

A warm committer reads only what changed since; a remembered fold is trusted only
while its last record is still the one it folded (a table made again, a log
collected past it, another process's records all fall back or catch up), and
committers racing a collector keep every verdict exact.
"""

from __future__ import annotations

import threading
import time

import pytest

from memwal_datasource.errors import OutcomeUnknown
from memwal_datasource.format.commit_format import released_key
from memwal_datasource.log import commit_folds
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, record_key
from memwal_datasource.log.commit_reader import forget_folds
from tests.helpers import DelegatingStore
from tests.log.test_commit import CountingStore, _collect_pass, _expected, _fill, _gc


def _wipe(store) -> None:
    for key in list(store.list("")):
        store.delete(key)


def _snapshot() -> dict:
    with commit_folds._LOCK:
        return dict(commit_folds._FOLDS)


def _restore(folds: dict) -> None:
    """This process remembers ``folds`` again, and the host nothing newer."""
    forget_folds()
    with commit_folds._LOCK:
        commit_folds._FOLDS.update(folds)


def _one(seq: int, shard: str = "s") -> list[CommittedRange]:
    return [CommittedRange(shard, 1, seq * 10, seq * 10 + 1, rows=1, task=0)]


def test_a_warm_commit_reads_only_the_tip(any_store):
    _fill(any_store, 30, 10)
    warm = CountingStore(any_store)
    assert CommitLog(warm).append(APPEND, _one(31)).record.sequence == 31
    forget_folds()
    cold = CountingStore(any_store)
    assert CommitLog(cold).append(APPEND, _one(32)).record.sequence == 32
    # warm: LIST checkpoints, GET its last record, HEAD the tip, LIST intents, LIST after.
    assert warm.reads <= 5, warm.calls
    assert cold.reads > warm.reads, (cold.calls, warm.calls)
    forget_folds()
    assert [r.sequence for r in CommitLog(any_store).visible()][-2:] == [31, 32]


def test_a_table_made_again_at_the_same_place_starts_from_its_own_log(any_store):
    _fill(any_store, 20, 10)
    _wipe(any_store)  # deleted by hand and written again: the remembered fold is stale
    assert CommitLog(any_store).append(APPEND, _one(1)).record.sequence == 1
    _wipe(any_store)
    expected = _fill(any_store, 25, None)  # as many records again, different ones
    _wipe(any_store)
    _fill(any_store, 20, 10)
    stale = _snapshot()
    _wipe(any_store)
    _fill(any_store, 25, None)
    _restore(stale)  # a fold of records 1..20 of the old log, whose record 20 differs
    assert CommitLog(any_store).append(APPEND, _one(26)).record.sequence == 26
    forget_folds()
    assert CommitLog(any_store).visible()[:-1] == expected


def test_a_table_made_again_forgets_the_old_fold_so_its_commits_warm_up(any_store):
    """A table deleted and made again at the same place: the old table's fold (further
    along) is forgotten by the first committer that finds it stale, so the next commits
    of this process read only the tip again (not every record since the start)."""
    _fill(any_store, 40, None)  # the old table's fold, at 40, remembered
    _wipe(any_store)
    _fill(any_store, 20, None)  # the new table, shorter
    assert CommitLog(any_store).append(APPEND, _one(21)).record.sequence == 21  # cold
    warm = CountingStore(any_store)
    assert CommitLog(warm).append(APPEND, _one(22)).record.sequence == 22
    assert warm.reads <= 5, warm.calls
    forget_folds()
    assert [r.sequence for r in CommitLog(any_store).visible()][-2:] == [21, 22]


def test_a_fold_collected_past_starts_from_the_newer_checkpoint(any_store):
    _fill(any_store, 25, 10)
    stale = _snapshot()  # this process's fold at 25; another process goes on to 40
    log = CommitLog(any_store, checkpoint_interval=10)
    for seq in range(26, 41):
        assert log.append(APPEND, _one(seq), job_id=f"j{seq}").record.sequence == seq
    any_store.put(released_key(39), b"{}")  # a collector: the boundary, then below it
    for seq in range(1, 40):
        any_store.delete(record_key(seq))
    _restore(stale)
    assert CommitLog(any_store).append(APPEND, _one(41)).record.sequence == 41
    _restore(stale)
    visible = CommitLog(any_store).visible()
    forget_folds()
    assert visible == CommitLog(any_store).visible()
    assert [r.sequence for r in visible if r.shard_id == "s"] == list(range(26, 42))


def test_a_fold_behind_other_processes_catches_up(any_store):
    _fill(any_store, 12, 10)
    stale = _snapshot()
    forget_folds()
    _fill(any_store, 30, 10, start=13)
    _restore(stale)
    counting = CountingStore(any_store)
    assert CommitLog(counting).append(APPEND, _one(31)).record.sequence == 31
    # Checkpoints 20 and 30 exist: the newer one replaces the stale fold.
    assert counting.calls["get"] <= 4, counting.calls
    forget_folds()
    expected = _expected(30)
    assert CommitLog(any_store).visible()[:-1] == expected


@pytest.mark.parametrize("backend", ["memory", "local", "s3", "gcs", "azure"])
def test_warm_committers_racing_a_collector_commit_each_job_once(any_store, monkeypatch):
    """Three committers (threads sharing this process's folds) and a collector that
    checkpoints and deletes below it, at once: every job lands once, in the fold.

    The protocol's clocks, scaled down 10x so the collector reaches the committers'
    records within the test: a commit re-checks after COMMIT_DEADLINE_S, and the
    collector's grace is three of those (gc.MIN_RETAIN_SECONDS is 3 x 10 s). A
    commit that itself took longer than that grace (a thread starved on a loaded
    machine) may find its records collected: its designed answer is
    ``OutcomeUnknown``, and its job may or may not have landed.
    """
    from memwal_datasource.log import commit as commit_mod
    monkeypatch.setattr(commit_mod, "COMMIT_DEADLINE_S", 1.0)
    monkeypatch.setattr(commit_mod, "INTENT_MAX_AGE_S", 1.0)
    monkeypatch.setattr(commit_mod, "LEADER_WAIT_S", 0.2)
    stop, errors, deleted, unknown = threading.Event(), [], [], []
    done = [0, 0, 0]  # jobs committed, per committer
    grace_s = 3.0
    deadline = time.monotonic() + 120

    def commit(w: int) -> None:
        # Until the collector has deleted records under the committers (and 10 jobs each).
        try:
            while (done[w] < 10 or not deleted) and time.monotonic() < deadline:
                i, t0 = done[w], time.monotonic()
                try:
                    CommitLog(any_store, retry_base_delay_ms=1).append(
                        APPEND, [CommittedRange(f"w{w}", 1, i + 1, i + 1, rows=1, task=0)],
                        job_id=f"w{w}-{i}")
                except OutcomeUnknown:
                    if time.monotonic() - t0 < grace_s:
                        raise  # within the grace: a collector must never cause it
                    unknown.append((f"w{w}", i + 1))
                    return
                done[w] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def collect() -> None:
        # The collector's contract: ascending, below a checkpoint, after a grace longer
        # than any commit takes.
        try:
            while not stop.is_set():
                deleted.extend(_collect_pass(any_store, grace_s))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(w,)) for w in range(3)]
    collector = threading.Thread(target=collect)
    collector.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    collector.join(120)
    assert not errors, errors
    assert deleted, "the collector ran beside the committers"
    warm = CommitLog(any_store).visible()  # from this process's remembered fold
    forget_folds()
    visible = CommitLog(any_store).visible()
    assert warm == visible
    got = sorted((r.shard_id, r.first) for r in visible)  # each job once (group records
    want = sorted((f"w{w}", i + 1) for w in range(3) for i in range(done[w]))  # hold many)
    assert sorted(set(got) - set(unknown)) == want and len(got) == len(set(got))


class _Remote(DelegatingStore):
    """``any_store`` as an object store (reads may go at once), with a hook on reads."""

    remote = True

    def __init__(self, inner, on_read):
        super().__init__(inner)
        self.on_read = on_read

    def get(self, key):
        self.on_read("get", key)
        return super().get(key)

    def head(self, key):
        self.on_read("head", key)
        return super().head(key)

    def list(self, prefix):
        self.on_read("list", prefix)
        return super().list(prefix)


class _RemoteListingAfter(_Remote):
    """:class:`_Remote` that lists after a key in one request, with ETags, as S3 does."""

    lists_after = True

    def list_after(self, prefix, after):
        self.on_read("list_after", prefix)
        return self.inner.list_after(prefix, after)

    def list_after_etags(self, prefix, after):
        self.on_read("list_after", prefix)
        return self.inner.list_after_etags(prefix, after)


# name: (the store the warm commit uses, the reads of its first look, whether the fold it
# starts from knows its last record's ETag: else the seed check is a GET beside the listing)
REMOTES = {"four reads": (_Remote, ["get", "head", "list", "list"], False),
           "listing after a key": (_RemoteListingAfter, ["get", "list_after"], False),
           "listing with the seed's ETag": (_RemoteListingAfter, ["list_after"], True)}


def _fill_for(store, remote: str) -> None:
    """30 records, the fold remembered with its last record's ETag or (through a store
    whose PUTs return none) without it."""
    _fill(store if REMOTES[remote][2] else DelegatingStore(store), 30, 10)


# Stores whose PUT answers with the MD5 of the bytes as the ETag (S3's plain objects).
MD5_ETAGS = ("memory", "s3")


@pytest.mark.parametrize("remote", list(REMOTES))
def test_a_warm_commit_on_an_object_store_makes_its_first_look_at_once(any_store, backend,
                                                                       remote):
    """The seed check, the checkpoint LIST, the tip probe and the intents LIST of a warm
    commit are in flight together (where the store lists after a key, the last three
    are one listing, and with the seed's ETag known, all four are): each waits here until
    all have started (a sequential look would break the barrier and fail the commit)."""
    kind, reads, etag = REMOTES[remote]
    if etag and backend not in MD5_ETAGS:
        reads = REMOTES["listing after a key"][1]  # no ETag to remember: a GET beside
    _fill_for(any_store, remote)
    meet, waited = threading.Barrier(len(reads), timeout=10), []

    def at_once(op, key):
        if len(waited) < len(reads):
            waited.append((op, key))
            meet.wait()

    assert CommitLog(kind(any_store, at_once)).append(APPEND, _one(31)).record.sequence == 31
    assert sorted(op for op, _key in waited) == reads, waited
    forget_folds()
    assert CommitLog(any_store).visible()[-1].sequence == 31


@pytest.mark.parametrize("remote,during", [("four reads", "get"), ("four reads", "head"),
                                           ("four reads", "list"),
                                           ("listing after a key", "get"),
                                           ("listing after a key", "list_after"),
                                           ("listing with the seed's ETag", "list_after")])
def test_a_warm_commit_reading_at_once_while_another_commits_and_a_collector_runs(
        any_store, remote, during):
    """Another process commits the next record and a collector checkpoints it and deletes
    every record below, just before one of the warm commit's reads at once (the others
    may have seen the log before): the commit lands once, after that record, and the
    log reads every job once."""
    _fill_for(any_store, remote)
    fired = threading.Event()

    def rival_then_collector(op, key):
        if op == during and not fired.is_set() and (op.startswith("list")
                                                    or "_memwal_commits/0" in key):
            fired.set()
            theirs = CommitLog(any_store, checkpoint_interval=None)
            theirs._seeded, theirs._state, theirs._ckpt = False, None, None  # another process
            assert theirs.append(APPEND, _one(31, "other")).record.sequence == 31
            assert theirs.checkpoint().sequence == 31
            _gc(any_store, 31)

    ours = CommitLog(REMOTES[remote][0](any_store, rival_then_collector)).append(
        APPEND, _one(32))
    assert fired.is_set() and ours.record.sequence == 32
    forget_folds()
    visible = CommitLog(any_store).visible()
    assert [r.sequence for r in visible][-2:] == [31, 32]
    assert [r.shard_id for r in visible[-2:]] == ["other", "s"]


@pytest.mark.parametrize("backend", ["s3"])
def test_a_warm_commit_on_s3_sends_two_requests(any_store, monkeypatch):
    """On S3 a warm commit is one listing from its fold's last record on (records,
    checkpoints and intents: start-after), and the PUT. The fold's last record is
    listed with the ETag its committer's PUT returned, so the seed needs no GET
    (CommitLogReader._listed_seed); the listing showed the next number free and
    unreleased, and the PUT landed well within the commit deadline of it, so the
    verdict needs no listing (CommitLogReader.clear_since)."""
    _fill(any_store, 30, 10)
    calls: list[tuple[str, str]] = []
    cls = type(any_store)
    for op in ("get", "head", "list", "list_after", "list_after_etags", "put_if_absent",
               "put", "delete_many"):
        def counted(self, key, *args, _real=getattr(cls, op), _op=op, **kw):
            calls.append((_op, key))
            return _real(self, key, *args, **kw)
        monkeypatch.setattr(cls, op, counted)
    assert CommitLog(any_store).append(APPEND, _one(31)).record.sequence == 31
    monkeypatch.undo()
    assert sorted(calls) == [("list_after_etags", "_memwal_commits/"),
                             ("put_if_absent", record_key(31))], calls
    forget_folds()
    assert [r.sequence for r in CommitLog(any_store).visible()][-2:] == [30, 31]


def test_a_commit_whose_put_stalled_past_the_deadline_lists_the_checkpoints(any_store,
                                                                           monkeypatch):
    """The look showed 31 free, but the PUT of 31 stalled past the deadline while others
    committed 31..36 and a collector folded them into checkpoint 35 and deleted 1..34:
    ours landed in a freed number. The verdict lists the checkpoints, removes ours and
    commits again at 37 (a stall inside the PUT, where the pre-PUT re-check cannot see
    it)."""
    from memwal_datasource.log import commit as commit_mod
    monkeypatch.setattr(commit_mod, "COMMIT_DEADLINE_S", 0.2)
    _fill(any_store, 30, 10)
    real_put = type(any_store).put_if_absent
    stalled = []

    def put_if_absent(self, key, data, *args, **kw):
        if key == record_key(31) and not stalled:
            stalled.append(time.monotonic())
            # While our PUT is in flight: others commit, a collector checkpoints and
            # deletes, and the stall outlasts the deadline (the fault being injected).
            _fill(any_store, 36, 5, start=31)
            _gc(any_store, 35)
            while time.monotonic() - stalled[0] <= commit_mod.COMMIT_DEADLINE_S:
                time.sleep(0.05)
        return real_put(self, key, data, *args, **kw)

    monkeypatch.setattr(type(any_store), "put_if_absent", put_if_absent)
    log = CommitLog(any_store)
    res = log.append(APPEND, [CommittedRange("x", 1, 1, 1, rows=1)], job_id="x")
    monkeypatch.undo()
    assert stalled and res.created and res.record.sequence == 37
    forget_folds()
    visible = CommitLog(any_store).visible()
    assert [(r.shard_id, r.sequence) for r in visible if r.shard_id == "x"] == [("x", 37)]
    assert not any_store.exists(record_key(31)) or CommitLog(any_store).read(31).job_id != "x"
