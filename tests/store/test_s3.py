"""S3 (:mod:`memwal_datasource.store.s3`): errors, the obstore data path and its
boto3 fallback in forked processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from memwal_datasource.errors import (
    ConfigError,
    StoreAuthError,
    StoreNotFoundError,
    TransientStoreError,
)
from memwal_datasource.options import S3Options
from memwal_datasource.store import open_store, put_resolved
from memwal_datasource.store.s3_clients import obstore_config
from tests.fault_proxy import FaultRule


def test_plain_http_endpoint_needs_allow_http():
    with pytest.raises(ConfigError, match="allow_http"):
        open_store("s3://b/t", {"aws_endpoint": "http://127.0.0.1:1"})


def test_s3_missing_bucket(s3_server):
    store = open_store("s3://no-such-bucket-here/t.lance", s3_server.storage_options())
    # The fix first, on obstore's data path (the PUT) and boto3's (the bucket check),
    # as GCS and Azure say it (tests/store/test_gcs_azure.py).
    fix = "^create the bucket first: bucket 'no-such-bucket-here' does not exist"
    with pytest.raises(StoreNotFoundError, match=fix):
        store.put_if_absent("k", b"v")
    with pytest.raises(StoreNotFoundError, match=fix):
        store.check_bucket()


def test_s3_wrong_credentials(s3_table):
    uri, opts = s3_table
    bad = dict(opts, aws_secret_access_key="definitely-wrong-secret")
    store = open_store(uri, bad)
    with pytest.raises(StoreAuthError) as info:
        store.put_if_absent("k", b"v")
    assert "definitely-wrong-secret" not in str(info.value)  # never print secrets
    assert str(info.value).startswith("check aws_access_key_id / aws_secret_access_key: ")
    assert not open_store(uri, opts).exists("k")


def test_s3_options_repr_hides_secret(s3_table):
    uri, opts = s3_table
    store = open_store(uri, opts)
    assert opts["aws_secret_access_key"] not in repr(store.options)


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
