"""Predicates applied by the reader (Lance's filter on base rows, Arrow on tail rows)
select what SQL selects, and a pushed predicate reaches Lance's scanner."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

from memwal_datasource.table.predicate import Pred, apply, arrow_filter, lance_filter
from memwal_datasource.table.table_scan import base_bytes, fragment_groups, read_base

ROWS = pa.table({
    "n": pa.array([1, 2, None, 4, 5, None, 7], pa.int64()),
    "s": pa.array(["a", "b'q", None, "é", "a", "zz", None]),
    "b": pa.array([True, False, None, True, None, False, True]),
    "f": pa.array([1.0, float("nan"), None, 2.0, 3.0, 4.0, 5.0]),
})


def sql(op, x, value):
    """SQL's answer for one row: True, False or None (null)."""
    if op == "is_null":
        return x is None
    if op == "is_not_null":
        return x is not None
    if x is None:
        return None
    if op == "in":
        return x in value
    return {"eq": x == value, "gt": x > value, "ge": x >= value, "lt": x < value,
            "le": x <= value}[op]


CASES = [("n", "eq", 4), ("n", "gt", 2), ("n", "ge", 2), ("n", "lt", 5), ("n", "le", 1),
         ("n", "in", (1, 7, 9)), ("n", "is_null", None), ("n", "is_not_null", None),
         ("s", "eq", "b'q"), ("s", "gt", "a"), ("s", "in", ("a", "é")), ("s", "lt", "zz"),
         ("b", "eq", True), ("b", "eq", False), ("b", "is_null", None)]


@pytest.mark.parametrize("negated", [False, True])
@pytest.mark.parametrize(("column", "op", "value"), CASES)
def test_arrow_and_lance_select_what_sql_selects(tmp_path, column, op, value, negated):
    pred = Pred.make(ROWS.schema, column, op, value, negated)
    assert pred is not None
    want = []
    for i, x in enumerate(ROWS.column(column).to_pylist()):
        got = sql(op, x, value)
        if negated and got is not None:
            got = not got
        if got:  # a null selects nothing
            want.append(i)
    rows = ROWS.append_column("i", pa.array(range(ROWS.num_rows)))
    assert apply(rows, arrow_filter([pred])).column("i").to_pylist() == want
    ds = lance.write_dataset(rows, str(tmp_path / "p.lance"))
    assert sorted(ds.to_table(filter=lance_filter([pred])).column("i").to_pylist()) == want


def test_what_is_not_applied_exactly_is_left_to_the_caller():
    s = ROWS.schema
    assert Pred.make(s, "f", "gt", 1.0) is None  # NaN orders differently in each
    assert Pred.make(s, "n", "eq", "4") is None  # a literal of another type
    assert Pred.make(s, "n", "eq", True) is None
    assert Pred.make(s, "n", "in", (1, None)) is None  # a null in IN
    assert Pred.make(s, "missing", "eq", 1) is None
    assert Pred.make(s, "n", "like", 1) is None
    assert Pred.make(s, "n", "is_null", negated=True) == Pred("n", "is_not_null")


def test_a_pushed_predicate_reaches_lances_scanner(tmp_path):
    """With the predicate Lance reads a sliver of what the whole fragments hold."""
    from memwal_datasource.table.view import TableView, create_table
    from tests.helpers import SCHEMA

    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA, primary_key=["id"])
    rows = pa.table({"id": pa.array(range(400_000), pa.int64()),
                     "v": pa.array([f"value-{i:08}" for i in range(400_000)])})
    lance.write_dataset(rows, uri, mode="append", max_rows_per_file=100_000)
    view = TableView(uri)
    ds = view.dataset()
    groups = fragment_groups(ds, base_bytes(ds) // 2 + 1)
    assert len(groups) == 2 and sorted(i for g in groups for i in g) == [
        f.fragment_id for f in ds.get_fragments()]
    ids = [f.fragment_id for f in ds.get_fragments()]
    point = (Pred("id", "eq", 123_456),)
    want = [{"id": 123_456, "v": "value-00123456"}]
    full, scan, probe = [], [], []
    everything = list(read_base(view, ds.version, ids, (), (), stats=full))
    assert sum(b.num_rows for b in everything) == 400_000
    # No index: Lance reads the id column and only the matching row's other columns.
    hit = list(read_base(view, ds.version, ids, (), point, stats=scan))
    assert [r for b in hit for r in b.to_pylist()] == want
    assert scan[0].bytes_read * 3 < full[0].bytes_read, (scan[0], full[0])
    # With the BTREE compaction keeps on the key, Lance reads one row.
    ds.create_scalar_index("id", "BTREE")
    hit = list(read_base(TableView(uri), view.dataset().version, ids, (), point, stats=probe))
    assert [r for b in hit for r in b.to_pylist()] == want
    assert probe[0].all_counts["rows_scanned"] == 1, probe[0]
    assert probe[0].bytes_read * 100 < full[0].bytes_read, (probe[0], full[0])
