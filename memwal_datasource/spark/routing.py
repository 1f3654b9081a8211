"""Getting rows to the right shard from Spark: ``partition_for_table`` and delete checks.

Spark's Python writers cannot ask Spark for a distribution, and on a table
with a sharding spec Lance's rule is one sharding value, one shard, one
writer. :func:`partition_for_table` repartitions a DataFrame so every
sharding value lands in exactly one task; the write path refuses a job in
which two tasks wrote one shard (naming this function as the fix).
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from ..errors import ConfigError
from ..sharding import BUCKET, IDENTITY, Sharding, table_sharding
from ..table import open_table, primary_key_of, table_exists
from .options import STORAGE_PREFIX, WriteOptions, storage_options, table_path

# The column partition_for_table adds (and drops again) to repartition on.
SHARD_COLUMN = "__memwal_sharding_value"


def _sharding_udf(sharding: Sharding):
    """An Arrow UDF computing each row's sharding value with Lance's own function."""
    from pyspark.sql.functions import arrow_udf
    from pyspark.sql.types import IntegerType

    column = sharding.columns[0]

    def values(col: pa.Array) -> pa.Array:
        return sharding.values(pa.record_batch([col], names=[column]))

    return arrow_udf(values, IntegerType())


def partition_for_table(df, path: str, storage_options: Mapping[str, str] | None = None,
                        num_partitions: int | None = None):
    """``df`` repartitioned so each sharding value of the table at ``path`` is in one task.

    * bucket spec: the bucket is computed by Lance's ``evaluate_sharding_spec``
      (an Arrow UDF), and rows are hash-partitioned on it into
      ``num_partitions`` (default: the spec's ``num_buckets``) partitions;
    * identity spec: hash-partitioned on the column (Spark's default number
      of shuffle partitions unless ``num_partitions``);
    * unsharded spec: one partition;
    * no spec (shards follow Spark partitions): ``df`` unchanged.

    A partition may hold several sharding values (the task writes one shard
    each); a value is never split. ``storage_options`` take Lance's names
    (``aws_endpoint``, ...) or the write options' ``storage.<name>`` form.
    """
    from pyspark.sql import functions as F

    opts = {k[len(STORAGE_PREFIX):] if k.startswith(STORAGE_PREFIX) else k: v
            for k, v in (storage_options or {}).items()}
    uri = table_path({"path": path})
    sharding = table_sharding(open_table(uri, storage_options_of(opts)))
    if sharding is None:
        return df
    if sharding.transform == IDENTITY:
        column = F.col(sharding.columns[0])
        return df.repartition(num_partitions, column) if num_partitions else \
            df.repartition(column)
    if sharding.transform != BUCKET:  # unsharded: every row goes to one shard
        return df.repartition(1)
    value = _sharding_udf(sharding)(F.col(sharding.columns[0]))
    return (df.withColumn(SHARD_COLUMN, value)
            .repartition(num_partitions or sharding.num_buckets, SHARD_COLUMN)
            .drop(SHARD_COLUMN))


def storage_options_of(options: Mapping[str, str]) -> dict[str, str]:
    """Lance-named storage options, aliases folded (as the write options do)."""
    return storage_options({f"{STORAGE_PREFIX}{k}": v for k, v in options.items()})


def prepare_delete(opts: WriteOptions, spark_schema) -> pa.Schema:
    """Driver checks of ``operation=delete``; returns the table's schema.

    The DataFrame must carry the primary-key columns (and the sharding
    column, if the table is sharded by another one), with the table's types;
    its other columns are ignored. Delete markers hold nulls in the table's
    other columns (zero values in non-nullable ones).
    """
    from .source import table_schema_for
    from .writer import placeholder

    if not table_exists(opts.path, opts.storage):
        raise ConfigError(f"option 'operation=delete': there is no table at {opts.path} to "
                          "delete from")
    table = open_table(opts.path, opts.storage)
    schema = table.schema
    pk = primary_key_of(schema)
    if not pk:
        raise ConfigError(f"option 'operation=delete' needs a primary key, and the table at "
                          f"{opts.path} has none: deletes are markers for keys")
    incoming = table_schema_for(spark_schema)
    sharding = table_sharding(table)
    need = list(pk) + [c for c in (sharding.columns if sharding else ()) if c not in pk]
    missing = [c for c in need if c not in incoming.names]
    if missing:
        raise ConfigError(f"option 'operation=delete': the DataFrame must carry column(s) "
                          f"{missing} (the primary key{' and sharding column' if sharding else ''} "
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
    return schema


def _castable(got: pa.DataType, want: pa.DataType) -> bool:
    from ..table import same_logical_type

    if same_logical_type(got, want):
        return True
    return pa.types.is_timestamp(got) and pa.types.is_timestamp(want) and got.unit == want.unit
