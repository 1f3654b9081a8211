"""A table's schema as users and writers see it: Lance's primary-key marks, the hidden
compaction key, and the checks a write's schema meets.

Pure pyarrow: writers, planners and readers import this without the table's commit
log, manifests or pylance (:mod:`memwal_datasource.table.view` builds on it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pyarrow as pa

from ..errors import ConfigError

PK_METADATA_KEY = b"lance-schema:unenforced-primary-key"
# The base table's hidden compaction key on tables without a primary key (see compact.py).
ROW_KEY = "_memwal_row"
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


def base_schema(schema: pa.Schema, primary_key: Sequence[str] = ()) -> pa.Schema:
    """The schema a new base table is created with.

    With a primary key: the key columns marked as Lance's unenforced primary key.
    Without one: the columns and the hidden compaction key :data:`ROW_KEY`
    (non-nullable ``int64``) as the unenforced primary key. LanceDB reads every
    table with a MemWAL index through its LSM scanner, which refuses a table
    without a primary key; with ``ROW_KEY`` it reads the base table, whose rows
    compaction keys uniquely (see :mod:`memwal_datasource.maintenance.compact`). Our writers
    and readers hide the column (:func:`data_schema`, :func:`primary_key_of`).
    """
    if primary_key:
        return with_primary_key(schema, primary_key)
    if ROW_KEY in schema.names:
        raise ConfigError(f"column '{ROW_KEY}' is reserved for the table's compaction key; "
                          "rename that column")
    return schema.append(pa.field(ROW_KEY, pa.int64(), nullable=False,
                                  metadata={PK_METADATA_KEY: b"true"}))


def primary_key_of(schema: pa.Schema) -> list[str]:
    """The user's primary-key columns: those carrying Lance's primary-key metadata,
    but not the hidden compaction key of a table without one (:data:`ROW_KEY`)."""
    return [f.name for f in schema
            if (f.metadata or {}).get(PK_METADATA_KEY) == b"true" and f.name != ROW_KEY]


def without_row_key(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the base table's hidden compaction key (writers never send it)."""
    i = schema.get_field_index(ROW_KEY)
    return schema if i < 0 else schema.remove(i)


def data_schema(schema: pa.Schema) -> pa.Schema:
    """The schema users see: no Lance per-field bookkeeping, no compaction row key."""
    fields = []
    for f in schema:
        if f.name == ROW_KEY:
            continue
        meta = {k: v for k, v in (f.metadata or {}).items() if k not in _LANCE_FIELD_KEYS}
        fields.append(f.with_metadata(meta or None))
    return pa.schema(fields)


def schema_mismatch(table: pa.Schema, incoming: pa.Schema, path: str = "<table>") -> str | None:
    """How a write of ``incoming`` to the table at ``path`` is refused, fix first; or ``None``.

    Columns are matched by name. The DataFrame may omit nullable columns of the
    table (a column ``add_columns`` added, say): the writer fills them with
    nulls, as Delta and Iceberg do (:func:`with_table_columns`). It may not omit
    a non-nullable one, nor carry a column the table lacks (the fix names the
    ``add_columns`` call). The columns it has keep the table's order. Types
    must match (string widths aside). Nullability is not judged here: Spark
    marks columns nullable after most expressions and UDFs, so a nullable
    column may feed a non-nullable one; the writer checks the data and fails
    naming the column if a null arrives, before writing that batch.
    """
    extra = [f for f in incoming if f.name not in table.names]
    if extra:
        return add_columns_fix(extra, path)
    required = [f.name for f in table if f.name not in incoming.names and not f.nullable]
    if required:
        return (f"Add column(s) {required} to the DataFrame: they are not nullable in the "
                f"table at {path}, so a write cannot leave them out (missing column(s) "
                f"{required}; nullable columns it leaves out are filled with nulls).")
    order = [n for n in table.names if n in incoming.names]
    if order != incoming.names:
        return (f"Select the columns in the table's order, e.g. df.select({order}): the "
                f"DataFrame's column order {incoming.names} differs from the table's "
                f"{table.names} at {path}.")
    for i in incoming:
        t = table.field(i.name)
        if not t.type.equals(i.type) and not same_logical_type(t.type, i.type):
            return (f"Cast column '{t.name}' to {t.type}: column '{t.name}' is {i.type} in the "
                    f"DataFrame but {t.type} in the table at {path}.")
    return None


def add_columns_fix(extra: Sequence[pa.Field], path: str) -> str:
    """The refusal of a write with columns the table lacks: the pylance call that adds them."""
    names = [f.name for f in extra]
    fields = ", ".join(f"pa.field({f.name!r}, pa.{_type_expr(f.type)})" for f in extra)
    return (f"Add column(s) {names} to the table first, then write again: "
            f"lance.dataset({path!r}).add_columns([{fields}]) (with pylance; pass the table's "
            "storage_options on object stores), or drop them from the DataFrame. The "
            f"DataFrame has unexpected column(s) {names}, which the table at {path} lacks; "
            "rows written before read null there.")


def _type_expr(t: pa.DataType) -> str:
    """``t`` as a ``pyarrow`` factory call where it reads as one (``int32()``), else its
    text (which a user can adapt)."""
    text = str(t)
    simple = {"string": "string()", "large_string": "large_string()", "bool": "bool_()",
              "binary": "binary()", "double": "float64()", "float": "float32()",
              "date32[day]": "date32()"}
    if text in simple:
        return simple[text]
    if re.fullmatch(r"u?int(8|16|32|64)", text):
        return f"{text}()"
    return f"<{text}>"


def with_table_columns(batch: pa.RecordBatch, table: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the table's nullable columns it lacks added as nulls, in table order.

    What a write that leaves out a nullable column stores (so every WAL entry
    carries the table's whole schema). A batch with a column the table lacks,
    without a non-nullable one, or in another order, is returned as it is: the
    schema check refuses it, naming the columns.
    """
    names = batch.schema.names
    if names == table.names or [n for n in table.names if n in names] != names:
        return batch  # nothing missing; or extra columns, or another order: refused later
    if any(f.name not in names and not f.nullable for f in table):
        return batch
    n = batch.num_rows
    cols = [batch.column(f.name) if f.name in names else pa.nulls(n, f.type) for f in table]
    fields = [batch.schema.field(f.name) if f.name in names else f for f in table]
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields))


def same_logical_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Same logical type with another offset width (Spark may send large strings)."""
    pairs = ((pa.types.is_string, pa.types.is_large_string),
             (pa.types.is_binary, pa.types.is_large_binary))
    return any((x(a) and y(b)) or (y(a) and x(b)) for x, y in pairs)
