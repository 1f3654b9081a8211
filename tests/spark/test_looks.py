"""A batch job's commit look, made on the driver while its tasks run (spark/looks.py).

On an object store the commit then starts with its PUT; a look another driver's
commit made stale costs a lost race and a fresh look, never a wrong answer: two
drivers whose looks were made at once each commit their rows exactly once.
"""

from __future__ import annotations

import memwal_datasource.log.commit as commit
from memwal_datasource.log import commit_folds
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.log.commit_reader import forget_folds
from memwal_datasource.spark import looks
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, TaskJob, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table.view import read_table
from memwal_datasource.write.writer_pool import POOL
from tests.spark.test_kept_writers import job_writer, one_job, rows


def _driver(uri, opts, table) -> MemWalBatchWriter:
    """A new job's writer (its look starts now), the look waited for."""
    w = MemWalBatchWriter(WriteOptions.parse({"path": uri, "keep_writers": "true", **{
        f"storage.{k}": v for k, v in opts.items()}}), table, overwrite=False)
    looks._LOOKS[w.job_id][1].result()
    return w


def _task(w: MemWalBatchWriter, table, ids, partition=0):
    """The task's message, once its kept writer's idle lease record (written after the
    task returns) has landed: the commit's requests are then the commit's alone."""
    msg = write_task(w.opts, table, iter([rows(ids)]), TaskJob.new(), partition=partition)
    for kept in list(POOL._kept.values()):
        kept.labelled()
    return msg


def _ids(uri, opts) -> list[int]:
    return sorted(read_table(uri, opts).column("id").to_pylist())


def test_a_commit_whose_look_ran_beside_its_tasks_is_its_put(fault_proxy, proxied_s3_table):
    """The look's one listing, made while the tasks ran, showed the number free and
    unreleased, and the PUT returned well within the commit deadline of it: the PUT is
    the whole commit (docs/protocol.md, invariant 4)."""
    uri, opts = proxied_s3_table
    first, table = job_writer(uri, opts)
    one_job(first, table, [1])  # this process's fold of the log is now the tip
    w = _driver(uri, opts, table)
    msg = _task(w, table, [2])
    fault_proxy.add_rule(fault="delay", delay_s=0.02)  # requests in flight together: one trip
    fault_proxy.clear_records()
    w.commit([msg])
    assert fault_proxy.round_trips() == 1  # the record's PUT
    assert [r.method for r in fault_proxy.records()] == ["PUT"]
    assert w.last_commit.sequence == 2
    assert _ids(uri, opts) == [1, 2]


def test_two_drivers_whose_looks_were_made_at_once_each_commit_once(fault_proxy,
                                                                     proxied_s3_table):
    """Two actors racing: both looks find the same next number; the second commit's PUT
    loses it, and that commit looks again and lands above the first."""
    uri, opts = proxied_s3_table
    first, table = job_writer(uri, opts)
    one_job(first, table, [1])
    a, b = _driver(uri, opts, table), _driver(uri, opts, table)
    ma, mb = _task(a, table, [2], partition=0), _task(b, table, [3], partition=1)
    lost = commit.LOST_RACES
    a.commit([ma])
    b.commit([mb])
    assert commit.LOST_RACES == lost + 1
    assert (a.last_commit.sequence, b.last_commit.sequence) == (2, 3)
    assert _ids(uri, opts) == [1, 2, 3]
    records = list(CommitLog(open_store(uri, opts)).records())
    assert [r.job_id for r in records[1:]] == [a.job_id, b.job_id]


def test_a_look_made_after_others_committed_is_not_trusted(fault_proxy, proxied_s3_table):
    """Another process committed since this one did: the commit looks again rather than
    risk a PUT it would likely lose."""
    uri, opts = proxied_s3_table
    first, table = job_writer(uri, opts)
    one_job(first, table, [1])
    store = open_store(uri, opts)
    ours = commit_folds.seed(store.uri, host=store.remote)  # this process's fold: the tip
    other = CommitLog(store)  # another process's driver commits (its fold is not ours)
    seq = other.next_sequence()
    other.append("append", [], job_id="someone-else")
    forget_folds()
    commit_folds.remember(store.uri, ours[0], ours[1], host=store.remote, etag=ours[2])
    w = _driver(uri, opts, table)
    assert not looks._LOOKS[w.job_id][1].result().quiet
    msg = _task(w, table, [2])
    lost = commit.LOST_RACES
    w.commit([msg])
    assert commit.LOST_RACES == lost
    assert w.last_commit.sequence == seq + 1
    assert _ids(uri, opts) == [1, 2]


def test_no_look_is_kept_on_local_disk_or_for_an_overwrite(tmp_path):
    uri = str(tmp_path / "t.lance")
    first, table = job_writer(uri, {})
    one_job(first, table, [1])
    w = MemWalBatchWriter(WriteOptions.parse({"path": uri}), table, overwrite=False)
    assert looks.take(w.job_id) is None


def test_no_look_is_made_ahead_in_a_spark_worker(proxied_s3_table, monkeypatch):
    """Spark plans a write in one kind of Python worker and commits it in another: a look
    made in the planner would never be used, so none is made (no request), and the
    commit looks for itself."""
    uri, opts = proxied_s3_table
    first, table = job_writer(uri, opts)
    one_job(first, table, [1])
    monkeypatch.setattr(looks, "in_spark_worker", lambda: True)
    w = MemWalBatchWriter(WriteOptions.parse({"path": uri, **{
        f"storage.{k}": v for k, v in opts.items()}}), table, overwrite=False)
    assert looks.take(w.job_id) is None
    w.commit([_task(w, table, [2])])
    assert _ids(uri, opts) == [1, 2]
