"""Batch idempotency keys (``txnAppId`` / ``txnVersion``, as Delta's), end to end.

A job carrying a key commits once per (app id, version): a re-run with a
version not above the last committed one writes its WAL entries but commits
nothing, so readers see its rows once. The re-run that matters is the one
after a crash around the commit, so a driver in a child process
(``tests/spark/driver_job.py``) runs the job with ``MEMWAL_KILL_AT`` armed just
before and just after its commit record lands, and the test then runs the same
job again, with the same key, on the session's Spark.

Spark 4.3 runs the writer's ``commit()`` in a Python worker the driver JVM
starts, so that worker is what the hook kills: Spark fails the job with
"Python worker exited unexpectedly (crashed)" raised from
``commitWriteInPython``; the driver's own Python process survives and reports
it. Replayed streaming micro-batches (the same check under the key
``stream:{query id}``) are covered by tests/spark/test_stream.py.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.utils import AnalysisException

from memwal_datasource.format.table_schema import without_row_key
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table
from tests.spark.test_writer import frame, read, tailer_ids, write

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("driver_job.py")
JOB_DEADLINE_S = 300
ROWS, PARTS = 200, 2  # what each killed job (and its re-run) writes
APP = "nightly-load"
KEY = {"txnAppId": APP, "txnVersion": "1"}
WAL_ONLY = {"enable_memtable": "false"}
CRASHED = "Python worker exited unexpectedly (crashed)"
# Set by this process's own SparkSession; the child must start a Spark of its own.
INHERITED_VARS = ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS",
                  "MASTER", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE",
                  "MEMWAL_KILL_AT")


def storage(opts: dict) -> dict:
    return {k[len("storage."):]: v for k, v in opts.items() if k.startswith("storage.")}


def records(uri, opts=None):
    return list(CommitLog(open_store(uri, storage(opts or {}))).records())


def keys(uri, opts=None) -> list[tuple[str | None, int | None]]:
    return [(r.txn_app_id, r.txn_version) for r in records(uri, opts)]


def ids(spark, uri, opts=None) -> list[int]:
    """The committed rows' ids, through Spark."""
    return sorted(r.id for r in read(spark, uri, opts or {}).select("id").collect())


# --- keys through the session's Spark ---------------------------------------------------

@pytest.mark.parametrize("backend", ["local", "s3"])
def test_key_commits_each_version_once(spark, spark_location):
    uri, opts = spark_location
    v1 = {**opts, **WAL_ONLY, **KEY}
    write(frame(spark, 0, 100, 2), uri, v1)
    write(frame(spark, 0, 100, 2), uri, v1)  # the same job again
    assert read(spark, uri, opts).count() == 100
    assert keys(uri, opts) == [(APP, 1)]
    # The second run did write (its entries are in the raw log), but did not commit.
    assert sorted(tailer_ids(uri, opts)) == sorted(list(range(100)) * 2)

    write(frame(spark, 100, 50, 2), uri, {**v1, "txnVersion": "2"})
    assert keys(uri, opts) == [(APP, 1), (APP, 2)]
    write(frame(spark, 1000, 50, 2), uri, v1)  # version 1 again: below the committed 2
    assert keys(uri, opts) == [(APP, 1), (APP, 2)]
    assert len(tailer_ids(uri, opts)) == 300  # it wrote, and committed nothing
    # Another application's key, at a version the first one already used, commits.
    write(frame(spark, 2000, 10, 1), uri, {**v1, "txnAppId": "other"})
    assert keys(uri, opts) == [(APP, 1), (APP, 2), ("other", 1)]
    assert ids(spark, uri, opts) == list(range(150)) + list(range(2000, 2010))


@pytest.mark.parametrize("backend", ["local"])
def test_bad_key_options_fail_on_the_driver(spark, spark_location):
    uri, opts = spark_location
    together = "options 'txnAppId' and 'txnVersion' go together"
    non_negative = "option 'txnVersion' must be a non-negative integer, got '{}'"
    cases = [({"txnAppId": APP}, together),
             ({"txnVersion": "1"}, together),
             ({"txnAppId": "", "txnVersion": "1"}, together),
             ({"txnAppId": "stream:abc", "txnVersion": "1"}, "reserved for streaming sinks"),
             *(({**KEY, "txnVersion": v}, non_negative.format(v))
               for v in ("-1", "1.5", "two", "+1", "1_0"))]
    tracker = spark.sparkContext.statusTracker()
    for extra, message in cases:
        jobs_before = tracker.getJobIdsForGroup()
        with pytest.raises(AnalysisException) as info:
            write(frame(spark, 0, 10, 1), uri, {**opts, **WAL_ONLY, **extra})
        assert message in str(info.value), (extra, str(info.value)[:2000])
        # Refused in writer() on the driver: no Spark job ran, nothing was created.
        assert tracker.getJobIdsForGroup() == jobs_before, extra
        assert not os.path.exists(uri), extra


def test_commit_of_a_committed_key_returns_the_earlier_record(tmp_path, caplog):
    uri = str(tmp_path / "t.lance")
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    table = without_row_key(create_table(uri, schema).schema)
    opts = WriteOptions.parse({"path": uri, **WAL_ONLY, **KEY})
    batch = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], schema=schema)
    first = MemWalBatchWriter(opts, table, overwrite=False)
    first.commit([write_task(opts, table, iter([batch]))])
    again = MemWalBatchWriter(opts, table, overwrite=False)
    with caplog.at_level(logging.WARNING, logger="memwal_datasource"):
        again.commit([write_task(opts, table, iter([batch]))])
    assert again.last_commit.sequence == first.last_commit.sequence == 1
    assert again.last_commit.job_id == first.last_commit.job_id != again.job_id
    assert [(r.txn_app_id, r.txn_version, r.job_id) for r in records(uri)] == \
        [(APP, 1, first.job_id)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"idempotency key {APP} version 1 is already committed as record 1" in m
               for m in warnings), warnings


# --- a commit killed before / after its record lands, then the job re-run ---------------

KILL_POINTS = ("commit.before", "commit.after")


class DriverJob:
    """driver_job.py in a child process: one job killed at each of ``KILL_POINTS``."""

    def __init__(self, work: Path):
        self.uris = {p: str(work / f"{p.replace('.', '_')}.lance") for p in KILL_POINTS}
        spec = {"jobs": [{"uri": self.uris[p], "options": {**WAL_ONLY, **KEY}, "start": 0,
                          "rows": ROWS, "parts": PARTS, "kill_at": p} for p in KILL_POINTS]}
        env = {k: v for k, v in os.environ.items() if k not in INHERITED_VARS}
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        self.proc = subprocess.Popen([sys.executable, str(JOB), json.dumps(spec)], cwd=work,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self._result: dict | str | None = None

    def result(self) -> dict:
        """``{kill point: (table uri, the job's outcome)}``, once the child has finished."""
        if self._result is None:
            try:
                out, err = self.proc.communicate(timeout=JOB_DEADLINE_S)
            finally:
                self.stop()
            lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            if len(lines) != 1:
                self._result = f"driver_job.py exited {self.proc.returncode}: {err[-5000:]}"
            else:
                body = json.loads(lines[0][len("RESULT "):])
                self._result = {"returncode": self.proc.returncode, **body}
        assert isinstance(self._result, dict), self._result
        # The driver's own Python process outlived both kills and reported them itself.
        assert self._result["returncode"] == 0
        assert self._result["driver_pid"] == self.proc.pid
        return {p: (self.uris[p], job)
                for p, job in zip(KILL_POINTS, self._result["jobs"], strict=True)}

    def stop(self) -> None:
        """Kill the child's process group (its JVM and Python workers) if it still runs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="session", autouse=True)
def driver_job(request, tmp_path_factory):
    """Start the child driver as soon as this module starts (session scope: before the
    session's SparkSession), so it runs while the other tests here run; only if a test
    that needs it was selected."""
    module = sys.modules[__name__]
    if not any(getattr(item, "module", None) is module and "killed" in item.fixturenames
               for item in request.session.items):
        yield None
        return
    job = DriverJob(tmp_path_factory.mktemp("killed"))
    yield job
    job.stop()


@pytest.fixture
def killed(driver_job):
    return driver_job.result()


@pytest.mark.parametrize("kill_at, records_after_kill", [("commit.before", 0),
                                                         ("commit.after", 1)])
def test_rerun_after_the_commit_was_killed_commits_once(spark, killed, kill_at,
                                                        records_after_kill):
    uri, outcome = killed[kill_at]
    # The commit worker was killed, not failed: Spark saw it die mid-commit (a Python
    # exception would come back as a PythonException with its traceback).
    assert outcome["ok"] is False
    assert outcome["error_type"] == "Py4JJavaError", outcome
    error = outcome["error"]
    assert CRASHED in error and "commitWriteInPython" in error, error[:3000]
    assert "PythonException" not in error, error[:3000]
    # Where it died: before the record was written, or right after it landed.
    before = records(uri)
    assert len(before) == records_after_kill
    if before:
        assert [(r.txn_app_id, r.txn_version) for r in before] == [(APP, 1)]
        assert sum(r.rows for r in before[0].ranges) == ROWS
    # Every task had finished: all rows are durable in the WAL either way.
    assert sorted(tailer_ids(uri, {})) == list(range(ROWS))

    write(frame(spark, 0, ROWS, PARTS), uri, {**WAL_ONLY, **KEY})  # the same job, no kill

    after = records(uri)
    assert [(r.txn_app_id, r.txn_version) for r in after] == [(APP, 1)]
    if before:  # the killed run's record stands; the re-run committed nothing
        assert after[0].job_id == before[0].job_id
    assert ids(spark, uri) == list(range(ROWS))  # every row exactly once
    assert sorted(tailer_ids(uri, {})) == sorted(list(range(ROWS)) * 2)  # the re-run wrote
