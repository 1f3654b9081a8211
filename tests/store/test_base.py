"""Helpers of :mod:`memwal_datasource.store.base`."""

from __future__ import annotations

import threading
import uuid

import pytest

from memwal_datasource.errors import TransientStoreError
from memwal_datasource.store import (
    MemoryStore,
    PutOutcome,
    beside,
    byte_view,
    conditional_put_error,
    conditional_put_outcome,
    open_store,
    read_both,
    same_bytes,
)


def test_byte_view_copies_nothing_for_contiguous_buffers():
    import pyarrow as pa

    buf = pa.py_buffer(b"xyz")
    view = byte_view(buf)
    assert view.format == "B" and view.obj is buf  # the Arrow memory itself
    raw = bytearray(b"abcd")
    assert byte_view(memoryview(raw)[1:3]).tobytes() == b"bc"
    assert byte_view(memoryview(raw)[::2]).tobytes() == b"ac"  # strided: copied
    assert same_bytes(b"xyz", buf) and not same_bytes(b"xy", buf)


# --- the one reading of conditional-write answers ---------------------------------------

EXISTS, UNKNOWN = PutOutcome.EXISTS, PutOutcome.UNKNOWN

# (status, code, precondition_failed) -> outcome, for every backend's answers.
ANSWERS = [
    ((412, "PreconditionFailed", False), EXISTS),  # S3 If-None-Match: *, GCS generation 0
    ((412, "HTTP 412", False), EXISTS),  # obstore with no XML code in the body
    ((412, "ConditionNotMet", False), EXISTS),  # Azure's 412
    ((409, "BlobAlreadyExists", False), EXISTS),  # Azure's existing blob
    ((304, "HTTP 304", False), EXISTS),  # object_store's NotModified from some S3s
    ((None, "", True), EXISTS),  # no status readable, but the SDK says precondition failed
    ((409, "ConditionalRequestConflict", False), UNKNOWN),  # S3: racing conditional PUTs
    ((409, "OperationAborted", False), UNKNOWN),
    ((409, "LeaseIdMissing", False), UNKNOWN),  # Azure: a lease, not an existing blob
    ((409, "HTTP 409", False), UNKNOWN),
    ((409, "InternalError", True), UNKNOWN),  # a readable status beats the SDK's class
    ((None, "", False), None),  # a lost connection: the general mapping's transient
    ((404, "NoSuchBucket", False), None),
    ((403, "AccessDenied", False), None),
    ((500, "InternalError", False), None),
    ((503, "SlowDown", False), None),
]


@pytest.mark.parametrize(("answer", "outcome"), ANSWERS)
def test_conditional_put_outcome_table(answer, outcome):
    status, code, precondition_failed = answer
    assert conditional_put_outcome(status, code,
                                   precondition_failed=precondition_failed) is outcome
    mapped = conditional_put_error(status, code, "s3://b/t/k",
                                   precondition_failed=precondition_failed)
    if outcome is None:
        assert mapped is None
    elif outcome is EXISTS:
        assert type(mapped) is FileExistsError and str(mapped) == "s3://b/t/k"
    else:
        assert isinstance(mapped, TransientStoreError)
        assert str(mapped).startswith("conflict writing s3://b/t/k: ")
        assert str(status) in str(mapped) and code in str(mapped)


def _obstore_exception(status: int, code: str) -> Exception:
    """An obstore error as object_store words it (the class is what obstore picks)."""
    from obstore.exceptions import AlreadyExistsError, GenericError, PreconditionError

    cls = {409: AlreadyExistsError, 412: PreconditionError}.get(status, GenericError)
    return cls(f"Generic error: Error performing PUT http://127.0.0.1:1/b/k in 2ms: Server "
               f"returned non-2xx status code: {status} Status: <?xml version=\"1.0\"?>"
               f"<Error><Code>{code}</Code><Message>m</Message></Error>")


@pytest.mark.parametrize(("status", "code"), [(412, "PreconditionFailed"),
                                              (409, "BlobAlreadyExists"),
                                              (409, "ConditionalRequestConflict"),
                                              (409, "InternalError"), (503, "SlowDown")])
def test_every_backend_reads_a_conditional_answer_the_same_way(status, code, monkeypatch):
    """S3 (obstore and boto3), GCS and Azure all map a create-only PUT's answer
    through the one table: the same exception class for the same answer."""
    from botocore.stub import Stubber

    from memwal_datasource.store import s3 as s3_module
    from memwal_datasource.store import s3_clients

    expected = {EXISTS: FileExistsError, UNKNOWN: TransientStoreError,
                None: TransientStoreError}[conditional_put_outcome(status, code)]
    s3 = open_store("s3://b/t", {"aws_region": "us-east-1", "aws_access_key_id": "id",
                                 "aws_secret_access_key": "secret"})
    stores = [s3, open_store("gs://b/t", {}),
              open_store("az://c/t", {"azure_storage_account_name": "a"})]
    exc = _obstore_exception(status, code)
    got = [type(s3_module.obstore_error(exc, where="w", bucket="b", endpoint="e",
                                        conditional=True))]
    got += [type(store._map(exc, "k", conditional=True)) for store in stores[1:]]

    # boto3, the data path of a process forked from one that used obstore.
    client = s3_clients.boto3_client(s3.options, conditional=True)
    monkeypatch.setattr(s3_module, "obstore_usable", lambda: False)
    with Stubber(client) as stub:
        stub.add_client_error("put_object", service_error_code=code, http_status_code=status)
        with pytest.raises(Exception) as info:  # noqa: PT011 - the class is what is compared
            s3.put_if_absent("k", b"v")
    got.append(type(info.value))
    assert got == [expected] * 4


class _Remote(MemoryStore):
    remote = True


def test_read_both_overlaps_two_reads_on_a_remote_store_only():
    """On a remote store both reads are in flight at once (each waits for the other at a
    barrier); elsewhere they run one after the other, in order."""
    meet = threading.Barrier(2, timeout=10)
    both = read_both(_Remote(uuid.uuid4().hex), lambda: (meet.wait(), "a")[1],
                     lambda: (meet.wait(), "b")[1])
    assert both == ("a", "b")
    order: list[str] = []
    local = MemoryStore(uuid.uuid4().hex)
    assert read_both(local, lambda: order.append("1") or 1, lambda: order.append("2") or 2) == (
        1, 2)
    assert order == ["1", "2"]


def test_read_both_raises_either_reads_error():
    remote = _Remote(uuid.uuid4().hex)

    def missing():
        raise FileNotFoundError("x")

    with pytest.raises(FileNotFoundError):
        read_both(remote, missing, lambda: 1)
    with pytest.raises(FileNotFoundError):
        read_both(remote, lambda: 1, missing)


def test_beside_runs_a_call_alongside_the_caller_on_a_remote_store_only():
    """Remote: the call runs while the caller goes on (they meet at a barrier); elsewhere
    it has run when ``beside`` returns. Either way its error reaches whoever takes it."""
    meet = threading.Barrier(2, timeout=10)
    running = beside(_Remote(uuid.uuid4().hex), lambda: (meet.wait(), "done")[1])
    meet.wait()  # the caller's own work, at the same time
    assert running.result(10) == "done"
    order: list[str] = []
    ran = beside(MemoryStore(uuid.uuid4().hex), lambda: order.append("call") or 7)
    order.append("caller")
    assert order == ["call", "caller"] and ran.result() == 7
    for store in (_Remote(uuid.uuid4().hex), MemoryStore(uuid.uuid4().hex)):
        failed = beside(store, lambda: {}["missing"])
        with pytest.raises(KeyError):
            failed.result(10)
