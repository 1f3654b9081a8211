"""A stand-in Spark Python worker for the kept-writer placement and kill tests.

A spawned process that runs one first-attempt task of partition 0 per command
(as a reused Python worker runs ``write_task``, then the driver's commit) and
keeps its writers between commands, as a worker does. :class:`Worker` is the
test's handle on one.
"""

from __future__ import annotations

import pyarrow as pa

from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, TaskJob, write_task
from memwal_datasource.write.writer_pool import POOL

SCHEMA = pa.schema([("id", pa.int64())])


class Worker:
    """A spawned :func:`serve` process, driven through a pipe."""

    def __init__(self, ctx, uri: str, opts: dict[str, str], options: dict[str, str]):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(uri, opts, child), kwargs=options)
        self.proc.start()

    def append(self, ids) -> tuple:
        """``ids`` appended by one job; or ``(ids, job, attempt, commit)``."""
        self.conn.send(ids)
        assert self.conn.poll(120), "the worker answered"
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send(None)
        assert self.conn.poll(120) and self.conn.recv() == "closed"
        self.proc.join(60)


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
