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

from memwal_datasource import sharding
from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import ConfigError, MemWalError
from memwal_datasource.manifest import ManifestStore, list_shards
from memwal_datasource.sharding import ShardingRequest
from memwal_datasource.store import open_store
from memwal_datasource.writer import open_shard_writer

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
    with ds.mem_wal_writer(shard) as native:  # replays our WAL, claims, flushes an SSTable
        assert native.lsm_scanner().to_table().column("id").to_pylist() == \
            part.column("id").to_pylist()
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
