"""Deletes from Spark (``operation=delete``): driver checks and delete markers.

A delete is a WAL entry of markers, Lance's ``_tombstone`` column set, for
the keys in the DataFrame; the whole-table read, compaction and pylance's
replay drop the deleted keys.
"""

from __future__ import annotations

import pyarrow as pa

from ..errors import ConfigError
from ..format.table_schema import primary_key_of, same_logical_type
from ..table.table_info import TableInfo, describe_table
from ..table.view import TOMBSTONE
from .options import WriteOptions
from .schema import table_schema_for


def placeholder(t: pa.DataType, n: int) -> pa.Array:
    """``n`` zero values of ``t``: what a delete marker holds in a non-nullable non-key column.

    Readers ignore a marker's non-key values; a null would break the column's
    declared nullability (and pylance's replay), so a zero value stands in.
    Raises ``ValueError`` for types without an obvious zero (nested types).
    """
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.array([""] * n, t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([b""] * n, t)
    if pa.types.is_boolean(t):
        return pa.array([False] * n, t)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return pa.array([0] * n, t)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.array([0] * n, pa.int32()).cast(t)
    if pa.types.is_temporal(t):
        return pa.array([0] * n, pa.int64()).cast(t)
    raise ValueError(f"no zero value for type {t}")


def tombstones(batch: pa.RecordBatch, schema: pa.Schema, keys: tuple[str, ...]) -> pa.RecordBatch:
    """Delete markers for the keys in ``batch``: key columns, then ``_tombstone=true``.

    ``schema`` is the writer's schema (the table's columns, then ``_tombstone``).
    Other columns hold nulls (zero values where the table declares them
    non-nullable); the DataFrame's other columns are ignored, as pylance's
    ``ShardWriter.delete`` ignores them.
    """
    n = batch.num_rows
    cols = []
    for f in schema:
        if f.name == TOMBSTONE:
            cols.append(pa.repeat(True, n))
        elif f.name in keys:
            col = batch.column(f.name)
            cols.append(col if col.type.equals(f.type) else col.cast(f.type))
        else:
            cols.append(pa.nulls(n, f.type) if f.nullable else placeholder(f.type, n))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def tombstone_schema(table: pa.Schema) -> pa.Schema:
    """The writer schema of delete markers: the table's columns, then ``_tombstone``."""
    return table.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))


def prepare_delete(opts: WriteOptions, spark_schema) -> TableInfo:
    """Driver checks of ``operation=delete``; returns the table's description.

    The DataFrame must carry the primary-key columns (and the sharding
    column, if the table is sharded by another one), with the table's types;
    its other columns are ignored. Delete markers hold nulls in the table's
    other columns (zero values in non-nullable ones).
    """
    info = describe_table(opts.path, opts.storage)
    if info is None:
        raise ConfigError(f"option 'operation=delete': there is no table at {opts.path} to "
                          "delete from")
    schema = info.schema
    pk = primary_key_of(schema)
    if not pk:
        raise ConfigError(f"option 'operation=delete' needs a primary key, and the table at "
                          f"{opts.path} has none: deletes are markers for keys")
    incoming = table_schema_for(spark_schema)
    by = info.sharding_columns
    need = list(pk) + [c for c in by if c not in pk]
    missing = [c for c in need if c not in incoming.names]
    if missing:
        raise ConfigError(f"option 'operation=delete': the DataFrame must carry column(s) "
                          f"{missing} (the primary key{' and sharding column' if by else ''} "
                          f"of the table at {opts.path}); it has {incoming.names}")
    for name in need:
        got, want = incoming.field(name).type, schema.field(name).type
        if not got.equals(want) and not _castable(got, want):
            raise ConfigError(f"option 'operation=delete': column '{name}' is {got} in the "
                              f"DataFrame but {want} in the table")
    for f in schema:
        if not f.nullable and f.name not in pk:
            try:
                placeholder(f.type, 1)
            except ValueError:
                raise ConfigError(
                    f"option 'operation=delete': column '{f.name}' of the table at {opts.path} "
                    f"is a non-nullable {f.type}; a delete marker must hold a value there and "
                    "this type has no zero value to use") from None
    return info


def _castable(got: pa.DataType, want: pa.DataType) -> bool:
    if same_logical_type(got, want):
        return True
    return pa.types.is_timestamp(got) and pa.types.is_timestamp(want) and got.unit == want.unit
