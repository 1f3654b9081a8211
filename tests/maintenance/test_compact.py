"""Compaction into the base Lance table: exactly once under re-runs, crashes between
any two steps, and a stalled compactor that wakes after another one finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from memwal_datasource import CompactionError, hooks
from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.format.table_schema import ROW_KEY
from memwal_datasource.log.commit import APPEND, OVERWRITE, CommitLog, CommittedRange
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, create_table
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA, new_shard

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.parametrize("backend", ["local", "s3"])


def batch(ids, tag: str) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"{tag}-{i}" for i in ids])],
                           schema=SCHEMA)


def write(uri, opts, shard, batches, *, kind=APPEND, commit=True, memtable=False) -> list[str]:
    """One task's writes to ``shard`` and (unless ``commit`` is false) its commit record.

    Returns the SSTables the task flushed (MemTable mode, pylance's native writer).
    """
    config = (ShardWriterConfig(enable_memtable=True, max_wal_flush_interval_ms=10) if memtable
              else ShardWriterConfig(enable_memtable=False, durable_write=False))
    with open_shard_writer(uri, shard, SCHEMA, config, opts) as w:
        for b in batches:
            w.put(b)
    s = w.stats()
    if commit:
        CommitLog(open_store(uri, opts)).append(kind, [CommittedRange(
            shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows, s.bytes,
            sstables=tuple(s.sstables))])
    return list(s.sstables)


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
    rows = TableView(uri, opts).dataset().to_table().to_pylist()
    assert len(rows) == len({r["id"] for r in rows}), "a key is in the base table twice"
    return {r["id"]: r["v"] for r in rows}


def test_compaction_folds_committed_rows_once(pk_table):
    uri, opts = pk_table
    want = history(uri, opts)
    table = TableView(uri, opts)
    assert compact(table, dry_run=True).pending_records == 3
    summary = compact(table, max_records_per_round=2)
    assert [r.number for r in summary.rounds] == [1, 2] and all(r.committed for r in summary.rounds)
    # Each round says how much of its time Lance's merge took (the rest is ours).
    assert all(0 < r.merge_seconds < r.seconds for r in summary.rounds)
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


def test_rounds_stop_before_the_record_that_passes_the_byte_bound(pk_table):
    """``max_bytes_per_round`` bounds the rows a round holds: a round ends before the
    record that would pass it, a record larger than the bound is a round of its own,
    and the folded table is the same whatever the bounds."""
    uri, opts = pk_table
    want = history(uri, opts)
    sizes = [sum(r.bytes for r in rec.ranges) for rec in CommitLog(open_store(uri, opts)).records()]
    assert len(sizes) == 3 and all(sizes)
    summary = compact(TableView(uri, opts), max_bytes_per_round=sizes[0] + sizes[1])
    assert [(r.after_seq, r.upto_seq) for r in summary.rounds] == [(0, 2), (2, 3)]
    assert base_rows(uri, opts) == want
    for rec in (batch([1, 2], "x"), batch([3], "y")):
        write(uri, opts, new_shard(), [rec])
    summary = compact(TableView(uri, opts), max_bytes_per_round=1)
    assert [(r.after_seq, r.upto_seq) for r in summary.rounds] == [(3, 4), (4, 5)]
    assert base_rows(uri, opts) == want | {1: "x-1", 2: "x-2", 3: "y-3"}


def test_a_round_planned_over_collected_records_falls_back_to_the_record_bound(pk_table,
                                                                              monkeypatch):
    """A compactor that stalled while others folded and gc freed the records it plans
    over cannot size its round by bytes: it plans by records, and its intent's put then
    finds the round done (``next_round``)."""
    from memwal_datasource.errors import MemWalError
    from memwal_datasource.maintenance.compact import round_end

    uri, opts = pk_table
    history(uri, opts)
    table = TableView(uri, opts)
    assert round_end(table, 0, 3, 1) == 1

    def collected(after=0):
        raise MemWalError("commit records before checkpoint 9 were garbage-collected")
        yield  # a generator, as records() is

    monkeypatch.setattr(table.commits, "records", collected)
    assert round_end(table, 0, 3, 1) == 3


def test_deletes_on_a_composite_key_compact(location):
    """A two-column primary key (an ``int32`` and a ``large_string``): a round's deletes
    drop exactly the keys deleted (the same ``a`` under another ``b`` stays), with
    updates beside them, by scan and through the base."""
    from memwal_datasource.format.memwal import TOMBSTONE

    uri, opts = location
    schema = pa.schema([pa.field("a", pa.int32(), False), pa.field("b", pa.large_string(), False),
                        pa.field("v", pa.string())])
    create_table(uri, schema, primary_key=["a", "b"], storage_options=opts)
    marked = schema.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))

    def put(rows, dead=False):
        a, b, v = zip(*rows, strict=True)
        batch = pa.record_batch([pa.array(a, pa.int32()), pa.array(b, pa.large_string()),
                                 pa.array(v, pa.string()), pa.array([dead] * len(rows))],
                                schema=marked)
        shard = new_shard()
        config = ShardWriterConfig(enable_memtable=False, durable_write=False)
        with open_shard_writer(uri, shard, marked, config, opts) as w:
            w.put(batch)
        s = w.stats()
        CommitLog(open_store(uri, opts)).append(APPEND, [CommittedRange(
            shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows, s.bytes)])

    put([(i, k, f"{i}{k}") for i in range(20) for k in ("x", "y'q")])
    compact(TableView(uri, opts))
    put([(3, "x", None), (4, "y'q", None), (5, "x", None)], dead=True)
    put([(6, "x", "new"), (5, "y'q", "new")])
    compact(TableView(uri, opts))
    rows = TableView(uri, opts).dataset().to_table().to_pylist()
    got = {(r["a"], r["b"]): r["v"] for r in rows}
    assert len(got) == len(rows)
    want = {(i, k): f"{i}{k}" for i in range(20) for k in ("x", "y'q")}
    for key in ((3, "x"), (4, "y'q"), (5, "x")):
        del want[key]
    want |= {(6, "x"): "new", (5, "y'q"): "new"}
    assert got == want


@pytest.mark.parametrize("fold", [True, False])
def test_a_round_folds_the_key_index_only_when_due(pk_table, fold, monkeypatch):
    import importlib

    merge_join = importlib.import_module("memwal_datasource.maintenance.merge_join")
    monkeypatch.setattr(merge_join, "joins_by_scan", lambda *a, **k: False)
    monkeypatch.setattr(merge_join, "INDEX_FOLD", 1e-9 if fold else 1e9)
    uri, opts = pk_table
    table = TableView(uri, opts)
    write(uri, opts, new_shard(), [batch(range(10), "a")])
    compact(table)  # builds the index over the round's rows
    write(uri, opts, new_shard(), [batch(range(5, 30), "b")])
    compact(table)
    stats = table.dataset().stats.index_stats("id_idx")
    assert stats["num_unindexed_rows"] == (0 if fold else 25), stats  # updates are new rows
    assert base_rows(uri, opts) == {i: f"a-{i}" for i in range(5)} | {
        i: f"b-{i}" for i in range(5, 30)}


@pytest.mark.parametrize("join", ["index", "scan"])
def test_rounds_join_by_index_or_by_scan_alike(pk_table, join, monkeypatch):
    """A round joins its rows to the base through the key's BTREE (a base large next to
    the round, its keys in few pages) or by scanning the key column (``joins_by_scan``):
    the same table either way, and the first round builds the index either way."""
    import importlib

    from lance.dataset import MergeInsertBuilder

    merge_join = importlib.import_module("memwal_datasource.maintenance.merge_join")
    monkeypatch.setattr(merge_join, "joins_by_scan", lambda *a, **k: join == "scan")
    scans: list[bool] = []
    use_index = MergeInsertBuilder.use_index
    monkeypatch.setattr(MergeInsertBuilder, "use_index",
                        lambda self, on: scans.append(not on) or use_index(self, on))
    uri, opts = pk_table
    want = history(uri, opts)
    table = TableView(uri, opts)
    assert len(compact(table, max_records_per_round=1).rounds) == 3
    assert base_rows(uri, opts) == want
    assert any(i.field_names == ["id"] and i.index_type == "BTree"
               for i in table.dataset().describe_indices())
    write(uri, opts, new_shard(), [batch([3, 8, 400], "d")])  # updates and an insert
    compact(table)
    want.update({3: "d-3", 8: "d-8", 400: "d-400"})
    assert base_rows(uri, opts) == want
    assert scans == ([True] * 4 if join == "scan" else [])


def test_a_large_batch_joins_through_the_index_within_lances_memory_pool(pk_table,
                                                                          monkeypatch):
    """One append's batch of 40k wide rows, joined through the BTREE under a 60 MB pool:
    Lance charged every 8k-row slice of it the whole batch's 20 MB (the round failed,
    "Resources exhausted"). A pool too small for the round itself fails it with the fix
    first, commits nothing, and the round compacts once the pool is raised."""
    import importlib

    merge_join = importlib.import_module("memwal_datasource.maintenance.merge_join")
    monkeypatch.setattr(merge_join, "joins_by_scan", lambda *a, **k: False)  # the index
    uri, opts = pk_table
    table = TableView(uri, opts)
    write(uri, opts, new_shard(), [batch(range(10), "a")])
    compact(table)  # the first round builds the key's BTREE
    wide = pa.record_batch([pa.array(range(5, 40_005), pa.int64()), pa.array(["x" * 500] * 40_000)],
                           schema=SCHEMA)
    write(uri, opts, new_shard(), [wide])
    version = table.dataset().version
    monkeypatch.setenv("LANCE_MEM_POOL_SIZE", str(2 << 20))
    with pytest.raises(CompactionError,
                       match=r"^Set the environment variable LANCE_MEM_POOL_SIZE to \d+ "
                             r"\(bytes; now 2097152\).*round 2 .*40000 rows"):
        compact(table)
    assert table.dataset().version == version  # nothing committed
    monkeypatch.setenv("LANCE_MEM_POOL_SIZE", str(60_000_000))
    assert [r.rows for r in compact(table).rounds] == [40_000]
    want = {i: "a-" + str(i) for i in range(5)} | {i: "x" * 500 for i in range(5, 40_005)}
    assert base_rows(uri, opts) == want


def run_worker(uri, opts, point: str) -> None:
    """A compactor killed at hook ``point`` in a child process, then a full re-run."""
    env = dict(os.environ, MEMWAL_STORAGE_OPTIONS=json.dumps(opts), MEMWAL_KILL_AT=point)
    proc = subprocess.run([sys.executable, "-m", "tests.compact_worker", uri], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    env.pop("MEMWAL_KILL_AT")
    proc = subprocess.run([sys.executable, "-m", "tests.compact_worker", uri], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_whole_table_read_is_exactly_once_at_every_stage(pk_table):
    from memwal_datasource import read_table

    uri, opts = pk_table
    want = history(uri, opts)

    def whole() -> dict[int, str]:
        rows = read_table(uri, opts).to_pylist()
        assert len(rows) == len({r["id"] for r in rows})
        return {r["id"]: r["v"] for r in rows}

    assert whole() == want  # nothing compacted: all from the tail
    compact(TableView(uri, opts), max_records_per_round=2, max_rounds=1)
    assert whole() == want  # half in the base, half in the tail
    compact(TableView(uri, opts))
    assert whole() == want == base_rows(uri, opts)
    write(uri, opts, new_shard(), [batch([3], "new")])
    assert whole() == {**want, 3: "new-3"}
    write(uri, opts, new_shard(), [batch([9], "ow")], kind=OVERWRITE)
    assert whole() == {9: "ow-9"}  # an uncompacted overwrite hides the base


# --- tables without a primary key (Spark's default) ----------------------------------

@pytest.fixture
def plain_table(location):
    """(uri, storage_options) of a fresh table without a primary key, with a MemWAL."""
    uri, opts = location
    create_table(uri, SCHEMA, storage_options=opts)
    return uri, opts


@pytest.fixture
def legacy_plain_table(location):
    """A table without a primary key as this package created it before the hidden key
    became its primary key at creation: no ``_memwal_row`` until the first compaction."""
    import lance

    from memwal_datasource.options import lance_storage_options
    from memwal_datasource.table.view import ensure_mem_wal

    uri, opts = location
    ensure_mem_wal(lance.write_dataset(SCHEMA.empty_table(), uri,
                                       storage_options=lance_storage_options(opts)))
    return uri, opts


def plain_history(uri, opts) -> Counter:
    """The PK history on a table without a key: every committed row counts, duplicates too."""
    history(uri, opts)
    want = Counter((i, f"a1-{i}") for i in range(0, 10))
    want.update((i, f"b1-{i}") for i in range(5, 15))
    want.update([(0, "a2-0"), (1, "a2-1"), (200, "a2-200")])
    return want


def plain_base(uri, opts) -> Counter:
    """The base table's rows as a multiset; every row key unique and set."""
    rows = TableView(uri, opts).dataset().to_table().to_pylist()
    keys = [r[ROW_KEY] for r in rows]
    assert None not in keys and len(set(keys)) == len(keys), "a row key is missing or repeated"
    return Counter((r["id"], r["v"]) for r in rows)


def test_table_without_primary_key_compacts_exactly_once(plain_table):
    from memwal_datasource import read_table

    uri, opts = plain_table
    want = plain_history(uri, opts)
    table = TableView(uri, opts)
    summary = compact(table, max_records_per_round=2)
    assert [(r.number, r.committed) for r in summary.rounds] == [(1, True), (2, True)]
    assert summary.rows == sum(want.values()) == 23
    assert plain_base(uri, opts) == want
    assert table.committed_tail() == []
    whole = read_table(uri, opts)
    assert whole.column_names == ["id", "v"]  # the row key stays hidden
    assert Counter((r["id"], r["v"]) for r in whole.to_pylist()) == want
    version = table.dataset().version
    assert compact(table).rounds == [] and table.dataset().version == version  # no-op re-run
    write(uri, opts, new_shard(), [batch([7, 7], "c")])
    assert compact(table).rows == 2
    want.update([(7, "c-7"), (7, "c-7")])
    assert plain_base(uri, opts) == want
    write(uri, opts, new_shard(), [batch([1, 2], "o")], kind=OVERWRITE)
    compact(table)
    assert plain_base(uri, opts) == Counter([(1, "o-1"), (2, "o-2")])


KINDS = {"pk": (["id"], history, base_rows), "plain": ([], plain_history, plain_base)}
KILL_POINTS = ["compact.intent:1", "compact.before_commit:1", "compact.after_commit:1",
               "compact.before_commit:2"]


@pytest.mark.parametrize("kind,point", [("pk", p) for p in KILL_POINTS]
                         + [("plain", p) for p in KILL_POINTS[1:]]
                         + [("legacy", "compact.row_key:1")])
def test_killed_compactor_then_rerun_is_exactly_once(location, kind, point, request):
    uri, opts = location
    pk, make_history, read_base = KINDS["plain" if kind == "legacy" else kind]
    if kind == "legacy":
        request.getfixturevalue("legacy_plain_table")
    else:
        create_table(uri, SCHEMA, primary_key=pk, storage_options=opts)
    want = make_history(uri, opts)
    run_worker(uri, opts, point)
    assert read_base(uri, opts) == want
    assert TableView(uri, opts).committed_tail() == []


def paused(point: str, names: set[str]):
    """At hook ``point``, threads named in ``names`` stop until their Event is set.

    Returns ({name: reached}, {name: release}) Events.
    """
    reached = {n: threading.Event() for n in names}
    release = {n: threading.Event() for n in names}

    def hold(**_):
        name = threading.current_thread().name
        if name in names and not reached[name].is_set():
            reached[name].set()
            assert release[name].wait(60)

    hooks.register(point, hold)
    return reached, release


@pytest.mark.parametrize("kind", ["pk", "plain"])
def test_stalled_compactor_wakes_after_another_finished(location, kind):
    uri, opts = location
    pk, make_history, read_base = KINDS[kind]
    create_table(uri, SCHEMA, primary_key=pk, storage_options=opts)
    want = make_history(uri, opts)
    reached, release = paused("compact.before_commit", {"stalled"})
    out: dict = {}
    stalled = threading.Thread(name="stalled", target=lambda: out.update(
        s=compact(TableView(uri, opts), max_records_per_round=2, max_rounds=1)))
    try:
        stalled.start()
        assert reached["stalled"].wait(60)
        other = compact(TableView(uri, opts), max_records_per_round=2)
        assert [r.committed for r in other.rounds] == [True, True]
        release["stalled"].set()
        stalled.join(60)
    finally:
        for e in release.values():
            e.set()
        hooks.clear()
    assert [r.committed for r in out["s"].rounds] == [False]  # Lance refused the stale mark
    assert read_base(uri, opts) == want


def test_two_compactors_adding_the_row_key_at_once(legacy_plain_table):
    """Both read the table without the column; one adds it, the other's add conflicts,
    it re-reads, finds the column and then loses the round to the first."""
    uri, opts = legacy_plain_table
    want = plain_history(uri, opts)
    reached, release = paused("compact.row_key", {"a", "b"})
    out: dict = {}
    errors: list[BaseException] = []

    def run(name):
        try:
            out[name] = compact(TableView(uri, opts), max_records_per_round=2)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = {n: threading.Thread(name=n, target=run, args=(n,)) for n in ("a", "b")}
    try:
        for t in threads.values():
            t.start()
        assert reached["a"].wait(60) and reached["b"].wait(60)  # both saw no column
        release["a"].set()
        threads["a"].join(60)
        release["b"].set()
        threads["b"].join(60)
    finally:
        for e in release.values():
            e.set()
        hooks.clear()
    assert not errors, errors
    assert [r.committed for r in out["a"].rounds] == [True, True]
    assert [r.committed for r in out["b"].rounds] == [False]
    assert TableView(uri, opts).dataset().schema.names.count(ROW_KEY) == 1
    assert plain_base(uri, opts) == want


# --- MemTable-mode SSTables --------------------------------------------------------

def test_rounds_mark_the_memtable_sstables_their_records_name(pk_table):
    """Rows come from the committed WAL ranges. MemTable shards are hidden from Lance's
    readers when first opened (their compacted generation is HIDDEN_GENERATION), so a
    round marks only the ledger: a generation not above the recorded one is never sent."""
    from memwal_datasource.format.lance_manifest import compacted_generations
    from memwal_datasource.table.view import LEDGER_SHARD
    from memwal_datasource.write.native import HIDDEN_GENERATION as H

    uri, opts = pk_table
    a, b = new_shard(), new_shard()
    assert write(uri, opts, a, [batch(range(0, 10), "a1")], memtable=True)[0].endswith("_gen_1")
    write(uri, opts, b, [batch(range(5, 15), "b1")], memtable=True)
    write(uri, opts, a, [batch(range(100, 103), "lost")], commit=False, memtable=True)
    assert write(uri, opts, a, [batch([0, 1], "a2")], memtable=True)[0].endswith("_gen_3")
    want = {i: f"a1-{i}" for i in range(0, 5)}
    want.update({i: f"b1-{i}" for i in range(5, 15)})
    want.update({0: "a2-0", 1: "a2-1"})
    table = TableView(uri, opts)
    first = compact(table, max_records_per_round=2, max_rounds=1).rounds[0]
    assert first.sstables == {}
    marks = compacted_generations(table.store, table.dataset().version)
    assert marks == {a: H, b: H, LEDGER_SHARD: 1}
    second = compact(table).rounds[0]
    assert second.sstables == {}
    assert base_rows(uri, opts) == want
    marks = compacted_generations(table.store, table.dataset().version)
    assert marks == {a: H, b: H, LEDGER_SHARD: 2}
    write(uri, opts, a, [batch([500], "w")])
    assert compact(table).rounds[0].sstables == {}
    marks = compacted_generations(table.store, table.dataset().version)
    assert marks == {a: H, b: H, LEDGER_SHARD: 3}
    assert base_rows(uri, opts) == {**want, 500: "w-500"}
