"""kill -9 at chosen protocol points, then reopen and re-run: nothing acknowledged is
lost, nothing is committed twice. Local disk, the S3 server and the GCS and Azure emulators."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.store import open_store
from tests.helpers import new_shard, wal_entries, wal_rows
from tests.test_s3_faults import committed_ids

REPO = Path(__file__).resolve().parent.parent
PUTS = 4

# (point, n): where the kill lands, and whether the job's record exists after it.
POINTS = {
    "claim.written:1": False,
    "open.tip:1": False,
    "open.sentinel:1": False,
    "append.before:3": False,
    "append.after:3": False,
    "writer.closed:1": False,
    "commit.before:1": False,
    "commit.after:1": True,
}


def run_job(uri: str, opts: dict, shard: str, kill_at: str | None, tmp_path: Path,
            start: int = 0, app: str = "job", version: int = 1):
    env = dict(os.environ, MEMWAL_STORAGE_OPTIONS=json.dumps(opts))
    env.pop("MEMWAL_KILL_AT", None)
    if kill_at:
        env["MEMWAL_KILL_AT"] = kill_at
    err = tmp_path / f"worker-{kill_at or 'clean'}.err"
    with open(err, "w") as errf:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.kill_worker", uri, shard, str(start), str(PUTS), app,
             str(version)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=errf, text=True,
            timeout=120)
    acked = [i for line in proc.stdout.splitlines() if line.startswith("ack ")
             for i in range(int(line.split()[1]), int(line.split()[2]))]
    return proc, acked, err.read_text()


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
@pytest.mark.parametrize("point", sorted(POINTS))
def test_kill_at_point_then_reopen_and_rerun(location, tmp_path, point):
    uri, opts = location
    shard = new_shard()
    store = open_store(uri, opts)
    WalAppender.open(store, shard)  # epoch 1 exists, so the job's open drops a sentinel
    proc, acked, err = run_job(uri, opts, shard, point, tmp_path)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {err[-2000:]}"
    # Every acknowledged row is in the WAL exactly once; nothing else is duplicated.
    present = wal_rows(store, shard)
    assert set(acked) <= set(present) and len(present) == len(set(present))
    assert committed_ids(uri, opts) == (sorted(acked) if POINTS[point] else [])
    # A reopen claims past the dead writer; the job re-run with its key commits once.
    proc2, acked2, err2 = run_job(uri, opts, shard, None, tmp_path)
    assert proc2.returncode == 0, err2[-2000:]
    assert ("duplicate" if POINTS[point] else "committed") in proc2.stdout
    want = acked if POINTS[point] else acked2
    assert committed_ids(uri, opts) == sorted(want)
    epochs = [e for _, e, _, sentinel in wal_entries(store, shard) if sentinel]
    assert epochs == sorted(epochs) and len(epochs) == len(set(epochs))
