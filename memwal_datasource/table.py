"""The Lance table a MemWAL belongs to: create, open, check schemas.

Creating writes an empty Lance dataset (version 1) with the primary key set as
Lance expects (field metadata ``lance-schema:unenforced-primary-key`` on a
non-nullable field) and initialises the MemWAL index on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from .errors import ConfigError, MemWalError
from .options import lance_storage_options

PK_METADATA_KEY = b"lance-schema:unenforced-primary-key"
# Lance's own per-field metadata; not part of what users compare.
_LANCE_FIELD_KEYS = (b"lance:field_id", PK_METADATA_KEY)


def with_primary_key(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """Mark ``primary_key`` columns as Lance's unenforced primary key (non-nullable)."""
    missing = [c for c in primary_key if c not in schema.names]
    if missing:
        raise ConfigError(
            f"option 'primary_key' names column(s) {missing} that are not in the "
            f"DataFrame's columns {schema.names}"
        )
    fields = []
    for f in schema:
        if f.name in primary_key:
            meta = dict(f.metadata or {})
            meta[PK_METADATA_KEY] = b"true"
            f = f.with_nullable(False).with_metadata(meta)
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def primary_key_of(schema: pa.Schema) -> list[str]:
    """Columns carrying Lance's primary-key metadata."""
    return [f.name for f in schema if (f.metadata or {}).get(PK_METADATA_KEY) == b"true"]


def table_exists(uri: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """True if a Lance dataset exists at ``uri``."""
    import lance

    try:
        lance.dataset(uri, storage_options=lance_storage_options(storage_options))
        return True
    except (OSError, ValueError, FileNotFoundError):
        return False


def open_table(uri: str, storage_options: Mapping[str, str] | None = None):
    """Open the Lance dataset at ``uri``, with a clear error if it is not there."""
    import lance

    try:
        return lance.dataset(uri, storage_options=lance_storage_options(storage_options))
    except (OSError, ValueError) as exc:
        raise MemWalError(f"no Lance table at {uri}: {exc}") from None


def ensure_mem_wal(ds) -> None:
    """Initialise the MemWAL index unless it already is (racing creators are fine)."""
    if ds.mem_wal_index_details() is not None:
        return
    try:
        ds.initialize_mem_wal()
    except OSError as exc:
        if "already initialized" not in str(exc):
            raise


def create_table(uri: str, schema: pa.Schema, primary_key: Sequence[str] = (),
                 storage_options: Mapping[str, str] | None = None):
    """Create an empty table with ``schema`` (and primary key) and a MemWAL.

    If another process created it first, the existing table is returned.
    """
    import lance

    if primary_key:
        schema = with_primary_key(schema, primary_key)
    opts = lance_storage_options(storage_options)
    try:
        ds = lance.write_dataset(schema.empty_table(), uri, mode="create",
                                 storage_options=opts)
    except OSError as exc:
        if "already exists" not in str(exc).lower():
            raise MemWalError(f"cannot create Lance table at {uri}: {exc}") from None
        ds = lance.dataset(uri, storage_options=opts)
    ensure_mem_wal(ds)
    return lance.dataset(uri, storage_options=opts)


def data_schema(schema: pa.Schema) -> pa.Schema:
    """The schema without Lance's per-field bookkeeping metadata."""
    fields = []
    for f in schema:
        meta = {k: v for k, v in (f.metadata or {}).items() if k not in _LANCE_FIELD_KEYS}
        fields.append(f.with_metadata(meta or None))
    return pa.schema(fields)


def schema_mismatch(table: pa.Schema, incoming: pa.Schema) -> str | None:
    """Describe how ``incoming`` differs from the table's schema, or ``None``.

    Names and types must match (string widths aside). Nullability is not
    judged here: Spark marks columns nullable after most expressions and UDFs,
    so a nullable column may feed a non-nullable one; the writer checks the data
    and fails naming the column if a null arrives, before writing that batch.
    """
    if table.names != incoming.names:
        missing = [n for n in table.names if n not in incoming.names]
        extra = [n for n in incoming.names if n not in table.names]
        parts = []
        if missing:
            parts.append(f"missing column(s) {missing}")
        if extra:
            parts.append(f"unexpected column(s) {extra}")
        if not parts:
            parts.append(f"column order {incoming.names} differs from {table.names}")
        return "; ".join(parts)
    for t, i in zip(table, incoming, strict=True):
        if not t.type.equals(i.type) and not same_logical_type(t.type, i.type):
            return f"column '{t.name}' is {i.type} in the DataFrame but {t.type} in the table"
    return None


def same_logical_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Same logical type with another offset width (Spark may send large strings)."""
    pairs = ((pa.types.is_string, pa.types.is_large_string),
             (pa.types.is_binary, pa.types.is_large_binary))
    return any((x(a) and y(b)) or (y(a) and x(b)) for x, y in pairs)
