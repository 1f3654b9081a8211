"""The fault-injecting S3 proxy itself, driven by boto3 and pylance against SeaweedFS."""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import io
import random
import threading
import time
import uuid
from collections.abc import Callable
from urllib.parse import quote, urlsplit

import boto3
import pyarrow as pa
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError

from tests.fault_proxy import FaultProxy, FaultRule

pytestmark = pytest.mark.s3

BUCKET = "memwal-tests"
WAIT_S = 20  # bound on every Event wait; never reached when the proxy works
# What botocore raises when the connection closes (FIN or RST) instead of answering.
DISCONNECTED = ConnectionClosedError
_SESSION = boto3.session.Session()  # one session: its clients share the loaded models


def _client(server, retries: dict | None):
    """A path-style boto3 client for ``server``; ``retries=None`` keeps boto3's defaults."""
    cfg: dict = {"s3": {"addressing_style": "path"}, "connect_timeout": 5, "read_timeout": 30}
    if retries is not None:
        cfg["retries"] = retries
    return _SESSION.client(
        "s3", endpoint_url=server.endpoint, region_name=server.region,
        aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key,
        config=Config(**cfg))


@pytest.fixture
def one_shot(proxied_s3):
    """A client through the proxy that makes exactly one attempt per call."""
    return _client(proxied_s3, {"total_max_attempts": 1})


@pytest.fixture
def direct(s3_server, s3_bucket):
    """A client straight to the server, to see what really landed."""
    return _client(s3_server, {"total_max_attempts": 1})


@pytest.fixture
def key(s3_bucket) -> str:
    return f"{uuid.uuid4().hex}/wal/000001.arrow"


def _exists(client, key: str) -> bool:
    try:
        client.head_object(Bucket=BUCKET, Key=key)
        return True
    except ClientError as exc:
        assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404, exc
        return False


def _read(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, threading.Event, dict]:
    """Run ``fn`` in a thread; ``done`` is set with ``out["result"]`` or ``out["error"]``."""
    done, out = threading.Event(), {}

    def run() -> None:
        try:
            out["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done, out


def test_forwards_put_get_list_head_delete(fault_proxy, one_shot, direct, key):
    blob = bytes(range(256)) * 12289  # ~3 MiB, every byte value
    odd = f"{key.rsplit('/', 1)[0]}/odd name +ü%.txt"
    one_shot.put_object(Bucket=BUCKET, Key=key, Body=blob)
    one_shot.put_object(Bucket=BUCKET, Key=odd, Body=io.BytesIO(b"file-like"))
    head = one_shot.head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] == len(blob)
    assert head["ETag"].strip('"') == hashlib.md5(blob).hexdigest()
    assert _read(one_shot, key) == blob
    assert _read(direct, odd) == b"file-like"
    rng = one_shot.get_object(Bucket=BUCKET, Key=key, Range="bytes=256-511")["Body"].read()
    assert rng == bytes(range(256))
    prefix = key.rsplit("/", 1)[0] + "/"
    listed = one_shot.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted([key, odd])
    one_shot.delete_object(Bucket=BUCKET, Key=odd)
    assert not _exists(direct, odd)
    with pytest.raises(ClientError) as err:
        one_shot.head_object(Bucket=BUCKET, Key=odd)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404

    recs = fault_proxy.records()
    assert [r.method for r in recs] == ["PUT", "PUT", "HEAD", "GET", "GET", "GET", "DELETE",
                                        "HEAD"]
    assert [r.status for r in recs] == [200, 200, 200, 200, 206, 200, 204, 404]
    assert all(r.forwarded and r.fault is None and r.status == r.upstream_status for r in recs)
    assert recs[1].path == f"/{BUCKET}/{odd}" and recs[1].header("Expect") == "100-continue"
    assert recs[5].path == f"/{BUCKET}" and f"prefix={quote(prefix, safe='')}" in recs[5].query
    assert len({r.conn for r in recs}) == 1  # boto3 kept one connection alive throughout


def test_forwards_a_chunked_request_body(fault_proxy, proxied_s3, direct, key):
    """A SigV4-signed PUT with ``Transfer-Encoding: chunked`` passes through unchanged."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    chunks = [b"chunk-one|", b"x" * 70000, b"|last"]
    netloc = urlsplit(proxied_s3.endpoint).netloc
    req = AWSRequest("PUT", f"{proxied_s3.endpoint}/{BUCKET}/{key}", data=b"".join(chunks),
                     headers={"Host": netloc, "Transfer-Encoding": "chunked"})
    S3SigV4Auth(Credentials(proxied_s3.access_key, proxied_s3.secret_key), "s3",
                proxied_s3.region).add_auth(req)
    conn = http.client.HTTPConnection(netloc, timeout=WAIT_S)
    conn.putrequest("PUT", f"/{BUCKET}/{key}", skip_host=True, skip_accept_encoding=True)
    for name, value in req.headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    for chunk in chunks:
        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    resp.read()
    conn.request("GET", "/", headers={"Host": netloc})  # the connection is still usable
    assert conn.getresponse().status in (200, 403)
    conn.close()
    assert _read(direct, key) == b"".join(chunks)
    put = fault_proxy.records(method="PUT")[0]
    assert put.header("Transfer-Encoding") == "chunked" and put.forwarded


def test_drop_response_on_conditional_put_lands_but_client_fails(fault_proxy, one_shot,
                                                                  direct, key):
    rule = fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=r"/wal/",
                                          fault="drop_response", times=1,
                                          only_conditional=True))
    with pytest.raises(DISCONNECTED):
        one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"entry-1", IfNoneMatch="*")
    assert rule.arrived.is_set() and rule.hits == 1
    assert _read(direct, key) == b"entry-1"  # the write landed
    (put,) = fault_proxy.records(method="PUT")
    assert (put.conditional, put.forwarded, put.upstream_status, put.status, put.fault) == \
        (True, True, 200, None, "drop_response")
    # The rule is spent: the next conditional PUT gets the server's real answer.
    with pytest.raises(ClientError) as err:
        one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"entry-1", IfNoneMatch="*")
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"


def test_drop_response_with_sdk_retries_turns_success_into_412(fault_proxy, proxied_s3,
                                                                direct, key):
    """The hazard: boto3's own retry of a conditional PUT whose reply was lost sees 412."""
    client = _client(proxied_s3, retries=None)  # boto3 defaults: standard mode, 3 attempts
    fault_proxy.add_rule(FaultRule(method="PUT", fault="drop_response", times=1,
                                   only_conditional=True))
    with pytest.raises(ClientError) as err:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"entry-1", IfNoneMatch="*")
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert _read(direct, key) == b"entry-1"  # ... although it was this client's write
    puts = fault_proxy.records(method="PUT")
    assert [(p.forwarded, p.upstream_status, p.status) for p in puts] == \
        [(True, 200, None), (True, 412, 412)]
    assert [p.header("amz-sdk-request") for p in puts] == \
        ["attempt=1; max=3", "attempt=2; max=3"]


@pytest.mark.parametrize("status,code", [(500, "InternalError"), (503, "SlowDown")])
def test_error_after_lands(fault_proxy, one_shot, direct, key, status, code):
    fault_proxy.add_rule(FaultRule(method="PUT", fault="error_after", status=status))
    with pytest.raises(ClientError) as err:
        one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"landed", IfNoneMatch="*")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert err.value.response["Error"]["Code"] == code
    assert _read(direct, key) == b"landed"
    (put,) = fault_proxy.records(method="PUT")
    assert (put.forwarded, put.upstream_status, put.status) == (True, 200, status)
    assert one_shot.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == 6  # still usable


@pytest.mark.parametrize("fault,rst", [("error_before", False), ("reset_before", False),
                                       ("reset_before", True)])
def test_faults_before_forwarding_land_nothing(fault_proxy, one_shot, direct, key, fault, rst):
    fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=r"/wal/", fault=fault, status=503,
                                   rst=rst))
    expected = ClientError if fault == "error_before" else DISCONNECTED
    with pytest.raises(expected) as err:
        one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"never", IfNoneMatch="*")
    if fault == "error_before":
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert not _exists(direct, key)
    (put,) = fault_proxy.records(method="PUT")
    assert (put.forwarded, put.upstream_status, put.status, put.fault) == \
        (False, None, 503 if fault == "error_before" else None, fault)
    other = key.replace("/wal/", "/other/")
    one_shot.put_object(Bucket=BUCKET, Key=other, Body=b"ok")  # unmatched keys pass
    assert _read(direct, other) == b"ok"


def test_times_lets_sdk_retry_succeed_and_is_recorded(fault_proxy, proxied_s3, direct, key):
    client = _client(proxied_s3, retries={"mode": "standard", "max_attempts": 3})
    rule = fault_proxy.add_rule(FaultRule(method="PUT", fault="error_before", status=503,
                                          times=1))
    client.put_object(Bucket=BUCKET, Key=key, Body=b"second try", IfNoneMatch="*")
    assert _read(direct, key) == b"second try"
    assert rule.hits == 1
    puts = fault_proxy.records(method="PUT")
    assert [(p.fault, p.forwarded, p.status) for p in puts] == \
        [("error_before", False, 503), (None, True, 200)]
    # Exactly one PUT per conditional write reached the server.
    assert len(fault_proxy.records(method="PUT", forwarded=True)) == 1


def test_matching_by_method_key_conditional_and_times(fault_proxy, one_shot, key):
    prefix = key.rsplit("/", 1)[0]
    cond = fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=r"/wal/.*\.arrow$",
                                          fault="error_before", only_conditional=True))
    gets = fault_proxy.add_rule(FaultRule(method="GET", key_pattern=r"/wal/", times=2,
                                          fault="error_before", status=500))
    one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"plain")  # not conditional: passes
    with pytest.raises(ClientError):
        one_shot.put_object(Bucket=BUCKET, Key=f"{prefix}/wal/x.arrow", Body=b"c",
                            IfNoneMatch="*")
    one_shot.put_object(Bucket=BUCKET, Key=f"{prefix}/wal/x.json", Body=b"c", IfNoneMatch="*")
    for _ in range(2):
        with pytest.raises(ClientError):
            one_shot.get_object(Bucket=BUCKET, Key=key)
    assert _read(one_shot, key) == b"plain"  # the third GET is past ``times``
    assert (cond.hits, gets.hits) == (1, 2)
    assert [(r.method, r.conditional, r.fault) for r in fault_proxy.records()] == [
        ("PUT", False, None), ("PUT", True, "error_before"), ("PUT", True, None),
        ("GET", False, "error_before"), ("GET", False, "error_before"), ("GET", False, None)]
    fault_proxy.clear_records()
    assert fault_proxy.records() == []


def test_probability_is_seeded(fault_proxy, one_shot, direct, key):
    direct.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    rule = fault_proxy.add_rule(FaultRule(method="HEAD", fault="error_before", status=503,
                                          probability=0.5, seed=7))
    outcomes = []
    for _ in range(24):
        try:
            one_shot.head_object(Bucket=BUCKET, Key=key)
            outcomes.append(False)
        except ClientError:
            outcomes.append(True)
    rng = random.Random(7)
    assert outcomes == [rng.random() < 0.5 for _ in range(24)]
    assert 0 < sum(outcomes) < 24 and rule.hits == sum(outcomes)
    assert [r.fault is not None for r in fault_proxy.records()] == outcomes


def test_hold_pauses_a_request_until_released(fault_proxy, one_shot, direct, key):
    rule = fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=r"/wal/", fault="hold"))
    thread, done, out = _in_thread(
        lambda: one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"held", IfNoneMatch="*"))
    assert rule.arrived.wait(WAIT_S)
    assert not _exists(direct, key)  # held before forwarding: nothing landed yet
    assert not done.is_set()
    (put,) = fault_proxy.records(method="PUT")
    assert (put.fault, put.forwarded, put.status) == ("hold", False, None)
    rule.release()
    assert done.wait(WAIT_S) and "error" not in out, out
    assert out["result"]["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert _read(direct, key) == b"held"
    assert (put.forwarded, put.status) == (True, 200)
    thread.join(WAIT_S)


def test_hold_after_lands_the_write_but_holds_the_reply(fault_proxy, one_shot, direct, key):
    rule = fault_proxy.add_rule(FaultRule(method="PUT", fault="hold_after"))
    _, done, out = _in_thread(
        lambda: one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"landed", IfNoneMatch="*"))
    assert rule.arrived.wait(WAIT_S)
    assert _read(direct, key) == b"landed"  # the write is visible ...
    assert not done.is_set()  # ... while its writer still waits for the reply
    (put,) = fault_proxy.records(method="PUT")
    assert (put.forwarded, put.upstream_status, put.status) == (True, 200, None)
    rule.release()
    assert done.wait(WAIT_S) and "error" not in out, out
    assert put.status == 200


def test_delay_forwards_late(fault_proxy, one_shot, direct, key):
    fault_proxy.add_rule(FaultRule(method="PUT", fault="delay", delay_s=0.3))
    start = time.monotonic()
    one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"late")
    assert time.monotonic() - start >= 0.3
    assert _read(direct, key) == b"late"


def test_stop_releases_held_requests(s3_server, s3_bucket, key):
    with FaultProxy(s3_server.endpoint) as proxy:
        rule = proxy.add_rule(fault="hold", method="GET")
        through = dataclasses.replace(s3_server, endpoint=proxy.endpoint, _proc=None)
        client = _client(through, {"total_max_attempts": 1})
        _, done, out = _in_thread(lambda: client.get_object(Bucket=BUCKET, Key=key))
        assert rule.arrived.wait(WAIT_S)
        assert not done.is_set()
    assert rule.released.is_set()
    assert done.wait(WAIT_S)  # disconnected, not left hanging
    assert "error" in out
    assert [(r.forwarded, r.status) for r in proxy.records()] == [(False, None)]


def test_pylance_writes_and_reads_through_the_proxy(fault_proxy, proxied_s3_table, direct):
    import lance

    uri, opts = proxied_s3_table
    assert opts["aws_endpoint"] == fault_proxy.endpoint and uri.startswith(f"s3://{BUCKET}/")
    table = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    # A transient 503 on the first data-file PUT: object_store retries it itself.
    flaky = fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=r"/data/.*\.lance$",
                                           fault="error_before", status=503, times=1))
    lance.write_dataset(table, uri, storage_options=opts)
    assert lance.dataset(uri, storage_options=opts).to_table().equals(table)
    assert flaky.hits == 1
    prefix = uri.removeprefix(f"s3://{BUCKET}/")
    landed = direct.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    assert any(o["Key"].endswith(".manifest") for o in landed)
    puts = fault_proxy.records(method="PUT")
    data_puts = [p for p in puts if "/data/" in p.path]
    assert [(p.forwarded, p.status) for p in data_puts] == [(False, 503), (True, 200)]
    manifests = [p for p in puts if p.path.endswith(".manifest")]
    assert manifests and all(p.conditional and p.status == 200 for p in manifests)
    # object_store sends plain Content-Length bodies: no chunked framing, no Expect.
    assert all(p.header("content-length") and not p.header("transfer-encoding")
               and not p.header("expect") for p in puts)
    assert all(p.header("host") == urlsplit(fault_proxy.endpoint).netloc
               for p in fault_proxy.records())


def test_pylance_own_retry_of_a_dropped_manifest_put_sees_412(fault_proxy, proxied_s3_table):
    """object_store also retries a conditional PUT whose reply was lost; Lance then reads the
    manifest back and accepts it (documents the client behaviour the proxy exposes)."""
    import lance

    uri, opts = proxied_s3_table
    fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=r"/_versions/.*\.manifest$",
                                   fault="drop_response", times=1, only_conditional=True))
    table = pa.table({"id": pa.array([7], pa.int64())})
    lance.write_dataset(table, uri, storage_options=opts)
    assert lance.dataset(uri, storage_options=opts).to_table().equals(table)
    manifest_puts = fault_proxy.records(method="PUT", key_pattern=r"\.manifest$")
    assert [(p.fault, p.upstream_status, p.status) for p in manifest_puts] == \
        [("drop_response", 200, None), (None, 412, 412)]


def test_round_trips_count_requests_in_flight_together_once(fault_proxy, one_shot, key):
    rule = fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=r"/wal/", fault="hold"))
    thread, done, out = _in_thread(
        lambda: one_shot.put_object(Bucket=BUCKET, Key=key, Body=b"x", IfNoneMatch="*"))
    assert rule.arrived.wait(WAIT_S)
    assert not _exists(one_shot, key)  # starts and ends while the PUT is in flight
    rule.release()
    assert done.wait(WAIT_S) and "error" not in out, out
    thread.join(WAIT_S)
    assert fault_proxy.round_trips() == 1
    assert _exists(one_shot, key)  # after both: a round trip of its own
    assert len(fault_proxy.records()) == 3 and fault_proxy.round_trips() == 2
    fault_proxy.clear_records()
    assert fault_proxy.round_trips() == 0
