"""Table descriptions read through our store (memwal_datasource.table.table_info)."""

from __future__ import annotations

import pickle
import shutil
import threading

import pyarrow as pa
import pytest

from memwal_datasource.store import open_store
from memwal_datasource.table import table_info
from memwal_datasource.table.sharding import create_table, table_sharding
from memwal_datasource.table.table_info import (
    INFO_DIR,
    KEEP_INFOS,
    TableInfo,
    TableSharding,
    describe_table,
    info_key,
    keep,
    lance_table_exists,
    latest_manifest,
    manifest_version,
)
from memwal_datasource.table.view import open_table

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()),
                    ("s", pa.struct([("a", pa.int32())]))])


@pytest.fixture(autouse=True)
def _no_process_cache():
    for kept in (table_info._cache, table_info._schemas):
        kept.clear()
    yield
    for kept in (table_info._cache, table_info._schemas):
        kept.clear()


def test_manifest_names_as_pylance_14_writes_them():
    u64 = (1 << 64) - 1
    assert manifest_version(f"_versions/{u64 - 7:020d}.manifest") == 7  # V2 names
    assert manifest_version("_versions/7.manifest") == 7  # V1 names
    for other in ("_versions/latest_version_hint.json", "_versions/d12.manifest",
                  "_versions/.tmp_x.manifest", "_versions/3.manifest-tmp"):
        assert manifest_version(other) is None


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_existence_and_latest_version_come_from_the_store(location):
    uri, storage = location
    store = open_store(uri, storage)
    assert not lance_table_exists(store) and latest_manifest(store) is None
    assert describe_table(uri, storage) is None
    ds = create_table(uri, SCHEMA, ("id",), storage, None)
    assert lance_table_exists(store)
    assert latest_manifest(store)[0] == ds.version


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_description_is_kept_and_equals_what_pylance_reads(location):
    uri, storage = location
    ds = create_table(uri, SCHEMA, ("id",), storage, None)
    store = open_store(uri, storage)
    info = describe_table(uri, storage)
    assert store.exists(info_key(ds.version))
    table_info._cache.clear()
    kept = describe_table(uri, storage)  # read back from _memwal_tables/
    for d in (info, kept):
        assert d.version == ds.version
        assert d.schema.equals(ds.schema, check_metadata=True)
        assert d.field_ids == table_info.field_ids(ds)
        assert d.has_mem_wal
        expected = table_sharding(ds)
        got = d.sharding(uri, storage)
        assert (got.spec, got.columns, got.recorded) == (expected.spec, expected.columns, True)


def test_a_table_made_anew_at_the_same_path_is_not_taken_for_the_old_one(tmp_path):
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA, ("id",), None, None)
    old = describe_table(uri)
    rows = pa.RecordBatch.from_pylist([{"id": 1, "v": "a", "s": {"a": 1}}], schema=SCHEMA)
    old.sharding(uri).values(rows)  # this process now knows the old version's LanceSchema
    shutil.rmtree(tmp_path / "t.lance" / "_versions")  # the Lance table is gone ...
    shutil.rmtree(tmp_path / "t.lance" / "data", ignore_errors=True)
    other = pa.schema([("key", pa.string()), ("n", pa.float64())])
    create_table(uri, other, ("key",), None, None)  # ... and another one has its versions
    new = describe_table(uri)
    assert new.version == old.version
    assert new.schema.names == ["key", "n"]
    batch = pa.RecordBatch.from_pylist([{"key": "a", "n": 1.0}, {"key": "b", "n": 2.0}],
                                       schema=other)
    expected = table_sharding(open_table(uri))
    assert new.sharding(uri).values(batch).equals(expected.values(batch))


def test_a_damaged_description_is_described_again(tmp_path):
    uri = str(tmp_path / "t.lance")
    ds = create_table(uri, SCHEMA, (), None, None)
    store = open_store(uri, None)
    store.put(info_key(ds.version), b"{not json")
    info = describe_table(uri)
    assert info.schema.equals(ds.schema)
    assert TableInfo.from_json(store.get(info_key(ds.version))).version == ds.version


def test_only_the_newest_descriptions_are_kept(tmp_path):
    uri = str(tmp_path / "t.lance")
    ds = create_table(uri, SCHEMA, (), None, None)
    store = open_store(uri, None)
    base = TableInfo.of_dataset(ds)
    for v in range(1, 11):
        keep(store, TableInfo(v, base.schema, base.field_ids))
    assert sorted(store.list(f"{INFO_DIR}/")) == [info_key(v) for v in
                                                  range(11 - KEEP_INFOS, 11)]


def test_a_described_sharding_opens_the_table_only_to_route_rows(tmp_path):
    uri = str(tmp_path / "t.lance")
    ds = create_table(uri, SCHEMA, ("id",), None, None)
    sharding = describe_table(uri).sharding(uri)
    assert isinstance(sharding, TableSharding) and sharding.lance_schema is None
    batch = pa.RecordBatch.from_arrays(
        [pa.array(range(50), pa.int64()), pa.array([str(i) for i in range(50)]),
         pa.array([{"a": i} for i in range(50)], SCHEMA.field("s").type)], schema=SCHEMA)
    expected = table_sharding(open_table(uri))
    assert sharding.values(batch).equals(expected.values(batch))
    assert sharding.route(batch).keys() == expected.route(batch).keys()
    assert sharding.lance_schema is not None  # opened once, to evaluate the spec
    shipped = pickle.loads(pickle.dumps(sharding))
    assert shipped.lance_schema is None  # a pickled copy carries no pylance object
    assert shipped.values(batch).equals(expected.values(batch))
    assert ds.version == sharding.version


def _one_row(version: int) -> pa.Table:
    return pa.Table.from_pylist([{"id": version, "v": "x", "s": {"a": 1}}], schema=SCHEMA)


def test_a_planner_on_s3_finds_the_latest_version_and_its_tag_in_one_listing(
        fault_proxy, proxied_s3_table):
    uri, storage = proxied_s3_table
    ds = create_table(uri, SCHEMA, ("id",), storage, None)
    describe_table(uri, storage)  # the first: also reads (or keeps) the description
    fault_proxy.clear_records()
    info = describe_table(uri, storage)
    assert info.version == ds.version
    assert [(r.method, "list-type=2" in r.query) for r in fault_proxy.records()] == [
        ("GET", True)]  # one listing, no HEAD
    store = open_store(uri, storage)
    assert info.manifest_tag == store.version_tag(latest_manifest(store)[1])


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_warm_planner_describes_a_version_made_since_with_its_own_tag(location):
    import lance

    uri, storage = location
    ds = create_table(uri, SCHEMA, ("id",), storage, None)
    assert describe_table(uri, storage).version == ds.version
    newer = lance.write_dataset(_one_row(1), uri, mode="append", storage_options=storage)
    store = open_store(uri, storage)
    info = describe_table(uri, storage)
    assert info.version == newer.version == ds.version + 1
    assert info.manifest_tag == store.version_tag(latest_manifest(store)[1])


def test_a_lance_commit_during_a_planners_listing_is_described(
        fault_proxy, proxied_s3_table, s3_server):
    """Two actors: the planner's listing is held while a Lance append lands a newer
    version; the listing then finds the newer one with its own tag."""
    import lance

    uri, storage = proxied_s3_table
    direct = s3_server.storage_options()
    ds = create_table(uri, SCHEMA, ("id",), direct, None)
    describe_table(uri, storage)
    fault_proxy.clear_records()
    bucket = "/" + uri.split("/")[2]
    held = fault_proxy.add_rule(method="GET", key_pattern=f"^{bucket}$", fault="hold", times=1)
    got: dict = {}
    planner = threading.Thread(target=lambda: got.setdefault("info", describe_table(uri, storage)))
    planner.start()
    assert held.arrived.wait(20)
    newer = lance.write_dataset(_one_row(1), uri, mode="append", storage_options=direct)
    held.release()
    planner.join(60)
    info = got["info"]
    assert info.version == newer.version == ds.version + 1
    store = open_store(uri, direct)
    assert info.manifest_tag == store.version_tag(latest_manifest(store)[1])


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_warm_planner_tells_a_table_made_anew_at_its_path(location):
    uri, storage = location
    create_table(uri, SCHEMA, ("id",), storage, None)
    old = describe_table(uri, storage)  # warm: the next look reads this manifest's tag
    store = open_store(uri, storage)
    for key in list(store.list("")):
        store.delete(key)
    other = pa.schema([("key", pa.string()), ("n", pa.float64())])
    create_table(uri, other, ("key",), storage, None)
    new = describe_table(uri, storage)
    assert new.version == old.version and new.manifest_tag != old.manifest_tag
    assert new.schema.names == ["key", "n"]
