"""Spark Connect fixtures: one real Connect server for the run, thin clients talking to it.

The server (:mod:`tests.spark.connect.connect_server`) is started once, on
first use, and stopped at the end of the run; a server that cannot start fails
every test that needs it (no skip). Clients are pyspark's Connect sessions
(``sc://127.0.0.1:<port>``): they hold no JVM, and every memwal planner and
task runs in the server's Python workers.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.spark.connect.connect_server import ConnectServer, start_connect_server


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory) -> Iterator[ConnectServer]:
    """A Spark Connect server on 127.0.0.1 (a free port), its working directory its own."""
    server = start_connect_server(tmp_path_factory.mktemp("connect") / "server-cwd")
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _connect_client_mode(monkeypatch):
    """Mark this process a Connect client while a test runs, as a client's builder does:
    ``pyspark.sql.functions`` then build Connect columns (partition_for_table uses
    them) even where an earlier test left a classic SparkContext in the process."""
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")


def _new_session(server: ConnectServer):
    # The Connect builder itself: SparkSession.builder would refuse while a classic
    # SparkContext from other tests lives in this process.
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    if not server.alive():
        raise RuntimeError(f"the Spark Connect server died; its log ends:\n{server.log_tail()}")
    return ConnectSession.builder.remote(server.url).create()


@pytest.fixture(scope="session")
def connect_spark(connect_server):
    """One Connect client session shared by the tests that need no session of their own."""
    session = _new_session(connect_server)
    assert session.range(3).count() == 3  # the server plans and runs a job
    yield session
    session.stop()


@pytest.fixture
def new_connect_session(connect_server) -> Iterator[Callable[[], object]]:
    """A factory of fresh Connect sessions (each with its own server-side artifact
    directory and Python workers); the ones still open are stopped after the test."""
    made = []

    def make():
        session = _new_session(connect_server)
        made.append(session)
        return session

    yield make
    for session in made:
        session.stop()


@pytest.fixture
def server_relative(connect_server) -> Callable[[str], tuple[str, Path]]:
    """``(relative name, where Spark puts it)``: a fresh name under the server's
    working directory, which is where Spark resolves relative paths."""

    def make(suffix: str) -> tuple[str, Path]:
        name = f"rel-{uuid.uuid4().hex[:12]}{suffix}"
        return name, connect_server.workdir / name

    return make
