"""Bucket-sharded primary-key tables under retried and speculative attempts (issue 10)."""

from __future__ import annotations

import threading

import lance
import pyarrow as pa
import pytest

from memwal_datasource.errors import Fenced, MemWalError
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.spark import partition_for_table
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, read_table
from tests.spark.test_sharding import BUCKETED, frame, lsm_rows, shards_of_keys
from tests.spark.test_writer import _Gate, fail_first_attempt, write


@pytest.mark.parametrize("memtable", ["false", "true"])
def test_retried_attempts_on_a_bucketed_table_leave_each_key_once_newest(spark, tmp_path,
                                                                        memtable):
    uri = str(tmp_path / "t.lance")
    mem = {"enable_memtable": memtable, "max_wal_flush_interval_ms": "10",
           "durable_write": "true"}
    write(frame(spark, 0, 1, "seed").coalesce(1), uri, {}, **mem, **BUCKETED)
    write(partition_for_table(frame(spark, 0, 4000, "old"), uri), uri, {}, **mem)
    # Every task's first attempt fails after durable entries; Spark retries it.
    newer = fail_first_attempt(partition_for_table(frame(spark, 0, 2000, "new"), uri),
                               1500, 2000)
    write(newer, uri, {}, **mem)
    last = list(CommitLog(open_store(uri)).records())[-1]
    assert any(r.attempt == 1 for r in last.ranges), "no task was retried"
    newest = {i: f"{'new' if i < 2000 else 'old'}-{i}" for i in range(4000)}
    assert all(len(s) == 1 for s in shards_of_keys(uri, {}).values()), "a key in two shards"
    table = read_table(uri).to_pylist()
    assert {r["id"]: r["v"] for r in table} == newest and len(table) == 4000
    if memtable == "true":
        assert lsm_rows(uri) == newest
    compact(TableView(uri))
    base = lance.dataset(uri).to_table(columns=["id", "v"]).to_pylist()
    assert {r["id"]: r["v"] for r in base} == newest and len(base) == 4000


def test_speculative_duplicate_on_a_bucketed_table_commits_one_attempt(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    write(frame(spark, 0, 1, "seed").coalesce(1), uri, {}, enable_memtable="false", **BUCKETED)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    wopts = WriteOptions.parse({"path": uri, "enable_memtable": "false",
                                "max_wal_flush_interval_ms": "10", "durable_write": "true"})
    table_schema = read_table(uri).schema
    writer = MemWalBatchWriter(wopts, table_schema, overwrite=False)

    def batches(tag):
        return [pa.record_batch([pa.array(range(i * 10, i * 10 + 10), pa.int64()),
                                 pa.array([f"{tag}-{k}" for k in range(i * 10, i * 10 + 10)])],
                                schema=schema).cast(table_schema) for i in range(3)]

    slow = _Gate(batches("slow"), pause_after=1)
    outcome = {}

    def slow_attempt():  # partition 0, attempt 0 (no TaskContext: both are partition 0)
        try:
            outcome["msg"] = writer.write(iter(slow))
        except (Fenced, MemWalError) as exc:
            outcome["error"] = exc

    t = threading.Thread(target=slow_attempt)
    t.start()
    assert slow.reached.wait(60)
    fast = writer.write(iter(batches("fast")))  # the speculative copy, same job and partition
    slow.go.set()
    t.join(60)
    assert "error" in outcome and "msg" not in outcome, outcome
    records = len(list(CommitLog(open_store(uri)).records()))
    writer.commit([fast])
    assert len(list(CommitLog(open_store(uri)).records())) == records + 1
    rows = {r["id"]: r["v"] for r in read_table(uri).to_pylist()}
    assert {k: v for k, v in rows.items() if k < 30} == {k: f"fast-{k}" for k in range(30)}
    assert all(len(s) == 1 for s in shards_of_keys(uri, {}).values())
