"""A stand-in Spark Python worker for tests/spark/test_kept_writer_placement.py.

A spawned process that runs one first-attempt task of partition 0 per command
(as a reused Python worker runs ``write_task``, then the driver's commit) and
keeps its writers between commands, as a worker does.
"""

from __future__ import annotations

import pyarrow as pa

from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, TaskJob, write_task
from memwal_datasource.write.writer_pool import POOL

SCHEMA = pa.schema([("id", pa.int64())])


def serve(uri: str, opts: dict[str, str], conn, **options: str) -> None:
    """Answer each ``[ids]`` with ``(shard, epoch, first, last)`` of the committed task;
    ``None`` ends it (kept writers closed). ``options``: write options. A command
    ``(ids, job, attempt, commit)`` runs that attempt of ``job`` (a :class:`TaskJob`)
    and commits it only if ``commit`` (an attempt whose success the driver never saw)."""
    writer = MemWalBatchWriter(WriteOptions.parse({"path": uri, **options, **{
        f"storage.{k}": v for k, v in opts.items()}}), SCHEMA, overwrite=False)
    while (cmd := conn.recv()) is not None:
        ids, job, attempt, commit = (cmd if isinstance(cmd, tuple)
                                     else (cmd, TaskJob.new(), 0, True))
        batch = pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)
        msg = write_task(writer.opts, SCHEMA, iter([batch]), job, partition=0,
                         attempt=attempt)
        if commit:
            writer.commit([msg])
        conn.send((msg.shard_id, msg.epoch, msg.first_position, msg.last_position))
    POOL.close_all()
    conn.send("closed")
