"""``format("durable_arrow")``: the fastest durable Python sink we can build, as a ceiling.

What any exactly-once sink through Spark's Python Data Source API must do at the least,
and nothing else: each task puts its rows as one Arrow IPC object, durably; the job's
commit puts one record naming those objects, durably and only once. No lease, no fence,
no sequence, no reader: two objects per one-task append (memwal's kept-writer append
also leaves two, its WAL entry and commit record). Both puts go through memwal's store
(``put_if_absent``: on local disk a temporary file, fsync, link and directory fsync; on
S3 one conditional PUT), through the same S3 client (obstore).
Its Arrow IPC is compressed exactly when memwal's WAL entries are by default (zstd on an
object store, none on local disk), so neither writes fewer bytes than the other.
With memwal's worker measures (``spark/worker_entry``), as the no-op sink has.
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


class DurableWriter(sds.DataSourceArrowWriter):
    """One durable object per task, one durable record per job."""

    def __init__(self, path: str, storage: dict[str, str]):
        self.path, self.storage, self.job = path, storage, uuid.uuid4().hex

    @entry_point
    def write(self, iterator) -> PutObject:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        store = open_store(self.path, self.storage)
        codec = ShardWriterConfig().wal_codec(store.remote)
        options = pa.ipc.IpcWriteOptions(compression=codec) if codec else None
        sink = pa.BufferOutputStream()
        rows, writer = 0, None
        for batch in prompted(iterator):
            if writer is None:
                writer = pa.ipc.new_stream(sink, batch.schema, options=options)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
        key = f"data/{self.job}-{ctx.partitionId()}-{ctx.attemptNumber()}.arrow"
        store.put_if_absent(key, sink.getvalue())
        return PutObject(key, rows)

    @entry_point
    def commit(self, messages) -> None:
        self._put_record(messages, self.job)

    def _put_record(self, messages, name: str) -> None:
        record = {"job": self.job, "objects": [m.key for m in messages if m is not None],
                  "rows": sum(m.rows for m in messages if m is not None)}
        open_store(self.path, self.storage).put_if_absent(
            f"commits/{name}.json", json.dumps(record).encode())

    def abort(self, messages) -> None:
        pass


class DurableStreamWriter(DurableWriter, sds.DataSourceStreamArrowWriter):
    """A micro-batch's record is named by its batch id: put once per batch."""

    @entry_point
    def commit(self, messages, batchId) -> None:  # noqa: N803 - Spark's name
        self._put_record(messages, f"batch-{batchId:020d}")

    def abort(self, messages, batchId) -> None:  # noqa: N803 - Spark's name
        pass


class DurableSource(sds.DataSource):
    """Options: ``path`` and ``storage.*`` (as memwal takes them)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _where(self) -> tuple[str, dict[str, str]]:
        opts = {k.lower(): v for k, v in dict(self.options).items()}
        return table_path(opts), storage_options(opts)  # as memwal reads them

    @entry_point
    def writer(self, schema, overwrite: bool) -> DurableWriter:
        return DurableWriter(*self._where())

    @entry_point
    def streamWriter(self, schema, overwrite: bool) -> DurableStreamWriter:  # noqa: N802
        return DurableStreamWriter(*self._where())


def committed_rows(path: str, storage: dict[str, str] | None = None) -> int:
    """Rows the sink's commit records name."""
    store = open_store(path, storage or {})
    return sum(json.loads(store.get(k))["rows"] for k in store.list("commits/"))
