"""WAL entries as pylance writes them: Lance field ids, ``_tombstone``, first manifest.

pylance (the oracle) writes every field's Lance id as ``lance:field_id`` field
metadata (children of structs and lists too) and ends each entry with a
non-nullable ``_tombstone`` column; upstream Lance matches an entry's columns
to the table's by field id. So a column renamed through Lance replays, reads
and compacts under its new name. Entries written before (no ids, no
``_tombstone``) stay readable by name.
"""

from __future__ import annotations

import uuid

import lance
import pyarrow as pa
import pytest

from memwal_datasource import ShardWriterConfig, compact, open_shard_writer, read_table
from memwal_datasource.errors import CorruptEntryError
from memwal_datasource.format.memwal import (
    FIELD_ID_KEY,
    TOMBSTONE,
    FieldId,
    decode_wal_entry,
    entry_columns,
    field_id,
    wal_entry_schema,
    wal_key,
)
from memwal_datasource.format.table_schema import data_schema
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.options import lance_storage_options
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import WalAppender, WalTailer
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, create_table, field_ids

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("s", pa.struct([("a", pa.int32()), ("b", pa.string())])),
    pa.field("l", pa.list_(pa.int32())),
    pa.field("v", pa.string()),
])
WAL_ONLY = ShardWriterConfig(enable_memtable=False, max_wal_flush_interval_ms=10)


def rows(ids, tag="r") -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "s": [{"a": i, "b": f"{tag}{i}"} for i in ids],
                     "l": [[i, i + 1] for i in ids], "v": [f"{tag}-{i}" for i in ids]},
                    schema=SCHEMA)


def first_data_entry(store, shard):
    for _pos, e in WalTailer(store, shard).entries(1):
        return e
    raise AssertionError("no data entry")


def dataset(uri, opts):
    return lance.dataset(uri, storage_options=lance_storage_options(opts))


def fields_with_metadata(schema: pa.Schema):
    """Every field, nested ones too, as (path, type, nullable, metadata)."""
    out = []

    def walk(f: pa.Field, path: str):
        out.append((path, str(f.type), f.nullable, dict(f.metadata or {})))
        t = f.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(t.field(i), f"{path}.{t.field(i).name}")
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            walk(t.value_field, f"{path}[]")

    for f in schema:
        walk(f, f.name)
    return out


def commit(uri, opts, stats):
    CommitLog(open_store(uri, opts)).append(APPEND, [CommittedRange(
        stats.shard_id, stats.epoch, stats.first_wal_position, stats.last_wal_position,
        stats.rows)])


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_our_entries_carry_what_pylances_carry(location):
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    ds = dataset(uri, opts)
    store = open_store(uri, opts)
    theirs, ours = str(uuid.uuid4()), str(uuid.uuid4())
    with ds.mem_wal_writer(theirs, max_wal_flush_interval_ms=10) as w:
        w.put(rows(range(3)).cast(ds.schema))
    with open_shard_writer(uri, ours, ds.schema, WAL_ONLY, opts) as w:
        w.put(rows(range(3)).cast(ds.schema))
    t, o = first_data_entry(store, theirs), first_data_entry(store, ours)
    assert fields_with_metadata(o.schema) == fields_with_metadata(t.schema)
    assert o.schema.names[-1] == TOMBSTONE and not o.schema.field(TOMBSTONE).nullable
    assert pa.Table.from_batches(o.batches).column(TOMBSTONE).to_pylist() == [False] * 3
    assert [field_id(f) for f in o.schema] == [0, 1, 4, 6, None]  # s.a=2, s.b=3, l[]=5


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_first_shard_manifest_is_what_lance_writes(location):
    """A claim on a new shard writes version 1 at epoch 1, as pylance's writer does;
    Lance's initialize_shard (a sharded table's shard) writes version 1 at epoch 0."""
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    store = open_store(uri, opts)
    theirs, ours = str(uuid.uuid4()), str(uuid.uuid4())
    dataset(uri, opts).mem_wal_writer(theirs).close()
    WalAppender.open(store, ours)
    t, o = ManifestStore(store, theirs).load(1), ManifestStore(store, ours).load(1)
    assert (o.version, o.writer_epoch, o.current_generation) == \
        (t.version, t.writer_epoch, t.current_generation) == (1, 1, 1)
    assert (o.replay_after_wal_entry_position, o.sstables) == (0, [])


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_renamed_column_reads_replays_and_compacts(location):
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    shard = str(uuid.uuid4())
    with open_shard_writer(uri, shard, dataset(uri, opts).schema, WAL_ONLY, opts) as w:
        w.put(rows(range(4), "before"))
    commit(uri, opts, w.stats())
    dataset(uri, opts).alter_columns({"path": "v", "name": "v2"},
                                     {"path": "s.a", "name": "a2"})
    # (The committed tail's rows: read_table's merge cannot join struct columns yet.)
    table = TableView(uri, opts)
    got = table.range_rows(table.committed_tail(), data_schema(dataset(uri, opts).schema))
    got = got.drop_columns([TOMBSTONE]).sort_by("id")
    assert got.column_names == ["id", "s", "l", "v2"]
    assert got.column("v2").to_pylist() == [f"before-{i}" for i in range(4)]
    assert [x["a2"] for x in got.column("s").to_pylist()] == list(range(4))
    # pylance replays our entries by field id (as an older version of this package
    # left the shard: replay position 0).
    manifests = ManifestStore(open_store(uri, opts), shard)
    m = manifests.latest()
    manifests.commit_update(m.writer_epoch, lambda m: setattr(
        m, "replay_after_wal_entry_position", 0))
    with dataset(uri, opts).mem_wal_writer(shard, max_wal_flush_interval_ms=10) as native:
        replayed = native.lsm_scanner().to_table().sort_by("id")
        assert replayed.column("v2").to_pylist() == [f"before-{i}" for i in range(4)]
    # Written after the rename (with the new names), then compacted with the old entries.
    schema = dataset(uri, opts).schema
    with open_shard_writer(uri, str(uuid.uuid4()), schema, WAL_ONLY, opts) as w:
        w.put(pa.table({"id": [10], "s": [{"a2": 10, "b": "x"}], "l": [[1]], "v2": ["after"]},
                       schema=schema))
    commit(uri, opts, w.stats())
    compact(uri, opts)
    base = dataset(uri, opts).to_table().sort_by("id")
    assert base.column("v2").to_pylist() == [f"before-{i}" for i in range(4)] + ["after"]
    assert [x["a2"] for x in base.column("s").to_pylist()] == [0, 1, 2, 3, 10]


@pytest.mark.parametrize("backend", ["local"])
def test_old_entries_without_field_ids_still_read_and_compact(location):
    """Entries as this package wrote them before: no ids, no _tombstone."""
    uri, opts = location
    flat = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    create_table(uri, flat, primary_key=["id"], storage_options=opts)
    store = open_store(uri, opts)
    shard = str(uuid.uuid4())
    app = WalAppender.open(store, shard)
    old = rows(range(3), "old").select(["id", "v"]).cast(flat)
    pos = app.append(flat, old.to_batches()).position
    entry = decode_wal_entry(store.get(wal_key(shard, pos)), "t")
    assert TOMBSTONE not in entry.schema.names and field_id(entry.schema.field("v")) is None
    CommitLog(store).append(APPEND, [CommittedRange(shard, app.epoch, pos, pos, 3)])
    assert read_table(uri, opts).sort_by("id").column("v").to_pylist() == \
        ["old-0", "old-1", "old-2"]
    compact(uri, opts)
    assert sorted(dataset(uri, opts).to_table().column("v").to_pylist()) == \
        ["old-0", "old-1", "old-2"]


def test_entry_columns_match_by_id_then_name():
    ids = {"id": FieldId(0), "v2": FieldId(1), "new": FieldId(7)}
    target = pa.schema([pa.field("id", pa.int64()), pa.field("v2", pa.string()),
                        pa.field("new", pa.int32())])
    with_ids = wal_entry_schema(pa.schema([("id", pa.int64()), ("v", pa.string())]),
                                {"id": FieldId(0), "v": FieldId(1)})
    assert with_ids.field("v").metadata[FIELD_ID_KEY] == b"1"
    batch = pa.record_batch([pa.array([1]), pa.array(["x"]), pa.array([True])],
                            schema=with_ids)
    cols = entry_columns(batch, target, ids)  # v is now v2 (same id); new is null
    assert [c.to_pylist() for c in cols] == [[1], ["x"], [None], [True]]
    old = pa.record_batch([pa.array([2]), pa.array(["y"])], names=["id", "v2"])
    assert [c.to_pylist() for c in entry_columns(old, target, ids)] == \
        [[2], ["y"], [None], [False]]
    # A same-named column with another id is another column (here: a dropped one).
    other = wal_entry_schema(pa.schema([("id", pa.int64()), ("v2", pa.string())]),
                             {"id": FieldId(0), "v2": FieldId(9)})
    b = pa.record_batch([pa.array([3]), pa.array(["z"]), pa.array([False])], schema=other)
    assert entry_columns(b, target, ids)[1].to_pylist() == [None]
    strict = pa.schema([pa.field("id", pa.int64()), pa.field("v2", pa.string(), False)])
    with pytest.raises(CorruptEntryError, match="no column 'v2'"):
        entry_columns(b, strict, ids)


@pytest.mark.parametrize("backend", ["local"])
def test_field_ids_of_a_dataset(location):
    uri, opts = location
    ds = create_table(uri, SCHEMA, storage_options=opts)
    ids = field_ids(ds)
    assert ids["s"] == FieldId(1, {"a": FieldId(2), "b": FieldId(3)})
    assert ids["l"].children["item"] == FieldId(5)
