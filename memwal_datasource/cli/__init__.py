"""``memwal``: inspect a table's MemWAL: shards, manifests, the WAL, commit records.

Every command but ``compact``, ``gc`` and ``maintain`` is read-only: none claims an epoch or
writes a file; those two run the fenced maintenance steps (``--dry-run`` shows
what they would do). Storage
options come from ``--storage key=value`` (Lance names, e.g. ``aws_endpoint``)
and, for S3, the standard AWS environment variables. Every command takes
``--json`` for machine-readable output with stable keys and raw numbers;
without it, tables fit an 80-column terminal or pipe (values wrap, never
``…``), sizes are human-readable and times are local ISO-8601.

Errors are one line on stderr and an exit code (see :data:`EXIT_CODES`);
storage secrets never appear in any output.
"""

from __future__ import annotations

import click

from .errors import (
    EPILOG,
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_RETRY,
    EXIT_USAGE,
    CliError,
    CliGroup,
)
from .inspect_cmds import commits, inspect, manifest, shards
from .maintain import compact, gc, maintain
from .options_cmd import options
from .params import TABLE_MARKERS, json_opt, open_table, resolve_shard, storage_opt
from .render import format_value, human_size, local_time, short, short_ids
from .survey import (
    SENTINEL_SCAN_LIMIT,
    ShardInfo,
    StoredLog,
    record_json,
    shard_info,
    status_name,
    stored_records,
)
from .wal_tail import tail

__all__ = [
    "EXIT_CODES", "EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_RETRY", "EXIT_USAGE",
    "SENTINEL_SCAN_LIMIT",
    "TABLE_MARKERS", "CliError", "ShardInfo", "StoredLog", "format_value", "human_size",
    "json_opt", "local_time", "main", "open_table", "record_json", "resolve_shard", "run",
    "shard_info", "short", "short_ids", "status_name", "storage_opt", "stored_records",
]


@click.group(cls=CliGroup, epilog=EPILOG)
@click.version_option(package_name="memwal_datasource")
def main() -> None:
    """Inspect a Lance table's MemWAL; compact and collect it (compact, gc, maintain).

    PATH is the table's root: a local path, file://..., s3://, gs://bucket/prefix or
    az://container/prefix.
    SHARD is a shard UUID or its first characters as tables print them.
    """


for _command in (shards, manifest, tail, commits, inspect, compact, gc, maintain, options):
    main.add_command(_command)


def run() -> None:
    """Console-script entry point (errors are already one line with an exit code).

    The CLI is an application, so it configures logging: the library's warnings
    (a damaged hint file skipped, ...) go to stderr as ``memwal: WARNING: ...``.
    """
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("memwal: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    main(prog_name="memwal")
