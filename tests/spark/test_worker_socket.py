"""Spark's Python workers answer the JVM promptly on TCP (memwal_datasource.spark.worker_socket).

A real ``df.write`` through a probe of the ``memwal`` source records, in each
Python worker it goes through (the planner's ``writer()``, every task's
``write()``, the commit), the TCP socket(s) to the JVM the module found and
whether Nagle's algorithm is off on them: without the module it is on. The
unit tests run the module against real sockets held by a frame compiled as
PySpark's worker code.
"""

from __future__ import annotations

import os
import socket
import sys

import pytest
from pyspark import cloudpickle

from memwal_datasource.spark import worker_heap, worker_socket

from .worker_probe import WorkerProbeSource, probed_write


def socket_state() -> dict:
    """The worker's sockets to the JVM, as this process sees them."""
    found = []
    for fd in worker_socket.worker_sockets():
        sock = socket.socket(fileno=fd)
        try:
            found.append({"peer": sock.getpeername()[0],
                          "nodelay": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)})
        finally:
            sock.detach()
    return {"pid": os.getpid(), "sockets": found}


class SocketProbeSource(WorkerProbeSource):
    @classmethod
    def name(cls) -> str:
        return "memwal_socket_probe"

    state = staticmethod(socket_state)


cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_every_python_worker_of_a_write_turns_nagle_off_on_its_jvm_socket(spark, tmp_path):
    assert spark.conf.get("spark.python.unix.domain.socket.enabled", "false") == "false"
    df = spark.range(0, 40, numPartitions=2).selectExpr("id", "cast(id as string) as v")
    seen = probed_write(spark, SocketProbeSource, df, tmp_path / "socket.json",
                        tmp_path / "t.lance")
    assert len(seen["tasks"]) == 2
    for state in [seen["planner"], *seen["tasks"], seen["commit"]]:
        assert state["pid"] != os.getpid(), state
        assert len(state["sockets"]) == 1, state  # exactly the JVM's connection
        (sock,) = state["sockets"]
        assert sock["peer"] in ("127.0.0.1", "::1", "::ffff:127.0.0.1"), state
        assert sock["nodelay"] != 0, state
    assert worker_socket.worker_sockets() == ()  # the driver is no worker
    assert sorted(r.id for r in spark.read.format("memwal").load(str(tmp_path / "t.lance"))
                  .collect()) == list(range(40))


# A function compiled as if it were PySpark's worker module: the frames the module looks for.
_FAKE_WORKER = compile(
    "def main(infile, outfile, call):\n    return call()\n",
    os.path.join(os.sep, "site-packages", "pyspark", "worker.py"), "exec")
_namespace: dict = {}
exec(_FAKE_WORKER, _namespace)
fake_worker_main = _namespace["main"]


@pytest.fixture
def as_worker(monkeypatch):
    monkeypatch.setattr(worker_heap, "_in_worker", True)
    monkeypatch.setattr(worker_socket, "_found", None)


@pytest.fixture
def tcp_pair():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    yield client, accepted
    client.close()
    accepted.close()


def nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_prompt_sets_nodelay_on_the_worker_frames_tcp_socket_and_leaves_it_open(
        as_worker, tcp_pair):
    client, accepted = tcp_pair
    unix_a, unix_b = socket.socketpair()
    with os.fdopen(os.dup(accepted.fileno()), "rb") as infile, unix_a, unix_b:
        assert nodelay(accepted) == 0
        found = fake_worker_main(infile, unix_a, lambda: (worker_socket.prompt(),
                                                          worker_socket.worker_sockets())[1])
        assert len(found) == 1  # the TCP one; the Unix socket is left alone
        assert os.fstat(found[0]).st_ino == os.fstat(accepted.fileno()).st_ino
        assert nodelay(accepted) != 0  # the same socket, through its dup
        client.sendall(b"x")
        assert infile.read(1) == b"x"  # PySpark's file still works
    assert nodelay(client) == 0  # the other end is not ours


def test_prompted_yields_every_item_in_a_worker_and_out_of_one(as_worker, tcp_pair):
    _, accepted = tcp_pair
    with os.fdopen(os.dup(accepted.fileno()), "rb") as infile:
        items = fake_worker_main(infile, infile,
                                 lambda: list(worker_socket.prompted(iter(range(5)))))
    assert items == list(range(5))
    assert nodelay(accepted) != 0


def test_outside_a_worker_nothing_is_touched(monkeypatch, tcp_pair):
    monkeypatch.setattr(worker_heap, "_in_worker", False)
    monkeypatch.setattr(worker_socket, "_found", None)
    _, accepted = tcp_pair
    with os.fdopen(os.dup(accepted.fileno()), "rb") as infile:
        fake_worker_main(infile, infile, worker_socket.prompt)
    assert nodelay(accepted) == 0
    assert list(worker_socket.prompted(iter("ab"))) == ["a", "b"]


def test_a_call_off_pysparks_stack_finds_nothing_and_does_not_stick(as_worker, tcp_pair):
    _, accepted = tcp_pair
    assert worker_socket.worker_sockets() == ()  # no PySpark frame: e.g. another thread
    with os.fdopen(os.dup(accepted.fileno()), "rb") as infile:
        found = fake_worker_main(infile, infile, worker_socket.worker_sockets)
    assert len(found) == 1  # the earlier miss was not remembered
