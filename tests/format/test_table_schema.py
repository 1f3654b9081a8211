"""A table's schema rules (memwal_datasource.format.table_schema): primary-key marks, the hidden
compaction key, and the checks a write's schema meets."""

from __future__ import annotations

import pyarrow as pa
import pytest

from memwal_datasource.errors import ConfigError
from memwal_datasource.format.table_schema import (
    PK_METADATA_KEY,
    ROW_KEY,
    base_schema,
    data_schema,
    primary_key_of,
    schema_mismatch,
    with_table_columns,
    without_row_key,
)

# --- writes after a schema change (Lance's add_columns) ---------------------------------

def test_schema_check_lets_a_write_leave_out_nullable_columns_only():
    table = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string()),
                       ("extra", pa.int32())])
    narrow = pa.schema([("id", pa.int64()), ("v", pa.string())])
    assert schema_mismatch(table, narrow, "/t") is None
    assert schema_mismatch(table, pa.schema([("id", pa.int64())]), "/t") is None
    # A non-nullable column cannot be left out: the fix first, naming it.
    problem = schema_mismatch(table, pa.schema([("v", pa.string())]), "/t")
    assert problem.startswith("Add column(s) ['id'] to the DataFrame: they are not nullable")
    # A column the table lacks: add_columns first, the pylance call named.
    wide = narrow.append(pa.field("w", pa.int32())).append(pa.field("s", pa.string()))
    problem = schema_mismatch(table, wide, "/t")
    first = problem.split(": ", 1)[0]
    assert first == "Add column(s) ['w', 's'] to the table first, then write again"
    assert ("lance.dataset('/t').add_columns([pa.field('w', pa.int32()), "
            "pa.field('s', pa.string())])") in problem
    assert "unexpected column(s) ['w', 's']" in problem
    assert schema_mismatch(table, pa.schema([("v", pa.string()), ("id", pa.int64())]),
                           "/t").startswith("Select the columns in the table's order")
    assert schema_mismatch(table, pa.schema([("id", pa.int64()), ("extra", pa.string())]),
                           "/t").startswith("Cast column 'extra' to int32")
    # The batch a write stores: the left-out nullable columns as nulls, in table order.
    b = pa.record_batch([pa.array([1, 2], pa.int64())], names=["id"])
    full = with_table_columns(b, table)
    assert full.schema.names == ["id", "v", "extra"]
    assert full.to_pylist() == [{"id": 1, "v": None, "extra": None},
                                {"id": 2, "v": None, "extra": None}]
    assert full.schema.field("extra").type == pa.int32()
    # Unfillable batches come back as they are (the writer's check names the problem).
    assert with_table_columns(pa.record_batch({"v": ["x"]}), table).schema.names == ["v"]


def test_a_table_without_a_primary_key_gets_the_hidden_row_key_users_never_see():
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    keyed = base_schema(schema, ["id"])
    assert keyed.field("id").metadata[PK_METADATA_KEY] == b"true"
    assert not keyed.field("id").nullable and primary_key_of(keyed) == ["id"]
    hidden = base_schema(schema)
    assert hidden.names == ["id", "v", ROW_KEY] and primary_key_of(hidden) == []
    assert without_row_key(hidden).names == data_schema(hidden).names == ["id", "v"]
    with pytest.raises(ConfigError, match="option 'primary_key' names column"):
        base_schema(schema, ["nope"])
    with pytest.raises(ConfigError, match=f"column '{ROW_KEY}' is reserved"):
        base_schema(schema.append(pa.field(ROW_KEY, pa.int64())))
