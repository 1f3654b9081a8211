"""Commit-log folds shared between the processes of one host (commit_folds).

Spark commits each job in whichever of the driver's Python workers is idle: these
tests run real processes taking turns and racing a collector, on S3 and both
emulators (folds of remote stores are shared), and feed committers torn, foreign
and stale fold files.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
import zlib

import pytest

from memwal_datasource.log import commit_folds
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.log.commit_reader import forget_folds
from memwal_datasource.store import open_store
from tests import race_worker
from tests.log.test_commit import CountingStore, _collect_pass

REMOTE = ["s3", "gcs", "azure"]


def _one(seq: int, shard: str = "s") -> list[CommittedRange]:
    return [CommittedRange(shard, 1, seq, seq, rows=1, task=0)]


class Counting(CountingStore):
    """Counts reads, and is remote when the store it wraps is (shares host folds)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.remote = inner.remote


def _new_process() -> None:
    """What a fresh process on this host holds: no fold of its own."""
    with commit_folds._LOCK:
        commit_folds._FOLDS.clear()
        commit_folds._SEEN.clear()


def _host_file(store) -> str:
    path = commit_folds._file(store.uri, host=True)
    assert path is not None, "this user's fold directory is usable"
    return path


@pytest.mark.parametrize("backend", REMOTE)
def test_commit_workers_taking_turns_read_only_the_tip(location):
    """Two commit processes taking turns: with shared folds every commit after the
    first reads what a warm committer reads; folding alone each reads the other's
    records again."""
    uri, opts = location
    ctx = mp.get_context("spawn")
    pipes, procs = {}, []
    for share in (False, True):
        for w in range(2):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=race_worker.commit_turns, args=(uri, opts, w, child, share))
            p.start()
            pipes[share, w], _ = parent, procs.append(p)
    counts: dict[bool, list[int]] = {False: [], True: []}
    try:
        job = 0
        for share in (False, True):
            for turn in range(8):
                job += 1
                pipes[share, turn % 2].send(job)
                seq, n = pipes[share, turn % 2].recv()
                assert seq == job
                counts[share].append(n)
    finally:
        for conn in pipes.values():
            conn.send(None)
        for p in procs:
            p.join(60)
    shared, alone = counts[True][1:], counts[False][2:]
    # Every shared commit is a warm one (the same reads each time), and cheaper than any
    # commit of a process that folds alone.
    assert len(set(shared)) == 1, counts
    assert max(shared) < min(alone), counts
    forget_folds()
    assert [r.first for r in CommitLog(open_store(*location)).visible()] == list(range(1, 17))


@pytest.mark.parametrize("backend", REMOTE)
def test_committer_processes_racing_a_collector_commit_each_job_once(location):
    """Two processes committing (each commit seeded by the host's newest fold) while a
    collector checkpoints and deletes below it: every job lands once, and a fold read
    from the host agrees with a cold one."""
    uri, opts = location
    store = open_store(*location)
    ctx = mp.get_context("spawn")
    done, errors, passes = threading.Event(), [], []
    grace_s = 3.0

    def collect() -> None:
        try:
            while not done.is_set():
                deleted = _collect_pass(store, grace_s)
                if deleted:
                    passes.append(len(deleted))
                    if len(passes) == 3:
                        collected.set()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    collected = threading.Event()
    with ctx.Manager() as manager:
        barrier, stop = manager.Barrier(2), manager.Event()
        with ctx.Pool(2) as pool:
            pending = pool.starmap_async(race_worker.commit_racing,
                                         [(uri, opts, w, stop, barrier) for w in range(2)])
            collector = threading.Thread(target=collect)
            collector.start()
            try:
                collected.wait(180)  # three collections beside the committers, then stop
            finally:
                stop.set()
                outs = pending.get(120)
                done.set()
                collector.join(120)
    assert not errors, errors
    assert len(passes) >= 3, "the collector deleted records while the committers ran"
    _new_process()
    warm = CommitLog(store).visible()  # seeded by the host's newest fold
    forget_folds()
    visible = CommitLog(store).visible()
    assert warm == visible
    got = sorted((r.shard_id, r.first) for r in visible)
    want = sorted((f"w{w}", i) for w, (done, _) in enumerate(outs) for i in done)
    unknown = {(f"w{w}", i) for w, (_, unk) in enumerate(outs) for i in unk}
    assert [g for g in got if g not in unknown] == want
    assert len(got) == len(set(got))


@pytest.mark.parametrize("backend", ["s3"])
def test_a_torn_or_foreign_host_fold_is_a_miss(any_store):
    """Whatever the host's file holds, a commit's verdict is exact; an unusable file
    only costs the reads of a cold commit."""
    log = CommitLog(any_store, checkpoint_interval=None)
    for seq in range(1, 13):
        log.append(APPEND, _one(seq), job_id=f"j{seq}")
    path = _host_file(any_store)
    _new_process()
    warm = Counting(any_store)
    assert CommitLog(warm).append(APPEND, _one(13)).record.sequence == 13
    good = open(path, "rb").read()
    body = json.loads(good[commit_folds._HEADER.size:])
    other = dict(body, uri="s3://another/table")
    payload = json.dumps(other).encode()
    spoiled = {
        "torn": good[: len(good) // 2],
        "bit flip": good[:-3] + bytes([good[-3] ^ 1]) + good[-2:],
        "garbage": os.urandom(200),
        "another table's": commit_folds._HEADER.pack(len(payload), zlib.crc32(payload)) + payload,
    }
    for seq, (why, data) in enumerate(spoiled.items(), start=14):
        with open(path, "wb") as f:
            f.write(data)
        _new_process()
        cold = Counting(any_store)
        assert CommitLog(cold).append(APPEND, _one(seq)).record.sequence == seq, why
        assert sum(cold.calls.values()) > sum(warm.calls.values()), (why, cold.calls)
    forget_folds()
    assert [r.first for r in CommitLog(any_store).visible()] == list(range(1, 18))


@pytest.mark.parametrize("backend", REMOTE)
def test_a_host_fold_of_a_table_made_again_at_the_same_place_is_dropped(any_store):
    log = CommitLog(any_store, checkpoint_interval=10)
    for seq in range(1, 31):
        log.append(APPEND, _one(seq, "old"), job_id=f"old{seq}")
    for key in list(any_store.list("")):
        any_store.delete(key)  # the table deleted by hand; another process makes it again
    path = _host_file(any_store)
    assert os.path.exists(path)
    _new_process()
    log = CommitLog(any_store, checkpoint_interval=10)
    for seq in range(1, 6):
        assert log.append(APPEND, _one(seq, "new"), job_id=f"new{seq}").record.sequence == seq
    _new_process()  # the next process starts from the new table's fold, not the old one's
    warm = Counting(any_store)
    assert CommitLog(warm).append(APPEND, _one(6, "new")).record.sequence == 6
    assert warm.calls["get"] <= 2, warm.calls
    forget_folds()
    assert [(r.shard_id, r.first) for r in CommitLog(any_store).visible()] == [
        ("new", s) for s in range(1, 7)]


def test_a_fold_directory_others_can_write_is_not_used(tmp_path, monkeypatch):
    shared = tmp_path / f"memwal-folds-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(commit_folds, "_host_checked", False)
    monkeypatch.setattr(commit_folds, "_host_dir", None)
    assert commit_folds._file("s3://bucket/t", host=True) is None
    shared.chmod(0o700)
    monkeypatch.setattr(commit_folds, "_host_checked", False)
    assert commit_folds._file("s3://bucket/t", host=True).startswith(str(shared))


def test_local_and_memory_folds_stay_in_the_process(tmp_path):
    before = set(os.listdir(commit_folds._directory()))
    for uri in (str(tmp_path / "t.lance"), "memory://folds-stay-here"):
        CommitLog(open_store(uri)).append(APPEND, _one(1))
    assert set(os.listdir(commit_folds._directory())) == before
