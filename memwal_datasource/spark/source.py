"""``MemWalDataSource``: the ``memwal`` format for Spark's Python Data Source API."""

from __future__ import annotations

import uuid

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from ..errors import ConfigError
from ..store import S3Store, open_store
from ..table import (
    create_table,
    data_schema,
    open_table,
    primary_key_of,
    schema_mismatch,
    table_exists,
)
from .options import ReadOptions, WriteOptions
from .reader import MemWalBatchReader, output_schema
from .stream import MemWalStreamReader
from .writer import MemWalBatchWriter, MemWalStreamWriter


def _to_arrow(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)


def _check_store(path: str, storage: dict[str, str]) -> None:
    """Fail on the driver when the bucket is missing or credentials are wrong."""
    store = open_store(path, storage)
    if isinstance(store, S3Store):
        store.check_bucket()


def prepare_table(opts: WriteOptions, spark_schema: StructType) -> pa.Schema:
    """Create the table from the DataFrame's schema, or check it against the table's."""
    _check_store(opts.path, opts.storage)
    incoming = _to_arrow(spark_schema)
    if table_exists(opts.path, opts.storage):
        table = open_table(opts.path, opts.storage).schema
        problem = schema_mismatch(data_schema(table), incoming)
        if problem:
            raise ConfigError(f"DataFrame does not match the table at {opts.path}: {problem}")
        existing_pk = tuple(primary_key_of(table))
        if opts.primary_key and opts.primary_key != existing_pk:
            raise ConfigError(f"option 'primary_key' is {list(opts.primary_key)} but the table at "
                              f"{opts.path} has primary key {list(existing_pk)}")
        return table
    if not opts.create_table:
        raise ConfigError(f"no Lance table at {opts.path} and option 'create_table' is false")
    return create_table(opts.path, incoming, opts.primary_key, opts.storage).schema


class MemWalDataSource(DataSource):
    """Read and write a Lance table's MemWAL. Format name: ``memwal``."""

    @classmethod
    def name(cls) -> str:
        return "memwal"

    def _read_opts(self) -> tuple[ReadOptions, pa.Schema]:
        opts = ReadOptions.parse(dict(self.options))
        return opts, open_table(opts.path, opts.storage).schema

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        opts, table = self._read_opts()
        return from_arrow_schema(output_schema(table, opts.metadata_columns))

    def reader(self, schema: StructType) -> MemWalBatchReader:
        opts, table = self._read_opts()
        return MemWalBatchReader(opts, table)

    def streamReader(self, schema: StructType) -> MemWalStreamReader:  # noqa: N802
        opts, table = self._read_opts()
        return MemWalStreamReader(opts, table)

    def writer(self, schema: StructType, overwrite: bool) -> MemWalBatchWriter:
        opts = WriteOptions.parse(dict(self.options))
        return MemWalBatchWriter(opts, prepare_table(opts, schema), overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> MemWalStreamWriter:  # noqa: N802
        raw = {k.lower(): v for k, v in dict(self.options).items()}
        query_id = raw.get("query_id")
        if not query_id:
            location = raw.get("checkpointlocation")
            if not location:
                raise ConfigError("a memwal stream sink needs option 'checkpointLocation' (or "
                                  "'query_id') to commit each micro-batch exactly once")
            query_id = str(uuid.uuid5(uuid.NAMESPACE_URL, location))
        opts = WriteOptions.parse(raw)
        return MemWalStreamWriter(opts, prepare_table(opts, schema), overwrite, query_id)
