"""How output looks: sizes, times, short ids, JSON, and tables that fit 80 columns."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from datetime import time as dtime
from decimal import Decimal

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text


def new_console() -> Console:
    """A console sized at call time (rich reads COLUMNS when not on a terminal)."""
    return Console(highlight=False)


def human_size(n: int | None) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units)."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def local_time(ms: int | None) -> str:
    """Epoch milliseconds as local ISO-8601 to the second (``-`` when unknown)."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000).isoformat(timespec="seconds")


def short(shard_id: str) -> str:
    """The 8-character form of an id used in tables (``--json`` has the full id)."""
    return shard_id[:8]


def short_ids(ids: list[str]) -> dict[str, str]:
    """Each id cut to the shortest common length (8 or more) that keeps them distinct."""
    n = 8
    while n < 36 and len({i[:n] for i in ids}) < len(set(ids)):
        n += 1
    return {i: i[:n] for i in ids}


def json_default(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (datetime, date, dtime)):
        return value.isoformat()
    if isinstance(value, (Decimal, timedelta)):
        return str(value)
    return str(value)


def emit_json(body: object) -> None:
    click.echo(json.dumps(body, indent=2, default=json_default))


def format_value(value: object) -> str:
    """A cell value as people read it (not a Python repr)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    if isinstance(value, (datetime, date, dtime)):
        return value.isoformat()
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=json_default)
    return str(value)


def new_table(*columns: str, min_widths: dict[str, int] | None = None) -> Table:
    """A compact table: no side borders, values fold instead of being cut."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1),
                  collapse_padding=True)
    for name in columns:
        table.add_column(name, overflow="fold", min_width=(min_widths or {}).get(name))
    return table


def cells(*values: object) -> list[Text]:
    """Cells as plain text: brackets in data are never taken for rich markup."""
    return [Text(v if isinstance(v, str) else format_value(v)) for v in values]
