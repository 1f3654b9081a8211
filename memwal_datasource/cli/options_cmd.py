"""``memwal options``: the Spark data source's options, from their one declaration."""

from __future__ import annotations

import click
from rich.text import Text

from ..options import STORAGE_PREFIX
from .errors import EPILOG, EXIT_USAGE, CliError
from .params import json_opt
from .render import cells, emit_json, new_console, new_table

# Scopes as typed on a command line; the test checks they are option_table's scopes.
SCOPE_ARGS = ("write", "stream-write", "read", "stream-read")


@click.command(epilog=EPILOG, short_help="List the Spark data source's options.")
@click.option("--scope", metavar="SCOPE", default=None,
              help=f"only the options one scope accepts: {', '.join(SCOPE_ARGS)}")
@click.option("--markdown", "as_markdown", is_flag=True,
              help="the Markdown reference docs/options.md quotes")
@json_opt
def options(scope: str | None, as_markdown: bool, as_json: bool) -> None:
    """List the Spark data source's options: name, value, default, scopes.

    Spark lower-cases option names, so any case works. Storage options are
    passed as storage.<name> with Lance's names (e.g. storage.aws_endpoint).
    """
    # Imported here: only this command needs the Spark layer's option table.
    from ..spark import option_table

    if as_markdown and (as_json or scope is not None):
        raise CliError("--markdown prints the whole reference: give it without --json or "
                       "--scope", EXIT_USAGE)
    if as_markdown:
        click.echo(option_table.markdown())
        return
    rows = list(option_table.OPTIONS)
    all_scopes = option_table.WRITES + option_table.READS
    if scope is not None:
        wanted = " ".join(scope.lower().replace("-", " ").replace("_", " ").split())
        if wanted not in all_scopes:
            raise CliError(f"unknown scope '{scope}'; give one of: {', '.join(SCOPE_ARGS)}",
                           EXIT_USAGE)
        rows = [o for o in rows if wanted in o.scopes]
    if as_json:
        emit_json([{"name": o.name, "kind": o.kind, "default": o.default or None,
                    "scopes": list(o.scopes), "description": o.doc} for o in rows])
        return
    table = new_table("option", "value", "default", "scopes", "meaning")
    # No padding (the box's divider is one space) and caps that leave the meaning a third
    # of 80 columns; the longest names and defaults fold onto a second line.
    table.padding = 0
    for column, cap in zip(table.columns[:4], (19, 16, 9, 6), strict=True):
        column.max_width = cap
    groups = {frozenset(all_scopes): "all", frozenset(option_table.WRITES): "writes",
              frozenset(option_table.READS): "reads"}
    for o in rows:
        scopes = groups.get(frozenset(o.scopes), ", ".join(o.scopes))
        # "a|b" kinds get spaces so the column can wrap between the alternatives.
        table.add_row(*cells(o.name, o.kind.replace("|", " | "), o.default or "-", scopes,
                             o.doc))
    console = new_console()
    console.print(table)
    console.print(Text(f"writes: {', '.join(option_table.WRITES)}; reads: "
                       f"{', '.join(option_table.READS)}"))
    console.print(Text(f"{STORAGE_PREFIX}<name> (all scopes): a storage option with Lance's "
                       "names (e.g. storage.aws_endpoint); credentials are never logged"))
