"""``memwal tail``: a shard's WAL entries, once or following new ones."""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.text import Text

from ..format.memwal import WalEntry
from ..shard.wal import WalTailer
from .errors import EPILOG, EXIT_USAGE, CliError
from .params import json_opt, open_table, resolve_shard, storage_opt
from .render import cells, format_value, human_size, json_default, new_console, new_table


def _entry_json(position: int, entry: WalEntry, rows: int) -> dict:
    sample = []
    if entry.batches and rows:
        import pyarrow as pa

        sample = pa.Table.from_batches(entry.batches).slice(0, rows).to_pylist()
    return {"position": position, "writer_epoch": entry.writer_epoch,
            "generation": entry.generation, "sentinel": entry.is_sentinel,
            "rows": entry.num_rows, "bytes": entry.nbytes, "sample": sample}


def _print_entry(console: Console, position: int, entry: WalEntry, rows: int) -> None:
    gen = f"  generation {entry.generation}" if entry.generation is not None else ""
    kind = "fence sentinel" if entry.is_sentinel else f"{entry.num_rows} rows"
    head = Text(f"#{position}", style="bold")
    head.append(f"  epoch {entry.writer_epoch}{gen}  {kind}  {human_size(entry.nbytes)}")
    console.print(head)
    if not entry.batches or not rows or not entry.num_rows:
        return
    import pyarrow as pa

    data = pa.Table.from_batches(entry.batches)
    table = new_table(*data.column_names)
    for row in data.slice(0, rows).to_pylist():
        table.add_row(*cells(*[format_value(v) for v in row.values()]))
    console.print(table)
    if data.num_rows > rows:
        console.print(Text(f"({data.num_rows - rows} more rows; --rows N shows more)"))


@click.command(epilog=EPILOG, short_help="Print a shard's last WAL entries, like tail.")
@click.argument("uri", metavar="PATH")
@click.argument("shard")
@click.option("--from", "start", type=click.IntRange(min=1), default=None,
              help="first position (default: the last --entries entries)")
@click.option("--entries", "-n", "last", type=click.IntRange(min=1), default=10,
              show_default=True, help="start this many entries before the WAL tip, like tail")
@click.option("--from-start", is_flag=True, help="start at the first entry in the WAL")
@click.option("--rows", type=click.IntRange(min=0), default=3, show_default=True,
              help="rows to show per entry")
@click.option("--follow", "-f", is_flag=True, help="keep polling for new entries (Ctrl-C stops)")
@click.option("--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="poll interval with --follow (seconds)")
@json_opt
@storage_opt
def tail(uri: str, shard: str, start: int | None, last: int, from_start: bool, rows: int,
         follow: bool, interval: float, as_json: bool, storage: dict[str, str]) -> None:
    """Print a shard's last WAL entries (fence sentinels marked), like tail.

    By default the last 10 entries (--entries N); --from-start prints the whole
    WAL and --from P starts at position P.

    With --json, one JSON object per line per entry (position, writer_epoch,
    generation, sentinel, rows, bytes, sample).
    """
    store = open_table(uri, storage)
    shard = resolve_shard(store, uri, shard)
    tailer = WalTailer(store, shard)
    if start is not None and from_start:
        raise CliError("give --from or --from-start, not both", EXIT_USAGE)
    first = tailer.first_position()
    if start is not None:
        pos = start
    elif from_start:
        pos = first
    else:
        pos = max(first, tailer.next_position() - last)
    console = new_console()
    shown = 0
    try:
        while True:
            for p, entry in tailer.entries(pos, include_sentinels=True):
                if as_json:
                    click.echo(json.dumps(_entry_json(p, entry, rows), default=json_default))
                else:
                    _print_entry(console, p, entry, rows)
                shown += 1
                pos = p + 1
            if not follow:
                break
            time.sleep(interval)  # polling the object store for new entries
    except KeyboardInterrupt:
        return
    if not shown and not as_json:
        console.print(Text(f"no WAL entries at or after position {pos} "
                           f"(the WAL tip is {tailer.next_position()})"))
