"""Sharding specs: Lance's values, our shard ids, routing, shard identity (pylance oracle)."""

from __future__ import annotations

import os
import struct
import uuid

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from lance.mem_wal import evaluate_sharding_spec

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import ConfigError, MemWalError
from memwal_datasource.shard.manifest import ManifestStore, list_shards
from memwal_datasource.store import open_store
from memwal_datasource.table import sharding
from memwal_datasource.table.sharding import ShardingRequest
from memwal_datasource.write.shard_writer import open_shard_writer

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("tenant", pa.string())])


def rows(ids, tenants=None) -> pa.RecordBatch:
    ids = list(ids)
    tenants = tenants or [f"t{i % 5}" for i in ids]
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"v{i}" for i in ids]),
                            pa.array(tenants)], schema=SCHEMA)


@pytest.fixture
def bucket_table(tmp_path):
    uri = str(tmp_path / "t.lance")
    ds = sharding.create_table(uri, SCHEMA, ["id"], {}, ShardingRequest("id", 8))
    return uri, ds


def test_create_records_lance_spec_and_refuses_conflicts(bucket_table):
    uri, ds = bucket_table
    spec = ds.mem_wal_index_details()["sharding_specs"][0]
    assert (spec["spec_id"], spec["fields"][0]["transform"]) == (1, "bucket")
    sh = sharding.table_sharding(ds)
    assert (sh.columns, sh.num_buckets, sh.spec_id) == (("id",), 8, 1)
    sharding.check_requested(sh, ShardingRequest("id", 8), uri)  # the same spec is fine
    with pytest.raises(ConfigError, match="conflict with the table .* bucket\\(id, 8\\)"):
        sharding.check_requested(sh, ShardingRequest("id", 4), uri)
    with pytest.raises(ConfigError, match="conflict"):
        sharding.create_table(uri, SCHEMA, ["id"], {}, ShardingRequest(identity_column="v"))
    with pytest.raises(ConfigError, match="without one"):
        sharding.check_requested(None, ShardingRequest("id", 8), uri)
    with pytest.raises(ConfigError, match="num_buckets' must be in"):
        ShardingRequest("id", 2000).validate()


def test_route_follows_lance_values_and_keeps_row_order(bucket_table):
    _uri, ds = bucket_table
    sh = sharding.table_sharding(ds)
    ids = [i * 7919 % 1000 - 500 for i in range(1000)]  # negatives, repeats, any order
    batch = rows(ids)
    lance_values = evaluate_sharding_spec(batch, sh.spec, ds.lance_schema).column(0)
    parts = sh.route(batch)
    assert len(parts) == 8
    seen = []
    for shard, (value, part) in parts.items():
        assert shard == sh.shard_id(value)
        # Every row of the part has the part's value, in the batch's original order.
        want = batch.filter(pc.equal(lance_values, value))
        assert part.equals(want)
        seen += part.column("id").to_pylist()
    assert sorted(seen) == sorted(ids)
    # Deterministic: another process (a fresh Sharding) names the same shards.
    again = sharding.table_sharding(lance.dataset(ds.uri))
    assert set(again.route(batch)) == set(parts)


def test_identity_values_and_field_entries(tmp_path):
    uri = str(tmp_path / "t.lance")
    ds = sharding.create_table(uri, SCHEMA, ["id"], {}, ShardingRequest(identity_column="tenant"))
    sh = sharding.table_sharding(ds)
    parts = sh.route(rows([1, 2, 3, 4], ["é", None, "é", "b"]))
    by_value = {value: part.column("id").to_pylist() for value, part in parts.values()}
    assert by_value == {"é": [1, 3], None: [2], "b": [4]}
    assert sh.field_entries("é") == [("bucket", "é".encode())]  # raw UTF-8, as the spec says
    assert sh.field_entries(None) == []


def test_our_shard_identity_is_what_pylance_keeps(bucket_table):
    """pylance as the oracle: a shard we create opens in pylance's writer with our spec id
    and field entries, and they equal Lance's value as raw little-endian Arrow bytes."""
    uri, ds = bucket_table
    sh = sharding.table_sharding(ds)
    store = open_store(uri)
    (shard, (value, part)), *_ = sh.route(rows(range(40))).items()
    sharding.initialize_shard(store, sh, shard, value)
    with open_shard_writer(uri, shard, ds.schema,
                           ShardWriterConfig(enable_memtable=False)) as w:
        w.put(part)
    with ds.mem_wal_writer(shard) as native:  # claims; flushes an SSTable at close
        # Our close moved the replay position past our entries: nothing replayed.
        assert native.lsm_scanner().to_table().num_rows == 0
        native.put(part)
    latest = ManifestStore(store, shard).latest()
    assert latest.sstables  # pylance wrote versions of its own on top of ours
    lance_value = evaluate_sharding_spec(part.slice(0, 1), sh.spec, ds.lance_schema)[0][0]
    assert latest.shard_field_entries == [("bucket", struct.pack("<i", lance_value.as_py()))]
    # pylance's own shard on this table carries the same spec id.
    own = str(uuid.uuid4())
    with ds.mem_wal_writer(own) as native:
        native.put(pa.Table.from_batches([part]))
    assert ManifestStore(store, own).load(1).shard_spec_id == latest.shard_spec_id == 1


def test_pylance_written_shard_is_where_we_route(bucket_table):
    """A pylance user who opens the shard our rule names for a value shares it with us:
    our next write of that value lands in the same shard, after pylance's entries."""
    uri, ds = bucket_table
    sh = sharding.table_sharding(ds)
    batch = rows([5])
    ((shard, (value, _)),) = sh.route(batch).items()
    with ds.mem_wal_writer(sh.shard_id(value)) as native:  # the public rule, from pylance
        native.put(pa.Table.from_batches([batch]))
    assert list_shards(open_store(uri)) == [shard]
    store = open_store(uri)
    sharding.initialize_shard(store, sh, shard, value)  # accepts pylance's entry-less shard
    with open_shard_writer(uri, shard, ds.schema,
                           ShardWriterConfig(enable_memtable=False)) as w:
        w.put(rows([5]))
    assert list_shards(store) == [shard]
    assert ManifestStore(store, shard).latest().writer_epoch == 2


def test_shard_of_another_value_is_refused(bucket_table):
    uri, ds = bucket_table
    sh = sharding.table_sharding(ds)
    store = open_store(uri)
    shard = sh.shard_id(3)
    sharding.initialize_shard(store, sh, shard, 3)
    with pytest.raises(MemWalError, match="refusing to mix values"):
        sharding.initialize_shard(store, sh, shard, 4)
    assert os.path.isdir(os.path.join(uri, "_mem_wal", shard))


# -- primary-key tables without sharding options --------------------------------------

def keyed(pk_types: dict[str, pa.DataType]) -> pa.Schema:
    return pa.schema([*(pa.field(n, t) for n, t in pk_types.items()), ("v", pa.string())])


def key_values(t: pa.DataType, n: int) -> pa.Array:
    if pa.types.is_boolean(t):
        return pa.array([i % 2 == 0 for i in range(n)])
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.array([f"k{i % 37}" for i in range(n)], t)
    if pa.types.is_binary(t):
        return pa.array([b"k%d" % (i % 37) for i in range(n)], t)
    return pa.array([i % 37 for i in range(n)], t)


@pytest.mark.parametrize("pk_types, column", [
    ({"id": pa.int8()}, "id"), ({"id": pa.int16()}, "id"), ({"id": pa.int32()}, "id"),
    ({"id": pa.int64()}, "id"), ({"id": pa.uint8()}, "id"), ({"id": pa.uint64()}, "id"),
    ({"id": pa.string()}, "id"), ({"id": pa.large_string()}, "id"),
    # Lance 14's bucket refuses binary; booleans fill two buckets: a later column is used.
    ({"blob": pa.binary(), "id": pa.int32()}, "id"),
    ({"flag": pa.bool_(), "id": pa.string()}, "id"),
    ({"flag": pa.bool_()}, "flag"),
])
def test_new_pk_table_defaults_to_lance_bucket_spec(tmp_path, pk_types, column):
    """pylance as the oracle: the recorded spec is bucket(key column, 16), and our routing
    (and so every key's shard) is Lance's evaluate_sharding_spec of it."""
    uri = str(tmp_path / "t.lance")
    schema = keyed(pk_types)
    ds = sharding.create_table(uri, schema, list(pk_types), {}, None)
    (spec,) = lance.dataset(uri).mem_wal_index_details()["sharding_specs"]
    f = spec["fields"][0]
    assert (f["transform"], f["parameters"]) == ("bucket", {"num_buckets": "16"})
    assert [x.id() for x in ds.lance_schema.fields() if x.name() == column] == f["source_ids"]
    sh = sharding.table_sharding(ds)
    assert sh.recorded and sh.columns == (column,)
    assert sh.num_buckets == sharding.DEFAULT_NUM_BUCKETS == 16
    batch = pa.record_batch([*(key_values(t, 300) for t in pk_types.values()),
                             pa.array([f"v{i}" for i in range(300)])], schema=ds.schema)
    lance_values = evaluate_sharding_spec(batch, spec, ds.lance_schema).column(0)
    shard_of_key = {}
    for shard, (value, part) in sh.route(batch).items():
        assert part.equals(batch.filter(pc.equal(lance_values, value)))
        for key in zip(*(part.column(n).to_pylist() for n in pk_types), strict=True):
            assert shard_of_key.setdefault(key, shard) == shard, "a key in two shards"
    assert len(set(shard_of_key.values())) == (2 if column == "flag" else
                                                len(set(lance_values.to_pylist())))


def test_binary_only_key_gets_lance_unsharded_spec(tmp_path):
    uri = str(tmp_path / "t.lance")
    ds = sharding.create_table(uri, keyed({"blob": pa.binary()}), ["blob"], {}, None)
    (spec,) = ds.mem_wal_index_details()["sharding_specs"]
    assert spec["fields"][0]["transform"] == "unsharded"
    batch = pa.record_batch([key_values(pa.binary(), 50), pa.array(["v"] * 50)],
                            schema=ds.schema)
    assert len(sharding.table_sharding(ds).route(batch)) == 1


def test_unbucketable_key_type_is_refused_naming_the_default(tmp_path):
    """Lance refuses a MemWAL on a date key whatever the spec; the error says which spec."""
    uri = str(tmp_path / "t.lance")
    schema = pa.schema([("day", pa.date32()), ("v", pa.string())])
    with pytest.raises(ConfigError, match=r"default spec \(unsharded, from primary key \['day'\]"
                                          r"\).*Date32"):
        sharding.create_table(uri, schema, ["day"], {}, None)


def test_tables_without_a_key_and_explicit_requests_are_unchanged(tmp_path):
    plain = sharding.create_table(str(tmp_path / "a.lance"), SCHEMA, [], {}, None)
    assert plain.mem_wal_index_details()["sharding_specs"] == []
    assert sharding.table_sharding(plain) is None
    ident = sharding.create_table(str(tmp_path / "b.lance"), SCHEMA, ["id"], {},
                                  ShardingRequest(identity_column="tenant"))
    assert sharding.table_sharding(ident).describe() == "identity(tenant) (spec id 1)"
    # A default request accepts whatever a racing creator recorded; an explicit one must match.
    again = sharding.create_table(str(tmp_path / "b.lance"), SCHEMA, ["id"], {}, None)
    assert sharding.table_sharding(again).describe() == "identity(tenant) (spec id 1)"


def specless_pk_table(uri: str):
    """A primary-key table as pylance users make it: initialize_mem_wal() with no spec."""
    from memwal_datasource.format.table_schema import with_primary_key

    ds = lance.write_dataset(with_primary_key(SCHEMA, ["id"]).empty_table(), uri)
    ds.initialize_mem_wal()
    return lance.dataset(uri)


def test_specless_pk_table_routes_every_row_to_one_unrecorded_shard(tmp_path):
    uri = str(tmp_path / "t.lance")
    ds = specless_pk_table(uri)
    assert ds.mem_wal_index_details()["sharding_specs"] == []
    sh = sharding.table_sharding(ds)
    assert not sh.recorded and sh.columns == ()
    batch = rows(range(200))
    (shard, (value, part)), = sh.route(batch).items()
    assert value == 0 and part.equals(batch)
    # Lance's unsharded rule: its evaluation of the same spec is 0 for every row.
    assert set(evaluate_sharding_spec(batch, dict(sh.spec), ds.lance_schema)
               .column(0).to_pylist()) == {0}
    assert shard == sharding.table_sharding(lance.dataset(uri)).shard_id(0)  # deterministic
    store = open_store(uri)
    sharding.initialize_shard(store, sh, shard, value)
    first = ManifestStore(store, shard).load(1)
    assert (first.shard_spec_id, first.shard_field_entries) == (0, [])  # no spec to name
    with open_shard_writer(uri, shard, ds.schema, ShardWriterConfig(enable_memtable=False)) as w:
        w.put(part)
    with ds.mem_wal_writer(shard) as native:  # pylance opens and keeps our shard
        native.put(part)
        got = native.lsm_scanner().to_table().column("id").to_pylist()
    assert sorted(got) == list(range(200))  # its own rows: ours were not replayed
    # Options asking for a spec are refused as on any MemWAL without one.
    with pytest.raises(ConfigError, match="already has a MemWAL without one"):
        sharding.check_requested(sh, ShardingRequest("id", 8), uri)
