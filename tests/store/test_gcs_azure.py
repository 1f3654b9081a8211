"""gs://, az:// and abfss:// stores: opening, the mapping of every "exists" answer (and
only those) to FileExistsError, missing buckets and bad credentials, and the emulator
fixtures' refusal of a server that ignores create-only preconditions."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from memwal_datasource.errors import (
    ConfigError,
    StoreAuthError,
    StoreNotFoundError,
    TransientStoreError,
)
from memwal_datasource.spark.prepare import check_store
from memwal_datasource.store import open_store, put_resolved
from memwal_datasource.store.azure import AzureStore
from memwal_datasource.store.gcs import GCSStore
from tests.cloud_emulators import EmulatorUnavailable, GcsXmlGateway, require_put_if_absent
from tests.fault_proxy import FaultRule

pytestmark = pytest.mark.cloud
SECRET = "s3cr3t-account-key-value"


def test_open_cloud_stores_by_scheme():
    gs = open_store("gs://bucket/a/t.lance", {"google_service_account": "/x.json",
                                              "aws_region": "us-east-1"})
    assert isinstance(gs, GCSStore) and gs.prefix == "a/t.lance" and gs.container == "bucket"
    assert gs.options.config == (("google_service_account", "/x.json"),)  # aws_* not passed
    az = open_store("az://cont/a/t.lance", {"azure_storage_account_name": "acct",
                                            "azure_storage_account_key": SECRET})
    assert isinstance(az, AzureStore) and az.container == "cont" and az.prefix == "a/t.lance"
    assert SECRET not in repr(az) and SECRET not in str(az.options)
    abfss = open_store("abfss://cont@acct.dfs.core.windows.net/t.lance", {})
    assert isinstance(abfss, AzureStore) and abfss.container == "cont"
    assert abfss.options.get("azure_storage_account_name") == "acct"
    assert abfss.uri == "abfss://cont@acct.dfs.core.windows.net/t.lance"


@pytest.mark.parametrize("uri", ["gs:///t", "az:///t", "abfss://acct.dfs.core.windows.net/t"])
def test_cloud_uri_without_bucket_is_refused(uri):
    with pytest.raises(Exception, match="write the URI as"):
        open_store(uri, {})


def test_azure_plain_http_endpoint_needs_allow_http():
    with pytest.raises(ConfigError, match="^set allow_http=true"):
        open_store("az://c/t", {"azure_endpoint": "http://127.0.0.1:1/devstoreaccount1"})


@pytest.fixture(params=["gcs", "azure"])
def proxied(request):
    return request.getfixturevalue(f"proxied_{request.param}_table")


def test_exists_answers_are_file_exists_and_nothing_else(proxied):
    """A real collision (GCS 412, Azure 409 BlobAlreadyExists) and a 412 the SDK reports
    after a lost response are FileExistsError; a 409 with any other code is transient
    (obstore reports every 409 as AlreadyExistsError: the class alone would be wrong)."""
    proxy, (uri, opts) = proxied
    store = open_store(uri, opts)
    store.put_if_absent("k", b"one")
    with pytest.raises(FileExistsError):
        store.put_if_absent("k", b"two")
    proxy.add_rule(FaultRule(method="PUT", only_conditional=True, fault="error_before",
                             status=412, times=1))
    with pytest.raises(FileExistsError):
        store.put_if_absent("fresh", b"x")
    proxy.add_rule(FaultRule(method="PUT", only_conditional=True, fault="error_before",
                             status=409, times=1))
    with pytest.raises(TransientStoreError):
        store.put_if_absent("fresh", b"x")
    assert store.get("k") == b"one" and not store.exists("fresh")


def test_lost_response_is_resolved_by_reading_back(proxied):
    """The PUT lands, its reply is lost, the one protocol retry answers 'exists': reading
    back tells it is ours; each key saw exactly two conditional PUTs (no SDK retries)."""
    proxy, (uri, opts) = proxied
    store = open_store(uri, opts)
    proxy.add_rule(FaultRule(method="PUT", only_conditional=True, fault="drop_response",
                             times=1))
    assert put_resolved(store, "wal/1", b"mine", retries=3, base_delay_ms=1, what="test")
    assert not put_resolved(store, "wal/1", b"theirs", retries=3, base_delay_ms=1, what="t")
    puts = [r for r in proxy.records(method="PUT") if r.conditional]
    assert len(puts) == 3 and all(r.path.endswith("/wal/1") for r in puts)


def test_missing_bucket_or_container(gcs_emulator, azure_emulator):
    for uri, opts in ((f"gs://no-such-bucket-{uuid.uuid4().hex[:8]}/t",
                       gcs_emulator.storage_options()),
                      (f"az://no-such-container-{uuid.uuid4().hex[:8]}/t",
                       azure_emulator.storage_options())):
        store = open_store(uri, opts)
        with pytest.raises(StoreNotFoundError, match="^create the (bucket|container) first"):
            store.put_if_absent("k", b"v")
        with pytest.raises(StoreNotFoundError):
            store.check_bucket()
        with pytest.raises(StoreNotFoundError):  # what a Spark write checks on the driver
            check_store(uri, opts)


def test_azure_bad_key_is_an_auth_error_without_the_key(azure_emulator):
    opts = dict(azure_emulator.storage_options(), azure_storage_account_key="QUJD" * 22)
    store = open_store(f"az://{azure_emulator.container}/t", opts)
    with pytest.raises(StoreAuthError, match="^check azure_storage_account_name") as info:
        store.put_if_absent("k", b"v")
    assert "QUJD" not in str(info.value) and info.value.__cause__ is None


def test_an_emulator_that_ignores_preconditions_is_refused(gcs_emulator):
    from tests.cloud_emulators import _service_account_file

    gateway = GcsXmlGateway(gcs_emulator.backend_url, honour_preconditions=False).start()
    try:
        sa = _service_account_file(Path(gcs_emulator.service_account_path).parent,
                                   gateway.endpoint)
        with pytest.raises(EmulatorUnavailable, match="ignores the precondition"):
            require_put_if_absent(f"gs://{gcs_emulator.bucket}/refusal",
                                  {"google_service_account": sa, "allow_http": "true"},
                                  "a precondition-blind gateway")
    finally:
        gateway.stop()
