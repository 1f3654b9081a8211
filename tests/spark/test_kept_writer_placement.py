"""Two Spark Python workers taking turns on one partition's slot, each keeping writers.

Spark hands tasks to its idle Python workers in turn, so the one-partition tasks
of repeated jobs (or a stream's micro-batches) alternate between two processes.
A task whose slot is free but kept by the other process's writer takes a shard
its own process keeps a writer on instead, so neither claims the other's shard
on every turn, and the table gains no shard. Two real processes (spawned), on
local disk and the S3 server.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.shard.leases import Holder, Leases
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import TaskJob
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table, read_table
from tests.spark import placement_worker
from tests.spark.placement_worker import Worker


@pytest.mark.parametrize("options", [{}, {"num_shards": "2"}], ids=["pool", "num_shards"])
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_two_workers_taking_turns_on_one_slot_each_continue_their_own_shard(location, options):
    uri, opts = location
    home = WriteOptions.parse({"path": uri, **options}).shard_for(0)
    create_table(uri, placement_worker.SCHEMA, storage_options=opts)
    ctx = mp.get_context("spawn")
    a, b = Worker(ctx, uri, opts, options), Worker(ctx, uri, opts, options)
    try:
        first_a = a.append([0])  # a keeps a writer on the slot's shard
        assert first_a[0] == home
        # Another job holds the slot while b appends: b takes the next free shard and
        # keeps it. Then a's next task continues its own writer on the slot.
        leases = Leases(open_store(uri, opts))
        blocker = leases.acquire(home, Holder("another job", 0))
        first_b = b.append([1])
        leases.release(blocker)
        assert first_b[0] != home
        turns = []
        for i in range(2, 10):  # the workers take turns, as Spark hands out tasks
            turns.append(((a, b)[i % 2] is a, (a, b)[i % 2].append([i])))
    finally:
        a.stop()
        b.stop()
    by_worker = {True: [], False: []}
    for is_a, res in turns[2:]:
        by_worker[is_a].append(res)
    # Each worker stayed on one shard at one epoch: no task claimed anew. (The blocker's
    # lease came between a's kept writer and a's first turn: on an object store that
    # turn continues the writer before its lease is proved, its rows stand, and the
    # writer is not kept, so a's second turn claims anew; elsewhere the first turn does.)
    a_shards = {(s, e) for s, e, _f, _l in by_worker[True]}
    b_shards = {(s, e) for s, e, _f, _l in by_worker[False]}
    assert len(a_shards) == 1 and len(b_shards) == 1, (a_shards, b_shards)
    assert {s for s, _e in a_shards | b_shards} == {home, first_b[0]}, "no shard gained"
    assert first_b[:2] in b_shards
    # Every row committed once, each range where its task wrote it.
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == list(range(10))
    ranges = [(r.shard_id, r.first, r.last) for rec in CommitLog(open_store(uri, opts)).records()
              for r in rec.ranges]
    assert sorted(ranges) == sorted((s, f, last) for s, _e, f, last in
                                    [first_a, first_b, *(res for _a, res in turns)])


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_retry_in_another_worker_claims_the_slot_and_fences_the_kept_writer(location):
    """Attempt 0 wrote and its worker kept the writer, idle; the driver never saw it
    succeed, and Spark retries the task in another worker. The retry claims the slot
    anew (it never goes elsewhere to spare a kept writer, as a first attempt does), so
    the kept writer is fenced; the next first attempt in that worker claims anew, and
    every committed row is there once."""
    uri, opts = location
    home = WriteOptions.parse({"path": uri}).shard_for(0)
    create_table(uri, placement_worker.SCHEMA, storage_options=opts)
    ctx = mp.get_context("spawn")
    a, b = Worker(ctx, uri, opts, {}), Worker(ctx, uri, opts, {})
    try:
        job = TaskJob.new()
        lost = a.append(([0], job, 0, False))  # its success never reached the driver
        retry = b.append(([0], job, 1, True))
        after = a.append([1])
    finally:
        a.stop()
        b.stop()
    assert lost[0] == retry[0] == home and retry[1] > lost[1], (lost, retry)
    assert after[:2] != lost[:2], "the fenced kept writer was not continued"
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [0, 1]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_two_workers_racing_for_one_slot_commit_every_row_once(location):
    """Two actors at once, round after round: two processes' tasks of partition 0 (each
    its own job) race for the same slot, each continuing its kept writer where it can.
    Each round one of them takes the slot and the other goes elsewhere or takes it over
    after, so kept writers are fenced while kept, leases are taken between a put and its
    proof, and on an object store WAL PUTs of continued writers collide with a claimer's
    sentinel and are written anew. Every job commits, every row is read once, and no
    two committed ranges share a WAL position."""
    import threading

    uri, opts = location
    create_table(uri, placement_worker.SCHEMA, storage_options=opts)
    ctx = mp.get_context("spawn")
    workers = [Worker(ctx, uri, opts, {}), Worker(ctx, uri, opts, {})]
    answers: list = []
    try:
        for r in range(10):
            ids = [[2 * r], [2 * r + 1]]
            threads = [threading.Thread(target=lambda w=w, i=i: answers.append(w.append(i)))
                       for w, i in zip(workers, ids, strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
    finally:
        for w in workers:
            w.stop()
    assert len(answers) == 20
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == list(range(20))
    ranges = [(r.shard_id, r.first, r.last) for rec in CommitLog(open_store(uri, opts)).records()
              for r in rec.ranges]
    assert len(ranges) == 20
    taken = [(s, p) for s, first, last in ranges for p in range(first, last + 1)]
    assert len(taken) == len(set(taken)), "two committed ranges share a WAL position"
