"""Any DataFrame writes a primary-key table (issue 20): tasks take turns per shard.

A DataFrame that is not prepared with ``partition_for_table`` has rows of every
bucket in every partition, and some keys in two partitions. Each task writes
the shards it can take and spills the rest, then writes them in turns
(``spark/shard_turns.py``). The rule for a key two tasks of one job wrote: the
row of the last turn on its shard wins (highest WAL position; in MemTable mode
the newest SSTable generation), which :func:`expected` computes from the
commit record. pylance's LsmScanner (over the committed SSTables), the
whole-table read (``view=table``) and compaction must all agree with it.

Tasks pause and fail at hook points through the socket gates of
``test_concurrent_jobs`` (never sleeps).
"""

from __future__ import annotations

import os
import threading

import lance
import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.errors import CommitRefused, Fenced, MemWalError
from memwal_datasource.format.table_schema import data_schema, without_row_key
from memwal_datasource.log.commit import CommitLog, CommittedRange
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table.sharding import ShardingRequest, table_sharding
from memwal_datasource.table.sharding import create_table as create_sharded
from memwal_datasource.table.view import TableView, open_table, read_table
from memwal_datasource.write.native import committed_lsm_scanner
from tests.spark.test_concurrent_jobs import EVENT_TIMEOUT_S, finish, in_thread, worker_gates
from tests.spark.test_sharding import BUCKETED, shards_of_keys
from tests.spark.test_writer import _Gate, write

M = 500  # rows per partition; keys 0..M-1 are in partitions 0 and 3


def modes(memtable: str) -> dict[str, str]:
    return {"enable_memtable": memtable, "max_wal_flush_interval_ms": "20"}


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


def unprepared(spark):
    """4 partitions, every bucket in each; key k < M in partitions 0 (v p0-k) and 3."""
    return spark.range(0, 4 * M, numPartitions=4).selectExpr(
        f"id % {3 * M} as id", "concat('p', spark_partition_id(), '-', id) as v")


def partition_rows() -> dict[int, dict[int, str]]:
    """{partition: {key: value}} of :func:`unprepared` (each key once per partition)."""
    return {p: {i % (3 * M): f"p{p}-{i}" for i in range(p * M, (p + 1) * M)} for p in range(4)}


def expected(uri: str, ranges: list[CommittedRange],
             rows: dict[int, dict[int, str]]) -> dict[int, str]:
    """The README's rule: a key several tasks wrote keeps the row of the last turn (highest
    WAL position) on its shard among the tasks that had it."""
    sharding = table_sharding(lance.dataset(uri))
    turn = {(r.shard_id, r.task): r.first for r in ranges}
    assert len(turn) == len(ranges), "two ranges of one task on one shard"
    keys = sorted({k for part in rows.values() for k in part})
    buckets = sharding.values(pa.record_batch([pa.array(keys, pa.int64())], names=["id"]))
    out = {}
    for key, bucket in zip(keys, buckets.to_pylist(), strict=True):
        shard = sharding.shard_id(bucket)
        last = max((p for p in rows if key in rows[p]), key=lambda p: turn[(shard, p)])
        out[key] = rows[last][key]
    return out


def table_rows(spark, uri) -> dict[int, str]:
    got = spark.read.format("memwal").option("view", "table").load(uri).collect()
    out = {r.id: r.v for r in got}
    assert len(out) == len(got), "view=table returned a key twice"
    return out


def lsm(uri) -> dict[int, str]:
    got = committed_lsm_scanner(TableView(uri)).to_table().to_pylist()
    out = {r["id"]: r["v"] for r in got}
    assert len(out) == len(got), "LsmScanner returned a key twice"
    return out


def plain(uri) -> dict[int, str]:
    got = read_table(uri).to_pylist()
    out = {r["id"]: r["v"] for r in got}
    assert len(out) == len(got), "read_table returned a key twice"
    return out


@pytest.mark.parametrize("memtable", ["false", "true"])
def test_unprepared_job_with_a_failed_turn_and_a_concurrent_job(spark, tmp_path, memtable):
    """Job A (unprepared, 4 partitions) pauses a task in its turn on a shard; job B (direct
    write_task calls, keys of its own on the same shards) spills that shard and waits for
    A holding nothing; A's paused turn then fails, Spark retries the task. Both commit (B
    after a re-run if A's retry overtook it on a shard); every key once, each with the
    value the rule picks, in every reader."""
    uri = str(tmp_path / "t.lance")
    mem = modes(memtable)
    write(spark.range(99_999, 100_000, numPartitions=1).selectExpr("id", "'seed' as v"),
          uri, {}, **mem, **BUCKETED)
    points = ["lease.acquired", "lease.waiting", "turn.written"]
    with worker_gates(spark, tmp_path, points, hold={"lease.acquired", "turn.written"}) as gates:
        job_a, out_a = in_thread(spark, write, unprepared(spark), uri, {}, **mem)
        # A task of A holds a shard (paused) until a sibling, done with its input, waits
        # for it: the sibling must then write that shard in a turn (every partition has
        # rows of every shard), however Spark's two slots were scheduled.
        first = gates.next("lease.acquired")
        while (waiter := gates.next("lease.waiting"))["blocker_job_id"] != first["job_id"]:
            pass
        assert waiter["job_id"] == first["job_id"]
        gates.release("lease.acquired")
        paused = gates.next("turn.written")  # a task in its turn: holds that shard
    try:
        assert paused["attempt"] == 0
        b_writer = MemWalBatchWriter(WriteOptions.parse({"path": uri, **mem}),
                                     without_row_key(open_table(uri).schema), overwrite=False)
        waiting = threading.Event()

        def b_waits(**context):
            if context["blocker_job_id"] == paused["job_id"]:
                waiting.set()

        hooks.register("lease.waiting", b_waits)
        b_keys = list(range(10_000, 10_200))
        b_batch = pa.record_batch([pa.array(b_keys, pa.int64()),
                                   pa.array([f"b-{k}" for k in b_keys])],
                                  schema=data_schema(b_writer.schema))
        job_b, out_b = in_thread(spark, write_task, b_writer.opts, b_writer.schema,
                                 iter([b_batch]), b_writer.job)
        assert waiting.wait(EVENT_TIMEOUT_S), "job B did not wait for job A's shard"
        assert "result" not in out_a and "error" not in out_a
        gates.fail("turn.written")  # A's task fails mid-turn; Spark retries it
        b_msg = finish(job_b, out_b)
        finish(job_a, out_a)
    finally:
        gates.close()
    assert paused["shard"] in {s.shard_id for s in b_msg.shards}  # B wrote it after A
    try:
        b_writer.commit([b_msg])
    except CommitRefused as exc:
        # A's retried task took a shard after B's turn there and A committed first: a
        # shard's writers commit in epoch order (every reader then agrees on each key),
        # so B is refused with nothing committed, and its re-run commits.
        assert str(exc).startswith("run the job again: shard ")
        assert not [r for r in CommitLog(open_store(uri)).records()
                    if r.job_id == b_writer.job_id]
        b_writer.commit([write_task(b_writer.opts, b_writer.schema, iter([b_batch]),
                                    b_writer.job)])

    records = list(CommitLog(open_store(uri)).records())
    (a_rec,) = [r for r in records if r.job_id == paused["job_id"]]
    retried = {r.task for r in a_rec.ranges if r.attempt == 1}
    assert paused["partition"] in retried, "the failed task was not retried"
    assert len(a_rec.ranges) > 4  # several tasks wrote each shard, in turns
    shared = {r.shard_id for r in a_rec.ranges if r.task == 0} & {
        r.shard_id for r in a_rec.ranges if r.task == 3}
    assert len(shared) == 4  # partitions 0 and 3 (which share keys) both wrote every shard
    want = expected(uri, a_rec.ranges, partition_rows())
    want |= {k: f"b-{k}" for k in range(10_000, 10_200)} | {99_999: "seed"}
    assert all(len(s) == 1 for s in shards_of_keys(uri, {}).values()), "a key in two shards"
    assert plain(uri) == want
    assert table_rows(spark, uri) == want
    if memtable == "true":
        assert lsm(uri) == want

    # Deletes from an unprepared DataFrame take turns too.
    doomed = spark.range(0, 100, numPartitions=3).selectExpr("id")
    write(doomed, uri, {}, operation="delete")
    want = {k: v for k, v in want.items() if k >= 100}
    assert plain(uri) == want
    compact(TableView(uri))
    base = lance.dataset(uri).to_table(columns=["id", "v"]).to_pylist()
    assert {r["id"]: r["v"] for r in base} == want and len(base) == len(want)
    assert lsm(uri) == want
    assert table_rows(spark, uri) == want


@pytest.mark.parametrize("memtable", ["false", "true"])
def test_a_speculative_attempt_while_a_sibling_waits_for_its_shards(tmp_path, memtable):
    """Partition 0's slow attempt holds every shard and pauses; partition 1 spills all its
    rows and waits for its sibling; a speculative attempt of partition 0 takes the shards
    over (fencing the slow one) and writes; partition 1 then takes its turns. The slow
    attempt fails; the job commits the speculative attempt and partition 1."""
    uri = str(tmp_path / "t.lance")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    table = create_sharded(uri, schema, ["id"], {},
                           ShardingRequest(bucket_column="id", num_buckets=4)).schema
    opts = WriteOptions.parse({"path": uri, **modes(memtable), "durable_write": "true"})
    writer = MemWalBatchWriter(opts, table, overwrite=False)

    def batches(lo, hi, tag, size=40):
        return [pa.record_batch([pa.array(range(i, min(i + size, hi)), pa.int64()),
                                 pa.array([f"{tag}-{k}" for k in range(i, min(i + size, hi))])],
                                schema=table) for i in range(lo, hi, size)]

    first = pa.record_batch([pa.array(range(40), pa.int64())], names=["id"])
    assert len(set(writer.opts.sharding.values(first).to_pylist())) == 4  # slow holds all 4
    slow_input = _Gate(batches(0, 120, "slow"), pause_after=1)
    sibling_waits = threading.Event()

    def waiting(**context):
        if context["partition"] == 1 and context["blocker_job_id"] == writer.job_id:
            sibling_waits.set()

    hooks.register("lease.waiting", waiting)
    outcome: dict = {}

    def run(name, batches_, partition, attempt):
        try:
            outcome[name] = write_task(writer.opts, table, iter(batches_), writer.job,
                                       partition=partition, attempt=attempt)
        except (Fenced, MemWalError) as exc:
            outcome[f"{name} error"] = exc

    slow = threading.Thread(target=run, args=("slow", slow_input, 0, 0))
    slow.start()
    assert slow_input.reached.wait(EVENT_TIMEOUT_S)
    sibling = threading.Thread(target=run, args=("sibling", batches(60, 180, "sib"), 1, 0))
    sibling.start()
    assert sibling_waits.wait(EVENT_TIMEOUT_S), "partition 1 did not wait for partition 0"
    run("fast", batches(0, 120, "fast"), 0, 1)  # the speculative copy of partition 0
    sibling.join(EVENT_TIMEOUT_S)
    slow_input.go.set()
    slow.join(EVENT_TIMEOUT_S)
    assert "slow error" in outcome and "slow" not in outcome, outcome
    fast, sib = outcome["fast"], outcome["sibling"]
    assert len(fast.shards) == 4 and len(sib.shards) == 4
    writer.commit([fast, sib])

    (rec,) = CommitLog(open_store(uri)).records()
    rows = {0: {k: f"fast-{k}" for k in range(120)}, 1: {k: f"sib-{k}" for k in range(60, 180)}}
    want = expected(uri, rec.ranges, rows)
    # The sibling's turns came after the speculative attempt released every shard.
    assert want == {k: f"fast-{k}" for k in range(60)} | {k: f"sib-{k}" for k in range(60, 180)}
    assert plain(uri) == want
    if memtable == "true":
        assert lsm(uri) == want
    compact(TableView(uri))
    base = lance.dataset(uri).to_table(columns=["id", "v"]).to_pylist()
    assert {r["id"]: r["v"] for r in base} == want and len(base) == len(want)
    assert lsm(uri) == want


def test_spill_files_keep_order_and_are_deleted():
    from memwal_datasource.spark.shard_turns import SpillFiles, stagger

    schema = pa.schema([("id", pa.int64())])
    spill = SpillFiles(schema)
    for i in range(10):
        spill.add("s1", pa.record_batch([pa.array([i, i + 100], pa.int64())], schema=schema))
    spill.add("s2", pa.record_batch([pa.array([7], pa.int64())], schema=schema))
    assert spill.dir is not None and sorted(spill.shards()) == ["s1", "s2"]
    chunks = list(spill.read("s1", chunk_bytes=40))
    assert len(chunks) > 1
    got = [v for chunk in chunks for b in chunk for v in b.column(0).to_pylist()]
    assert got == [v for i in range(10) for v in (i, i + 100)]
    assert "s1" not in spill
    root = spill.dir
    spill.close()
    assert not os.path.exists(root)
    assert stagger(["c", "a", "b"], 4) == ["b", "c", "a"]


def test_spill_files_bound_open_files_and_keep_order_across_segments(monkeypatch):
    from memwal_datasource.spark import shard_turns

    monkeypatch.setattr(shard_turns, "SPILL_OPEN_FILES", 2)
    schema = pa.schema([("id", pa.int64())])
    spill = shard_turns.SpillFiles(schema)
    for i in range(12):  # round-robin over 4 shards: every add past the second evicts
        spill.add(f"s{i % 4}", pa.record_batch([pa.array([i], pa.int64())], schema=schema))
        assert len(spill._open) <= 2
    for k in range(4):
        got = [v for chunk in spill.read(f"s{k}", 1 << 20) for b in chunk
               for v in b.column(0).to_pylist()]
        assert got == [k, k + 4, k + 8]
    assert os.listdir(spill.dir) == []
    spill.close()
