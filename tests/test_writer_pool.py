"""Writers kept between tasks (memwal_datasource.writer_pool), without Spark.

A kept writer's lease names the job that uses it now, or that it is idle; an
idle one is taken over by another job (whose claim fences it, so it is closed
when next taken, never reused); writers retire after ``max_age_s`` so gc, which
skips leased shards, reaches a busy worker's shards. Memory, local disk, the
S3 server and both emulators (``backend``).
"""

from __future__ import annotations

import uuid

import pyarrow as pa

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.leases import Holder, Leases
from memwal_datasource.shard_writer import open_shard_writer
from memwal_datasource.store import open_store
from memwal_datasource.writer_pool import KeptWriter, WriterPool

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


def test_a_kept_writers_lease_names_the_kept_writer_not_a_finished_job(location):
    """Kept, its lease names this process's kept writer (bounded waits for other jobs,
    never a finished job's); reused back to back, it writes no lease at all."""
    pool = WriterPool(idle_s=3600, max_age_s=3600, mark_idle_s=3600, reaper=False)
    kept, leases = kept_writer(location, "job-1")
    pool.give("k", kept)
    holder = leases.current(kept.shard).holder
    assert holder.job_id.startswith("kept-") and not holder.kept
    assert holder.label == "writer kept between tasks"
    generation = leases.current(kept.shard).generation
    got = pool.take("k")
    assert got is kept
    got.writer.put(pa.table({"id": [3]}))
    pool.give("k", got)
    assert leases.current(kept.shard).generation == generation, "no lease write"
    pool.close_all()


def test_an_idle_writer_is_taken_over_and_never_reused(location):
    pool = WriterPool(idle_s=3600, max_age_s=3600, mark_idle_s=0.0, reaper=False)
    kept, leases = kept_writer(location, "job-1")
    pool.give("k", kept)
    assert pool.mark_idle() == 1
    assert leases.current(kept.shard).holder.kept
    # Another job's task may take the shard at once: the idle writer holds it for no job.
    uri, opts = location
    other, blocker = Leases(open_store(uri, opts)).try_take(kept.shard, Holder("job-9", 0))
    assert other is not None and blocker is None
    newer = open_shard_writer(uri, kept.shard, SCHEMA, ShardWriterConfig(enable_memtable=False),
                              storage_options=opts)  # its claim fences the kept writer
    assert pool.take("k") is None, "a taken-over writer is closed"
    assert len(pool) == 0
    newer.close()


def test_a_writer_past_its_max_age_retires(location):
    pool = WriterPool(idle_s=3600, max_age_s=0.0, mark_idle_s=3600, reaper=False)
    kept, leases = kept_writer(location, "job-1")
    pool.give("k", kept)
    assert pool.take("k") is None
    cur = leases.current(kept.shard)
    assert cur is None or cur.released, "retiring releases the lease (gc may collect it)"


def test_an_idle_writer_taken_again_is_marked_in_use(location):
    pool = WriterPool(idle_s=3600, max_age_s=3600, mark_idle_s=0.0, reaper=False)
    kept, leases = kept_writer(location, "job-1")
    pool.give("k", kept)
    assert pool.mark_idle() == 1 and leases.current(kept.shard).holder.kept
    assert pool.take("k") is kept
    assert not leases.current(kept.shard).holder.kept, "in use: nobody may take it over"
    pool.give("k", kept)
    pool.close_all()
