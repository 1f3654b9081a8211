"""A stand-in Spark Python worker for tests/spark/test_kept_writer_placement.py.

A spawned process that runs one first-attempt task of partition 0 per command
(as a reused Python worker runs ``write_task``, then the driver's commit) and
keeps its writers between commands, as a worker does.
"""

from __future__ import annotations

import pyarrow as pa

from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, TaskJob, write_task
from memwal_datasource.writer_pool import POOL

SCHEMA = pa.schema([("id", pa.int64())])


def serve(uri: str, opts: dict[str, str], conn, **options: str) -> None:
    """Answer each ``[ids]`` with ``(shard, epoch, first, last)`` of the committed task;
    ``None`` ends it (kept writers closed). ``options``: write options."""
    writer = MemWalBatchWriter(WriteOptions.parse({"path": uri, **options, **{
        f"storage.{k}": v for k, v in opts.items()}}), SCHEMA, overwrite=False)
    while (ids := conn.recv()) is not None:
        batch = pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)
        msg = write_task(writer.opts, SCHEMA, iter([batch]), TaskJob.new(), partition=0,
                         attempt=0)
        writer.commit([msg])
        conn.send((msg.shard_id, msg.epoch, msg.first_position, msg.last_position))
    POOL.close_all()
    conn.send("closed")
