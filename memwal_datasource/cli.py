"""``memwal``: inspect shards, read manifests, tail the WAL, list commits.

Every command is read-only: none claims an epoch or writes a file.
Storage options come from ``--storage key=value`` (Lance names, e.g.
``aws_endpoint``) and, for S3, the standard AWS environment variables.
"""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.table import Table

from .commit import CommitLog, CommittedView
from .errors import MemWalError
from .manifest import ManifestStore, list_shards
from .options import redact
from .store import open_store
from .wal import WalTailer


def _console() -> Console:
    """A console sized at call time (rich reads COLUMNS when not on a terminal)."""
    return Console()


def _storage(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"'{pair}' is not key=value", param_hint="--storage")
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    return out


storage_opt = click.option("--storage", "-s", multiple=True, metavar="KEY=VALUE",
                           help="storage option (Lance names, e.g. aws_endpoint=http://...)")


@click.group()
@click.version_option(package_name="memwal_datasource")
def main() -> None:
    """Inspect a Lance table's MemWAL (read-only)."""


@main.command()
@click.argument("uri")
@storage_opt
def shards(uri: str, storage: tuple[str, ...]) -> None:
    """List shards with their epoch, WAL tip and SSTables."""
    store = open_store(uri, _storage(storage))
    view = CommittedView(CommitLog(store).visible())
    table = Table("manifest v", "epoch", "status", "WAL first..tip", "committed", "sstables")
    table.add_column("shard", no_wrap=True, min_width=36)
    for shard in list_shards(store):
        m = ManifestStore(store, shard).latest()
        tailer = WalTailer(store, shard)
        committed = sum(r.last - r.first + 1 for r in view.ranges(shard))
        table.add_row(str(m.version if m else "-"), str(m.writer_epoch if m else "-"),
                      "SEALED" if m and m.sealed else "ACTIVE",
                      f"{tailer.first_position()}..{tailer.next_position()}",
                      f"{committed} entries", str(len(m.sstables) if m else 0), shard)
    _console().print(table)


@main.command()
@click.argument("uri")
@click.argument("shard")
@storage_opt
def manifest(uri: str, shard: str, storage: tuple[str, ...]) -> None:
    """Print a shard's latest manifest as JSON."""
    m = ManifestStore(open_store(uri, _storage(storage)), shard).latest()
    if m is None:
        raise click.ClickException(f"shard {shard} has no manifest under {uri}")
    body = {k: v for k, v in m.__dict__.items() if k not in ("raw", "claim_nonce")}
    body["sstables"] = [s.__dict__ for s in m.sstables]
    body["shard_field_entries"] = [(f, v.hex()) for f, v in m.shard_field_entries]
    _console().print_json(json.dumps(body))


@main.command()
@click.argument("uri")
@click.argument("shard")
@click.option("--from", "start", type=int, default=None, help="first position (default: first)")
@click.option("--rows", type=int, default=3, help="rows to show per entry")
@click.option("--follow", "-f", is_flag=True, help="keep polling for new entries")
@click.option("--interval", type=float, default=1.0, help="poll interval with --follow (s)")
@storage_opt
def tail(uri: str, shard: str, start: int | None, rows: int, follow: bool, interval: float,
         storage: tuple[str, ...]) -> None:
    """Print WAL entries of a shard (sentinels included, marked)."""
    tailer = WalTailer(open_store(uri, _storage(storage)), shard)
    pos = start if start is not None else tailer.first_position()
    while True:
        for p, entry in tailer.entries(pos, include_sentinels=True):
            kind = "sentinel" if entry.is_sentinel else f"{entry.num_rows} rows"
            gen = f" generation={entry.generation}" if entry.generation is not None else ""
            _console().print(f"[bold]{p}[/bold] epoch={entry.writer_epoch}{gen} {kind} "
                          f"{entry.nbytes} bytes")
            if entry.batches and rows:
                import pyarrow as pa

                _console().print(pa.Table.from_batches(entry.batches).slice(0, rows).to_pylist())
            pos = p + 1
        if not follow:
            return
        time.sleep(interval)  # polling the object store for new entries


@main.command()
@click.argument("uri")
@storage_opt
def commits(uri: str, storage: tuple[str, ...]) -> None:
    """List commit records (what read_committed readers see)."""
    table = Table("seq", "kind", "job", "stream batch", "ranges", "rows")
    for rec in CommitLog(open_store(uri, _storage(storage))).records():
        stream = f"{rec.query_id[:8]}:{rec.batch_id}" if rec.query_id else ""
        table.add_row(str(rec.sequence), rec.kind, rec.job_id[:12], stream,
                      str(len(rec.ranges)), str(sum(r.rows for r in rec.ranges)))
    _console().print(table)


@main.command()
@click.argument("uri")
@storage_opt
def compact(uri: str, storage: tuple[str, ...]) -> None:
    """Not available: explains why (no safe compaction API in pylance 14)."""
    raise click.ClickException(
        "compaction must update the MemWAL index's compacted_sstables atomically with the "
        "base-table commit; pylance 14 exposes no API for that, and a merge_insert without it "
        f"would make readers count SSTable rows twice. Nothing was changed at {uri} "
        f"(storage {redact(_storage(storage))})."
    )


def run() -> None:
    """Entry point with clean errors instead of tracebacks."""
    try:
        main(standalone_mode=True)
    except MemWalError as exc:
        raise SystemExit(f"memwal: {exc}") from None
