"""Getting rows to the right shard from Spark: ``partition_for_table``.

Spark's Python writers cannot ask Spark for a distribution, and on a table
with a sharding spec Lance's rule is one sharding value, one shard, one
writer at a time. Any DataFrame can be written: tasks sharing a shard take
turns on it (:mod:`memwal_datasource.spark.shard_turns`), spilling the rows
that wait to local disk. :func:`partition_for_table` is the fast path: it
repartitions a DataFrame so every sharding value lands in exactly one task,
so no task waits or spills.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from ..table.sharding import BUCKET, IDENTITY, Sharding, table_sharding
from ..table.view import open_table, table_exists
from .connect import client_path
from .options import STORAGE_PREFIX, WriteOptions, storage_options, table_path
from .prepare import prepare_table

# The column partition_for_table adds (and drops again) to repartition on.
SHARD_COLUMN = "__memwal_sharding_value"


_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h1: int, k1: int) -> int:
    k1 = _rotl((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593 & _M32
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a long (Murmur3 x86_32, seed 42), as a signed int."""
    h1 = _mix(_mix(seed, value & _M32), (value >> 32) & _M32) ^ 8
    h1 = (h1 ^ (h1 >> 16)) * 0x85EBCA6B & _M32
    h1 = (h1 ^ (h1 >> 13)) * 0xC2B2AE35 & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def partition_keys(n: int) -> list[int]:
    """``keys[p]``: the smallest long that ``repartition(n, col)`` sends to partition ``p``.

    Spark's hash partitioning is ``pmod(hash(col), n)``; repartitioning on
    the bucket itself would put two buckets in one task and leave another
    task idle about a third of the time. Repartitioning on ``keys[bucket % n]``
    gives each partition exactly its buckets.
    """
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < n:
        keys.setdefault(spark_hash_long(candidate) % n, candidate)
        candidate += 1
    return [keys[p] for p in range(n)]


def _partition_key_udf(sharding: Sharding, n: int):
    """An Arrow UDF: each row's partition key (Lance's bucket, mapped by :func:`partition_keys`)."""
    from pyspark.sql.functions import arrow_udf
    from pyspark.sql.types import LongType

    column = sharding.columns[0]
    keys = pa.array(partition_keys(n), pa.int64())

    def values(col: pa.Array) -> pa.Array:
        import pyarrow.compute as pc

        buckets = sharding.values(pa.record_batch([col], names=[column])).cast(pa.int64())
        return pc.take(keys, pc.remainder(buckets, n))

    return arrow_udf(values, LongType())


def partition_for_table(df, path: str, storage_options: Mapping[str, str] | None = None,
                        num_partitions: int | None = None,
                        create_options: Mapping[str, str] | None = None):
    """``df`` repartitioned so each sharding value of the table at ``path`` is in one task.

    * bucket spec: the bucket is computed by Lance's ``evaluate_sharding_spec``
      (an Arrow UDF), and bucket ``b`` goes to partition ``b % num_partitions``
      (default: the spec's ``num_buckets``, one bucket per task);
    * identity spec: hash-partitioned on the column (Spark's default number
      of shuffle partitions unless ``num_partitions``);
    * unsharded spec, or a primary-key table whose MemWAL records no spec
      (written to one shard, see ``Sharding.unrecorded``): one partition;
    * no spec and no primary key (shards follow Spark partitions): ``df``
      unchanged.

    A partition may hold several sharding values (the task writes one shard
    each); a value is never split. ``storage_options`` take Lance's names
    (``aws_endpoint``, ...) or the write options' ``storage.<name>`` form.

    The spec is the table's, so the table must exist. With ``create_options``
    (the write options ``df.write`` will get, e.g. ``{"primary_key": "id"}``)
    a missing table is first created, empty, from ``df``'s schema exactly as
    that write would create it (its default or ``shard_by_*`` spec): the first
    write of a primary-key table can then be partitioned too.

    Works on classic and Spark Connect DataFrames; it reads (and may create)
    the table from the calling process, so from a Connect client ``path``
    must be absolute or a URI, reachable from the client as from the server.
    """
    from pyspark.sql import functions as F

    opts = {k[len(STORAGE_PREFIX):] if k.startswith(STORAGE_PREFIX) else k: v
            for k, v in (storage_options or {}).items()}
    # Resolved here, in the caller's process: on a Connect client a relative path is refused.
    uri = table_path({"path": client_path(df, path, "the path argument of "
                                                    "partition_for_table()")})
    storage = storage_options_of(opts)
    if create_options is not None and not table_exists(uri, storage):
        _create_like_write(df, uri, storage, create_options)
    sharding = table_sharding(open_table(uri, storage))
    if sharding is None:
        return df
    if sharding.transform == IDENTITY:
        column = F.col(sharding.columns[0])
        return df.repartition(num_partitions, column) if num_partitions else \
            df.repartition(column)
    if sharding.transform != BUCKET:  # unsharded: every row goes to one shard
        return df.repartition(1)
    n = num_partitions or sharding.num_buckets
    value = _partition_key_udf(sharding, n)(F.col(sharding.columns[0]))
    return (df.withColumn(SHARD_COLUMN, value)
            .repartition(n, SHARD_COLUMN)
            .drop(SHARD_COLUMN))


def _create_like_write(df, uri: str, storage: Mapping[str, str],
                       create_options: Mapping[str, str]) -> None:
    """Create the table at ``uri`` as ``df.write`` with ``create_options`` would."""
    options = {**{f"{STORAGE_PREFIX}{k}": v for k, v in storage.items()}, **create_options,
               "path": uri}
    prepare_table(WriteOptions.parse(options), df.schema)


def storage_options_of(options: Mapping[str, str]) -> dict[str, str]:
    """Lance-named storage options, aliases folded (as the write options do)."""
    return storage_options({f"{STORAGE_PREFIX}{k}": v for k, v in options.items()})
