"""Reading many WAL entries flat: planning by bytes, concurrent in-order fetching,
coalescing, and the same rows as the one-entry-at-a-time path (``range_rows``)."""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pyarrow as pa
import pytest

from memwal_datasource.errors import CollectedError, MissingEntryError
from memwal_datasource.format.memwal import TOMBSTONE, wal_entry_schema, wal_key
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.store import open_store
from memwal_datasource.table.tail_scan import (
    ENTRY_COST,
    Segment,
    Slice,
    _positions,
    commit_order_slices,
    cost,
    merged,
    plan_slices,
    tail_batches,
    tail_table,
    visible_entries,
)
from memwal_datasource.table.view import TableView, create_table, field_ids
from tests.helpers import SCHEMA


def entry(ids, tag="v", tomb=None) -> list[pa.RecordBatch]:
    n = len(ids)
    return [pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"{tag}-{i}" for i in ids]),
                             pa.array(tomb or [False] * n)],
                            names=["id", "v", TOMBSTONE])]


class Entries:
    """Appends one-commit WAL entries (each its own commit record) to kept writers."""

    def __init__(self, uri, opts, shards=4):
        store = open_store(uri, opts)
        self.schema = wal_entry_schema(SCHEMA, field_ids(TableView(uri, opts).dataset()))
        self.apps = [WalAppender.open(store, str(uuid.uuid4())) for _ in range(shards)]
        self.log = CommitLog(store)

    def append(self, shard: int, ids, tag="v", tomb=None) -> CommittedRange:
        app = self.apps[shard]
        batches = [pa.RecordBatch.from_arrays(b.columns, schema=self.schema)
                   for b in entry(list(ids), tag, tomb)]
        res = app.append(self.schema, batches)
        r = CommittedRange(app.shard_id, app.epoch, res.position, res.position, len(ids),
                           res.nbytes)
        self.log.append(APPEND, [r])
        return r


def small_entries(uri, opts, shards=4, entries=200, rows=3, pk=False, start=0):
    """``entries`` one-commit entries spread round-robin over ``shards`` (one kept
    writer each); with ``pk`` every fifth entry rewrites earlier keys and deletes one.
    Returns the committed ranges in commit order."""
    w, out = Entries(uri, opts, shards), []
    for i in range(entries):
        ids = list(range(start + i * rows, start + (i + 1) * rows))
        tomb = None
        if pk and i % 5 == 4:  # keys of earlier entries: updates, and one delete
            ids = [start + (i - 4) * rows + j for j in range(rows)]
            tomb = [j == 0 for j in range(rows)]
        out.append(w.append(i % shards, ids, f"e{i}", tomb))
    return out


@pytest.fixture
def table(tmp_path):
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA)
    return uri, {}


@pytest.fixture
def keyed(tmp_path):
    uri = str(tmp_path / "k.lance")
    create_table(uri, SCHEMA, primary_key=["id"])
    return uri, {}


def covered(groups) -> Counter:
    return Counter((s.shard_id, e, p) for g in groups for s in g for e, a, b in s.spans
                   for p in range(a, b + 1))


# --- planning ----------------------------------------------------------------------------

def test_many_small_entries_plan_as_a_few_partitions_each_position_once():
    shards = {f"s{k}": merged([Segment(1, p, p, 5_000) for p in range(1, 2_501)])
              for k in range(4)}
    assert all(len(ss) == 1 for ss in shards.values())  # one kept writer: one span a shard
    total = sum(cost(ss) for ss in shards.values())
    groups = plan_slices(shards, target=-(-int(total) // 4))
    assert len(groups) == 4
    assert covered(groups) == Counter((f"s{k}", 1, p) for k in range(4) for p in range(1, 2501))
    # Sixty-four small shards share partitions instead of a task each.
    small = {f"s{k:02}": [Segment(1, 1, 10, 10_000)] for k in range(64)}
    target = -(-int(sum(cost(ss) for ss in small.values())) // 4)
    groups = plan_slices(small, target=target)
    assert len(groups) <= 5
    assert all(sum(s.cost() for s in g) <= target * 1.06 for g in groups)


def test_plan_cuts_long_shards_at_entry_bounds_and_covers_every_range_once():
    rnd = random.Random(7)
    shards = {}
    for k in range(5):
        segs, pos = [], 1
        for _ in range(rnd.randint(1, 40)):
            n = rnd.randint(1, 30)
            segs.append(Segment(rnd.randint(1, 3), pos, pos + n - 1, rnd.randint(0, 10**7)))
            pos += n + rnd.randint(0, 2)  # gaps: sentinels, other attempts' entries
        shards[f"s{k}"] = segs
    want = Counter((sh, s.epoch, p) for sh, ss in shards.items() for s in ss
                   for p in range(s.first, s.last + 1))
    each = {(sh, p): s.entry_bytes() + ENTRY_COST for sh, ss in shards.items() for s in ss
            for p in range(s.first, s.last + 1)}
    for target in (ENTRY_COST * 3, 5 * 10**6, 10**12):
        groups = plan_slices(shards, target=target)
        assert covered(groups) == want
        for g in groups:
            for s in g:
                assert [sp[1] for sp in s.spans] == sorted(sp[1] for sp in s.spans)
                # A slice passes its target by at most the entry that reached it.
                biggest = max(each[s.shard_id, p] for _e, a, b in s.spans
                              for p in range(a, b + 1))
                assert s.cost() <= target * 1.01 + biggest
        if target == 10**12:
            assert len(groups) == 1


def test_overlapping_spans_fetch_each_position_once_with_every_epoch():
    spans = ((1, 1, 5), (2, 3, 8), (1, 1, 5), (None, 10, 10))
    got = [(p, e) for p, e, _s in _positions(spans)]
    assert [p for p, _ in got] == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert dict(got)[4] == frozenset({1, 2}) and dict(got)[7] == frozenset({2})
    assert dict(got)[10] is None


# --- fetching and coalescing -------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 4])
def test_visible_entries_in_order_skip_sentinels_and_other_epochs(table, threads):
    uri, opts = table
    store = open_store(uri, opts)
    shard = str(uuid.uuid4())
    old = WalAppender.open(store, shard)
    for i in range(5):
        old.append(SCHEMA, [pa.record_batch([pa.array([i], pa.int64()), pa.array(["a"])],
                                            schema=SCHEMA)])
    new = WalAppender.open(store, shard)  # its sentinel at 6
    for i in range(5, 40):
        new.append(SCHEMA, [pa.record_batch([pa.array([i], pa.int64()), pa.array(["b"])],
                                            schema=SCHEMA)])
    view = TableView(uri, opts)
    got = [(p, e.writer_epoch) for _s, p, e in visible_entries(
        view, [Slice(shard, ((2, 1, 40),), 0)], threads=threads)]
    assert got == [(p, 2) for p in range(7, 41)]
    raw = [p for _s, p, _e in visible_entries(view, [Slice(shard, ((None, 1, 40),), 0)],
                                              threads=threads)]
    assert raw == [p for p in range(1, 41) if p != 6]
    store.delete(wal_key(shard, 20))  # damage, not a collection: reported as such
    with pytest.raises(MissingEntryError, match="position 20"):
        list(visible_entries(view, [Slice(shard, ((2, 7, 40),), 0)], threads=threads))


def test_a_read_planned_before_gc_released_its_entries_says_read_again(keyed):
    from memwal_datasource.maintenance.compact import compact
    from memwal_datasource.maintenance.gc import collect
    from tests.helpers import later

    uri, opts = keyed
    small_entries(uri, opts, shards=2, entries=20, pk=True)
    view = TableView(uri, opts)
    planned = commit_order_slices(view.committed_tail())
    compact(view)
    collect(view, retain_seconds=0, clock=later(view))
    with pytest.raises(CollectedError, match="read again"):
        tail_table(TableView(uri, opts), planned, SCHEMA, lambda: None)


@pytest.mark.parametrize("pk", [False, True])
def test_tail_table_is_range_rows_in_commit_order(table, keyed, pk):
    uri, opts = keyed if pk else table
    small_entries(uri, opts, shards=3, entries=90, pk=pk)
    view = TableView(uri, opts)
    tail = view.committed_tail()
    want = view.range_rows(tail, SCHEMA)
    for threads in (1, 4):
        got = tail_table(view, commit_order_slices(tail), SCHEMA,
                         lambda: field_ids(view.dataset()), threads=threads)
        assert got.equals(want), threads
    assert len(commit_order_slices(tail)) == 90  # commit order interleaves the shards


def test_small_entries_coalesce_into_bounded_batches(table):
    uri, opts = table
    ranges = small_entries(uri, opts, shards=1, entries=100, rows=3)
    view = TableView(uri, opts)
    slices = commit_order_slices(ranges)
    assert len(slices) == 1  # one kept writer, a commit per entry: one span
    for whose in (False, True):  # entries decoded in runs, or one by one (whose rows)
        got = list(tail_batches(view, slices, SCHEMA, lambda: field_ids(view.dataset()),
                                target_rows=30, whose=whose))
        assert [t.rows.num_rows for t in got] == [30] * 10
        ids = [i for t in got for i in t.rows.column("id").to_pylist()]
        assert ids == list(range(300))
    assert [r[1] for t in got for r in t.runs] == list(range(1, 101))
    assert {r[3] for t in got for r in t.runs} == {3}


@pytest.mark.parametrize("threads", [1, 4])
def test_runs_decoded_together_skip_sentinels_other_epochs_and_name_a_damaged_entry(
        table, threads):
    from memwal_datasource.errors import CorruptEntryError

    uri, opts = table
    store = open_store(uri, opts)
    shard = str(uuid.uuid4())
    for epoch_rows in (range(0, 5), range(5, 40)):
        app = WalAppender.open(store, shard)  # from epoch 2 on, a sentinel first
        for i in epoch_rows:
            app.append(SCHEMA, [pa.record_batch([pa.array([i, -i], pa.int64()),
                                                 pa.array(["a", None])], schema=SCHEMA)])
    view = TableView(uri, opts)

    def ids(spans):
        got = tail_batches(view, [Slice(shard, spans, 0)], SCHEMA, lambda: None,
                           threads=threads, target_rows=16)
        return [i for t in got for i in t.rows.column("id").to_pylist()]

    assert ids(((2, 1, 41),)) == [x for i in range(5, 40) for x in (i, -i)]
    assert ids(((None, 1, 41),)) == [x for i in range(40) for x in (i, -i)]
    assert ids(((1, 1, 5), (2, 20, 22))) == [x for i in (*range(5), 18, 19, 20)
                                             for x in (i, -i)]
    key = wal_key(shard, 30)
    good = store.get(key)
    store.put(key, good[:-20])  # cut short: no end-of-stream marker
    with pytest.raises(CorruptEntryError, match="position 30"):
        ids(((2, 7, 41),))
    # Framed whole, but its batch message is garbage: the run is decoded entry by entry.
    head = 8 + int.from_bytes(good[4:8], "little")
    store.put(key, good[:head] + b"\xff" * (len(good) - head - 8) + good[-8:])
    with pytest.raises(CorruptEntryError, match="position 30"):
        ids(((2, 7, 41),))


def test_entries_of_two_schemas_are_not_concatenated(table):
    """An entry written before a column was added has no such column: it is matched to
    the table's columns on its own (nulls), never glued to entries that have it."""
    uri, opts = table
    store = open_store(uri, opts)
    shard = str(uuid.uuid4())
    app = WalAppender.open(store, shard)
    wide = pa.schema([*SCHEMA, ("w", pa.int32())])
    rows = []
    for i in range(6):
        if i % 2:
            b = pa.record_batch([pa.array([i], pa.int64()), pa.array(["x"]),
                                 pa.array([i], pa.int32())], schema=wide)
        else:
            b = pa.record_batch([pa.array([i], pa.int64()), pa.array(["x"])], schema=SCHEMA)
        app.append(b.schema, [b])
        rows.append((i, i if i % 2 else None))
    view = TableView(uri, opts)
    got = list(tail_batches(view, [Slice(shard, ((app.epoch, 1, 6),), 0)], wide, lambda: None))
    assert len(got) == 6
    assert [(r["id"], r["w"]) for t in got for r in t.rows.to_pylist()] == rows
