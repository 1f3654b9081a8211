"""Issue 18: maintenance (compaction, checkpoints, gc) never loses or hides a committed row.

One deterministic test per interleaving, on local disk and the S3 server. The order
is forced with hooks (:mod:`memwal_datasource.hooks`) and threads that wait on
Events, never with sleeps. Time passing for retention is a gc ``clock`` that runs
ahead of the store's (``tests.helpers.later``) or one set relative to a round's
done marker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import CollectedError, CommitRefused
from memwal_datasource.format.memwal import wal_key
from memwal_datasource.log import commit as commit_mod
from memwal_datasource.log.commit import (
    APPEND,
    COMMITS_DIR,
    OVERWRITE,
    CommitLog,
    CommittedRange,
    record_key,
)
from memwal_datasource.log.rounds import done_ms, round_key
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.maintenance.gc import MIN_RETAIN_SECONDS, collect, plan
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.spark.stream import readable_from
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, create_table, read_table
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import (
    SCHEMA,
    DelegatingStore,
    committed_view,
    later,
    new_shard,
    stall_record_puts,
    stream_reader,
    stream_rows,
)
from tests.maintenance.test_compact import batch, write

pytestmark = pytest.mark.parametrize("backend", ["local", "s3"])


@pytest.fixture(autouse=True)
def _no_hooks_left():
    yield
    hooks.clear()


def append_entries(store, shard, *entries: tuple[list[int], str]):
    """A task's WAL-only writes to ``shard``, one entry per ``(ids, tag)``; its range."""
    app = WalAppender.open(store, shard)
    for ids, tag in entries:
        app.append(SCHEMA, [batch(ids, tag)])
    n = sum(len(ids) for ids, _ in entries)
    return app, CommittedRange(shard, app.epoch, app.first_position, app.last_position, n)


def as_dict(table: pa.Table) -> dict[int, str]:
    rows = table.to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"a key is read twice: {sorted(ids)}"
    return {r["id"]: r["v"] for r in rows}


def every_reader(uri, opts) -> dict[int, str]:
    """read_table, TableView.to_table() and base + committed tail agree; their rows."""
    by_read = as_dict(read_table(uri, opts))
    assert as_dict(TableView(uri, opts).to_table()) == by_read
    assert committed_view(TableView(uri, opts)) == Counter(by_read.items())
    return by_read


class Pause:
    """At hook ``point``, the first call from thread ``thread`` waits until released."""

    def __init__(self, point: str, thread: str):
        self.thread = thread
        self.reached, self.go = threading.Event(), threading.Event()
        self.context: dict = {}
        self._remove = hooks.register(point, self._hold)

    def _hold(self, **context):
        if threading.current_thread().name == self.thread and not self.reached.is_set():
            self.context = context
            self.reached.set()
            assert self.go.wait(120), "never released"

    def release(self):
        self.go.set()
        self._remove()


def in_thread(name: str, fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(name=name, target=run, daemon=True)
    t.start()
    return t, out


# --- 1. a commit that lands while gc runs is never hidden -------------------------------

@pytest.mark.parametrize("kind", [APPEND, OVERWRITE])
@pytest.mark.parametrize("when", ["gc.fenced", "gc.recorded"])
def test_commit_landing_while_gc_runs_is_never_hidden(pk_table, kind, when):
    """P wrote S@1 (uncommitted, its writer gone); Q wrote S@3 (after its sentinel at 2),
    committed and was compacted, so gc plans floor(S) = 4. P's driver commits between
    gc's plan and its record (``gc.fenced``): gc re-plans and keeps P's entry. After the
    record (``gc.recorded``) P's commit is refused. No reader ever loses P's rows; an
    overwrite never leaves the table reading empty."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    _, p_range = append_entries(store, shard, ([1, 2], "p"))
    assert (p_range.epoch, p_range.first, p_range.last) == (1, 1, 1)
    _, q_range = append_entries(store, shard, ([10], "q"))
    assert (q_range.epoch, q_range.first) == (2, 3)
    CommitLog(store).append(APPEND, [q_range])
    table = TableView(uri, opts)
    compact(table)
    assert plan(table, retain_seconds=0, clock=later(table)).shards[0].floor == 4

    outcome: dict = {}
    replans: list = []

    def commit_p(**_):
        if outcome:
            return
        try:  # a table without sharding: the Spark commit does not order epochs
            outcome["seq"] = CommitLog(store).append(kind, [p_range],
                                                     ordered_epochs=False).record.sequence
        except CommitRefused as exc:
            outcome["refused"] = exc

    hooks.register(when, commit_p)
    hooks.register("gc.replan", lambda **kw: replans.append(kw))
    done = collect(table, retain_seconds=0, clock=later(table))
    assert outcome, f"gc never reached {when}"
    p_rows = {1: "p-1", 2: "p-2"}
    if when == "gc.fenced":
        assert "seq" in outcome, outcome.get("refused")
        want = p_rows if kind == OVERWRITE else {**p_rows, 10: "q-10"}
        assert every_reader(uri, opts) == want  # P's rows are neither lost nor hidden
        assert replans, "gc wrote its record without seeing P's commit"
        assert done.gc_sequence is None or done.gc_sequence > outcome["seq"]
        assert all(sp.floor <= 1 for sp in done.shards if sp.shard_id == shard)
        assert store.exists(wal_key(shard, 1)), "P's committed entry was deleted"
    else:
        assert isinstance(outcome.get("refused"), CommitRefused)
        assert "garbage collection released" in str(outcome["refused"])
        assert not any(r.job_id for r in CommitLog(store).records()
                       if any(x.epoch == 1 for x in r.ranges))
        want = {10: "q-10"}
    assert every_reader(uri, opts) == want
    tail_ids = {i for r in TableView(uri, opts).committed_tail() if r.epoch == 1
                for i in (1, 2)}
    assert tail_ids == ({1, 2} if "seq" in outcome else set())
    # Later maintenance keeps it so: P's range is compacted, then released.
    collect(TableView(uri, opts), retain_seconds=0, clock=later(table))
    assert every_reader(uri, opts) == want
    compact(TableView(uri, opts))
    collect(TableView(uri, opts), retain_seconds=0, clock=later(table, hours=4))
    assert every_reader(uri, opts) == want


# --- 2. a whole-table read racing compaction and gc ---------------------------------------

class PausingLog(DelegatingStore):
    """The first read of the commit log waits for ``go`` (the table's ``log_pause``)."""

    def __init__(self, inner, table):
        super().__init__(inner)
        self.table = table

    def _maybe(self, key):
        if key.startswith(COMMITS_DIR) and self.table.at == "before_fold":
            self.table.pause()

    def get(self, key):
        self._maybe(key)
        return self.inner.get(key)

    def head(self, key):
        self._maybe(key)
        return self.inner.head(key)

    def list(self, prefix):
        self._maybe(prefix)
        return self.inner.list(prefix)


class PausingTable(TableView):
    """A table whose reads pause once, at ``at``, until ``go`` is set.

    In ``to_table``: ``before_fold`` is the first read of the commit log;
    ``after_fold`` is the first ``dataset()`` call (the log is folded, the base
    version is not fixed yet); ``after_plan`` the second (the snapshot is planned,
    the base and the tail's WAL entries are not read yet).
    """

    def __init__(self, uri, opts, at: str):
        super().__init__(uri, opts)
        self.store = PausingLog(self.store, self)
        self.commits = CommitLog(self.store)
        self.at, self.calls = at, 0
        self.reached, self.go = threading.Event(), threading.Event()

    def pause(self):
        if not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(120), "never released"

    def dataset(self, version=None):
        self.calls += 1
        if (self.at, self.calls) in (("after_fold", 1), ("after_plan", 2)):
            self.pause()
        return super().dataset(version)


@pytest.mark.parametrize("keyed", [True, False], ids=["pk", "plain"])
@pytest.mark.parametrize("at", ["before_fold", "after_fold", "after_plan"])
def test_whole_table_read_racing_compaction_and_gc(location, keyed, at):
    """to_table() pauses before its fold, after it, or after its whole plan while a
    round commits the tail, a checkpoint is taken and gc releases the tail's WAL
    entries and the records below the checkpoint: it returns every committed row
    exactly once (re-planning once itself where it met collected entries)."""
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"] if keyed else [], storage_options=opts)
    a, b = new_shard(), new_shard()
    want: Counter = Counter()
    for i, shard in enumerate([a, b, a]):
        ids = [10 * i, 10 * i + 1]
        write(uri, opts, shard, [batch(ids, f"c{i}")])
        want.update((j, f"c{i}-{j}") for j in ids)
    compact(TableView(uri, opts))
    for i, shard in enumerate([b, a, b], start=3):
        ids = [10 * i, 10 * i + 1]
        write(uri, opts, shard, [batch(ids, f"t{i}")])
        want.update((j, f"t{i}-{j}") for j in ids)
    assert len(TableView(uri, opts).committed_tail()) == 3
    reader = PausingTable(uri, opts, at)
    t, out = in_thread("reader", reader.to_table)
    try:
        assert reader.reached.wait(120)
        table = TableView(uri, opts)
        assert compact(table).rounds[0].committed
        CommitLog(open_store(uri, opts)).checkpoint()
        done = collect(table, retain_seconds=0, clock=later(table))
    finally:
        reader.go.set()
        t.join(120)
    assert not t.is_alive()
    assert "error" not in out, repr(out.get("error"))
    got = Counter((r["id"], r["v"]) for r in out["result"].to_pylist())
    assert got == want
    assert {sp.shard_id for sp in done.shards} == {a, b}  # the tail's entries went
    assert done.records  # and records below the checkpoint
    assert Counter((r["id"], r["v"]) for r in read_table(uri, opts).to_pylist()) == want
    assert committed_view(TableView(uri, opts)) == want


# --- 3. a stalled committer whose sequence number was collected --------------------------

@pytest.mark.parametrize("stall", ["inside_put", "past_deadline"])
def test_stalled_committer_whose_sequence_was_collected_is_never_lost(pk_table, stall,
                                                                      monkeypatch):
    """X picks record 2 and stalls before its PUT; records 2..4 land, a checkpoint,
    compaction, and gc deletes records 1..3. X's PUT finds 2 free again: it must never
    be reported created at 2 (nobody reads it there). Its verdict is exact: either it
    is refused (and X's rows are not committed), or X commits again at a fresh number
    that every reader and a new stream then see (what the commit log does now: the
    checkpoint covering 2 says whose record it folded there). ``inside_put``: the stall
    is inside X's PUT, after its last check (its monotonic clock, read when the PUT
    returns, shows it). ``past_deadline``: X's clock says the stall outlasted
    COMMIT_DEADLINE_S, so X checks again before its PUT. (A stall X's clock never sees,
    while the store's runs past the retention, breaks the clocks' assumption of
    docs/protocol.md, invariant 4.)"""
    uri, opts = pk_table
    store = open_store(uri, opts)
    a = new_shard()
    write(uri, opts, a, [batch([0], "first")])  # record 1
    _, x_range = append_entries(store, new_shard(), ([500], "x"))
    pause = Pause("commit.before", "X")
    x, out = in_thread("X", CommitLog(store).append, APPEND, [x_range], job_id="job-x")
    try:
        assert pause.reached.wait(120)
        n = pause.context["sequence"]
        assert n == 2
        for i in range(1, 4):  # records 2, 3, 4
            write(uri, opts, a, [batch([i], f"n{i}")])
        table = TableView(uri, opts)
        compact(table)
        assert CommitLog(store).checkpoint().sequence == 4
        done = collect(table, retain_seconds=0, clock=later(table))
        assert record_key(n) in [k for k, _ in done.records]
        assert not store.exists(record_key(n))
        if stall == "past_deadline":
            real = time.monotonic
            commit_mod.time = SimpleNamespace(
                time=time.time, monotonic=lambda: real() + 2 * commit_mod.COMMIT_DEADLINE_S)
        else:
            stall_record_puts(monkeypatch, store)  # X's PUT of n is the next record PUT
    finally:
        pause.release()
        x.join(120)
        commit_mod.time = time
    assert not x.is_alive()
    want = {i: f"n{i}-{i}" for i in range(1, 4)} | {0: "first-0"}
    log = CommitLog(store)
    mine = [r for r in log.records(after=log.first_stored() - 1) if r.job_id == "job-x"]
    if "result" in out:  # re-checked or told its PUT was orphaned: a fresh number
        assert out["result"].created and out["result"].record.sequence > 5
        assert [r.sequence for r in mine] == [out["result"].record.sequence]
        want[500] = "x-500"
        assert every_reader(uri, opts) == want
        assert 500 in stream_rows(uri, opts)
        return
    assert "result" not in out, f"X's record {n} was reported created: {out['result']}"
    assert isinstance(out.get("error"), CommitRefused), out.get("error")
    assert not store.exists(record_key(n)) or CommitLog(store).read(n).job_id != "job-x"
    assert mine == []
    assert every_reader(uri, opts) == want
    served = stream_rows(uri, opts)
    assert 500 not in served and set(served) <= set(want)


def test_rerun_of_a_key_whose_record_was_collected_commits_nothing(pk_table):
    """A keyed job commits, is compacted, checkpointed and its record collected; the
    job re-run with the same key (new entries) is still a duplicate."""
    from memwal_datasource.log.commit import Txn

    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    _, first = append_entries(store, shard, ([1], "once"))
    assert CommitLog(store).append(APPEND, [first], txn=Txn("app", 7)).created
    write(uri, opts, shard, [batch([2], "other")])
    table = TableView(uri, opts)
    compact(table)
    CommitLog(store).checkpoint()
    done = collect(table, retain_seconds=0, clock=later(table))
    assert record_key(1) in [k for k, _ in done.records] and not store.exists(record_key(1))
    _, again = append_entries(store, shard, ([1], "twice"))
    res = CommitLog(store).append(APPEND, [again], txn=Txn("app", 7))
    assert not res.created and res.record.sequence == 1
    assert every_reader(uri, opts) == {1: "once-1", 2: "other-2"}


# --- 4. retention counts from the round's commit, on the store's clock ------------------

def test_retention_counts_from_the_rounds_done_marker_on_the_stores_clock(pk_table, caplog):
    """Records whose writing driver's clock says they are 3 hours old, compacted just
    now, are not released with a 1-hour retention; released exactly when the store's
    clock passes the round's done marker plus the retention; a retention below the
    minimum is raised to it, with a warning."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    real = time.time
    fake = SimpleNamespace(time=lambda: real() - 3 * 3600, monotonic=time.monotonic)
    orig = commit_mod.time
    commit_mod.time = fake  # the writing driver's clock is 3 hours behind
    try:
        write(uri, opts, shard, [batch([1, 2], "old")])
        write(uri, opts, shard, [batch([3], "old")])
    finally:
        commit_mod.time = orig
    log = CommitLog(store)
    assert all(r.created_ms < real() * 1000 - 2 * 3600_000 for r in log.records())
    table = TableView(uri, opts)
    compact(table)
    entries = [wal_key(shard, p) for p in (1, 3)]  # 2 is the second writer's sentinel
    kept = collect(table, retain_seconds=3600)  # the store's clock: just compacted
    assert kept.shards == [] and kept.gc_sequence is None
    assert all(store.exists(k) for k in entries)
    assert kept.pending_seq == 2 and kept.releasable_seq == 0
    stamp = done_ms(store, 1)
    assert stamp is not None

    def at(offset_s: float):
        return lambda: stamp + int(offset_s * 1000)

    caplog.set_level(logging.WARNING, logger="memwal_datasource.maintenance.gc")
    low = collect(table, retain_seconds=1, clock=at(MIN_RETAIN_SECONDS - 5))
    assert low.retain_seconds == MIN_RETAIN_SECONDS
    assert "below the minimum" in caplog.text
    assert low.shards == [] and all(store.exists(k) for k in entries)
    assert collect(table, retain_seconds=60, clock=at(55)).shards == []
    assert all(store.exists(k) for k in entries)
    done = collect(table, retain_seconds=1, clock=at(MIN_RETAIN_SECONDS + 5))
    assert [sp.floor for sp in done.shards] == [4]
    assert not any(store.exists(k) for k in entries)
    assert every_reader(uri, opts) == {1: "old-1", 2: "old-2", 3: "old-3"}


# --- 6. a new stream from 'earliest' and commit order inverted on a shard ---------------

def test_new_stream_never_starts_before_collected_entries(pk_table):
    """On shard S: A (epoch 1) wrote 1..2, B (epoch 2) 4, C (epoch 3) 6..7 (3 and 5 are
    sentinels). C commits first (r1), then A (r2), both compacted; then B (r3). gc's
    floor is 4: r1 is still readable but r2 is not, so 'earliest' is after r2."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    _, ra = append_entries(store, shard, ([1], "a"), ([2], "a"))
    _, rb = append_entries(store, shard, ([4], "b"))
    _, rc = append_entries(store, shard, ([6], "c"), ([7], "c"))
    assert [(r.first, r.last) for r in (ra, rb, rc)] == [(1, 2), (4, 4), (6, 7)]
    log = CommitLog(store)
    r1 = log.append(APPEND, [rc], ordered_epochs=False).record.sequence
    r2 = log.append(APPEND, [ra], ordered_epochs=False).record.sequence
    table = TableView(uri, opts)
    compact(table)
    log.append(APPEND, [rb], ordered_epochs=False)
    done = collect(table, retain_seconds=0, clock=later(table))
    assert [sp.floor for sp in done.shards] == [4]
    assert store.exists(wal_key(shard, 6)) and not store.exists(wal_key(shard, 1))
    assert r1 < r2
    assert readable_from(CommitLog(store)) == r2 + 1
    reader = stream_reader(uri, opts)
    start = reader.initialOffset()
    assert start["commit"] == r2
    assert sorted(stream_rows(uri, opts)) == [4]
    assert every_reader(uri, opts) == {1: "a-1", 2: "a-2", 4: "b-4", 6: "c-6", 7: "c-7"}


# --- 7. gc keeps the round intents stored base versions need ------------------------------

def cleanup_old_versions(table: TableView) -> None:
    table.dataset().cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)


def three_rounds(uri, opts) -> tuple[list[int], dict[int, str]]:
    """Three compaction rounds (their base versions) and an uncompacted tail; the rows."""
    shard = new_shard()
    table = TableView(uri, opts)
    versions = []
    for i in range(3):
        write(uri, opts, shard, [batch([i, 100 + i], f"r{i}")])
        compact(table)
        versions.append(table.dataset().version)
    write(uri, opts, shard, [batch([7], "tail")])
    want = every_reader(uri, opts)
    for v in versions:
        assert as_dict(table.to_table(base_version=v)) == want
    return versions, want


def test_older_base_versions_read_the_whole_table_after_gc(pk_table):
    """gc keeps every round intent a stored base version records, and reading the
    table at an older base version after gc released the WAL entries of the rounds
    after it returns the whole table, or raises CollectedError naming the fix; never
    a table without those rounds' rows."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    versions, want = three_rounds(uri, opts)
    table = TableView(uri, opts)
    done = collect(table, retain_seconds=0, clock=later(table))
    assert done.shards
    assert all(store.exists(round_key(n)) for n in (1, 2, 3))
    for v in versions:  # every stored version still reads, and reads the whole table
        try:
            got = as_dict(TableView(uri, opts).to_table(base_version=v))
        except CollectedError as exc:
            assert "newer version" in str(exc)
            continue
        assert got == want, f"to_table(base_version={v}) after gc"


def test_base_version_cleaned_up_by_lance_raises_collected_error(pk_table):
    """After Lance's cleanup_old_versions, gc deletes the intents only removed versions
    needed; reading such a version raises CollectedError naming the fix."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    versions, want = three_rounds(uri, opts)
    table = TableView(uri, opts)
    cleanup_old_versions(table)
    collect(TableView(uri, opts), retain_seconds=0, clock=later(table))
    assert not store.exists(round_key(1)) and not store.exists(round_key(2))
    assert store.exists(round_key(3))
    with pytest.raises(CollectedError, match="newer version"):
        TableView(uri, opts).to_table(base_version=versions[0])
    assert every_reader(uri, opts) == want


class PausePut(DelegatingStore):
    """Pauses the first ``put_if_absent`` of ``key`` until released."""

    def __init__(self, inner, key: str):
        super().__init__(inner)
        self.key = key
        self.reached, self.go = threading.Event(), threading.Event()

    def put_if_absent(self, key, data):
        if key == self.key and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(120), "never released"
        self.inner.put_if_absent(key, data)


def test_stale_compactor_recreating_a_collected_intent_leaves_none(pk_table):
    """Compactor X plans round 1 (one record) and stalls before writing its intent;
    another compactor commits round 1 (both records) and round 2, old versions are
    cleaned up and gc deletes intent 1. X's intent 1 would be wrong: it is removed."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    write(uri, opts, shard, [batch([1], "a")])
    write(uri, opts, shard, [batch([2], "b")])
    stalled = PausePut(open_store(uri, opts), round_key(1))
    x_table = TableView(uri, opts, store=stalled)
    t, out = in_thread("X", compact, x_table, max_records_per_round=1)
    try:
        assert stalled.reached.wait(120)
        table = TableView(uri, opts)
        first = compact(table).rounds[0]
        assert (first.number, first.upto_seq) == (1, 2)
        write(uri, opts, shard, [batch([3], "c")])
        assert compact(table).rounds[0].number == 2
        cleanup_old_versions(table)
        collect(table, retain_seconds=0, clock=later(table))
        assert not store.exists(round_key(1))
    finally:
        stalled.go.set()
        t.join(120)
    assert not t.is_alive()
    assert "error" not in out, repr(out.get("error"))
    assert all(r.number > 2 for r in out["result"].rounds)
    assert not store.exists(round_key(1)), table.round(1)
    want = {1: "a-1", 2: "b-2", 3: "c-3"}
    assert as_dict(TableView(uri, opts).dataset().to_table()) == want
    assert every_reader(uri, opts) == want


def test_stalled_compactor_whose_round_was_committed_and_collected(pk_table):
    """Compactor X writes round 1's intent and stalls before reading its entries;
    another compactor commits round 1 and gc releases its WAL entries. X must find
    its round already committed (as it does without gc), not fail or commit twice."""
    uri, opts = pk_table
    shard = new_shard()
    write(uri, opts, shard, [batch([1], "a")])
    write(uri, opts, shard, [batch([2], "b")])
    pause = Pause("compact.intent", "X")
    t, out = in_thread("X", compact, TableView(uri, opts))
    try:
        assert pause.reached.wait(120)
        table = TableView(uri, opts)
        assert compact(table).rounds[0].committed
        done = collect(table, retain_seconds=0, clock=later(table))
        assert done.shards
    finally:
        pause.release()
        t.join(120)
    assert not t.is_alive()
    assert "error" not in out, repr(out.get("error"))
    assert [r.committed for r in out["result"].rounds] == [False]
    want = {1: "a-1", 2: "b-2"}
    assert as_dict(TableView(uri, opts).dataset().to_table()) == want
    assert every_reader(uri, opts) == want


# --- 8. primary keys: a shard's writers commit in epoch order ----------------------------

def memtable_task(uri, opts, shard, ids, tag) -> CommittedRange:
    config = ShardWriterConfig(enable_memtable=True, max_wal_flush_interval_ms=10)
    with open_shard_writer(uri, shard, SCHEMA, config, opts) as w:
        w.put(batch(ids, tag))
    s = w.stats()
    return CommittedRange(shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows,
                          sstables=tuple(s.sstables))


def lsm_rows(uri, opts) -> dict[int, str]:
    from memwal_datasource.write.native import committed_lsm_scanner

    return as_dict(committed_lsm_scanner(TableView(uri, opts)).to_table())


def test_older_writer_committing_after_a_newer_one_is_refused(pk_table):
    """P's task writes S, Q's task writes S (a newer epoch, same keys), Q commits, P
    commits: P is refused, and read_table, compaction and pylance's LSM view agree
    that every key holds Q's value."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    write(uri, opts, new_shard(), [batch([1, 2, 3, 4], "base")])
    compact(TableView(uri, opts))
    p = memtable_task(uri, opts, shard, [1, 2, 3], "p")
    q = memtable_task(uri, opts, shard, [2, 3, 5], "q")
    assert q.epoch > p.epoch
    CommitLog(store).append(APPEND, [q], ordered_epochs=True)
    with pytest.raises(CommitRefused, match="newer writer"):
        CommitLog(store).append(APPEND, [p], ordered_epochs=True)
    want = {1: "base-1", 2: "q-2", 3: "q-3", 4: "base-4", 5: "q-5"}
    assert every_reader(uri, opts) == want
    assert lsm_rows(uri, opts) == want
    compact(TableView(uri, opts))
    assert as_dict(TableView(uri, opts).dataset().to_table()) == want
    assert every_reader(uri, opts) == want
    assert lsm_rows(uri, opts) == want


# --- 9. schema evolution ------------------------------------------------------------------

def test_reads_and_compaction_after_a_column_is_added(pk_table):
    uri, opts = pk_table
    a = new_shard()
    write(uri, opts, a, [batch([1, 2], "c")])
    compact(TableView(uri, opts))
    write(uri, opts, a, [batch([3], "t")])  # committed, not compacted, no 'extra'
    table = TableView(uri, opts)
    table.dataset().add_columns(pa.field("extra", pa.int32()))
    got = read_table(uri, opts)
    assert got.column_names == ["id", "v", "extra"]
    assert {r["id"]: (r["v"], r["extra"]) for r in got.to_pylist()} == {
        1: ("c-1", None), 2: ("c-2", None), 3: ("t-3", None)}
    wide = SCHEMA.append(pa.field("extra", pa.int32()))
    with open_shard_writer(uri, a, wide, ShardWriterConfig(enable_memtable=False), opts) as w:
        w.put(pa.record_batch([pa.array([4], pa.int64()), pa.array(["w-4"]),
                               pa.array([7], pa.int32())], schema=wide))
    s = w.stats()
    CommitLog(open_store(uri, opts)).append(APPEND, [CommittedRange(
        a, s.epoch, s.first_wal_position, s.last_wal_position, s.rows)])
    want = {1: ("c-1", None), 2: ("c-2", None), 3: ("t-3", None), 4: ("w-4", 7)}
    assert {r["id"]: (r["v"], r["extra"]) for r in read_table(uri, opts).to_pylist()} == want
    summary = compact(TableView(uri, opts))
    assert summary.rounds and all(r.committed for r in summary.rounds)
    base = TableView(uri, opts).dataset().to_table()
    assert {r["id"]: (r["v"], r["extra"]) for r in base.to_pylist()} == want
    assert {r["id"]: (r["v"], r["extra"]) for r in read_table(uri, opts).to_pylist()} == want


def test_compactors_with_different_round_bounds_fold_each_record_once(pk_table):
    """Two actors: compactor X, bounding rounds at one record's bytes, writes round 1's
    intent and stalls; Y, with the default bounds, finds X's intent and folds exactly its
    records as round 1, the rest as round 2. X wakes to a round already committed. The
    intent fixes a round, whatever bounds each compactor was given."""
    uri, opts = pk_table
    shard = new_shard()
    for i, tag in enumerate("abc"):
        write(uri, opts, shard, [batch([i, 10 + i], tag)])
    pause = Pause("compact.intent", "X")
    t, out = in_thread("X", compact, TableView(uri, opts), max_bytes_per_round=1, max_rounds=1)
    try:
        assert pause.reached.wait(120)
        rounds = compact(TableView(uri, opts)).rounds
        assert [(r.number, r.after_seq, r.upto_seq, r.committed) for r in rounds] == [
            (1, 0, 1, True), (2, 1, 3, True)]
    finally:
        pause.release()
        t.join(120)
    assert not t.is_alive() and "error" not in out, repr(out.get("error"))
    assert [(r.number, r.committed) for r in out["result"].rounds] == [(1, False)]
    want = {i: f"{tag}-{i}" for i, tag in enumerate("abc")}
    want |= {10 + i: f"{tag}-{10 + i}" for i, tag in enumerate("abc")}
    assert as_dict(TableView(uri, opts).dataset().to_table()) == want
    assert every_reader(uri, opts) == want
