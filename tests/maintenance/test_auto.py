"""Automatic maintenance: thresholds, one maintainer per table, crashes mid-round and
mid-gc finished by the next maintainer, failures recorded and retried, the backlog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from memwal_datasource import MemWalTable, hooks
from memwal_datasource.errors import StoreError
from memwal_datasource.maintenance.auto import BackgroundMaintainer, maintain_once
from memwal_datasource.maintenance.backlog import backlog
from memwal_datasource.maintenance.thresholds import Thresholds
from memwal_datasource.shard.leases import Leases
from memwal_datasource.table.view import TableView, create_table, read_table
from tests.helpers import SCHEMA, later, make_batch, new_shard
from tests.maintenance.test_compact import write

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.parametrize("backend", ["local", "s3"])
WAIT_S = 60


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


def appends(uri, opts, n: int, rows: int = 10) -> list[int]:
    """``n`` committed appends of ``rows`` new keys each, on two shards; the keys."""
    shards = [new_shard(), new_shard()]
    for i in range(n):
        write(uri, opts, shards[i % 2], [make_batch(i * rows, rows)])
    return list(range(n * rows))


def exactly_once(uri, opts, keys) -> None:
    got = Counter(read_table(uri, opts).column("id").to_pylist())
    assert got == Counter(keys), "a row is missing or read twice"


def thread_nice(pid: int) -> list[int]:
    """The nice value of every thread of process ``pid`` (Linux: nice is per thread)."""
    return [int(Path(t, "stat").read_text().rsplit(") ", 1)[1].split()[16])
            for t in Path(f"/proc/{pid}/task").iterdir()]


def expired_leases(table) -> Leases:
    """Leases judged an hour later: a dead maintainer's lease has expired."""
    return Leases(table.store, ttl_s=60, clock=lambda: time.time() + 3600)


def test_below_the_thresholds_nothing_runs_and_nothing_is_written(pk_table):
    uri, opts = pk_table
    keys = appends(uri, opts, 3)
    table = TableView(uri, opts)
    result = maintain_once(table, Thresholds(pending_records=4))
    assert not result.ran and result.before.pending_records == 3
    assert "below the thresholds" in result.line()
    assert not list(table.store.list("_memwal_leases/")) and not list(
        table.store.list("_memwal_maintenance/"))
    # Each bound alone starts compaction: records, bytes, age.
    for bound in (Thresholds(pending_records=3), Thresholds(pending_bytes=1),
                  Thresholds(pending_age_s=0.0)):
        assert bound.passed(3, result.before.pending_bytes, result.before.oldest_pending_age_s)
    result = maintain_once(table, Thresholds(pending_records=3), gc_clock=later(table))
    assert result.ran and result.compaction.rows == 30 and result.gc is not None
    assert "3 pending commit records >= 3" in result.line()
    stats = MemWalTable(uri, opts).stats()
    assert stats.pending_records == 0 and stats.compacted_through == 3
    done = stats.maintenance
    assert done["compaction"]["result"]["rows"] == 30 and not done["compaction"]["failing"]
    assert done["gc"]["result"]["wal_entries"] > 0  # the clock ran past the retention
    exactly_once(uri, opts, keys)


def test_one_maintainer_at_a_time(pk_table):
    uri, opts = pk_table
    keys = appends(uri, opts, 4)
    inside, release = threading.Event(), threading.Event()
    working = Counter()

    def leased(**_):
        working["now"] += 1
        working["max"] = max(working["max"], working["now"])

    def released(**_):
        working["now"] -= 1

    def first_round(**_):
        if not inside.is_set():
            inside.set()
            assert release.wait(WAIT_S)

    hooks.register("maintain.leased", leased)
    hooks.register("maintain.released", released)
    hooks.register("maintain.round", first_round)
    one_round = Thresholds(pending_records=1, max_records_per_round=1)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault(
        "first", maintain_once(TableView(uri, opts), one_round, label="first")))
    first.start()
    assert inside.wait(WAIT_S)  # the first maintainer is between two rounds, leased
    second = maintain_once(TableView(uri, opts), one_round, label="second")
    assert not second.ran and "'first'" in (second.busy_by or "")
    assert "another maintainer works on it" in second.line()
    release.set()
    first.join(WAIT_S)
    assert results["first"].error is None and results["first"].compaction.pending_records == 0
    assert working["max"] == 1 and working["now"] == 0
    exactly_once(uri, opts, keys)


def run_worker(uri, opts, kill_at: str) -> subprocess.CompletedProcess:
    """A forced pass in a child killed (SIGKILL) at hook point ``kill_at``, or at its
    ``n``-th object delete for ``gc.delete:n``."""
    kill = ({"MEMWAL_KILL_ON_DELETE": kill_at.split(":")[1]} if kill_at.startswith("gc.delete")
            else {"MEMWAL_KILL_AT": kill_at})
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEMWAL_STORAGE_OPTIONS": json.dumps(opts),
           **kill}
    return subprocess.run([sys.executable, "-m", "tests.maintain_worker", uri], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kill_at", ["compact.before_commit:2", "gc.delete:3"])
def test_a_maintainer_killed_mid_round_or_mid_gc_is_finished_by_the_next(pk_table, kill_at):
    uri, opts = pk_table
    keys = appends(uri, opts, 6)
    table = TableView(uri, opts)
    if kill_at.startswith("gc"):  # compacted already: the worker goes straight to gc
        maintain_once(table, Thresholds(pending_records=1, gc_every_s=1e9))
    dead = run_worker(uri, opts, kill_at)
    assert dead.returncode == -9, dead.stderr[-2000:]
    # Its lease outlives it: a maintainer now finds the table busy ...
    busy = maintain_once(table, Thresholds(pending_records=1), force=True)
    assert not busy.ran and "maintain_worker" in busy.busy_by
    # ... and once it expired, finishes what the dead one started.
    after = maintain_once(table, Thresholds(pending_records=1), force=True,
                          leases=expired_leases(table), gc_clock=later(table))
    assert after.error is None and after.ran, after.line()
    assert backlog(table).pending_records == 0
    if kill_at.startswith("gc"):  # the dead one recorded floors and deleted 2 objects
        assert after.gc.items(), "the next gc deletes what the dead one left"
        stored = [k for k in table.store.list("_mem_wal/") if "/wal/" in k]
        floors = table.commits.state().floors
        assert floors and all(
            int(TableView(uri, opts).tailer(s).first_position()) >= f for s, f in floors.items())
        assert stored, "entries at and above the floors stay"
    exactly_once(uri, opts, keys)
    assert sorted(table.dataset().to_table().column("id").to_pylist()) == keys


def test_a_failing_pass_is_recorded_and_retried_in_the_background(pk_table):
    uri, opts = pk_table
    keys = appends(uri, opts, 3)
    failures = []

    def store_error(**_):
        if not failures:
            failures.append(1)
            raise StoreError("injected: the store refused the request")

    passes: list = []
    done = threading.Event()

    def on_pass(result, **_):
        passes.append(result)
        if len(passes) == 2:
            done.set()

    hooks.register("compact.before_commit", store_error)
    hooks.register("maintain.pass", on_pass)
    m = BackgroundMaintainer(uri, opts, Thresholds(pending_records=1, check_every_s=0.05),
                             isolated=False)
    try:
        m.nudge()
        assert done.wait(WAIT_S), "the maintainer did not try again after its failure"
    finally:
        m.stop(WAIT_S)
    assert isinstance(passes[0].error, StoreError) and "FAILED: StoreError" in passes[0].line()
    assert passes[1].error is None and passes[1].compaction.rows == 30
    status = MemWalTable(uri, opts).stats().maintenance
    assert "injected" in status["compaction"]["last_error"]
    assert not status["compaction"]["failing"]  # the retry succeeded; the error stays shown
    exactly_once(uri, opts, keys)


def test_the_background_maintainer_follows_a_table_dropped_and_created_again(pk_table):
    uri, opts = pk_table
    appends(uri, opts, 3)
    passes: list = []
    ran = threading.Event()

    def on_pass(result, **_):
        passes.append(result)
        if result.compaction is not None:
            ran.set()

    hooks.register("maintain.pass", on_pass)
    m = BackgroundMaintainer(uri, opts, Thresholds(pending_records=1, check_every_s=0.05))
    try:
        m.nudge()
        assert ran.wait(WAIT_S), "the first table was not compacted"
        # Its passes run in a child process at the lowest CPU priority.
        child = m._child._proc  # noqa: SLF001
        assert child is not None and child.poll() is None
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 19
        assert set(thread_nice(child.pid)) == {19}, "a thread of the child (Lance's) is not"
        ran.clear()
        store = TableView(uri, opts).store
        store.delete_many(list(store.list("")))  # dropped: every object of the table gone
        create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
        keys = appends(uri, opts, 2)
        m.nudge()
        assert ran.wait(WAIT_S), "the table created again was not compacted"
    finally:
        m.stop(WAIT_S)
    assert passes[-1].error is None and passes[-1].compaction.rows == 20
    exactly_once(uri, opts, keys)
    assert sorted(TableView(uri, opts).dataset().to_table().column("id").to_pylist()) == keys
    assert child.wait(WAIT_S) is not None, "the child process outlived its maintainer"
