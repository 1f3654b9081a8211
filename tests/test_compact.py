"""Compaction into the base Lance table: exactly once under re-runs, crashes between
any two steps, and a stalled compactor that wakes after another one finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.commit import APPEND, OVERWRITE, CommitLog, CommittedRange
from memwal_datasource.compact import CompactionError, compact
from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.store import open_store
from memwal_datasource.table import MemWalTable, create_table
from memwal_datasource.writer import open_shard_writer
from tests.helpers import SCHEMA, new_shard

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.parametrize("backend", ["local", "s3"])


def batch(ids, tag: str) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"{tag}-{i}" for i in ids])],
                           schema=SCHEMA)


def write(uri, opts, shard, batches, *, kind=APPEND, commit=True) -> None:
    """One task's writes to ``shard`` and (unless ``commit`` is false) its commit record."""
    config = ShardWriterConfig(enable_memtable=False, durable_write=False)
    with open_shard_writer(uri, shard, SCHEMA, config, opts) as w:
        for b in batches:
            w.put(b)
    s = w.stats()
    if commit:
        CommitLog(open_store(uri, opts)).append(kind, [CommittedRange(
            shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows)])


def history(uri, opts) -> dict[int, str]:
    """Commit a history of appends and updates (and a failed task); the newest value per key."""
    a, b = new_shard(), new_shard()
    write(uri, opts, a, [batch(range(0, 10), "a1")])
    write(uri, opts, b, [batch(range(5, 15), "b1")])          # updates 5..9
    write(uri, opts, a, [batch(range(100, 103), "lost")], commit=False)  # a failed task
    write(uri, opts, a, [batch([0, 1], "a2"), batch([200], "a2")])
    want = {i: f"a1-{i}" for i in range(0, 5)}
    want.update({i: f"b1-{i}" for i in range(5, 15)})
    want.update({0: "a2-0", 1: "a2-1", 200: "a2-200"})
    return want


def base_rows(uri, opts) -> dict[int, str]:
    rows = MemWalTable(uri, opts).dataset().to_table().to_pylist()
    assert len(rows) == len({r["id"] for r in rows}), "a key is in the base table twice"
    return {r["id"]: r["v"] for r in rows}


def test_compaction_folds_committed_rows_once(pk_table):
    uri, opts = pk_table
    want = history(uri, opts)
    table = MemWalTable(uri, opts)
    assert compact(table, dry_run=True).pending_records == 3
    summary = compact(table, max_records_per_round=2)
    assert [r.number for r in summary.rounds] == [1, 2] and all(r.committed for r in summary.rounds)
    assert base_rows(uri, opts) == want
    assert table.committed_tail() == []  # the WAL-tail view no longer shows them
    version = table.dataset().version
    assert compact(table).rounds == [] and table.dataset().version == version  # no-op re-run
    # New commits after a compaction are compacted by the next one, overwrite included.
    write(uri, opts, new_shard(), [batch([7, 300], "c")])
    assert len(table.committed_tail()) == 1
    compact(table)
    want.update({7: "c-7", 300: "c-300"})
    assert base_rows(uri, opts) == want
    write(uri, opts, new_shard(), [batch([1, 2], "o")], kind=OVERWRITE)
    compact(table)
    assert base_rows(uri, opts) == {1: "o-1", 2: "o-2"}


@pytest.mark.parametrize("point", ["compact.intent:1", "compact.before_commit:1",
                                   "compact.after_commit:1", "compact.before_commit:2"])
def test_killed_compactor_then_rerun_is_exactly_once(pk_table, point):
    uri, opts = pk_table
    want = history(uri, opts)
    env = dict(os.environ, MEMWAL_STORAGE_OPTIONS=json.dumps(opts), MEMWAL_KILL_AT=point)
    proc = subprocess.run([sys.executable, "-m", "tests.compact_worker", uri], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    env.pop("MEMWAL_KILL_AT")
    proc = subprocess.run([sys.executable, "-m", "tests.compact_worker", uri], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert base_rows(uri, opts) == want
    assert MemWalTable(uri, opts).committed_tail() == []


def test_stalled_compactor_wakes_after_another_finished(pk_table):
    uri, opts = pk_table
    want = history(uri, opts)
    held, release = threading.Event(), threading.Event()

    def hold(round):
        if threading.current_thread().name == "stalled":
            held.set()
            assert release.wait(60)

    hooks.register("compact.before_commit", hold)
    out: dict = {}
    stalled = threading.Thread(name="stalled", target=lambda: out.update(
        s=compact(MemWalTable(uri, opts), max_records_per_round=2, max_rounds=1)))
    try:
        stalled.start()
        assert held.wait(60)
        other = compact(MemWalTable(uri, opts), max_records_per_round=2)
        assert [r.committed for r in other.rounds] == [True, True]
        release.set()
        stalled.join(60)
    finally:
        release.set()
        hooks.clear()
    assert [r.committed for r in out["s"].rounds] == [False]  # Lance refused the stale mark
    assert base_rows(uri, opts) == want


def test_whole_table_read_is_exactly_once_at_every_stage(pk_table):
    from memwal_datasource import read_table

    uri, opts = pk_table
    want = history(uri, opts)

    def whole() -> dict[int, str]:
        rows = read_table(uri, opts).to_pylist()
        assert len(rows) == len({r["id"] for r in rows})
        return {r["id"]: r["v"] for r in rows}

    assert whole() == want  # nothing compacted: all from the tail
    compact(MemWalTable(uri, opts), max_records_per_round=2, max_rounds=1)
    assert whole() == want  # half in the base, half in the tail
    compact(MemWalTable(uri, opts))
    assert whole() == want == base_rows(uri, opts)
    write(uri, opts, new_shard(), [batch([3], "new")])
    assert whole() == {**want, 3: "new-3"}
    write(uri, opts, new_shard(), [batch([9], "ow")], kind=OVERWRITE)
    assert whole() == {9: "ow-9"}  # an uncompacted overwrite hides the base


def test_table_without_primary_key_is_refused_clearly(location):
    uri, opts = location
    create_table(uri, SCHEMA, storage_options=opts)
    write(uri, opts, new_shard(), [batch([1], "x")])
    with pytest.raises(CompactionError, match="no primary key.*primary_key"):
        compact(MemWalTable(uri, opts))
