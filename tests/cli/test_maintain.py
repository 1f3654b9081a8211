"""``memwal maintain`` (one pass, a loop stopped by SIGTERM) and the backlog in
``memwal inspect``: its ``--json`` fields are a stable schema (docs/operations.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memwal_datasource import MemWalTable, hooks
from tests.cli.test_cli import invoke
from tests.maintenance.test_auto import appends, exactly_once

REPO = Path(__file__).resolve().parents[2]

# The documented ``backlog`` object of ``memwal inspect --json`` (docs/operations.md).
BACKLOG_FIELDS = {
    "pending_records", "pending_rows", "pending_bytes", "oldest_pending_ms",
    "oldest_pending_age_s", "last_sequence", "compacted_through", "compacted_round",
    "base_version", "round_in_progress", "full", "wal_objects", "wal_bytes", "shards",
    "checkpoints", "latest_checkpoint", "stream_holds", "pending_intents", "maintenance"}
SHARD_FIELDS = {"shard_id", "wal_objects", "wal_bytes"}
HOLD_FIELDS = {"hold_id", "label", "after_seq", "age_s", "live"}
OPERATION_FIELDS = {"started_ms", "seconds", "by", "failing", "result", "ok_ms"}


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


def cli_storage(opts: dict) -> list[str]:
    return [a for k, v in opts.items() for a in ("--storage", f"{k}={v}")]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_inspect_json_backlog_has_the_documented_fields(pk_table):
    from memwal_datasource.log.holds import HoldKeeper

    uri, opts = pk_table
    keys = appends(uri, opts, 3)
    keeper = HoldKeeper(MemWalTable(uri, opts).store, label="test stream")
    keeper.hold(1)
    try:
        body = json.loads(invoke("inspect", uri, "--json", *cli_storage(opts)).stdout)
    finally:
        keeper.stop()
    b = body["backlog"]
    assert set(b) == BACKLOG_FIELDS
    assert (b["pending_records"], b["pending_rows"], b["compacted_through"]) == (3, 30, 0)
    assert b["oldest_pending_age_s"] >= 0 and b["full"] and b["round_in_progress"] is None
    assert len(b["shards"]) == 2 and all(set(s) == SHARD_FIELDS for s in b["shards"])
    assert b["wal_objects"] == sum(s["wal_objects"] for s in b["shards"]) >= 3
    assert b["wal_bytes"] > 0 and b["maintenance"] == {}
    [hold] = b["stream_holds"]
    assert set(hold) == HOLD_FIELDS and hold["live"] and hold["after_seq"] == 1
    assert hold["label"] == "test stream"
    # A pass records the last compaction and gc; the human form shows them.
    out = invoke("maintain", uri, "--once", "--pending-records", "3", *cli_storage(opts))
    assert out.exit_code == 0, out.output
    assert "compacted 1 round(s), 30 rows (3 pending commit records >= 3)" in out.stdout
    b = json.loads(invoke("inspect", uri, "--json", *cli_storage(opts)).stdout)["backlog"]
    assert b["pending_records"] == 0 and b["compacted_round"] == 1
    assert set(b["maintenance"]) == {"compaction", "gc", "maintainer"}
    for op in ("compaction", "gc"):
        assert set(b["maintenance"][op]) == OPERATION_FIELDS
    assert b["maintenance"]["compaction"]["result"] == {
        "rounds": 1, "rows": 30, "records": 3, "committed_rounds": 1,
        "pending_records_after": 0}
    human = invoke("inspect", uri, *cli_storage(opts)).stdout
    assert "last compaction" in human and "rows 30" in human and "0 commit record(s) pending" \
        in human
    exactly_once(uri, opts, keys)


def test_maintain_loops_until_sigterm_and_stops_between_passes(tmp_path):
    from memwal_datasource.table.view import create_table
    from tests.helpers import SCHEMA

    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA, primary_key=["id"])
    keys = appends(uri, {}, 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "memwal_datasource.cli", "maintain", uri, "--interval", "0.1",
         "--pending-records", "1", "--json"], cwd=REPO, env={**os.environ,
                                                             "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [json.loads(proc.stdout.readline()) for _ in range(2)]  # two passes
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert lines[0]["compaction"] == {"rounds": 1, "rows": 20, "pending_records": 0}
    assert lines[1]["compaction"] is None and lines[1]["backlog"]["pending_records"] == 0
    assert all(json.loads(line)["error"] is None for line in rest.splitlines() if line)
    exactly_once(uri, {}, keys)

