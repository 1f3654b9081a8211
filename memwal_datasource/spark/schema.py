"""DataFrame schemas and batches as a table stores them (driver checks and task fixes).

On the driver, :func:`table_schema_for` turns a DataFrame's schema into the
Arrow schema its table gets, refusing what cannot be stored (naming the column).

Spark hands a writer its batches as its Arrow conversion makes them; two of
their quirks are fixed in the task before the shard writer sees a batch
(:func:`conform`): timestamps arrive in the session time zone (the table
stores them as UTC instants: the same values), and Arrow decimals read off
Spark's socket may sit at addresses pylance's native writer cannot import
(MemTable mode copies them to aligned memory).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from ..errors import ConfigError
from ..format.memwal import TOMBSTONE
from ..format.table_schema import ROW_KEY

# Column names the MemWAL format gives a meaning of its own.
RESERVED_COLUMNS = {
    TOMBSTONE: "it marks deleted rows in the MemWAL format",
    ROW_KEY: "compaction adds it to tables without a primary key as their hidden row key",
}


def table_schema_for(spark_schema: StructType) -> pa.Schema:
    """The Arrow schema a table gets for a DataFrame; refuses what it cannot store.

    Names the column and the reason for a reserved name or a type Spark's Arrow
    path cannot carry. Timestamps with a time zone become UTC instants.
    """
    # Lazy: pyspark's Arrow type mapping is only needed on the driver's planner.
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
    # Lazy: only MemTable mode with a misaligned decimal column gets here.
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


def conformed(batches: Iterator[pa.RecordBatch], schema: pa.Schema,
              realign: bool) -> Iterator[pa.RecordBatch]:
    """``batches`` checked for null keys and conformed (:func:`conform`), one at a time."""
    for batch in batches:
        check_no_null_keys(batch, schema)
        yield conform(batch, schema, realign)
