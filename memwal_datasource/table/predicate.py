"""Row predicates a reader applies itself: a Lance filter for the base table, the
same predicate as an Arrow expression for WAL-tail rows.

A :class:`Pred` is one comparison of a top-level column with literals (the
conjuncts Spark pushes). Only column types whose comparison means the same in
Spark, in Lance's SQL (DataFusion) and in Arrow are accepted (integers,
strings, booleans): floats differ on NaN, timestamps on time zones, so those
stay with the caller. Every predicate drops a row whose column is null, as
SQL's three-valued logic does, negated ones included (``NOT (c IN (1, 2))``
is null, not true, for a null ``c``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

# op -> the SQL operator; "in", "is_null" and "is_not_null" are written apart.
_SQL_OPS = {"eq": "=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}
OPS = (*_SQL_OPS, "in", "is_null", "is_not_null")


def pushable_type(t: pa.DataType) -> type | None:
    """The Python type of literals a column of type ``t`` may be compared with, or
    ``None`` if predicates on it are not applied here."""
    if pa.types.is_integer(t):
        return int
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return str
    if pa.types.is_boolean(t):
        return bool
    return None


def _literal_ok(value: Any, kind: type) -> bool:
    if kind is int:  # bool is an int to Python, never to SQL
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


@dataclass(frozen=True)
class Pred:
    """``column op value``; ``negated`` is SQL's ``NOT`` (still false on nulls)."""

    column: str
    op: str
    value: Any = None  # a literal; a tuple of them for "in"
    negated: bool = False

    @classmethod
    def make(cls, schema: pa.Schema, column: str, op: str, value: Any = None,
             negated: bool = False) -> Pred | None:
        """The predicate, or ``None`` if it cannot be applied exactly here."""
        if op not in OPS or column not in schema.names or "`" in column:
            return None
        kind = pushable_type(schema.field(column).type)
        if kind is None:
            return None
        if op in ("is_null", "is_not_null"):
            # NOT (c IS NULL) is c IS NOT NULL: turn it round so nothing is negated.
            if negated:
                op = "is_not_null" if op == "is_null" else "is_null"
            return cls(column, op)
        values = tuple(value) if op == "in" else (value,)
        if not values or not all(_literal_ok(v, kind) for v in values):
            return None  # nulls in the literal, or a literal of another type
        return cls(column, op, values if op == "in" else value, negated)

    def sql(self) -> str:
        """The predicate in Lance's filter syntax."""
        col = f"`{self.column}`"
        if self.op == "is_null":
            return f"{col} IS NULL"
        if self.op == "is_not_null":
            return f"{col} IS NOT NULL"
        if self.op == "in":
            body = f"{col} IN ({', '.join(_sql_literal(v) for v in self.value)})"
        else:
            body = f"{col} {_SQL_OPS[self.op]} {_sql_literal(self.value)}"
        return f"({col} IS NOT NULL AND NOT ({body}))" if self.negated else f"({body})"

    def expression(self) -> pc.Expression:
        """The predicate as an Arrow expression (what :meth:`sql` selects, on Arrow rows)."""
        f = pc.field(self.column)
        if self.op == "is_null":
            return f.is_null()
        if self.op == "is_not_null":
            return f.is_valid()
        if self.op == "in":
            # is_in answers false, not null, for a null: the is_valid keeps NOT exact.
            body = f.isin(pa.array(self.value))
            return f.is_valid() & (~body if self.negated else body)
        body = {"eq": f == self.value, "gt": f > self.value, "ge": f >= self.value,
                "lt": f < self.value, "le": f <= self.value}[self.op]
        return f.is_valid() & ~body if self.negated else body


def _sql_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def lance_filter(preds: Sequence[Pred]) -> str | None:
    """The conjunction as one Lance filter string (``None`` for none)."""
    return " AND ".join(p.sql() for p in preds) or None


def arrow_filter(preds: Sequence[Pred]) -> pc.Expression | None:
    """The conjunction as one Arrow expression (``None`` for none)."""
    out = None
    for p in preds:
        out = p.expression() if out is None else out & p.expression()
    return out


def apply(batch: pa.RecordBatch | pa.Table, expr: pc.Expression | None):
    """``batch`` without the rows ``expr`` does not select (a null selects none)."""
    return batch if expr is None or not batch.num_rows else batch.filter(expr)
