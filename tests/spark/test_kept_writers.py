"""Writers kept between tasks (memwal_datasource.write.writer_pool) through the Spark task path.

Called as Spark's Python worker calls it (``write_task`` in this process, which
stands for a reused worker): a first attempt takes the writer a previous task
kept (no lease, claim, sentinel or release written); a retried attempt claims
anew and fences it; a writer fenced while kept is not reused; commits and
reads see each job's rows exactly once.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.errors import MemWalError
from memwal_datasource.format.table_schema import without_row_key
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.shard.leases import Holder, Leases
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, TaskJob, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table, read_table
from memwal_datasource.write.writer_pool import POOL

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


@pytest.fixture(autouse=True)
def _empty_pool():
    POOL.close_all()
    yield
    POOL.close_all()


def rows(ids) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"v{i}" for i in ids])],
                           schema=SCHEMA)


def job_writer(uri, opts):
    table = without_row_key(create_table(uri, SCHEMA, storage_options=opts).schema)
    return MemWalBatchWriter(WriteOptions.parse({"path": uri, "keep_writers": "true", **{
        f"storage.{k}": v for k, v in opts.items()}}), table, overwrite=False), table


def one_job(writer, table, ids, attempt=0, job=None):
    msg = write_task(writer.opts, table, iter([rows(ids)]), job or TaskJob.new(), partition=0,
                     attempt=attempt)
    writer.commit([msg])
    return msg


def objects(store) -> set[str]:
    return set(store.list(""))


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_first_attempt_reuses_the_kept_writer_and_writes_only_its_entry(location):
    uri, opts = location
    writer, table = job_writer(uri, opts)
    store = open_store(uri, opts)
    first = one_job(writer, table, [1, 2])
    assert len(POOL) == 1
    before = objects(store)
    second = one_job(writer, table, [3])
    new = {k for k in objects(store) - before if not k.startswith("_memwal_leases/")}
    # One WAL entry and the job's commit record (and lease generations, as any task
    # writes): no manifest version, hint or sentinel.
    assert sorted(k.split("/")[0] for k in new) == ["_mem_wal", "_memwal_commits"], new
    assert [k.split("/")[2] for k in new if k.startswith("_mem_wal/")] == ["wal"], new
    assert (second.shard_id, second.epoch) == (first.shard_id, first.epoch)
    assert second.first_position == first.last_position + 1
    assert (second.rows, second.wal_entries) == (1, 1)
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2, 3]
    ranges = [r for rec in CommitLog(store).records() for r in rec.ranges]
    assert [(r.first, r.last, r.rows) for r in ranges] == [
        (first.first_position, first.last_position, 2), (second.first_position,
                                                         second.last_position, 1)]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_the_next_task_takes_the_shard_after_the_kept_record_without_reading_it(
        location, monkeypatch):
    """The continuing task's lease is one put after the kept writer's idle record and a
    listing (Leases.take_after): the current lease is never read."""
    from memwal_datasource.shard.leases import Leases

    uri, opts = location
    writer, table = job_writer(uri, opts)
    first = one_job(writer, table, [1, 2])
    reads: list[str] = []
    latest = Leases._latest
    monkeypatch.setattr(Leases, "_latest", lambda self, shard: reads.append(shard) or latest(
        self, shard))
    second = one_job(writer, table, [3])
    assert (second.shard_id, second.epoch) == (first.shard_id, first.epoch)
    assert reads == []
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_retried_attempt_claims_anew_and_fences_the_kept_writer(location):
    uri, opts = location
    writer, table = job_writer(uri, opts)
    job = TaskJob.new()
    first = one_job(writer, table, [1], job=job)
    retry = one_job(writer, table, [2], attempt=1, job=job)  # the same task, again
    # A retry never takes a kept writer: it claims anew. The kept writer's lease says
    # idle, so the retry takes its partition's slot, and its claim fences the kept writer.
    assert retry.shard_id == first.shard_id and len(POOL) == 0
    assert (retry.shard_id, retry.epoch) != (first.shard_id, first.epoch)
    assert retry.epoch > (first.epoch if retry.shard_id == first.shard_id else 0)
    one_job(writer, table, [3])
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_writer_fenced_while_kept_is_not_reused(location):
    uri, opts = location
    writer, table = job_writer(uri, opts)
    store = open_store(uri, opts)
    first = one_job(writer, table, [1])
    WalAppender.open(store, first.shard_id)  # another process claims the shard
    stolen = ManifestStore(store, first.shard_id).latest().writer_epoch
    second = one_job(writer, table, [2])
    assert second.epoch > stolen  # opened anew, not the fenced one
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2]


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_claim_before_the_continuing_tasks_wal_put_costs_no_row_and_no_duplicate(location):
    """Two actors at once: another process claims the shard (taking no lease) after the
    kept writer was last checked and before the continuing task's WAL PUT. On an object
    store the task continues the writer at once and checks after its PUT: the PUT meets
    the claimer's sentinel, so the task leases anew and writes its rows again (its lease
    was proved: the same shard, a newer epoch). On local disk the fence is checked as
    the shard is leased, before the PUT: the task fails without a message and the retry
    claims anew. Either way each row is read once."""
    uri, opts = location
    writer, table = job_writer(uri, opts)
    store = open_store(uri, opts)
    first = one_job(writer, table, [1])
    job, claimed = TaskJob.new(), []

    def claim_before_the_put(shard, epoch, position):
        if (shard, epoch) == (first.shard_id, first.epoch) and not claimed:
            claimed.append(WalAppender.open(store, shard).epoch)

    def task(attempt: int, ids: list[int]):
        return write_task(writer.opts, table, iter([rows(ids)]), job, partition=0,
                          attempt=attempt)

    remove = hooks.register("append.before", claim_before_the_put)
    try:
        if store.remote:
            msg = task(0, [2])
        else:
            with pytest.raises(MemWalError):
                task(0, [9])
    finally:
        remove()
    assert claimed and claimed[0] > first.epoch
    if not store.remote:
        msg = task(1, [2])
    assert msg.shard_id == first.shard_id and msg.epoch > claimed[0]
    assert (msg.rows, msg.wal_entries) == (1, 1)
    writer.commit([msg])
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2]
    assert len(POOL) == (1 if store.remote else 0)  # the writer opened anew is kept


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_retry_racing_the_attempt_that_continues_the_kept_writer_commits_once(location):
    """Two actors at once: attempt 0 continues the kept writer and is paused right after
    its WAL entry lands; attempt 1 of the same task claims anew (fencing that writer),
    writes and is committed. Attempt 0 then fails, or (on an object store, where it
    settles after its PUT) leases anew and writes its rows again; either way its first
    entry's rows are never visible, and attempt 1's are read once."""
    uri, opts = location
    writer, table = job_writer(uri, opts)
    first = one_job(writer, table, [1])  # the writer is now kept, epoch first.epoch
    job, landed, resume, outcome = TaskJob.new(), threading.Event(), threading.Event(), {}

    def pause_the_kept_writer(shard, epoch, position):
        if (shard, epoch) == (first.shard_id, first.epoch):
            landed.set()
            assert resume.wait(60)

    def attempt_0():
        try:
            outcome["msg"] = write_task(writer.opts, table, iter([rows([9])]), job,
                                        partition=0, attempt=0)
        except Exception as exc:  # noqa: BLE001 - inspected below
            outcome["error"] = exc

    remove = hooks.register("append.after", pause_the_kept_writer)
    racer = threading.Thread(target=attempt_0)
    try:
        racer.start()
        assert landed.wait(60), "attempt 0 never wrote its entry"
        retry = write_task(writer.opts, table, iter([rows([2])]), job, partition=0, attempt=1)
    finally:
        resume.set()
        racer.join(60)
        remove()
    assert retry.shard_id == first.shard_id and retry.epoch > first.epoch
    store = open_store(uri, opts)
    if "msg" in outcome and store.remote:
        # On an object store attempt 0 continued its writer before proving its lease;
        # the retry's claim came before the fence check after its PUT: attempt 0 leased
        # anew (the retry had released the slot by then) and wrote its rows again,
        # at an epoch after the retry's.
        msg = outcome["msg"]
        assert msg.shard_id != retry.shard_id or msg.epoch > retry.epoch
        assert msg.first_position > retry.last_position or msg.shard_id != retry.shard_id
    else:
        # Fenced at its close (or, had its lease renewal run first, LeaseLost).
        assert "msg" not in outcome and isinstance(outcome.get("error"), MemWalError), outcome
    writer.commit([retry])  # what Spark commits: the attempt that succeeded
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2]
    # Neither attempt left the fenced writer to continue (attempt 0's new one, at most).
    assert len(POOL) == (1 if "msg" in outcome else 0)


def test_a_failed_task_does_not_give_its_writer_back(tmp_path):
    uri = str(tmp_path / "t.lance")
    writer, table = job_writer(uri, {})
    one_job(writer, table, [1])

    def failing():
        yield rows([2])
        raise RuntimeError("the task's input failed")

    with pytest.raises(RuntimeError):
        write_task(writer.opts, table, failing(), TaskJob.new(), partition=0, attempt=0)
    assert len(POOL) == 0
    third = one_job(writer, table, [3])
    assert sorted(read_table(uri).column("id").to_pylist()) == [1, 3]
    assert third.rows == 1


def test_with_the_option_off_every_task_releases_and_claims_anew(tmp_path):
    uri = str(tmp_path / "t.lance")
    table = without_row_key(create_table(uri, SCHEMA).schema)
    writer = MemWalBatchWriter(WriteOptions.parse({"path": uri, "keep_writers": "false"}),
                               table, overwrite=False)
    first, second = one_job(writer, table, [1]), one_job(writer, table, [2])
    assert len(POOL) == 0 and second.epoch > first.epoch


def test_idle_kept_writers_close_and_release_their_lease(tmp_path):
    from memwal_datasource.shard.leases import Leases

    uri = str(tmp_path / "t.lance")
    writer, table = job_writer(uri, {})
    msg = one_job(writer, table, [1])
    leases = Leases(open_store(uri))
    assert not leases.current(msg.shard_id).released  # kept: still leased
    assert POOL.close_idle(0.0) == 1
    assert leases.current(msg.shard_id).released
    manifest = ManifestStore(open_store(uri), msg.shard_id).latest()
    assert manifest.replay_after_wal_entry_position >= msg.last_position  # no replay debt


# --- a table deleted and made anew at the same path ------------------------------------

def wipe(uri: str, opts) -> None:
    """Delete the table at ``uri`` (every object, as ``rm -r`` or a bucket cleanup does)."""
    store = open_store(uri, opts)
    for key in list(store.list("")):
        store.delete(key)


def stale_kept_writer(uri, opts):
    """A writer kept after three jobs (WAL positions 1..3) on a table that is then deleted
    and created anew at the same path, with the same shard ids (its writer group's slots)."""
    writer, table = job_writer(uri, opts)
    msgs = [one_job(writer, table, [i]) for i in (1, 2, 3)]
    assert len(POOL) == 1 and msgs[-1].last_position == 3
    wipe(uri, opts)
    return job_writer(uri, opts), msgs[0].shard_id


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_kept_writer_of_a_replaced_table_closes_without_writing_into_the_new_one(location):
    """The kept writer of a deleted table retires (idle) after the new table's first writer
    of the same shard wrote and closed: it must not move the new shard's replay position
    past entries that do not exist there (its epoch, 1, is the new writer's too)."""
    from memwal_datasource.config import ShardWriterConfig
    from memwal_datasource.write.shard_writer import open_shard_writer

    uri, opts = location
    (_writer, table), shard = stale_kept_writer(uri, opts)
    fresh = open_shard_writer(uri, shard, table, ShardWriterConfig(enable_memtable=False),
                              storage_options=opts)
    fresh.put(rows([10]))
    fresh.close()
    manifests = ManifestStore(open_store(uri, opts), shard)
    before = manifests.latest()
    assert (before.writer_epoch, before.replay_after_wal_entry_position) == (1, 1)
    POOL.close_all()  # the stale writer retires
    after = manifests.latest()
    assert after == before, f"the stale writer wrote into the new table: {after}"


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_kept_writer_of_a_replaced_table_is_not_continued(location):
    """Even when its lease record is the new table's latest (a renewal that landed after
    the table was made anew), the next task claims the new table's shard anew."""
    from memwal_datasource.shard.leases import Leases

    uri, opts = location
    (writer, table), shard = stale_kept_writer(uri, opts)
    [(_, kept)] = list(POOL._kept.items())
    Leases(open_store(uri, opts)).renew(kept.held.lease)  # the stale renewal
    msg = one_job(writer, table, [20])
    assert msg.shard_id == shard
    assert (msg.first_position, msg.last_position) == (1, 1), "continued the stale writer"
    latest = ManifestStore(open_store(uri, opts), shard).latest()
    assert latest is not None and latest.writer_epoch == msg.epoch
    assert read_table(uri, opts).column("id").to_pylist() == [20]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_kept_writer_is_continued_across_a_compaction(location):
    """A compaction commits a new Lance version of the same table: the next job's planner
    reads that version, and its task still continues the kept writer (the kept writer's
    version is still there, the same object: one HEAD), with every row once."""
    from memwal_datasource import compact

    uri, opts = location
    writer, table = job_writer(uri, opts)
    first = one_job(writer, table, [1, 2])
    assert compact(uri, opts).rows == 2
    later = MemWalBatchWriter(WriteOptions.parse({"path": uri, **{
        f"storage.{k}": v for k, v in opts.items()}}), table, overwrite=False)
    assert later.opts.table_stamp.version > writer.opts.table_stamp.version
    second = one_job(later, table, [3])
    assert (second.shard_id, second.epoch) == (first.shard_id, first.epoch), "claimed anew"
    assert second.first_position == first.last_position + 1
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_retry_taking_the_lease_before_the_continuing_task_proved_it_commits_once(location):
    """Two actors at once: the attempt continuing the kept writer has put its lease
    record; before its listing proves the lease (on an object store that listing runs
    beside its WAL write), attempt 1 of the same task takes the lease over, claims anew,
    writes and succeeds. Attempt 0 then fails, fenced, or reports the entry its fence
    check saw stand (where the listing is part of the put, it leases and claims anew
    itself); only what is committed is ever visible."""
    uri, opts = location
    writer, table = job_writer(uri, opts)
    first = one_job(writer, table, [1])
    job, retry = TaskJob.new(), {}

    def retry_takes_over(shard, job_id, **_):
        if job_id == job.job_id and not retry:
            retry["msg"] = None  # once: the retry's own acquisition proves too
            retry["msg"] = write_task(writer.opts, table, iter([rows([2])]), job,
                                      partition=0, attempt=1)

    remove = hooks.register("lease.proving", retry_takes_over)
    try:
        try:
            attempt_0 = write_task(writer.opts, table, iter([rows([9])]), job, partition=0,
                                   attempt=0)
        except MemWalError as exc:  # fenced by the retry's claim: it reports no success
            attempt_0 = exc
    finally:
        remove()
    taken = retry["msg"]
    assert taken.shard_id == first.shard_id and taken.epoch > first.epoch
    if not open_store(uri, opts).remote:  # the listing is part of the put: leased anew
        assert attempt_0.epoch > taken.epoch
    elif not isinstance(attempt_0, Exception):
        # The listing runs beside the close's fence check on an object store: a check
        # made before the retry's claim landed passes, and the rows stand (the lease,
        # not proved, costs only the writer): they landed before that claim.
        assert (attempt_0.shard_id, attempt_0.epoch) == (first.shard_id, first.epoch)
        assert attempt_0.last_position < taken.first_position
    writer.commit([taken])  # what Spark commits: the attempt that succeeded first
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2]
    assert len(POOL) <= 1  # at most the writer of the attempt that succeeded last


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_lease_taken_but_never_claimed_before_the_proof_costs_the_writer_not_the_task(
        location):
    """Two actors at once: after the continuing attempt's lease put, another holder (a
    retry of the same task that then stalls, say) takes the lease over and claims
    nothing. The continuing attempt's listing does not prove its lease; its fence still
    holds, so its rows stand: it succeeds, keeps no writer, and leaves the lease alone."""
    uri, opts = location
    writer, table = job_writer(uri, opts)
    first = one_job(writer, table, [1])
    store = open_store(uri, opts)
    job, other = TaskJob.new(), {}

    def takes_the_lease(shard, job_id, partition, **_):
        if job_id == job.job_id and not other:
            other["lease"] = None
            other["lease"] = Leases(store).try_acquire(
                shard, Holder(job.job_id, partition, 1, label="stalled retry"))

    remove = hooks.register("lease.proving", takes_the_lease)
    try:
        msg = write_task(writer.opts, table, iter([rows([9])]), job, partition=0, attempt=0)
    finally:
        remove()
    assert other["lease"] is not None
    if store.remote:  # continued the kept writer, whose fence held
        assert (msg.shard_id, msg.epoch) == (first.shard_id, first.epoch)
        assert len(POOL) == 0  # not kept: the lease is the other holder's
        assert Leases(store).current(first.shard_id) == other["lease"]
    else:  # the listing is part of the put: leased anew (a takeover) and claimed
        assert msg.epoch > first.epoch
    writer.commit([msg])
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 9]


def _continues_in_two_round_trips(fault_proxy, writer, table, first, uri, opts) -> None:
    """The next task (every request delayed) continues ``first``'s kept writer in two
    round trips (its idle lease record written after it returned), and both tasks' rows
    are read once."""
    fault_proxy.add_rule(fault="delay", delay_s=0.1)
    fault_proxy.clear_records()
    msg = write_task(writer.opts, table, iter([rows([2])]), TaskJob.new(), partition=0,
                     attempt=0)
    returned = time.monotonic()  # the idle record, sent after, is not the task's
    # At most: on a loaded machine a request sent right after a reply can look like part
    # of the same round trip.
    assert fault_proxy.round_trips(before=returned) <= 2
    assert (msg.shard_id, msg.epoch) == (first.shard_id, first.epoch)  # continued
    (kept,) = POOL._kept.values()
    assert kept.labelled() is None  # the idle record, off the task's path, landed
    # The lease put beside the WAL PUT; the lease's listing beside the close's fence check
    # (the version hint and the probe past the writer's version); the idle record.
    methods = sorted(r.method for r in fault_proxy.records())
    assert methods == ["GET", "GET", "HEAD", "PUT", "PUT", "PUT"], methods
    writer.commit([msg])
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2]


def test_a_task_continuing_a_kept_writer_on_s3_takes_two_round_trips(fault_proxy,
                                                                     proxied_s3_table):
    """Lease put beside the WAL PUT; the lease's listing beside the close's fence check;
    the idle lease record after the task. Every request is delayed, so requests in
    flight together are seen as one round trip."""
    uri, opts = proxied_s3_table
    writer, table = job_writer(uri, opts)
    first = one_job(writer, table, [1])
    _continues_in_two_round_trips(fault_proxy, writer, table, first, uri, opts)


def test_a_task_continuing_its_workers_writer_off_its_slot_reads_no_lease_first(
        fault_proxy, proxied_s3_table):
    """The worker keeps a writer for partition 0 on another shard (its slot was busy
    when an earlier job's task came). The next task continues that writer right after
    its own idle record, without reading the slot's lease first: the same two round
    trips as continuing a writer on the slot."""
    uri, opts = proxied_s3_table
    writer, table = job_writer(uri, opts)
    home = writer.opts.shard_for(0)
    leases = Leases(open_store(uri, opts))
    blocker = leases.acquire(home, Holder("another job", 0))
    first = one_job(writer, table, [1])
    assert first.shard_id != home  # the slot was busy: the next free one, kept
    leases.release(blocker)
    _continues_in_two_round_trips(fault_proxy, writer, table, first, uri, opts)


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_stale_kept_writer_never_claims_a_shard_another_live_writer_holds(location):
    """Two actors: while this process kept a writer on its shard, another process's
    writer took the shard, claimed it and went on for enough lease generations that the
    one after this process's idle record was deleted; it holds the lease now. The next
    task's put of that generation lands in the freed slot, and the kept writer is fenced:
    the task proves the lease before anything claims, finds it lost and leases another
    shard. The live writer is never fenced."""
    uri, opts = location
    writer, table = job_writer(uri, opts)
    first = one_job(writer, table, [1])
    store, shard = open_store(uri, opts), first.shard_id
    other, leases = Holder("other-process-job", 0, 0, label="another process"), Leases(store)
    live = None
    for _ in range(4):  # each: acquire, claim (fences our kept writer), release
        if live is not None:
            leases.release(live)
        live = leases.try_acquire(shard, other)
        assert live is not None
    appender = WalAppender.open(store, shard)  # the live writer: the latest epoch
    record = next(iter(POOL._kept.values())).held.lease
    freed = f"_memwal_leases/{shard}/{record.generation + 1:020d}.json"
    assert not store.exists(freed)  # pruned by the other writer's acquisitions
    msg = write_task(writer.opts, table, iter([rows([2])]), TaskJob.new(), partition=0,
                     attempt=0)
    assert msg.shard_id != shard  # leased another shard
    assert not store.exists(freed)  # its stray record there was deleted again
    assert leases.current(shard) == live
    assert ManifestStore(store, shard).latest().writer_epoch == appender.epoch  # not fenced
    # The fenced writer is gone from the pool, not checked again by every later task.
    assert {s for _key, s in POOL._kept} == {msg.shard_id}
    writer.commit([msg])
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 2]


@pytest.mark.parametrize("fenced", [False, True], ids=["kept", "fenced-while-kept"])
@pytest.mark.parametrize("backend", ["s3", "azure"])
def test_a_long_continuing_task_settles_its_writer_early_and_loses_no_row(
        location, monkeypatch, fenced):
    """A task continuing a kept writer on an object store keeps the rows it gave it until
    the writer is settled; past a bound it settles early (its entries durable, its lease
    proved) and goes on. A writer fenced while kept (another process claimed the shard,
    taking no lease) has its rows written again to a writer claimed anew: every row of
    the task is read once, and the rows it wrote after settling go to that writer."""
    from memwal_datasource.spark import pool_shard

    monkeypatch.setattr(pool_shard, "UNSETTLED_BYTES", 1)  # settle at the first batch
    uri, opts = location
    writer, table = job_writer(uri, opts)
    store = open_store(uri, opts)
    first = one_job(writer, table, [1])
    if fenced:
        WalAppender.open(store, first.shard_id)
    claimed = ManifestStore(store, first.shard_id).latest().writer_epoch
    batches = [rows([10 + i, 20 + i]) for i in range(4)]
    msg = write_task(writer.opts, table, iter(batches), TaskJob.new(), partition=0,
                     attempt=0)
    assert msg.shard_id == first.shard_id and msg.rows == 8
    assert msg.epoch == (claimed + 1 if fenced else first.epoch)
    writer.commit([msg])
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == sorted(
        [1, *(10 + i for i in range(4)), *(20 + i for i in range(4))])
    assert len(POOL) == 1


@pytest.mark.parametrize("backend", ["s3"])
def test_a_long_task_whose_lease_put_lost_keeps_its_rows_and_lets_the_writer_go(
        location, monkeypatch):
    """Two actors: while this process kept a writer, another took the shard's lease and
    released it without claiming. A long task (settling early) continues the kept writer
    at once; its lease put loses to the other's generation, so it never holds the lease.
    The fence held, so its rows stand; the writer is not kept."""
    from memwal_datasource.spark import pool_shard

    monkeypatch.setattr(pool_shard, "UNSETTLED_BYTES", 1)
    uri, opts = location
    writer, table = job_writer(uri, opts)
    first = one_job(writer, table, [1])
    leases = Leases(open_store(uri, opts))
    leases.release(leases.try_acquire(first.shard_id, Holder("another job", 0)))
    batches = [rows([10 + i]) for i in range(3)]
    msg = write_task(writer.opts, table, iter(batches), TaskJob.new(), partition=0,
                     attempt=0)
    assert (msg.shard_id, msg.epoch, msg.rows) == (first.shard_id, first.epoch, 3)
    writer.commit([msg])
    assert sorted(read_table(uri, opts).column("id").to_pylist()) == [1, 10, 11, 12]
    assert len(POOL) == 0
