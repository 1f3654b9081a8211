"""``format("durable_arrow")``: the fastest durable Python sink we can build, as a ceiling;
``format("noop_arrow")``: the same sink writing nothing, the ceiling of any Python sink.

What any exactly-once sink must do at the least: each task puts its rows as one Arrow IPC
object, the job's commit one record naming them, both durably (``put_if_absent``) and
compressed as memwal's WAL entries are; no lease, fence or sequence; memwal's worker measures.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyspark.sql.datasource as sds

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.spark.options import storage_options, table_path
from memwal_datasource.spark.worker_entry import entry_point
from memwal_datasource.spark.worker_socket import prompted
from memwal_datasource.store import open_store

NAME = "durable_arrow"


@dataclass
class PutObject(sds.WriterCommitMessage):
    key: str
    rows: int


class DurableWriter(sds.DataSourceArrowWriter, sds.DataSourceStreamArrowWriter):
    """One durable object per task, one durable record per job or micro-batch (named by its
    batch id: put once per batch); or nothing (``durable``)."""

    def __init__(self, path: str, storage: dict[str, str], durable: bool):
        self.path, self.storage, self.durable, self.job = path, storage, durable, uuid.uuid4().hex

    @entry_point
    def write(self, iterator) -> PutObject:
        iterator = prompted(iterator)
        if not self.durable:
            return PutObject("", sum(b.num_rows for b in iterator))
        from pyspark import TaskContext

        ctx, store = TaskContext.get(), open_store(self.path, self.storage)
        codec = ShardWriterConfig().wal_codec(store.remote)
        options = pa.ipc.IpcWriteOptions(compression=codec) if codec else None
        sink, batches = pa.BufferOutputStream(), list(iterator)
        if batches:
            with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
                for batch in batches:
                    writer.write_batch(batch)
        key = f"data/{self.job}-{ctx.partitionId()}-{ctx.attemptNumber()}.arrow"
        store.put_if_absent(key, sink.getvalue())
        return PutObject(key, sum(b.num_rows for b in batches))

    @entry_point
    def commit(self, messages, batchId=None) -> None:  # noqa: N803 - Spark's name
        name = self.job if batchId is None else f"batch-{batchId:020d}"
        done = [m for m in messages if m is not None]
        if self.durable:
            open_store(self.path, self.storage).put_if_absent(
                f"commits/{name}.json", json.dumps({
                    "job": self.job, "objects": [m.key for m in done],
                    "rows": sum(m.rows for m in done)}).encode())

    def abort(self, messages, batchId=None) -> None:  # noqa: N803 - Spark's name
        pass


class DurableSource(sds.DataSource):
    """Options: ``path`` and ``storage.*`` (as memwal takes them)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    @entry_point
    def writer(self, schema, overwrite: bool) -> DurableWriter:
        opts, durable = {k.lower(): v for k, v in dict(self.options).items()}, self.name() == NAME
        return DurableWriter(table_path(opts) if durable else "", storage_options(opts),
                             durable)  # the path and storage options as memwal's

    streamWriter = writer  # noqa: N815 - Spark's name


class NoopSource(DurableSource):
    """``format("noop_arrow")``: counts rows, writes nothing."""

    name = classmethod(lambda cls: "noop_arrow")


def committed_rows(path: str, storage: dict[str, str] | None = None) -> int:
    """Rows the sink's commit records name."""
    store = open_store(path, storage or {})
    return sum(json.loads(store.get(k))["rows"] for k in store.list("commits/"))
