"""Issue 18: maintenance (compaction, checkpoints, gc) never loses or hides a committed row.

One deterministic test per interleaving, on local disk and the S3 server. The order
is forced with hooks (:mod:`memwal_datasource.hooks`) and threads that wait on
Events, never with sleeps. Time passing for retention is a gc ``clock`` that runs
ahead of the store's (``tests.helpers.later``) or one set relative to a round's
done marker.
"""

from __future__ import annotations

import threading
from collections import Counter

import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.commit import APPEND, OVERWRITE, CommitLog, CommittedRange, record_key
from memwal_datasource.compact import compact
from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import CommitRefused
from memwal_datasource.format import wal_key
from memwal_datasource.gc import collect, plan
from memwal_datasource.store import open_store
from memwal_datasource.table import MemWalTable, read_table
from memwal_datasource.wal import WalAppender
from memwal_datasource.writer import open_shard_writer
from tests.helpers import (
    SCHEMA,
    committed_view,
    later,
    new_shard,
    stream_rows,
)
from tests.test_compact import batch, write

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
    """read_table, MemWalTable.to_table() and base + committed tail agree; their rows."""
    by_read = as_dict(read_table(uri, opts))
    assert as_dict(MemWalTable(uri, opts).to_table()) == by_read
    assert committed_view(MemWalTable(uri, opts)) == Counter(by_read.items())
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
    table = MemWalTable(uri, opts)
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
        assert replans, "gc wrote its record without seeing P's commit"
        assert done.gc_sequence is None or done.gc_sequence > outcome["seq"]
        assert all(sp.floor <= 1 for sp in done.shards if sp.shard_id == shard)
        assert store.exists(wal_key(shard, 1)), "P's committed entry was deleted"
        want = p_rows if kind == OVERWRITE else {**p_rows, 10: "q-10"}
    else:
        assert isinstance(outcome.get("refused"), CommitRefused)
        assert "garbage collection released" in str(outcome["refused"])
        assert not any(r.job_id for r in CommitLog(store).records()
                       if any(x.epoch == 1 for x in r.ranges))
        want = {10: "q-10"}
    assert every_reader(uri, opts) == want
    tail_ids = {i for r in MemWalTable(uri, opts).committed_tail() if r.epoch == 1
                for i in (1, 2)}
    assert tail_ids == ({1, 2} if "seq" in outcome else set())
    # Later maintenance keeps it so: P's range is compacted, then released.
    collect(MemWalTable(uri, opts), retain_seconds=0, clock=later(table))
    assert every_reader(uri, opts) == want
    compact(MemWalTable(uri, opts))
    collect(MemWalTable(uri, opts), retain_seconds=0, clock=later(table, hours=4))
    assert every_reader(uri, opts) == want


# --- 3. a stalled committer whose sequence number was collected --------------------------

def test_stalled_committer_whose_sequence_was_collected_is_refused(pk_table):
    """X picks record 2 and stalls before its PUT; records 2..4 land, a checkpoint,
    compaction, and gc deletes records 1..3. X's PUT finds 2 free again: it must be
    refused (not created=True) and leave no record 2 behind; readers and a new stream
    agree that X's rows are not committed."""
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
        table = MemWalTable(uri, opts)
        compact(table)
        assert CommitLog(store).checkpoint().sequence == 4
        done = collect(table, retain_seconds=0, clock=later(table))
        assert record_key(n) in [k for k, _ in done.records]
        assert not store.exists(record_key(n))
    finally:
        pause.release()
        x.join(120)
    assert not x.is_alive()
    assert "result" not in out, f"X's record {n} was reported created: {out['result']}"
    assert isinstance(out.get("error"), CommitRefused), out.get("error")
    assert not store.exists(record_key(n)) or CommitLog(store).read(n).job_id != "job-x"
    log = CommitLog(store)
    assert all(r.job_id != "job-x" for r in log.records(after=log.first_stored() - 1))
    want = {i: f"n{i}-{i}" for i in range(1, 4)} | {0: "first-0"}
    assert every_reader(uri, opts) == want
    served = stream_rows(uri, opts)
    assert 500 not in served and set(served) <= set(want)


# --- 8. primary keys: a shard's writers commit in epoch order ----------------------------

def memtable_task(uri, opts, shard, ids, tag) -> CommittedRange:
    config = ShardWriterConfig(enable_memtable=True, max_wal_flush_interval_ms=10)
    with open_shard_writer(uri, shard, SCHEMA, config, opts) as w:
        w.put(batch(ids, tag))
    s = w.stats()
    return CommittedRange(shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows,
                          sstables=tuple(s.sstables))


def lsm_rows(uri, opts) -> dict[int, str]:
    from memwal_datasource.native import committed_lsm_scanner

    return as_dict(committed_lsm_scanner(MemWalTable(uri, opts)).to_table())


def test_older_writer_committing_after_a_newer_one_is_refused(pk_table):
    """P's task writes S, Q's task writes S (a newer epoch, same keys), Q commits, P
    commits: P is refused, and read_table, compaction and pylance's LSM view agree
    that every key holds Q's value."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    write(uri, opts, new_shard(), [batch([1, 2, 3, 4], "base")])
    compact(MemWalTable(uri, opts))
    p = memtable_task(uri, opts, shard, [1, 2, 3], "p")
    q = memtable_task(uri, opts, shard, [2, 3, 5], "q")
    assert q.epoch > p.epoch
    CommitLog(store).append(APPEND, [q], ordered_epochs=True)
    with pytest.raises(CommitRefused, match="newer writer"):
        CommitLog(store).append(APPEND, [p], ordered_epochs=True)
    want = {1: "base-1", 2: "q-2", 3: "q-3", 4: "base-4", 5: "q-5"}
    assert every_reader(uri, opts) == want
    assert lsm_rows(uri, opts) == want
    compact(MemWalTable(uri, opts))
    assert as_dict(MemWalTable(uri, opts).dataset().to_table()) == want
    assert every_reader(uri, opts) == want
    assert lsm_rows(uri, opts) == want


# --- 9. schema evolution ------------------------------------------------------------------

def test_reads_and_compaction_after_a_column_is_added(pk_table):
    uri, opts = pk_table
    a = new_shard()
    write(uri, opts, a, [batch([1, 2], "c")])
    compact(MemWalTable(uri, opts))
    write(uri, opts, a, [batch([3], "t")])  # committed, not compacted, no 'extra'
    table = MemWalTable(uri, opts)
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
    summary = compact(MemWalTable(uri, opts))
    assert summary.rounds and all(r.committed for r in summary.rounds)
    base = MemWalTable(uri, opts).dataset().to_table()
    assert {r["id"]: (r["v"], r["extra"]) for r in base.to_pylist()} == want
    assert {r["id"]: (r["v"], r["extra"]) for r in read_table(uri, opts).to_pylist()} == want
