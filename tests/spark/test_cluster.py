"""A run with separate executor processes: a standalone master and one worker on 127.0.0.1.

Local mode runs tasks in Python workers forked for the driver's own JVM; here
the test starts Spark's standalone ``Master`` and ``Worker`` (``spark-class``
from the pyspark package), and a separate driver process
(``tests/spark/cluster_job.py``) submits the job to them. The writer object is
really pickled to another JVM's Python workers and every per-process piece
(stores, shard writers, pylance's native writer) is created there.

Readiness is polled, never slept on: the master's JSON status page
(``http://127.0.0.1:<webui>/json``) must list an ALIVE worker with 2 cores
before the job starts. Both daemons run in their own process groups and are
stopped by group in the fixture's teardown, pass or fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.store import open_store

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

JOB = Path(__file__).with_name("cluster_job.py")
ROWS, PARTS = 20_000, 4  # what cluster_job.py writes per mode
MODES = ["false", "true"]  # enable_memtable
READY_DEADLINE_S = 90
JOB_DEADLINE_S = 180
HAS_PROC = os.path.isdir("/proc/self")
# Settings of this process's own (local-mode) Spark that must not steer the cluster's.
INHERITED_SPARK_VARS = frozenset({
    "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS", "MASTER",
    "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_CONF_DIR",
})


def skip(reason: str) -> None:
    """A missing piece of the standalone cluster fails the test loudly (never a skip)."""
    pytest.fail(reason, pytrace=False)


def spark_class() -> tuple[Path, Path]:
    """(SPARK_HOME, spark-class) of the installed pyspark package; skips if unusable."""
    import pyspark

    home = Path(pyspark.__file__).parent
    script = home / "bin" / "spark-class"
    if not script.is_file() or not (home / "jars").is_dir():
        skip(f"no spark-class launcher in the pyspark package ({script})")
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        skip("no Java runtime (JAVA_HOME/bin/java or java on PATH) for the standalone cluster")
    if not shutil.which("bash"):
        skip("spark-class needs bash")
    return home, script


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL whatever is left after ``grace_s``.

    The group also holds the children (executor JVMs of a Worker, the driver JVM
    of a job), so they go too. The group id is ``proc.pid`` (start_new_session).
    Interrupted (Ctrl-C, pytest-timeout), it SIGKILLs the group before re-raising.
    """
    try:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                proc.poll()  # reap the leader, else its zombie keeps the group alive
                try:
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        proc.poll()


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Stop every group, last started first; one failing to stop does not spare the rest."""
    pending = list(procs)
    try:
        while pending:
            stop_group(pending.pop())
    finally:
        for proc in pending:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class Cluster:
    master_url: str
    master_ui: str
    master: subprocess.Popen
    worker: subprocess.Popen
    env: dict[str, str]
    logs: Path

    def status(self) -> dict:
        with urllib.request.urlopen(f"{self.master_ui}/json", timeout=2) as resp:
            return json.load(resp)

    def diagnostics(self) -> str:
        files = sorted(self.logs.glob("*.log")) + sorted(self.logs.parent.glob("work/*/*/stderr"))
        return "\n".join(f"--- {p} ---\n{tail(p)}" for p in files)


def wait_until_ready(cluster: Cluster, deadline_s: float) -> float:
    """Poll the master's /json until a worker with 2 cores is ALIVE; returns seconds taken."""
    t0 = time.monotonic()
    last: object = "no answer yet"
    while time.monotonic() - t0 < deadline_s:
        for name, proc in (("master", cluster.master), ("worker", cluster.worker)):
            if proc.poll() is not None:
                raise RuntimeError(f"spark {name} exited with {proc.returncode} before the "
                                   f"cluster was ready\n{cluster.diagnostics()}")
        try:
            status = cluster.status()
        except (OSError, ValueError) as exc:  # UI not listening, or serving HTML while
            last = exc  # its JSON handler is not attached yet (seen once in CI)
        else:
            last = status
            alive = [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]
            if status.get("status") == "ALIVE" and alive and alive[0].get("cores") == 2:
                return time.monotonic() - t0
        time.sleep(0.2)
    raise RuntimeError(f"standalone cluster not ready after {deadline_s}s (last status: {last})"
                       f"\n{cluster.diagnostics()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and one worker (2 cores, 2g) on 127.0.0.1, stopped by group.

    Yielded as soon as both are launched; ``wait_until_ready`` before use.
    """
    home, script = spark_class()
    base = tmp_path_factory.mktemp("standalone")
    conf_dir, work_dir, logs = base / "conf", base / "work", base / "logs"
    for d in (conf_dir, work_dir, logs):
        d.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k not in INHERITED_SPARK_VARS},
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf_dir),  # empty: no site spark-env.sh / defaults leak in
        "SPARK_LOCAL_IP": "127.0.0.1",  # RPC and web UIs bind to loopback only
        "SPARK_NO_DAEMONIZE": "1",
        # No REST submission server: it would bind the fixed port 6066.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        # Master and Worker only route messages: start them cheaply on small CI machines.
        # No port retries: if a chosen port was taken meanwhile, exit (and fail) at once
        # instead of listening on port+1 where nobody looks.
        "SPARK_DAEMON_JAVA_OPTS": ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                                   "-Dspark.port.maxRetries=0"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    port, ui, worker_ui = free_port(), free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        with open(logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen([str(script), *args], env=env, cwd=base, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        procs.append(proc)
        return proc

    try:
        master = start("master", "org.apache.spark.deploy.master.Master",
                       "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui))
        worker = start("worker", "org.apache.spark.deploy.worker.Worker", master_url,
                       "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
                       "--webui-port", str(worker_ui), "--work-dir", str(work_dir))
        yield Cluster(master_url, f"http://127.0.0.1:{ui}", master, worker, env, logs)
    finally:
        stop_all(procs)  # worker (and its executors) first, then the master


@pytest.fixture(scope="module")
def cluster_run(cluster, tmp_path_factory):
    """Run cluster_job.py as a separate driver process; (parsed RESULT line, table dir).

    The driver starts its JVM while the cluster comes up and connects once the
    master reports an ALIVE worker (a ``go`` line on its stdin).
    """
    tables = tmp_path_factory.mktemp("cluster_tables")
    t0 = time.monotonic()
    with open(cluster.logs / "driver.log", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(JOB), cluster.master_url, str(tables), "--wait-for-go"],
            env=cluster.env, cwd=tables, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=err, start_new_session=True)
    try:
        ready = wait_until_ready(cluster, READY_DEADLINE_S)
        print(f"standalone cluster {cluster.master_url} ready in {ready:.1f}s", file=sys.stderr)
        try:
            out, _ = proc.communicate(b"go\n", timeout=JOB_DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"cluster job still running after {JOB_DEADLINE_S}s\n"
                        f"{cluster.diagnostics()}")
    finally:
        stop_group(proc, grace_s=5)
    took = time.monotonic() - t0
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or len(lines) != 1:
        pytest.fail(f"cluster job exited with {proc.returncode}\n{cluster.diagnostics()}")
    print(f"cluster job done {took:.1f}s after launch", file=sys.stderr)
    return json.loads(lines[0][len("RESULT "):]), tables


@pytest.mark.parametrize("memtable", MODES)
def test_rows_written_equal_rows_read(cluster_run, memtable):
    result, _ = cluster_run
    got = result["modes"][memtable]
    assert got["written"] == ROWS
    assert got["rows"] == ROWS
    assert got["distinct"] == ROWS  # with min/max: each id 0..ROWS-1 exactly once
    assert (got["min"], got["max"]) == (0, ROWS - 1)
    assert got["bad_v"] == 0


@pytest.mark.parametrize("memtable", MODES)
def test_tasks_ran_in_executor_processes(cluster, cluster_run, memtable):
    result, _ = cluster_run
    got = result["modes"][memtable]
    driver = result["driver_pid"]
    procs = {"write": got["write_procs"], "read": got["read_procs"]}
    for side, seen in procs.items():
        assert seen, f"no {side}-side process recorded"
        pids = {pid for pid, _ in seen}
        assert driver not in pids, f"{side} tasks ran in the driver process {driver}"
        if not HAS_PROC:
            continue
        for pid, chain in seen:
            ancestors = [int(p) for p in chain.split(",")]
            assert ancestors[0] == pid
            # Forked from the executor JVM the Worker launched, not from the driver.
            assert cluster.worker.pid in ancestors, (side, pid, ancestors, cluster.worker.pid)
            assert driver not in ancestors, (side, pid, ancestors, driver)


@pytest.mark.parametrize("memtable", MODES)
def test_one_commit_record_per_job(cluster_run, memtable):
    _, tables = cluster_run
    (rec,) = CommitLog(open_store(str(tables / f"memtable_{memtable}.lance"))).records()
    assert rec.kind == "append"
    assert len(rec.ranges) == PARTS
    assert sorted(r.task for r in rec.ranges) == list(range(PARTS))
    assert len({r.shard_id for r in rec.ranges}) == PARTS
    assert sum(r.rows for r in rec.ranges) == ROWS
    assert all(r.first >= 1 and r.last >= r.first for r in rec.ranges)
