"""``MemWalDataSource``: the ``memwal`` format for Spark's Python Data Source API.

Everything a write or read can be refused for is checked here, on the driver,
before any task runs: options, the DataFrame's column types (named when the
Arrow path cannot carry them), reserved column names, the table's schema.

Spark hands a writer its batches as its Arrow conversion makes them; two of
their quirks are fixed here before the shard writer sees a batch
(:func:`conform`): timestamps arrive in the session time zone (the table
stores them as UTC instants: the same values), and Arrow decimals read off
Spark's socket may sit at addresses pylance's native writer cannot import
(MemTable mode copies them to aligned memory).
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
from urllib.parse import unquote, urlparse

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .. import sharding
from ..commit import COMMITS_DIR, OVERWRITE, Txn, stream_app_id
from ..errors import ConfigError, MemWalError, without_native_locations
from ..format import MEM_WAL_DIR
from ..options import scrub_url
from ..store import ObjectStore, open_store
from ..table import (
    ROW_KEY,
    data_schema,
    open_table,
    primary_key_of,
    schema_mismatch,
    table_exists,
    without_row_key,
)
from .deletes import prepare_delete
from .interpreter import check_python_workers
from .options import ReadOptions, WriteOptions
from .reader import METADATA_FIELDS, TOMBSTONE, MemWalBatchReader, output_schema
from .stream import MemWalStreamReader, refuse_unsupported
from .writer import (
    MemWalBatchWriter,
    MemWalCommitMessage,
    MemWalStreamWriter,
    commit_job,
)

# Column names the MemWAL format gives a meaning of its own.
RESERVED_COLUMNS = {
    TOMBSTONE: "it marks deleted rows in the MemWAL format",
    ROW_KEY: "compaction adds it to tables without a primary key as their hidden row key",
}


# What marks a location as a table of ours: a Lance dataset or a MemWAL.
TABLE_DIRS = ("_versions", MEM_WAL_DIR, COMMITS_DIR)


# --- types ------------------------------------------------------------------

def table_schema_for(spark_schema: StructType) -> pa.Schema:
    """The Arrow schema a table gets for a DataFrame; refuses what it cannot store.

    Names the column and the reason for a reserved name or a type Spark's Arrow
    path cannot carry. Timestamps with a time zone become UTC instants.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    fields = []
    for f in spark_schema.fields:
        why = RESERVED_COLUMNS.get(f.name.lower())
        if why:
            raise ConfigError(f"column '{f.name}' is reserved: {why}; rename it, e.g. "
                              f".withColumnRenamed('{f.name}', '{f.name.lstrip('_')}')")
        try:
            (field,) = to_arrow_schema(StructType([f]), timezone="UTC")
        except Exception as exc:  # noqa: BLE001 - pyspark raises several kinds
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"column '{f.name}' has type {f.dataType.simpleString()}, which Spark's Arrow "
                f"path cannot carry ({reason}); cast it (e.g. to string or a number) before "
                "writing") from None
        fields.append(field)
    return pa.schema(fields)


def _without_tz(t: pa.DataType) -> pa.DataType:
    """``t`` with every zoned timestamp in it set to UTC (zones only label instants)."""
    if pa.types.is_timestamp(t) and t.tz is not None:
        return pa.timestamp(t.unit, tz="UTC")
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_without_tz(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_without_tz(t.key_type)),
                       t.item_field.with_type(_without_tz(t.item_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_without_tz(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_without_tz(t.value_type)))
    return t


def _has_decimal(t: pa.DataType) -> bool:
    if pa.types.is_decimal(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_decimal(f.type) for f in t)
    if pa.types.is_map(t):
        return _has_decimal(t.key_type) or _has_decimal(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_decimal(t.value_type)
    return False


def _aligned(arr: pa.Array) -> pa.Array:
    """``arr`` with every buffer 16-byte aligned (copied only when one is not)."""
    if all(b is None or b.address % 16 == 0 for b in arr.buffers()):
        return arr
    import numpy as np

    return arr.take(pa.array(np.arange(len(arr), dtype=np.int64)))


def align_timestamps(incoming: pa.Schema, table: pa.Schema) -> pa.Schema:
    """``incoming`` with each zoned timestamp labelled in the table's zone (by name)."""
    out = []
    for i in incoming:
        t = table.field(i.name) if i.name in table.names else None
        out.append(t if t is not None and not i.type.equals(t.type)
                   and _without_tz(i.type).equals(_without_tz(t.type)) else i)
    return pa.schema(out)


def conform(batch: pa.RecordBatch, schema: pa.Schema, realign: bool) -> pa.RecordBatch:
    """A Spark batch as the table stores it: zoned timestamps relabelled, decimals aligned.

    Columns are matched by name (a write may leave out nullable columns; the
    shard writer fills them). Anything else that differs is left for the shard
    writer to refuse, naming it.
    """
    if any(n not in schema.names for n in batch.schema.names):
        return batch
    cols, fields, changed = [], [], False
    for col, got in zip(batch.columns, batch.schema, strict=True):
        want = schema.field(got.name)
        if not col.type.equals(want.type) and _without_tz(col.type).equals(
                _without_tz(want.type)):
            col, changed = col.cast(want.type), True
        if realign and _has_decimal(col.type):
            fixed = _aligned(col)
            col, changed = fixed, changed or fixed is not col
        cols.append(col)
        fields.append(got.with_type(col.type))
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields)) if changed else batch


def check_no_null_keys(batch: pa.RecordBatch, schema: pa.Schema) -> None:
    """Refuse a batch with a null in a non-nullable (primary key) column, naming it.

    Spark marks most columns nullable, so only the data can tell; this runs in
    the task on every batch before the shard writer sees it (nothing of the
    batch is written, and the job commits nothing).
    """
    for f in schema:
        if f.nullable or f.name not in batch.schema.names:
            continue
        nulls = batch.column(f.name).null_count
        if nulls:
            raise ConfigError(
                f"Primary key column '{f.name}' must not be null: drop or fill those rows "
                f"before writing (e.g. df.na.drop(subset=['{f.name}'])); a batch had {nulls} "
                "null(s), and the job commits nothing.")


def _conformed(batches: Iterator[pa.RecordBatch], schema: pa.Schema,
               realign: bool) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        check_no_null_keys(batch, schema)
        yield conform(batch, schema, realign)


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
        return super().write(_conformed(iterator, self.schema,
                                        self.opts.config.enable_memtable))


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
        return super().write(_conformed(iterator, self.schema,
                                        self.opts.config.enable_memtable))

    mark: StreamMark | None = None

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
    query: local paths become absolute (relative ones against the working
    directory, as Spark resolves them), ``file:`` URIs become paths, and other
    URIs lose trailing slashes and ``.`` segments. An absolute path or URI
    keeps the identity earlier versions derived from it.
    """
    text = location.strip()
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if len(scheme) <= 1 or scheme == "file":  # a plain path, a drive letter, or file:
        path = unquote(parsed.path) if scheme == "file" else text
        canonical = os.path.normpath(os.path.abspath(path))
    else:
        path = posixpath.normpath(parsed.path).rstrip("/") if parsed.path else ""
        canonical = f"{scheme}://{parsed.netloc}{'' if path == '.' else path}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, canonical))


def _hashable_key(t: pa.DataType) -> bool:
    """A type Lance's MemWAL can hash as a primary key (pylance 14: its error lists them)."""
    return (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


def check_key_types(schema: pa.Schema, primary_key: tuple[str, ...]) -> None:
    """Refuse, before the table is made, a primary key column Lance cannot hash."""
    for name in primary_key:
        if name in schema.names and not _hashable_key(schema.field(name).type):
            t = schema.field(name).type
            raise ConfigError(
                f"Cast primary key column '{name}' to a supported key type (integer, boolean, "
                f"string or binary), e.g. .withColumn('{name}', col('{name}').cast('string')), "
                f"or pick another key with option 'primary_key': '{name}' is {t}, which "
                "Lance's MemWAL cannot use as a primary key.")


def _check_store(path: str, storage: dict[str, str]) -> ObjectStore:
    """The table's store; fails on the driver when the bucket is missing or credentials
    are wrong or missing."""
    store = open_store(path, storage)
    check = getattr(store, "check_bucket", None)  # S3, GCS and Azure stores
    if check is not None:
        check()
    return store


def _refuse_foreign_directory(path: str, store: ObjectStore) -> None:
    """Refuse to create a table where something that is not one already lives."""
    if any(d in TABLE_DIRS or d.startswith("_memwal") for d in store.list_dirs("")):
        return  # a table (or a MemWAL) of ours, part-made: creating completes it
    found = next(iter(store.list("")), None)
    if found is not None:
        raise ConfigError(
            f"Save to an empty or new path, or to an existing Lance table: {path} is not "
            f"empty and is not a Lance table (it holds {found}), so the memwal format will "
            "not write its files into it.")


def open_for_read(path: str, storage: dict[str, str]):
    """The Lance dataset to read, with errors that say what to do.

    The store is checked first, so rejected or missing S3 credentials are
    reported as such, not as a missing table.
    """
    _check_store(path, storage)
    try:
        return open_table(path, storage)
    except MemWalError as exc:
        text = without_native_locations(str(exc))
        if "was not found" in text:
            raise ConfigError(
                f"no memwal table at {path}: write to it first (df.write.format('memwal')"
                f".save('{path}') creates it), or check the path") from None
        raise MemWalError(text) from None


def refuse_without_mem_wal(path: str, storage: dict[str, str], ds) -> None:
    """A WAL-tail read of a plain Lance table (no MemWAL) fails instead of returning 0 rows."""
    if ds.mem_wal_index_details() is not None:
        return
    if set(open_store(path, storage).list_dirs("")) & {MEM_WAL_DIR, COMMITS_DIR}:
        return
    raise ConfigError(
        f"Read it with option view=table (the whole table), or write to it once through "
        f"df.write.format('memwal') to start its MemWAL: the Lance table at {path} has no "
        "MemWAL, so the WAL tail this read returns by default (view=tail) would be empty.")


def prepare_table(opts: WriteOptions, spark_schema: StructType) -> pa.Schema:
    """Create the table from the DataFrame's schema, or check it against the table's."""
    if opts.delete:
        return prepare_delete(opts, spark_schema)
    incoming = table_schema_for(spark_schema)
    store = _check_store(opts.path, opts.storage)
    if table_exists(opts.path, opts.storage):
        # Compaction's hidden key (tables without a primary key) is never written.
        table = without_row_key(open_table(opts.path, opts.storage).schema)
        problem = schema_mismatch(data_schema(table), align_timestamps(incoming, table),
                                  opts.path)
        if problem:  # leaving out a nullable column is fine: the writer fills nulls
            raise ConfigError(problem)
        existing_pk = tuple(primary_key_of(table))
        if opts.primary_key and opts.primary_key != existing_pk:
            raise ConfigError(f"option 'primary_key' is {list(opts.primary_key)} but the table at "
                              f"{opts.path} has primary key {list(existing_pk)}")
        return table
    if not opts.create_table:
        raise ConfigError(f"no Lance table at {opts.path} and option 'create_table' is false")
    _refuse_foreign_directory(opts.path, store)
    check_key_types(incoming, opts.primary_key)
    created = sharding.create_table(opts.path, incoming, opts.primary_key, opts.storage,
                                    opts.shard_by).schema
    return without_row_key(created)  # a table without a primary key is created with it


class MemWalDataSource(DataSource):
    """Read and write a Lance table's MemWAL. Format name: ``memwal``."""

    @classmethod
    def name(cls) -> str:
        """``memwal``. In the driver (``spark.dataSource.register`` asks for the name)
        this first checks that Spark's Python workers run an interpreter with this
        package (:func:`~memwal_datasource.spark.interpreter.check_python_workers`)."""
        check_python_workers()
        return "memwal"

    def _read_opts(self) -> tuple[ReadOptions, pa.Schema]:
        opts = ReadOptions.parse(dict(self.options))
        table = without_row_key(open_for_read(opts.path, opts.storage).schema)
        if opts.metadata_columns:
            taken = [f.name for f in METADATA_FIELDS if f.name != TOMBSTONE
                     and f.name in table.names]
            if taken:
                raise ConfigError(f"option 'metadata_columns' adds column(s) {taken}, which the "
                                  f"table at {opts.path} already has; read without it")
        return opts, table

    @without_native_paths
    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        opts, table = self._read_opts()
        return from_arrow_schema(output_schema(table, opts.metadata_columns))

    @without_native_paths
    def reader(self, schema: StructType) -> MemWalBatchReader:
        opts, table = self._read_opts()
        if opts.stream_start is not None:
            name = next(k for k in ("starting_commit", "starting_timestamp")
                        if k in {o.lower() for o in dict(self.options)})
            raise ConfigError(f"option '{name}' applies to spark.readStream only; a batch read "
                              "takes 'starting_positions' / 'ending_positions' per shard")
        if opts.view == "tail":
            refuse_without_mem_wal(opts.path, opts.storage, open_table(opts.path, opts.storage))
        return MemWalBatchReader(opts, table)

    @without_native_paths
    def streamReader(self, schema: StructType) -> MemWalStreamReader:  # noqa: N802
        opts, table = self._read_opts()
        refuse_unsupported(opts)
        return MemWalStreamReader(opts, table)

    @without_native_paths
    def writer(self, schema: StructType, overwrite: bool) -> MemWalBatchWriter:
        opts = WriteOptions.parse(dict(self.options))
        return SparkBatchWriter(opts, prepare_table(opts, schema), overwrite)

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
            mark = StreamMark(query_id, location)
        opts = WriteOptions.parse(raw)
        writer = SparkStreamWriter(opts, prepare_table(opts, schema), overwrite, query_id)
        if mark is not None:
            # Spark plans a writer per micro-batch: the mark is renewed (and checked) each time.
            mark.renew(open_store(opts.path, opts.storage))
            writer.mark = mark
        return writer
