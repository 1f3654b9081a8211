"""The put-if-absent contract on every backend, plus backend-specific errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid

import pytest

from memwal_datasource.errors import (
    ConfigError,
    StoreAuthError,
    StoreNotFoundError,
    TransientStoreError,
    UnsupportedStoreError,
)
from memwal_datasource.options import S3Options
from memwal_datasource.store import (
    LocalStore,
    MemoryStore,
    S3Store,
    byte_view,
    open_store,
    put_resolved,
    same_bytes,
)
from memwal_datasource.store.s3_clients import obstore_config
from tests.fault_proxy import FaultRule


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


@pytest.mark.parametrize("uri", ["gcs://b/t", "azure://c/t", "hdfs://nn/t", "http://h/t"])
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


# --- payloads: any bytes-like object --------------------------------------------------

def _payloads() -> dict[str, object]:
    import numpy as np
    import pyarrow as pa

    raw = bytes(range(256)) * 5
    return {"bytes": raw, "bytearray": bytearray(raw), "memoryview": memoryview(raw)[7:900],
            "pyarrow.Buffer": pa.py_buffer(raw), "pyarrow slice": pa.py_buffer(raw).slice(3, 500),
            "numpy uint8": np.frombuffer(raw, dtype=np.uint8)}


def test_bytes_like_payloads_round_trip(any_store):
    for name, payload in _payloads().items():
        expected = bytes(memoryview(payload).cast("B"))
        any_store.put_if_absent(f"p/{name}", payload)
        assert any_store.get(f"p/{name}") == expected, name
        assert any_store.head(f"p/{name}") == len(expected)
        any_store.put(f"h/{name}", payload)
        assert any_store.get(f"h/{name}") == expected, name


def test_memory_store_keeps_its_own_copy():
    store = MemoryStore(uuid.uuid4().hex)
    buf = bytearray(b"abc")
    store.put_if_absent("k", buf)
    buf[0:1] = b"X"  # the writer reuses its buffer
    assert store.get("k") == b"abc"


def test_put_resolved_reads_back_any_bytes_like(any_store):
    import pyarrow as pa

    data = pa.py_buffer(b"entry-bytes" * 100)
    assert put_resolved(any_store, "r/k", data, retries=0, base_delay_ms=1, what="test")
    # A second call finds the key: the read-back compares against a pyarrow Buffer.
    assert put_resolved(any_store, "r/k", data, retries=0, base_delay_ms=1, what="test")
    assert not put_resolved(any_store, "r/k", memoryview(b"other"), retries=0,
                            base_delay_ms=1, what="test")


def test_byte_view_copies_nothing_for_contiguous_buffers():
    import pyarrow as pa

    buf = pa.py_buffer(b"xyz")
    view = byte_view(buf)
    assert view.format == "B" and view.obj is buf  # the Arrow memory itself
    raw = bytearray(b"abcd")
    assert byte_view(memoryview(raw)[1:3]).tobytes() == b"bc"
    assert byte_view(memoryview(raw)[::2]).tobytes() == b"ac"  # strided: copied
    assert same_bytes(b"xyz", buf) and not same_bytes(b"xy", buf)


# --- S3: the obstore data path ----------------------------------------------------------

@pytest.mark.s3
@pytest.mark.parametrize("status", [409, 500, 503])
def test_s3_conditional_put_failure_is_sent_once_and_transient(proxied_s3_table, fault_proxy,
                                                               status):
    uri, opts = proxied_s3_table
    store = open_store(uri, opts)
    fault_proxy.add_rule(FaultRule(method="PUT", only_conditional=True, fault="error_before",
                                   status=status))
    with pytest.raises(TransientStoreError) as info:
        store.put_if_absent("k", b"v")
    assert str(status) in str(info.value) and "/k" in str(info.value)
    assert len(fault_proxy.records(method="PUT")) == 1  # no SDK retry behind our back
    fault_proxy.clear_rules()
    assert not store.exists("k")


@pytest.mark.s3
@pytest.mark.parametrize("fault", [dict(fault="reset_before"), dict(fault="drop_response")])
def test_s3_lost_connection_is_transient_and_resolved_by_read_back(proxied_s3_table,
                                                                   fault_proxy, fault):
    uri, opts = proxied_s3_table
    store = open_store(uri, opts)
    fault_proxy.add_rule(FaultRule(method="PUT", only_conditional=True, times=1, **fault))
    with pytest.raises(TransientStoreError, match="cannot reach S3"):
        store.put_if_absent("k", b"v")
    landed = fault["fault"] == "drop_response"
    assert store.exists("k") == landed
    # The protocol's retry: one more PUT, and a 412 on our own bytes is success.
    assert put_resolved(store, "k", b"v", retries=1, base_delay_ms=1, what="test")
    assert len(fault_proxy.records(method="PUT")) == 2


@pytest.mark.s3
def test_s3_reads_keep_retries(proxied_s3_table, fault_proxy):
    uri, opts = proxied_s3_table
    store = open_store(uri, opts)
    store.put_if_absent("k", b"v")
    fault_proxy.add_rule(FaultRule(method="GET", fault="error_before", status=503, times=1))
    assert store.get("k") == b"v"
    assert len(fault_proxy.records(method="GET")) == 2


@pytest.mark.s3
def test_s3_lance_option_names_work_for_both_clients(s3_server, s3_bucket):
    """aws_allow_http / aws_token / aws_endpoint / aws_region / virtual-hosted: obstore
    carries the writes, boto3 the listing; both must read the same names."""
    opts = {"aws_endpoint": s3_server.endpoint, "aws_region": s3_server.region,
            "aws_access_key_id": s3_server.access_key,
            "aws_secret_access_key": s3_server.secret_key,
            "aws_allow_http": "true", "aws_virtual_hosted_style_request": "false"}
    uri = f"s3://{s3_bucket}/{uuid.uuid4().hex}/t.lance"
    store = open_store(uri, opts)
    assert store.options.path_style and store.data_client() == "obstore"
    store.put_if_absent("a/k", b"v")
    assert list(store.list("a/")) == ["a/k"] and store.get("a/k") == b"v"
    parsed = S3Options.from_storage_options(dict(opts, aws_token="session-tok"))
    assert parsed.session_token == "session-tok"
    config, client_options = obstore_config(parsed)
    assert config["aws_session_token"] == "session-tok" and client_options["allow_http"]
    assert config["aws_virtual_hosted_style_request"] == "false"
    assert "session-tok" not in repr(parsed)


_FORK_SCRIPT = r"""
import os, sys
from memwal_datasource.store import open_store, put_resolved
assert "obstore" not in sys.modules, "obstore touched at import time"
uri, endpoint, key_id, secret = sys.argv[1:5]
opts = {"aws_endpoint": endpoint, "aws_access_key_id": key_id, "aws_secret_access_key": secret,
        "aws_region": "us-east-1", "allow_http": "true"}
store = open_store(uri, opts)

def child(name):
    pid = os.fork()
    if pid == 0:
        try:
            s = open_store(uri, opts)
            s.put_if_absent(name, name.encode())
            ok = (s.get(name) == name.encode()
                  and put_resolved(s, name, name.encode(), retries=0, base_delay_ms=1, what=name))
            print(name, s.data_client(), ok, flush=True)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

child("before")  # the parent has not run obstore yet: the child may
store.put_if_absent("parent", b"parent")
print("parent", store.data_client(), store.get("parent") == b"parent", flush=True)
child("after")  # obstore's runtime does not survive fork: this child uses boto3
store.put_if_absent("parent-again", b"x")
print("parent-again", store.data_client(), store.get("parent-again") == b"x", flush=True)
"""


@pytest.mark.s3
def test_s3_store_works_in_forked_children(s3_table, s3_server, tmp_path):
    """A child forked after the parent used obstore must not hang (it switches to boto3)."""
    uri, _ = s3_table
    script = tmp_path / "fork_child.py"
    script.write_text(_FORK_SCRIPT)
    # Its own session, so a hung child is killed with its parent (a hang fails the test).
    proc = subprocess.Popen(
        [sys.executable, str(script), uri, s3_server.endpoint, s3_server.access_key,
         s3_server.secret_key],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"a forked child hung using the S3 store; output so far: {out!r}")
    assert proc.returncode == 0, err
    assert out.split("\n")[:4] == [
        "before obstore True", "parent obstore True", "after boto3 True",
        "parent-again obstore True"], out + err


@pytest.mark.s3
def test_s3_credentials_from_the_aws_chain(s3_server, s3_bucket, tmp_path, monkeypatch):
    """No keys in the options: boto3's chain (here a shared credentials file, which
    object_store alone does not read) supplies them to the obstore data path too."""
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {s3_server.access_key}\n"
                     f"aws_secret_access_key = {s3_server.secret_key}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    store = open_store(f"s3://{s3_bucket}/{uuid.uuid4().hex}/t.lance",
                       {"aws_endpoint": s3_server.endpoint, "aws_region": s3_server.region,
                        "allow_http": "true"})
    assert store.data_client() == "obstore"
    store.put_if_absent("k", b"v")
    assert store.get("k") == b"v" and list(store.list("")) == ["k"]


def test_local_path_is_one_plain_absolute_path(tmp_path, monkeypatch):
    from memwal_datasource.store import local_path

    spaced = tmp_path / "a b" / "t.lance"
    assert local_path(spaced.as_uri()) == str(spaced)  # %20 decoded, as Lance decodes it
    assert local_path(str(spaced)) == str(spaced)
    assert local_path("file://localhost" + str(spaced)) == str(spaced)
    monkeypatch.chdir(tmp_path)
    assert local_path("rel/t.lance") == str(tmp_path / "rel" / "t.lance")
    assert local_path("s3://b/t.lance") is None and local_path("memory://x") is None
    assert open_store(spaced.as_uri()).root == open_store(str(spaced)).root == str(spaced)
    with pytest.raises(UnsupportedStoreError) as err:
        local_path("file://tmp/t.lance")
    assert str(err.value).startswith("write file:///tmp/t.lance (three slashes) or a plain path")


@pytest.mark.s3
def test_missing_s3_credentials_are_named(s3_server, s3_bucket, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # A timeout no other test uses: boto3 clients are cached per options, and a
    # cached one would hold credentials another test's environment supplied.
    store = open_store(f"s3://{s3_bucket}/t.lance",
                       {"aws_endpoint": s3_server.endpoint, "aws_region": s3_server.region,
                        "allow_http": "true", "s3_connect_timeout_s": "7.25"})
    with pytest.raises(StoreAuthError) as err:
        store.check_bucket()
    first = str(err.value).split(": ", 1)[0]
    assert first.startswith("Set storage.aws_access_key_id and storage.aws_secret_access_key")
    assert "AWS_ACCESS_KEY_ID" in first and "cannot reach" not in str(err.value)
