"""A real Spark Connect server for tests: pyspark's own server jar, 127.0.0.1 only.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``
from the installed pyspark (its ``bin/`` and ``jars/``, no download), bound to
127.0.0.1 on a free port, in a working directory of its own (where Spark
resolves relative paths), stopped by its process group. Its Python workers run
this interpreter with this process's ``PYTHONPATH``, so they import the same
``memwal_datasource`` as the tests. A server that does not start raises
:class:`ConnectServerUnavailable` with its log's tail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.processes import stop_group

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# The JVM's start, the server's and its first session's; a slow shared machine needs more.
READY_TIMEOUT_S = 180.0


class ConnectServerUnavailable(RuntimeError):
    """The Connect server could not start; the message says why (with its log)."""


@dataclass
class ConnectServer:
    """A running Spark Connect server."""

    port: int
    workdir: Path  # the server JVM's working directory: Spark resolves relative paths here
    log_path: Path
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The ``sc://`` URL a thin client connects to."""
        return f"sc://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log (for failure messages)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"

    def alive(self) -> bool:
        """True while the server process runs."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Stop the server and its Python workers (idempotent)."""
        proc, self._proc = self._proc, None
        stop_group(proc, timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_submit() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")


def _wait_listening(server: ConnectServer, deadline_s: float) -> None:
    """Poll the gRPC port every 50 ms until it accepts a connection or the server dies."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise ConnectServerUnavailable(
                f"the Spark Connect server exited at startup; its log ends:\n{server.log_tail()}")
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex(("127.0.0.1", server.port)) == 0:
                return
        time.sleep(0.05)  # polling interval, not synchronisation
    raise ConnectServerUnavailable(
        f"the Spark Connect server did not listen on 127.0.0.1:{server.port} within "
        f"{deadline_s:.0f}s; its log ends:\n{server.log_tail()}")


def start_connect_server(workdir: Path | str, master: str = "local[2,4]",
                         timeout: float = READY_TIMEOUT_S) -> ConnectServer:
    """Start a Connect server with its working directory ``workdir``; raise if it fails.

    Tried twice: the free port is chosen long before the JVM binds it, and
    another process may take it meanwhile (the server then exits at startup).
    """
    errors = []
    for attempt in range(2):
        try:
            return _start(Path(workdir), master, timeout, attempt)
        except ConnectServerUnavailable as exc:
            errors.append(f"attempt {attempt + 1}: {exc}")
            if "exited at startup" not in str(exc):
                break  # alive but not listening: a second try would wait as long again
    raise ConnectServerUnavailable("\n".join(errors))


def _start(workdir: Path, master: str, timeout: float, attempt: int) -> ConnectServer:
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    conf = {
        "spark.master": master,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.python.worker.reuse": "true",
        "spark.sql.warehouse.dir": str(workdir / "spark-warehouse"),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    args = [_spark_submit(), "--class", SERVER_CLASS, "--name", "memwal-tests-connect"]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    args.append("spark-internal")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    # The server must not mistake itself for a Connect client.
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
        env.pop(key, None)
    log_path = workdir.parent / f"{workdir.name}-server-{attempt}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the process
    try:
        proc = subprocess.Popen(args, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    finally:
        log.close()  # the child holds its own descriptor
    server = ConnectServer(port=port, workdir=workdir, log_path=log_path, _proc=proc)
    try:
        _wait_listening(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server
