"""A worker killed (SIGKILL) while a task continues its kept writer on an object store,
while another worker appends to the same slot.

On S3 a task continuing a kept writer puts its lease beside its WAL PUT, proves the
lease beside the fence check after it, and writes the idle record after it returns
(docs/protocol.md, "Cheaper fence checks and lease writes"). A process killed at any
of those points leaves a lease that expires, WAL entries no commit names, or a
committed job: never a row read twice, a committed row lost, or a live writer stuck.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections import Counter

import pytest

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table, read_table
from tests.spark import placement_worker
from tests.spark.placement_worker import Worker

# Points in the second (continuing) task of a worker, or just after it: the first task
# claims its shard (a lease put, the idle record after it: the first two lease puts).
KILL_POINTS = [
    "lease.before_put:3",  # the continuing task's lease put, beside its WAL PUT
    "append.after:2",  # its WAL entry landed, nothing settled yet
    "lease.proving:2",  # the listing that proves its lease, beside the fence check
    "lease.before_put:4",  # the idle record, as the task returns
    "commit.after:2",  # its job committed, the idle record in flight, nobody told
]


def _killed_worker(ctx, uri, opts, monkeypatch, point: str) -> Worker:
    monkeypatch.setenv("MEMWAL_KILL_AT", point)  # read by the spawned process's hooks
    try:
        return Worker(ctx, uri, opts, {})
    finally:
        monkeypatch.delenv("MEMWAL_KILL_AT")


@pytest.mark.parametrize("point", KILL_POINTS)
@pytest.mark.parametrize("backend", ["s3"])
def test_a_worker_killed_while_continuing_its_kept_writer_loses_and_doubles_nothing(
        location, monkeypatch, point):
    uri, opts = location
    create_table(uri, placement_worker.SCHEMA, storage_options=opts)
    ctx = mp.get_context("spawn")
    doomed = _killed_worker(ctx, uri, opts, monkeypatch, point)
    rival = Worker(ctx, uri, opts, {})
    acked: list[int] = []
    try:
        doomed.append([0])  # claims slot 0's shard and keeps the writer
        acked.append(0)
        # Two actors at once: the rival's jobs race the doomed worker's second task.
        rival_ids = [[10 + i] for i in range(4)]
        rival_answers: list = []
        racing = threading.Thread(
            target=lambda: rival_answers.extend(rival.append(ids) for ids in rival_ids))
        racing.start()
        doomed.conn.send([1])
        if doomed.conn.poll(120):
            try:
                doomed.conn.recv()
                acked.append(1)  # committed before the kill (the idle record's point)
            except EOFError:
                pass
        doomed.proc.join(60)
        racing.join(240)
        assert not racing.is_alive() and len(rival_answers) == 4, "the rival kept appending"
        assert doomed.proc.exitcode == -9, f"not killed at {point}"
        acked += [i for ids in rival_ids for i in ids]
        late = Worker(ctx, uri, opts, {})  # a new process after the death
        try:
            late.append([20])
            acked.append(20)
        finally:
            late.stop()
    finally:
        rival.stop()
    got = Counter(read_table(uri, opts).column("id").to_pylist())
    assert all(n == 1 for n in got.values()), f"rows read twice: {got}"
    assert set(acked) <= set(got) <= set(acked) | {1}, (sorted(got), acked)
    if point.startswith("commit.after"):
        assert got[1] == 1  # committed, though the worker died before saying so
    ranges = [(r.shard_id, r.first, r.last) for rec in CommitLog(open_store(uri, opts)).records()
              for r in rec.ranges]
    taken = [(s, p) for s, first, last in ranges for p in range(first, last + 1)]
    assert len(taken) == len(set(taken)), "two committed ranges share a WAL position"
