"""The put-if-absent contract on every backend, plus backend-specific errors."""

from __future__ import annotations

import os
import threading

import pytest

from memwal_datasource.errors import (
    ConfigError,
    StoreAuthError,
    StoreNotFoundError,
    UnsupportedStoreError,
)
from memwal_datasource.store import LocalStore, MemoryStore, S3Store, open_store


def test_put_if_absent_contract(any_store):
    any_store.put_if_absent("a/b/one", b"first")
    with pytest.raises(FileExistsError) as info:
        any_store.put_if_absent("a/b/one", b"second")
    assert "a/b/one" in str(info.value)
    assert any_store.get("a/b/one") == b"first"  # the loser changed nothing
    assert any_store.exists("a/b/one")
    assert any_store.head("a/b/one") == 5
    assert not any_store.exists("a/b/two")
    assert any_store.head("a/b/two") is None


def test_get_missing_raises_file_not_found(any_store):
    with pytest.raises(FileNotFoundError):
        any_store.get("nope/missing")


def test_put_overwrites_and_delete(any_store):
    any_store.put("h/hint.json", b"1")
    any_store.put("h/hint.json", b"2")
    assert any_store.get("h/hint.json") == b"2"
    any_store.delete("h/hint.json")
    assert not any_store.exists("h/hint.json")
    any_store.delete("h/hint.json")  # missing is fine


def test_list_and_list_dirs(any_store):
    for key in ("_mem_wal/s1/wal/x.arrow", "_mem_wal/s1/manifest/y.binpb",
                "_mem_wal/s2/wal/z.arrow", "other/k"):
        any_store.put_if_absent(key, b"v")
    assert sorted(any_store.list("_mem_wal/s1/")) == [
        "_mem_wal/s1/manifest/y.binpb", "_mem_wal/s1/wal/x.arrow"]
    assert any_store.list_dirs("_mem_wal") == ["s1", "s2"]
    assert any_store.list_dirs("_mem_wal/") == ["s1", "s2"]
    assert list(any_store.list("absent/")) == []
    assert any_store.list_dirs("absent") == []


def test_concurrent_put_if_absent_has_one_winner(any_store):
    n = 8
    wins: list[int] = []
    barrier = threading.Barrier(n)

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            any_store.put_if_absent("race/key", f"writer-{i}".encode())
            wins.append(i)
        except FileExistsError:
            pass

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert any_store.get("race/key") == f"writer-{wins[0]}".encode()


def test_local_store_leaves_no_temp_files(tmp_path):
    store = LocalStore(str(tmp_path))
    store.put_if_absent("d/k", b"x")
    with pytest.raises(FileExistsError):
        store.put_if_absent("d/k", b"y")
    assert os.listdir(tmp_path / "d") == ["k"]


def test_local_store_ignores_hidden_temp_files_in_listing(tmp_path):
    store = LocalStore(str(tmp_path))
    store.put_if_absent("d/k", b"x")
    (tmp_path / "d" / ".k.123.tmp").write_bytes(b"half")  # a crashed writer's leftover
    assert list(store.list("d/")) == ["d/k"]


def test_open_store_by_scheme(tmp_path):
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert open_store(f"file://{tmp_path}").root == str(tmp_path)
    assert isinstance(open_store("memory://x"), MemoryStore)
    MemoryStore.reset("x")
    s3 = open_store("s3://bucket/prefix/t.lance", {"aws_region": "us-east-1"})
    assert isinstance(s3, S3Store) and s3.prefix == "prefix/t.lance"


@pytest.mark.parametrize("uri", ["gs://b/t", "az://c/t", "hdfs://nn/t", "http://h/t"])
def test_unknown_scheme_is_refused(uri):
    with pytest.raises(UnsupportedStoreError, match="conditional writes"):
        open_store(uri)


def test_plain_http_endpoint_needs_allow_http():
    with pytest.raises(ConfigError, match="allow_http"):
        open_store("s3://b/t", {"aws_endpoint": "http://127.0.0.1:1"})


def test_s3_missing_bucket(s3_server):
    store = open_store("s3://no-such-bucket-here/t.lance", s3_server.storage_options())
    with pytest.raises(StoreNotFoundError, match="no-such-bucket-here"):
        store.put_if_absent("k", b"v")
    with pytest.raises(StoreNotFoundError, match="no-such-bucket-here"):
        store.check_bucket()


def test_s3_wrong_credentials(s3_table):
    uri, opts = s3_table
    bad = dict(opts, aws_secret_access_key="definitely-wrong-secret")
    store = open_store(uri, bad)
    with pytest.raises(StoreAuthError) as info:
        store.put_if_absent("k", b"v")
    assert "definitely-wrong-secret" not in str(info.value)  # never print secrets
    assert "aws_secret_access_key" in str(info.value)
    assert not open_store(uri, opts).exists("k")


def test_s3_options_repr_hides_secret(s3_table):
    uri, opts = s3_table
    store = open_store(uri, opts)
    assert opts["aws_secret_access_key"] not in repr(store.options)
