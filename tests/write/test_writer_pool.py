"""Writers kept between tasks (memwal_datasource.write.writer_pool), without Spark.

A kept writer's lease says it is idle, so any task takes the shard as it would
a released one; the next task of this process that leases the shard continues
the writer only if its lease replaced the kept writer's own (else another holder
may have claimed: the writer is dropped); writers retire after ``max_age_s``.
Memory, local disk, the S3 server and both emulators (``backend``).
"""

from __future__ import annotations

import uuid

import pyarrow as pa

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.shard.leases import Holder, Leases
from memwal_datasource.store import open_store
from memwal_datasource.write.shard_writer import open_shard_writer
from memwal_datasource.write.writer_pool import KeptWriter, WriterPool

SCHEMA = pa.schema([pa.field("id", pa.int64())])


def kept_writer(location, job: str) -> tuple[KeptWriter, Leases]:
    uri, opts = location
    store = open_store(uri, opts)
    leases = Leases(store)
    shard = str(uuid.uuid4())
    held = leases.hold(leases.acquire(shard, Holder(job, 0)))
    writer = open_shard_writer(uri, shard, SCHEMA, ShardWriterConfig(enable_memtable=False),
                               storage_options=opts)
    writer.put(pa.table({"id": [1, 2]}))
    writer.flush()
    return KeptWriter(shard, writer, held), leases


def lease_again(location, shard: str, job: str):
    """A task's lease on ``shard`` (what it replaced is ``leases.replaced[shard]``)."""
    uri, opts = location
    leases = Leases(open_store(uri, opts))
    lease, blocker = leases.try_take(shard, Holder(job, 0))
    assert lease is not None and blocker is None, blocker
    return leases.hold(lease), leases


def test_a_kept_writers_lease_says_idle_and_names_no_finished_job(location):
    """Kept, its lease names this process's kept writer, idle: free for any task."""
    pool = WriterPool(idle_s=3600, max_age_s=3600, reaper=False)
    kept, leases = kept_writer(location, "job-1")
    pool.give("k", kept)
    holder = leases.current(kept.shard).holder
    assert holder.job_id.startswith("kept-") and holder.kept
    assert holder.label == "idle writer kept between tasks"
    pool.close_all()


def test_the_next_task_leasing_the_shard_continues_the_writer(location):
    """No claim: the epoch stays, and the rows go on at the next position."""
    pool = WriterPool(idle_s=3600, max_age_s=3600, reaper=False)
    kept, _ = kept_writer(location, "job-1")
    epoch, last = kept.writer.epoch, kept.writer.stats().last_wal_position
    pool.give("k", kept)
    held, leases = lease_again(location, kept.shard, "job-2")
    got = pool.take("k", kept.shard, leases.replaced[kept.shard], held)
    assert got is kept and got.held is held and got.writer.epoch == epoch
    got.writer.put(pa.table({"id": [3]}))
    got.writer.flush()
    assert got.writer.stats().last_wal_position == last + 1
    pool.give("k", got)
    assert leases.current(kept.shard).holder.kept
    pool.close_all()
    cur = leases.current(kept.shard)
    assert cur.released, "closing releases the lease"


def test_the_next_task_takes_the_shard_right_after_the_kept_writers_record(location):
    """The fast path: ``kept_record`` hands the idle record (for the writer's table only),
    ``take_after`` leases right after it, and the task continues the writer."""
    from memwal_datasource.table.table_info import TableStamp

    pool = WriterPool(idle_s=3600, max_age_s=3600, reaper=False)
    kept, _ = kept_writer(location, "job-1")
    kept.stamp, kept.store = TableStamp(5, "a"), open_store(*location)
    epoch = kept.writer.epoch
    pool.give("k", kept)
    assert pool.kept_record("k", kept.shard, TableStamp(4, "a")) is None  # older: not ours
    assert pool.kept_record("k", kept.shard, TableStamp(5, "b")) is None  # made anew
    assert pool.kept_record("other key", kept.shard, TableStamp(5, "a")) is None
    record = pool.kept_record("k", kept.shard, TableStamp(5, "a"))
    assert record == kept.held.lease and record.holder.kept
    leases = Leases(open_store(*location))
    lease = leases.take_after(record, Holder("job-2", 0))
    assert lease is not None and leases.replaced[kept.shard] == record
    got = pool.take("k", kept.shard, leases.replaced[kept.shard], leases.hold(lease),
                    TableStamp(5, "a"))
    assert got is kept and got.writer.epoch == epoch
    assert leases.current(kept.shard).holder.job_id == "job-2"
    pool.close_all()


def test_a_writer_another_holder_came_between_is_dropped_not_reused(location):
    """Another job took the shard (and claimed) while the writer was kept: the next task
    of this process leasing the shard must not continue the fenced writer."""
    pool = WriterPool(idle_s=3600, max_age_s=3600, reaper=False)
    kept, _ = kept_writer(location, "job-1")
    pool.give("k", kept)
    uri, opts = location
    other, other_leases = lease_again(location, kept.shard, "job-9")  # idle: taken at once
    newer = open_shard_writer(uri, kept.shard, SCHEMA, ShardWriterConfig(enable_memtable=False),
                              storage_options=opts)  # its claim fences the kept writer
    newer.close()
    other.release()
    held, leases = lease_again(location, kept.shard, "job-2")
    assert pool.take("k", kept.shard, leases.replaced[kept.shard], held) is None
    assert len(pool) == 0
    held.release()


def test_a_writer_past_its_max_age_retires(location):
    pool = WriterPool(idle_s=3600, max_age_s=0.0, reaper=False)
    kept, leases = kept_writer(location, "job-1")
    pool.give("k", kept)
    assert pool.close_idle(3600) == 1
    cur = leases.current(kept.shard)
    assert cur is None or cur.released, "retiring releases the lease (gc may collect it)"


def _task(location, pool: WriterPool, shard: str, job: str, between=None) -> tuple:
    """One task of a process on ``shard``: lease it, continue the kept writer or claim
    anew, write ids of its own, check the fence, give the writer back. ``between`` runs
    while it holds the lease, before it writes (the other process's attempt)."""
    uri, opts = location
    leases = Leases(open_store(uri, opts))
    lease, blocker = leases.try_take(shard, Holder(job, 0))
    assert lease is not None, blocker
    held = leases.hold(lease)
    kept = pool.take("k", shard, leases.replaced[shard], held)
    writer = kept.writer if kept else open_shard_writer(
        uri, shard, SCHEMA, ShardWriterConfig(enable_memtable=False), storage_options=opts)
    if between is not None:
        between()
    before = writer.stats().last_wal_position
    ids = [hash((job, j)) & 0xFFFFFFFF for j in range(3)]
    writer.put(pa.table({"id": ids}))
    writer.flush()
    writer.check_fence()
    s = writer.stats()
    pool.give("k", KeptWriter(shard, writer, held))
    return (s.epoch, (before or 0) + 1 if kept else s.first_wal_position, s.last_wal_position,
            ids, kept is not None)


def test_two_processes_taking_turns_on_a_shard_never_write_into_each_others_ranges(location):
    """Two processes (pools) take one shard in turns, two tasks each (the second continues
    its kept writer), while the other process's task tries to lease it at the same
    moment and is refused: every task that succeeded owns its WAL range, at its epoch,
    holding exactly its rows."""
    import threading

    from memwal_datasource.shard.wal import WalTailer

    uri, opts = location
    shard = str(uuid.uuid4())
    pools = [WriterPool(idle_s=3600, max_age_s=3600, reaper=False) for _ in range(2)]
    out: list = []
    for turn in range(8):
        me = (turn // 2) % 2
        refused: list = []

        def attempt(turn=turn, refused=refused) -> None:
            blocker = Leases(open_store(uri, opts)).try_take(shard, Holder(f"o{turn}", 0))[1]
            refused.append(blocker is not None)

        def between(attempt=attempt) -> None:  # the other process, while this task holds it
            t = threading.Thread(target=attempt)
            t.start()
            t.join(60)

        out.append(_task(location, pools[me], shard, f"p{me}-{turn}", between))
        assert refused == [True], "a live task's lease keeps the other process off"
    for p in pools:
        p.close_all()
    # Each process's second task continued its kept writer; each first one claimed.
    assert [continued for *_x, continued in out] == [False, True] * 4
    epochs = [epoch for epoch, *_ in out]
    assert epochs == sorted(epochs) and len(set(epochs)) == 4
    tailer = WalTailer(open_store(uri, opts), shard)
    seen: set[int] = set()
    for epoch, first, last, ids, _continued in out:
        entries = list(tailer.entries(first, last))
        assert {e.writer_epoch for _p, e in entries} == {epoch}
        got = [v for _p, e in entries for b in e.batches for v in b.column("id").to_pylist()]
        assert got == ids
        assert not seen & set(range(first, last + 1)), "ranges never overlap"
        seen |= set(range(first, last + 1))
