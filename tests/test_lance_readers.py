"""Every Lance reader sees exactly the committed rows (issue 19).

Lance's own readers (LanceDB's ``to_arrow``/``count_rows``/``search().where``,
``lance.dataset(...).to_table()``, and an ``LsmScanner`` built from the shard
manifests as the MemWAL spec says) read a memwal table through the base
table. After writes with failed attempts (a writer opened, written and
abandoned without a commit), fenced attempts, deletes and an overwrite they
return a subset of the committed rows, never an uncommitted one, never a row
twice; after compaction exactly the committed rows; after garbage collection
still. A native pylance writer opening any shard replays nothing. Tables with
and without a primary key, both modes, local disk and S3.
"""

from __future__ import annotations

import uuid
from collections import Counter

import lance
import pyarrow as pa
import pytest

from memwal_datasource import ShardWriterConfig, compact, lancedb_table, read_table
from memwal_datasource.errors import Fenced
from memwal_datasource.format.lance_manifest import compacted_generations
from memwal_datasource.format.memwal import TOMBSTONE
from memwal_datasource.format.table_schema import ROW_KEY
from memwal_datasource.lance_readers import split_table_uri
from memwal_datasource.log.commit import APPEND, OVERWRITE, CommitLog, CommittedRange
from memwal_datasource.maintenance.gc import collect
from memwal_datasource.options import lance_storage_options
from memwal_datasource.shard.manifest import ManifestStore, list_shards
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, create_table
from memwal_datasource.write.native import HIDDEN_GENERATION
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import later

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
UNCOMMITTED = 900  # ids from here on are only ever written by attempts that never commit
CASES = [("pk", "memtable"), ("pk", "wal"), ("plain", "wal")]


def rows(ids, tag: str) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "v": [f"{tag}-{i}" for i in ids]}, schema=SCHEMA)


def config(mode: str) -> ShardWriterConfig:
    return ShardWriterConfig(enable_memtable=mode == "memtable", max_wal_flush_interval_ms=10)


class Model:
    """The table's committed rows as the tests expect them, and the writes that make them."""

    def __init__(self, uri, opts, pk: bool, mode: str):
        self.uri, self.opts, self.pk, self.mode = uri, opts, pk, mode
        self.rows: dict[int, str] | Counter = {} if pk else Counter()
        self.store = open_store(uri, opts)
        self.at_compaction = Counter()  # the committed rows when compaction last ran

    def compact(self) -> None:
        compact(self.uri, self.opts)
        self.at_compaction = self.committed()

    def commit(self, stats, kind=APPEND) -> None:
        CommitLog(self.store).append(kind, [CommittedRange(
            stats.shard_id, stats.epoch, stats.first_wal_position, stats.last_wal_position,
            stats.rows, sstables=tuple(stats.sstables))])

    def write(self, shard, data: pa.Table, *, commit=True, kind=APPEND):
        w = open_shard_writer(self.uri, shard, SCHEMA, config(self.mode), self.opts)
        w.put(data)
        w.close()
        if commit:
            self.commit(w.stats(), kind)
            self.apply(data, overwrite=kind == OVERWRITE)
        return w.stats()

    def apply(self, data: pa.Table, overwrite=False) -> None:
        if overwrite:
            self.rows.clear()
        for i, v in zip(data.column("id").to_pylist(), data.column("v").to_pylist(),
                        strict=True):
            if self.pk:
                self.rows[i] = v
            else:
                self.rows[(i, v)] += 1

    def delete(self, shard, ids) -> None:
        """Delete markers (Lance's _tombstone), written WAL-only as the Spark writer does."""
        schema = SCHEMA.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))
        n = len(ids)
        marks = pa.table([pa.array(ids, pa.int64()), pa.nulls(n, pa.string()),
                          pa.array([True] * n)], schema=schema)
        w = open_shard_writer(self.uri, shard, schema, config("wal"), self.opts)
        w.put(marks)
        w.close()
        self.commit(w.stats())
        for i in ids:
            self.rows.pop(i, None)

    def committed(self) -> Counter:
        """The committed rows as a multiset of (id, v)."""
        if self.pk:
            return Counter(self.rows.items())
        return Counter(self.rows)


def as_rows(t: pa.Table) -> Counter:
    return Counter(zip(t.column("id").to_pylist(), t.column("v").to_pylist(), strict=True))


def spec_lsm_scanner(uri, opts):
    """An LsmScanner built as the spec says: every shard manifest's SSTables above the
    base table's compacted generation for that shard."""
    from lance.mem_wal import LsmScanner, ShardSnapshot

    ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
    store = open_store(uri, opts)
    compacted = compacted_generations(store, ds.version)
    snaps = []
    for shard in list_shards(store):
        m = ManifestStore(store, shard).latest()
        if m is None:
            continue
        snap = ShardSnapshot(shard)
        for s in sorted(m.sstables, key=lambda s: s.generation):
            if s.generation > compacted.get(shard, 0):
                snap = snap.with_sstable(s.generation, s.path)
        snaps.append(snap)
    return LsmScanner.from_snapshots(ds, snaps)


def lance_views(uri, opts) -> dict[str, Counter]:
    """What each of Lance's readers returns, as multisets of (id, v)."""
    import lancedb

    parent, name = split_table_uri(uri)
    db = lancedb.connect(parent, storage_options=lance_storage_options(opts) or None)
    t = db.open_table(name)
    everything = t.to_arrow()
    views = {
        "lancedb.to_arrow": as_rows(everything),
        "lancedb.search.where": as_rows(t.search().where(f"id < {UNCOMMITTED * 10}")
                                        .limit(1_000_000).to_arrow()),
        "lance.to_table": as_rows(lance.dataset(
            uri, storage_options=lance_storage_options(opts)).to_table()),
        "lsm_scanner": as_rows(spec_lsm_scanner(uri, opts).to_table()),
    }
    count = t.count_rows()
    views["lancedb.count_rows"] = Counter({("count", count): 1})
    assert count == everything.num_rows, "count_rows and to_arrow disagree"
    return views


def check(model: Model, *, exact: bool) -> None:
    """Each Lance reader returns exactly the rows committed when compaction last ran:
    no uncommitted row, no key twice, deletes applied; with ``exact`` (just compacted)
    that is every committed row. Our whole-table read is always fresh."""
    want = model.committed()
    for name, got in lance_views(model.uri, model.opts).items():
        if name == "lancedb.count_rows":
            (_, n), = got
            assert n == sum(model.at_compaction.values()), name
            continue
        assert not [r for r in got if r[0] >= UNCOMMITTED], f"{name}: uncommitted rows"
        assert got == model.at_compaction, (
            f"{name}: extra {sorted(got - model.at_compaction)}, "
            f"missing {sorted(model.at_compaction - got)}")
        if model.pk:
            assert max(Counter(i for i, _ in got.elements()).values(), default=1) == 1, name
    if exact:
        assert model.at_compaction == want
    assert as_rows(read_table(model.uri, model.opts)) == want  # our own view: always fresh


def replays_nothing(uri, opts) -> None:
    """pylance's native writer opened directly on every shard replays no row."""
    ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
    for shard in list_shards(open_store(uri, opts)):
        w = ds.mem_wal_writer(shard, max_wal_flush_interval_ms=10)
        try:
            assert w.memtable_stats()["row_count"] == 0, f"shard {shard} replayed rows"
        finally:
            w.close()


def history(model: Model) -> None:
    """Commits, a failed attempt, a fenced attempt, deletes and an overwrite."""
    a, b, c = (str(uuid.uuid4()) for _ in range(3))
    model.write(a, rows(range(0, 10), "a1"))
    model.write(b, rows(range(10, 20), "b1"))
    # A failed attempt: opened, written, closed (SSTables flushed in MemTable mode),
    # never committed.
    model.write(a, rows(range(UNCOMMITTED, UNCOMMITTED + 5), "failed"), commit=False)
    # A fenced attempt: its successor claims the shard; its rows never commit.
    zombie = open_shard_writer(model.uri, b, SCHEMA, config(model.mode), model.opts)
    zombie.put(rows(range(UNCOMMITTED + 10, UNCOMMITTED + 13), "zombie"))
    successor = open_shard_writer(model.uri, b, SCHEMA, config(model.mode), model.opts)
    with pytest.raises(Fenced):
        zombie.put(rows([UNCOMMITTED + 20], "zombie"))
        zombie.close()
    zombie.abort()
    data = rows(range(5, 15), "b2")
    successor.put(data)
    successor.close()
    model.commit(successor.stats())
    model.apply(data)
    if model.pk:
        model.delete(c, [0, 1, 12])
    model.write(c, rows(range(20, 25), "c1"))


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("keyed,mode", CASES)
def test_lance_readers_see_only_committed_rows(location, keyed, mode):
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"] if keyed == "pk" else (), storage_options=opts)
    model = Model(uri, opts, keyed == "pk", mode)
    check(model, exact=True)  # empty
    history(model)
    check(model, exact=False)
    replays_nothing(uri, opts)
    model.compact()
    check(model, exact=True)
    # An overwrite hides everything before it; until compacted, readers keep the old rows.
    model.write(str(uuid.uuid4()), rows(range(50, 53), "o"), kind=OVERWRITE)
    model.write(str(uuid.uuid4()), rows([UNCOMMITTED + 30], "failed2"), commit=False)
    check(model, exact=False)
    model.compact()
    check(model, exact=True)
    t = TableView(uri, opts)
    assert collect(t, retain_seconds=0, clock=later(t)).shards  # gc really collects
    check(model, exact=True)
    replays_nothing(uri, opts)
    check(model, exact=True)  # the native opens above changed nothing readers see


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_memtable_shards_are_hidden_before_their_first_sstable(location):
    """Committed MemTable SSTables are hidden too: Lance's readers see rows when
    compaction brings them into the base table, never before, never twice."""
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    model = Model(uri, opts, True, "memtable")
    shard = str(uuid.uuid4())
    stats = model.write(shard, rows(range(3), "m"))
    assert stats.sstables  # flushed at close
    ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
    assert compacted_generations(model.store, ds.version)[shard] == HIDDEN_GENERATION
    assert sum(lance_views(uri, opts)["lancedb.to_arrow"].values()) == 0
    check(model, exact=False)
    model.compact()
    check(model, exact=True)


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("keyed", ["pk", "plain"])
def test_lancedb_table_hands_over_the_committed_view(location, keyed):
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"] if keyed == "pk" else (), storage_options=opts)
    model = Model(uri, opts, keyed == "pk", "wal")
    model.write(str(uuid.uuid4()), rows(range(4), "x"))
    model.write(str(uuid.uuid4()), rows([UNCOMMITTED], "failed"), commit=False)
    stale = lancedb_table(uri, opts, fresh=False)
    assert stale.count_rows() == 0  # nothing compacted yet
    t = lancedb_table(uri, opts)
    assert as_rows(t.to_arrow()) == model.committed()
    assert as_rows(t.search().where("id >= 2").to_arrow()) == Counter(
        {r: n for r, n in model.committed().items() if r[0] >= 2})
    if keyed == "plain":  # the hidden key is Lance's primary key; LanceDB shows it
        assert ROW_KEY in t.schema.names


def test_split_table_uri():
    assert split_table_uri("/data/db/t.lance") == ("/data/db", "t")
    assert split_table_uri("s3://b/p/t.lance/") == ("s3://b/p", "t")
    with pytest.raises(ValueError, match="not a table path"):
        split_table_uri("t.lance")


@pytest.mark.parametrize("backend", ["local"])
def test_a_killed_attempt_leaves_replay_debt_until_the_next_open(location):
    """The one case a direct native opener can replay uncommitted rows: an attempt killed
    before close. Our next open of the shard (either mode) moves the replay position."""
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    shard = str(uuid.uuid4())
    killed = open_shard_writer(uri, shard, SCHEMA, config("wal"), opts)
    killed.put(rows([UNCOMMITTED], "killed"))
    killed.flush()  # durable, then the process "dies": no close
    m = ManifestStore(open_store(uri, opts), shard).latest()
    assert m.replay_after_wal_entry_position == 0  # the debt
    reopened = open_shard_writer(uri, shard, SCHEMA, config("wal"), opts)
    reopened.close()
    assert ManifestStore(open_store(uri, opts), shard).latest() \
        .replay_after_wal_entry_position >= 2
    replays_nothing(uri, opts)
