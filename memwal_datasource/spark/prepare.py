"""The driver's table preparation for a write: create the table, or check the DataFrame.

Runs where Spark plans the write (``DataSource.writer()``), before any task.
An existing table is read through :mod:`memwal_datasource.table.table_info`: its
description of the latest version, kept in the table, spares the planner
(a Spark Python worker) pylance's import; pylance is imported only to create
the table or to describe a version nobody described yet.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql.types import StructType

from ..errors import ConfigError, MemWalError
from ..format.memwal import MEM_WAL_DIR
from ..format.table_schema import (
    add_columns_fix,
    data_schema,
    primary_key_of,
    schema_mismatch,
    without_row_key,
)
from ..log.commit import COMMITS_DIR
from ..store import ObjectStore, open_store
from ..table import sharding
from ..table.sharding import check_requested
from ..table.table_info import TableInfo, TableStamp, describe_created, describe_table
from .deletes import prepare_delete
from .options import WriteOptions
from .schema import align_timestamps, check_key_types, table_schema_for

log = logging.getLogger("memwal_datasource")

# What marks a location as a table of ours: a Lance dataset or a MemWAL.
TABLE_DIRS = ("_versions", MEM_WAL_DIR, COMMITS_DIR)


# Buckets this process has checked, by (scheme, bucket, digest of the storage options):
# a reused planner checks each once, not once per append (a HEAD each time).
_checked_buckets: set[tuple[str, str, str]] = set()


def check_store(path: str, storage: dict[str, str]) -> ObjectStore:
    """The table's store; fails on the driver when the bucket is missing or credentials
    are wrong or missing (checked once per process for the same bucket and options: a
    bucket removed later fails the write's first store call, as clearly)."""
    store = open_store(path, storage)
    check = getattr(store, "check_bucket", None)  # S3, GCS and Azure stores
    if check is not None:
        parsed = urlparse(path)
        key = (parsed.scheme.lower(), parsed.netloc, hashlib.sha256(
            json.dumps(sorted(storage.items())).encode()).hexdigest())
        if key not in _checked_buckets:
            check()
            _checked_buckets.add(key)
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


def described(opts: WriteOptions) -> TableInfo:
    """The description of the table a write goes to; fails when there is no table."""
    info = describe_table(opts.path, opts.storage)
    if info is None:
        raise MemWalError(f"no Lance table at {opts.path}: write to it through "
                          "df.write.format('memwal') first (it creates the table), or check the "
                          "path")
    return info


def prepare_table_info(opts: WriteOptions, spark_schema: StructType) -> TableInfo:
    """Create the table from the DataFrame's schema, or check it against the table's.

    Returns the table's description (its schema, field ids, sharding spec).
    """
    if opts.delete:
        return prepare_delete(opts, spark_schema)
    incoming = table_schema_for(spark_schema)
    store = check_store(opts.path, opts.storage)
    info = describe_table(opts.path, opts.storage, store=store)
    if info is not None:
        # Compaction's hidden key (tables without a primary key) is never written.
        table = without_row_key(info.schema)
        extra = [f for f in incoming if f.name not in table.names]
        if extra and opts.merge_schema:
            info = merge_columns(opts, store, table, incoming, extra)
            table = without_row_key(info.schema)
        elif extra:
            raise ConfigError(
                f"Write with option merge_schema=true to add column(s) {[f.name for f in extra]}"
                " to the table (nullable; rows written before read null). "
                + add_columns_fix(extra, opts.path))
        problem = schema_mismatch(data_schema(table), align_timestamps(incoming, table),
                                  opts.path)
        if problem:  # leaving out a nullable column is fine: the writer fills nulls
            raise ConfigError(problem)
        existing_pk = tuple(primary_key_of(table))
        if opts.primary_key and opts.primary_key != existing_pk:
            raise ConfigError(f"option 'primary_key' is {list(opts.primary_key)} but the table at "
                              f"{opts.path} has primary key {list(existing_pk)}")
        return info
    if not opts.create_table:
        raise ConfigError(f"no Lance table at {opts.path} and option 'create_table' is false")
    _refuse_foreign_directory(opts.path, store)
    check_key_types(incoming, opts.primary_key)
    created = sharding.create_table(opts.path, incoming, opts.primary_key, opts.storage,
                                    opts.shard_by)
    return describe_created(opts.path, opts.storage, created, store=store)


# Tries of add_columns against concurrent commits (each re-reads the table).
MERGE_ATTEMPTS = 5


def merge_columns(opts: WriteOptions, store: ObjectStore, table: pa.Schema,
                  incoming: pa.Schema, extra: list[pa.Field]) -> TableInfo:
    """Option ``merge_schema``: add ``extra`` (nullable) to the table with Lance's
    ``add_columns``, before any task writes; the new table's description.

    Refused first, changing nothing, when the write would still not fit (a changed
    type names its column). Writers that planned with the old schema go on: their
    entries lack the new columns, which read as null. A concurrent writer adding the
    same columns wins or loses Lance's commit; the loser re-reads and finds them.
    """
    import lance

    from ..options import lance_storage_options
    from ..table.table_info import describe_created

    added = [pa.field(f.name, f.type, nullable=True) for f in extra]
    merged = pa.schema(list(table) + added)
    problem = schema_mismatch(data_schema(merged), align_timestamps(incoming, merged), opts.path)
    if problem:
        raise ConfigError(f"{problem} (option merge_schema adds new columns only; it does "
                          "not change a column's type)")
    for attempt in range(MERGE_ATTEMPTS + 1):
        ds = lance.dataset(opts.path, storage_options=lance_storage_options(opts.storage))
        missing = [f for f in added if f.name not in ds.schema.names]
        if not missing:
            return describe_created(opts.path, opts.storage, ds, store=store)
        if attempt == MERGE_ATTEMPTS:
            break
        try:
            ds.add_columns(missing)
        except OSError as exc:  # a concurrent commit: read again
            log.info("memwal merge_schema on %s: add_columns conflicted (%s); reading again",
                     opts.path, exc)
            continue
        log.info("memwal merge_schema: added column(s) %s to %s", [f.name for f in missing],
                 opts.path)
    raise MemWalError(f"Write again: option merge_schema could not add column(s) "
                      f"{[f.name for f in extra]} to {opts.path}: every try conflicted with "
                      "another commit")


def prepare_table(opts: WriteOptions, spark_schema: StructType) -> pa.Schema:
    """:func:`prepare_table_info`'s schema, as writers take it: a table without a primary
    key is created with compaction's hidden row key, which writers never send."""
    return without_row_key(prepare_table_info(opts, spark_schema).schema)


def prepare_writer_options(opts: WriteOptions, schema: pa.Schema,
                           table: TableInfo | None = None) -> WriteOptions:
    """Driver: checks that need the table, and what tasks need of it (sharding, field ids).

    ``schema`` is the table's (after :func:`prepare_table`);
    ``table`` its description, read here when not given (:mod:`memwal_datasource.table.table_info`).
    """
    pk = primary_key_of(schema)
    opts = opts.with_table_key(bool(pk))
    if opts.config.enable_memtable and not pk:
        raise ConfigError(
            f"option 'enable_memtable' is true but the table at {opts.path} has no "
            "primary key: Lance's LSM reads (LsmScanner, point lookups) and MemTable replay are "
            "exactly once only as upserts by key. Set option 'primary_key' when creating the "
            "table, or write with enable_memtable=false (the default without a primary key)")
    if opts.delete:
        if not pk:
            raise ConfigError(f"option 'operation=delete' needs a primary key, and the table at "
                              f"{opts.path} has none: deletes are markers for keys")
    table = table or described(opts)
    sharding = table.sharding(opts.path, opts.storage)
    check_requested(sharding, opts.shard_by, opts.path)
    if sharding is not None and opts.num_shards:
        raise ConfigError(f"option 'num_shards' does not apply: the table at {opts.path} is "
                          f"sharded by {sharding.describe()}, which decides the shards")
    return replace(opts, sharding=sharding, field_ids=table.field_ids,
                   table_stamp=TableStamp.of(table))
