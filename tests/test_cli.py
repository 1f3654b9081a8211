"""The read-only ``memwal`` CLI, on local disk and S3."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from click.testing import CliRunner

from memwal_datasource.cli import main
from memwal_datasource.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.store import open_store
from memwal_datasource.wal import WalAppender

SHARD = "6f1c1e1e-0000-4000-8000-0000000000aa"
SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture
def table(location):
    uri, opts = location
    store = open_store(uri, opts)
    a = WalAppender.open(store, SHARD)
    a.append(SCHEMA, [pa.record_batch([pa.array([1, 2, 3])], schema=SCHEMA)])
    WalAppender.open(store, SHARD)  # a second claim: epoch 2 and a sentinel at 2
    CommitLog(store).append(APPEND, [CommittedRange(SHARD, 1, 1, 1, 3)])
    args = [x for k, v in opts.items() for x in ("--storage", f"{k}={v}")]
    return uri, args, store


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_cli_reads_without_writing(table):
    uri, args, store = table
    before = sorted(store.list(""))
    runner = CliRunner()
    out = runner.invoke(main, ["shards", uri, *args], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert SHARD in out.output and "1..3" in out.output and "1 entries" in out.output
    out = runner.invoke(main, ["tail", uri, SHARD, *args])
    assert out.exit_code == 0, out.output
    assert "1 epoch=1 3 rows" in out.output and "2 epoch=2 sentinel" in out.output
    out = runner.invoke(main, ["manifest", uri, SHARD, *args])
    assert json.loads(out.output)["writer_epoch"] == 2
    out = runner.invoke(main, ["commits", uri, *args])
    assert "append" in out.output
    assert sorted(store.list("")) == before  # every command is read-only


@pytest.mark.parametrize("backend", ["local"])
def test_cli_errors_are_clear(table):
    uri, args, _ = table
    runner = CliRunner()
    out = runner.invoke(main, ["compact", uri])
    assert out.exit_code != 0 and "compacted_sstables" in out.output
    out = runner.invoke(main, ["manifest", uri, "6f1c1e1e-0000-4000-8000-0000000000bb"])
    assert out.exit_code != 0 and "has no manifest" in out.output
    out = runner.invoke(main, ["shards", uri, "--storage", "novalue"])
    assert out.exit_code != 0 and "key=value" in out.output
