"""``MemWalDataSource``: the ``memwal`` format for Spark's Python Data Source API.

Everything a write or read can be refused for is checked on the driver,
before any task runs: options, the DataFrame's column types and reserved
names (:mod:`.schema`), the table's schema (:mod:`.prepare`). The writers
Spark gets feed their batches through :func:`~.schema.conformed`.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from ..errors import ConfigError, MemWalError, without_native_locations
from ..format.memwal import MEM_WAL_DIR
from ..format.table_schema import without_row_key
from ..log.commit import COMMITS_DIR, OVERWRITE, Txn, stream_app_id
from ..options import scrub_url
from ..store import ObjectStore, open_store
from ..table.table_info import TableInfo, describe_table
from .connect import resolve_local
from .interpreter import check_python_workers
from .options import ReadOptions, WriteOptions
from .prepare import check_store, prepare_table, prepare_table_info
from .reader import METADATA_FIELDS, TOMBSTONE, MemWalBatchReader, output_schema
from .schema import conformed
from .stream import MemWalStreamReader, refuse_unsupported
from .worker_entry import entry_point
from .writer import (
    MemWalBatchWriter,
    MemWalCommitMessage,
    MemWalStreamWriter,
    commit_job,
)

__all__ = ["MemWalDataSource", "checkpoint_query_id", "prepare_table", "without_native_paths"]


# --- errors -----------------------------------------------------------------

def without_native_paths(fn):
    """``fn`` whose exceptions carry no Rust source locations (pylance appends
    ``.../rust/lance/src/....rs:L:C`` to its messages); the exception itself,
    its type and traceback are kept."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            text = str(exc)
            if ".rs:" in text and len(exc.args) <= 1:
                clean = without_native_locations(text)
                if clean != text:
                    exc.args = (clean,)
            raise
    return wrapper


# --- writers ----------------------------------------------------------------

class SparkBatchWriter(MemWalBatchWriter):
    """:class:`MemWalBatchWriter` fed batches through :func:`conform`."""

    @without_native_paths
    def write(self, iterator: Iterator[pa.RecordBatch]) -> MemWalCommitMessage:
        return super().write(conformed(iterator, self.schema,
                                        self.opts.config.enable_memtable))


# How errors name a stream sink's checkpoint.
CHECKPOINT_OPTION = "option 'checkpointLocation'"
# Where each stream with an explicit query_id marks itself live (one file per checkpoint).
STREAMS_DIR = "_memwal_streams"
# A mark this recent is a live stream's (streams renew it every micro-batch).
STREAM_LIVE_S = 600.0


@dataclass(frozen=True)
class StreamMark:
    """A stream's claim on its explicit ``query_id``, renewed every micro-batch.

    Two streams with one ``query_id`` would each skip the other's micro-batches
    as already committed (a batch commits once per query id and batch id), so
    half their rows would silently vanish. Each stream therefore writes
    ``_memwal_streams/<query>/<checkpoint>.json`` and fails, naming
    ``query_id``, while another checkpoint's mark is younger than
    :data:`STREAM_LIVE_S`; the loser removes its own mark.
    """

    query_id: str
    checkpoint: str

    @property
    def folder(self) -> str:
        return f"{STREAMS_DIR}/{uuid.uuid5(uuid.NAMESPACE_URL, self.query_id)}"

    @property
    def key(self) -> str:
        return f"{self.folder}/{checkpoint_query_id(self.checkpoint)}.json"

    def renew(self, store: ObjectStore, now_ms: int | None = None) -> None:
        """Mark this stream live, then fail if another live stream has the same query id."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        store.put(self.key, json.dumps({"query_id": self.query_id,
                                        "checkpoint": scrub_url(self.checkpoint),
                                        "seen_ms": now}).encode())
        for key in store.list(self.folder + "/"):
            if key == self.key:
                continue
            try:
                other = json.loads(store.get(key))
                age_s = (now - int(other["seen_ms"])) / 1000
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                continue
            if age_s < STREAM_LIVE_S:
                store.delete(self.key)
                raise ConfigError(
                    f"Give each stream its own query_id, or leave option 'query_id' unset "
                    f"(the checkpoint location then identifies the stream): query_id "
                    f"'{self.query_id}' is in use by another live stream (checkpoint "
                    f"{other.get('checkpoint')}, last micro-batch {age_s:.0f}s ago), and two "
                    "streams with one query_id would each skip the other's micro-batches as "
                    f"already committed. If that stream has stopped, start this one after "
                    f"{STREAM_LIVE_S - age_s:.0f}s or delete {store.describe(key)}.")


class SparkStreamWriter(MemWalStreamWriter):
    """:class:`MemWalStreamWriter` fed through :func:`conform`; honours complete mode.

    ``outputMode("complete")`` reaches a sink as ``overwrite=True``: every
    micro-batch is the whole result, so each commits as an overwrite record
    (it hides everything before it, atomically), keyed like any micro-batch so
    a replayed batch commits once. Spark itself refuses ``update`` mode.
    """

    @without_native_paths
    def write(self, iterator: Iterator[pa.RecordBatch]) -> MemWalCommitMessage:
        return super().write(conformed(iterator, self.schema,
                                        self.opts.config.enable_memtable))

    mark: StreamMark | None = None

    @entry_point
    @without_native_paths
    def commit(self, messages, batchId: int) -> None:  # noqa: N803 - Spark's name
        if self.mark is not None:  # another stream took the query id since planning?
            self.mark.renew(open_store(self.opts.path, self.opts.storage))
        if not self.overwrite:
            super().commit(messages, batchId)
            return
        commit_job(self.opts, messages, OVERWRITE, f"{self.query_id}:{batchId}", self.started,
                   query_id=self.query_id, batch_id=batchId,
                   txn=Txn(stream_app_id(self.query_id), batchId))


def checkpoint_query_id(location: str) -> str:
    """A stream's identity: uuid5 of its normalised checkpoint location.

    Spark's Python API gives a sink its options only (not Spark's query id),
    so the checkpoint location is the stable identity. It is normalised first,
    so ``ck``, ``ck/``, ``./ck``, ``/abs/ck`` and ``file:///abs/ck`` are one
    query: local paths become absolute (relative ones against the directory
    Spark resolves them in, the JVM's working directory, never a Connect
    worker's own: :func:`~.connect.resolve_local`), ``file:`` URIs become
    paths, and other URIs lose trailing slashes and ``.`` segments. An
    absolute path or URI keeps the identity earlier versions derived from it.
    """
    text = location.strip()
    local = resolve_local(text, CHECKPOINT_OPTION)
    if local is not None:
        canonical = os.path.normpath(local)
    else:
        parsed = urlparse(text)
        scheme = parsed.scheme.lower()
        path = posixpath.normpath(parsed.path).rstrip("/") if parsed.path else ""
        canonical = f"{scheme}://{parsed.netloc}{'' if path == '.' else path}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, canonical))


def open_for_read(path: str, storage: dict[str, str]) -> TableInfo:
    """The description of the table to read (:mod:`memwal_datasource.table.table_info`: no
    pylance where a writer kept it), with errors that say what to do.

    The store is checked first, so rejected or missing S3 credentials are
    reported as such, not as a missing table.
    """
    store = check_store(path, storage)
    try:
        # A read writes nothing into the table: it only uses what writers kept.
        info = describe_table(path, storage, store=store, remember=False)
    except MemWalError as exc:
        raise MemWalError(without_native_locations(str(exc))) from None
    if info is None:
        raise ConfigError(
            f"no memwal table at {path}: write to it first (df.write.format('memwal')"
            f".save('{path}') creates it), or check the path")
    return info


def refuse_without_mem_wal(path: str, storage: dict[str, str], table: TableInfo) -> None:
    """A WAL-tail read of a plain Lance table (no MemWAL) fails instead of returning 0 rows."""
    if table.has_mem_wal:
        return
    if set(open_store(path, storage).list_dirs("")) & {MEM_WAL_DIR, COMMITS_DIR}:
        return
    raise ConfigError(
        f"Read it with option view=table (the whole table), or write to it once through "
        f"df.write.format('memwal') to start its MemWAL: the Lance table at {path} has no "
        "MemWAL, so the WAL tail this read returns by default (view=tail) would be empty.")


class MemWalDataSource(DataSource):
    """Read and write a Lance table's MemWAL. Format name: ``memwal``."""

    @classmethod
    def name(cls) -> str:
        """``memwal``. In the driver (``spark.dataSource.register`` asks for the name)
        this first checks that Spark's Python workers run an interpreter with this
        package (:func:`~memwal_datasource.spark.interpreter.check_python_workers`)."""
        check_python_workers()
        return "memwal"

    def _read_opts(self) -> tuple[ReadOptions, pa.Schema, TableInfo]:
        opts = ReadOptions.parse(dict(self.options))
        info = open_for_read(opts.path, opts.storage)
        table = without_row_key(info.schema)
        if opts.metadata_columns:
            taken = [f.name for f in METADATA_FIELDS if f.name != TOMBSTONE
                     and f.name in table.names]
            if taken:
                raise ConfigError(f"option 'metadata_columns' adds column(s) {taken}, which the "
                                  f"table at {opts.path} already has; read without it")
        return opts, table, info

    @entry_point
    @without_native_paths
    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        opts, table, _ = self._read_opts()
        return from_arrow_schema(output_schema(table, opts.metadata_columns))

    @entry_point
    @without_native_paths
    def reader(self, schema: StructType) -> MemWalBatchReader:
        opts, table, info = self._read_opts()
        if opts.stream_start is not None:
            name = next(k for k in ("starting_commit", "starting_timestamp")
                        if k in {o.lower() for o in dict(self.options)})
            raise ConfigError(f"option '{name}' applies to spark.readStream only; a batch read "
                              "takes 'starting_positions' / 'ending_positions' per shard")
        if opts.view == "tail":
            refuse_without_mem_wal(opts.path, opts.storage, info)
        return MemWalBatchReader(opts, table, info.field_ids)

    @entry_point
    @without_native_paths
    def streamReader(self, schema: StructType) -> MemWalStreamReader:  # noqa: N802
        opts, table, _ = self._read_opts()
        refuse_unsupported(opts)
        return MemWalStreamReader(opts, table)

    @entry_point
    @without_native_paths
    def writer(self, schema: StructType, overwrite: bool) -> MemWalBatchWriter:
        opts = WriteOptions.parse(dict(self.options))
        table = prepare_table_info(opts, schema)
        return SparkBatchWriter(opts, without_row_key(table.schema), overwrite, table=table)

    @entry_point
    @without_native_paths
    def streamWriter(self, schema: StructType, overwrite: bool) -> MemWalStreamWriter:  # noqa: N802
        raw = {k.lower(): v for k, v in dict(self.options).items()}
        query_id = raw.get("query_id")
        location = raw.get("checkpointlocation")
        mark = None
        if not query_id:
            if not location:
                raise ConfigError("a memwal stream sink needs option 'checkpointLocation' (or "
                                  "'query_id') to commit each micro-batch exactly once")
            query_id = checkpoint_query_id(location)
        elif location:
            # Resolved here, once: the mark is renewed in other workers (the commit's).
            mark = StreamMark(query_id, resolve_local(location.strip(), CHECKPOINT_OPTION)
                              or location)
        opts = WriteOptions.parse(raw)
        table = prepare_table_info(opts, schema)
        writer = SparkStreamWriter(opts, without_row_key(table.schema), overwrite, query_id,
                                   table=table)
        if mark is not None:
            # Spark plans a writer per micro-batch: the mark is renewed (and checked) each time.
            mark.renew(open_store(opts.path, opts.storage))
            writer.mark = mark
        return writer
