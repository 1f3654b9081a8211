"""``memwal``: inspect a table's MemWAL: shards, manifests, the WAL, commit records.

Every command is read-only: none claims an epoch or writes a file. Storage
options come from ``--storage key=value`` (Lance names, e.g. ``aws_endpoint``)
and, for S3, the standard AWS environment variables. Every command takes
``--json`` for machine-readable output with stable keys and raw numbers;
without it, tables fit an 80-column terminal or pipe (values wrap, never
``…``), sizes are human-readable and times are local ISO-8601.

Errors are one line on stderr and an exit code (see :data:`EXIT_CODES`);
storage secrets never appear in any output.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta
from datetime import time as dtime
from decimal import Decimal

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..commit import (
    COMMITS_DIR,
    OVERWRITE,
    Checkpoint,
    CommitLog,
    CommitRecord,
    CommittedRange,
)
from ..errors import (
    ConfigError,
    MemWalError,
    StoreAuthError,
    StoreError,
    StoreNotFoundError,
    UnsupportedStoreError,
)
from ..format import MEM_WAL_DIR, WalEntry
from ..manifest import ManifestStore, list_shards
from ..options import lance_storage_options, secret_values
from ..store import LocalStore, ObjectStore, open_store
from ..wal import WalTailer

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_ERROR: "runtime or storage error (store unreachable, credentials, damaged file)",
    EXIT_USAGE: "usage error (bad argument, option, shard id or URI)",
    EXIT_NOT_FOUND: "not found: no memwal table at the path, or no such shard",
}
# What makes a directory a memwal table: a Lance dataset, or a MemWAL of ours.
TABLE_MARKERS = ("_versions", MEM_WAL_DIR, COMMITS_DIR)
# Uncommitted WAL positions read per shard to tell fence sentinels from data.
SENTINEL_SCAN_LIMIT = 256
_SECRETS_KEY = "memwal.secrets"


class CliError(click.ClickException):
    """A one-line error with its exit code (see :data:`EXIT_CODES`)."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR):
        super().__init__(" ".join(_scrub(message).split()))
        self.exit_code = exit_code


def _scrub(text: str) -> str:
    """``text`` with every secret given via ``--storage`` replaced by ``***``."""
    ctx = click.get_current_context(silent=True)
    secrets = ctx.meta.get(_SECRETS_KEY, ()) if ctx is not None else ()
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _translate(exc: Exception) -> CliError:
    """Map an exception to a one-line :class:`CliError` with its exit code."""
    if isinstance(exc, (ConfigError, UnsupportedStoreError)):
        return CliError(str(exc), EXIT_USAGE)
    if isinstance(exc, (StoreNotFoundError, FileNotFoundError)):
        return CliError(f"not found: {exc}", EXIT_NOT_FOUND)
    if isinstance(exc, StoreAuthError):
        return CliError(str(exc))
    if isinstance(exc, (MemWalError, OSError)):
        return CliError(f"{exc}; check the path, --storage options and that the store is "
                        "reachable")
    return CliError(f"internal error ({type(exc).__name__}: {exc}); set MEMWAL_DEBUG=1 for a "
                    "traceback and report it")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


class _Group(click.Group):
    """Turns every error a command raises into one line and a documented exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            _silence_stdout()  # the reader (e.g. `| head`) has seen enough
            ctx.exit(EXIT_OK)
        except Exception as exc:  # noqa: BLE001 - every error becomes one line
            if os.environ.get("MEMWAL_DEBUG"):
                raise
            raise _translate(exc) from None


def _console() -> Console:
    """A console sized at call time (rich reads COLUMNS when not on a terminal)."""
    return Console(highlight=False)


def _storage(ctx: click.Context, _param: click.Parameter,
             pairs: tuple[str, ...]) -> dict[str, str]:
    """Parse ``--storage`` pairs; remember secret values so no output shows them."""
    out: dict[str, str] = {}
    for i, pair in enumerate(pairs, 1):
        if "=" not in pair:
            # The argument itself is not echoed: it may be a mistyped secret.
            raise CliError(f"--storage #{i} is not KEY=VALUE (e.g. "
                           "aws_endpoint=http://127.0.0.1:9000)", EXIT_USAGE)
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    secrets = secret_values(out)
    ctx.meta[_SECRETS_KEY] = [*ctx.meta.get(_SECRETS_KEY, []), *secrets]
    return out


storage_opt = click.option("--storage", "-s", multiple=True, metavar="KEY=VALUE",
                           callback=_storage,
                           help="storage option (Lance names, e.g. aws_endpoint=http://...)")
json_opt = click.option("--json", "as_json", is_flag=True,
                        help="machine-readable JSON (stable keys, raw numbers)")


def open_table(uri: str, storage: dict[str, str]) -> ObjectStore:
    """The store of the memwal table at ``uri``, or a one-line error saying what is wrong.

    A memwal table is a directory holding a Lance dataset (``_versions/``) or a
    MemWAL (``_mem_wal/`` or ``_memwal_commits/``).
    """
    try:
        store = open_store(uri, storage)
    except (ConfigError, StoreError) as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    hint = "give the table's root directory (the one holding _versions/ or _mem_wal/)"
    if isinstance(store, LocalStore):
        if not os.path.exists(store.root):
            raise CliError(f"no memwal table at {uri}: the path does not exist; {hint}",
                           EXIT_NOT_FOUND)
        if not os.path.isdir(store.root):
            raise CliError(f"{uri} is a file, not a memwal table; {hint}", EXIT_NOT_FOUND)
    found = set(store.list_dirs(""))
    if not found & set(TABLE_MARKERS):
        markers = ", ".join(f"{m}/" for m in TABLE_MARKERS)
        raise CliError(f"{uri} is not a memwal table (no {markers} under it); {hint}",
                       EXIT_NOT_FOUND)
    return store


def resolve_shard(store: ObjectStore, uri: str, text: str) -> str:
    """The full id of shard ``text`` (a UUID, or a unique prefix as tables print it)."""
    want = text.strip().lower()
    listing = f"`memwal shards {uri}` lists the shards"
    try:
        full: str | None = str(uuid.UUID(want))
    except ValueError:
        full = None
        if not re.fullmatch(r"[0-9a-f-]{1,36}", want):
            raise CliError(f"'{text}' is not a shard id: give a shard UUID or its first "
                           f"characters; {listing}", EXIT_USAGE) from None
    shards = list_shards(store)
    if full is not None:
        if full not in shards:
            raise CliError(f"shard {full} not found in {uri}; {listing}", EXIT_NOT_FOUND)
        return full
    matches = [s for s in shards if s.startswith(want)]
    if not matches:
        raise CliError(f"no shard starting with '{want}' in {uri}; {listing}", EXIT_NOT_FOUND)
    if len(matches) > 1:
        raise CliError(f"'{want}' matches {len(matches)} shards in {uri}; give more "
                       "characters of the id", EXIT_USAGE)
    return matches[0]


# --- formatting -------------------------------------------------------------

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


def _json_default(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (datetime, date, dtime)):
        return value.isoformat()
    if isinstance(value, (Decimal, timedelta)):
        return str(value)
    return str(value)


def _emit_json(body: object) -> None:
    click.echo(json.dumps(body, indent=2, default=_json_default))


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
        return json.dumps(value, default=_json_default)
    return str(value)


def _table(*columns: str, min_widths: dict[str, int] | None = None) -> Table:
    """A compact table: no side borders, values fold instead of being cut."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1),
                  collapse_padding=True)
    for name in columns:
        table.add_column(name, overflow="fold", min_width=(min_widths or {}).get(name))
    return table


def _cells(*values: object) -> list[Text]:
    """Cells as plain text: brackets in data are never taken for rich markup."""
    return [Text(v if isinstance(v, str) else format_value(v)) for v in values]


# --- what the commands report ----------------------------------------------

def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _gaps(covered: list[tuple[int, int]], first: int, last: int) -> Iterable[int]:
    """Positions in ``first..last`` outside ``covered`` (merged, sorted)."""
    pos = first
    for lo, hi in covered:
        if hi < pos:
            continue
        yield from range(pos, min(lo, last + 1))
        pos = max(pos, hi + 1)
        if pos > last:
            return
    yield from range(pos, last + 1)


@dataclass
class ShardInfo:
    """One shard as the CLI reports it (``--json`` emits these keys)."""

    shard_id: str
    status: str
    writer_epoch: int | None
    manifest_version: int | None
    wal_first: int
    wal_last: int
    wal_entries: int
    committed_entries: int
    visible_entries: int
    uncommitted_entries: int
    sentinel_entries: int
    uncommitted_exact: bool
    committed_rows: int
    committed_bytes: int
    sstables: int

    def wal_span(self) -> str:
        """``first..last`` of the existing positions, ``-`` when the WAL is empty."""
        return f"{self.wal_first}..{self.wal_last}" if self.wal_entries else "-"


def status_name(sealed: bool) -> str:
    """A manifest status as people read it."""
    return "SEALED" if sealed else "ACTIVE"


def _clipped(spans: list[tuple[int, int]], first: int, last: int) -> int:
    """How many positions of ``first..last`` the merged ``spans`` cover."""
    return sum(max(0, min(hi, last) - max(lo, first) + 1) for lo, hi in spans)


def shard_info(store: ObjectStore, shard: str, ranges: list[tuple[int, CommittedRange]],
               visible_from: int) -> ShardInfo:
    """Manifest, WAL range and commit coverage of one shard.

    ``ranges`` are ``(record sequence, range)`` of every known commit;
    ``visible_from`` is the sequence of the last overwrite record (0 if none):
    records before it are committed but hidden. Entry counts are of the WAL
    entries stored now (committed + uncommitted + sentinels = entries, when
    exact). Positions no record covers are read (up to
    :data:`SENTINEL_SCAN_LIMIT`) to tell fence sentinels, which carry no rows,
    from uncommitted data entries.
    """
    m = ManifestStore(store, shard).latest()
    tailer = WalTailer(store, shard)
    first, nxt = tailer.first_position(), tailer.next_position()
    mine = [(seq, r) for seq, r in ranges if r.shard_id == shard]
    covered = _merge((r.first, r.last) for _, r in mine)
    visible = _merge((r.first, r.last) for seq, r in mine if seq >= visible_from)
    sentinels = uncommitted = scanned = 0
    exact = True
    for pos in _gaps(covered, first, nxt - 1):
        if scanned >= SENTINEL_SCAN_LIMIT:
            exact = False
            uncommitted += 1
            continue
        scanned += 1
        entry = tailer.read(pos)
        if entry is not None and entry.is_sentinel:
            sentinels += 1
        else:
            uncommitted += 1
    return ShardInfo(
        shard_id=shard, status=status_name(bool(m and m.sealed)),
        writer_epoch=m.writer_epoch if m else None, manifest_version=m.version if m else None,
        wal_first=first, wal_last=nxt - 1, wal_entries=max(0, nxt - first),
        committed_entries=_clipped(covered, first, nxt - 1),
        visible_entries=_clipped(visible, first, nxt - 1),
        uncommitted_entries=uncommitted, sentinel_entries=sentinels, uncommitted_exact=exact,
        committed_rows=sum(r.rows for _, r in mine),
        committed_bytes=sum(r.bytes for _, r in mine),
        sstables=len(m.sstables) if m else 0)


@dataclass
class StoredLog:
    """The commit records still stored, and the checkpoint standing for collected ones."""

    records: list[CommitRecord]
    checkpoint: Checkpoint | None  # set when a garbage collection removed records
    first: int  # sequence of the first stored record

    @property
    def collected(self) -> int:
        """Records ``1..collected`` were garbage-collected (0: none)."""
        return self.first - 1


def stored_records(log: CommitLog) -> StoredLog:
    """Every stored commit record, from the first one a garbage collection kept."""
    first = log.first_stored()
    ck = log.latest_checkpoint() if first > 1 else None
    return StoredLog(list(log.records(after=first - 1)), ck, first)


def _survey(store: ObjectStore) -> tuple[StoredLog, list[ShardInfo]]:
    log = stored_records(CommitLog(store))
    ranges = [(rec.sequence, r) for rec in log.records for r in rec.ranges]
    visible_from = max((r.sequence for r in log.records if r.kind == OVERWRITE), default=0)
    if log.checkpoint is not None:  # what the collected records made visible
        ranges += [(log.checkpoint.sequence, r) for r in log.checkpoint.visible]
        visible_from = max(visible_from, log.checkpoint.last_overwrite or 0)
    return log, [shard_info(store, s, ranges, visible_from) for s in list_shards(store)]


def _shards_table(infos: list[ShardInfo], lag: bool) -> Table:
    cols = ["shard", "status", "epoch", "WAL", "committed"]
    cols += ["uncommitted"] if lag else []
    cols += ["size", "sst"]
    table = _table(*cols, min_widths={"shard": 8, "status": 6})
    names = short_ids([s.shard_id for s in infos])
    for s in infos:
        row: list[object] = [names[s.shard_id], s.status,
                             "-" if s.writer_epoch is None else str(s.writer_epoch),
                             s.wal_span(), str(s.committed_entries)]
        if lag:
            row.append(f"{s.uncommitted_entries}{'' if s.uncommitted_exact else '+'}")
        row += [human_size(s.committed_bytes), str(s.sstables)]
        table.add_row(*_cells(*row))
    return table


def record_json(rec: CommitRecord) -> dict:
    """A commit record's summary with stable keys."""
    return {"sequence": rec.sequence, "kind": rec.kind, "created_ms": rec.created_ms,
            "job_id": rec.job_id, "writer_group": rec.writer_group,
            "query_id": rec.query_id, "batch_id": rec.batch_id,
            "txn_app_id": rec.txn_app_id, "txn_version": rec.txn_version,
            "ranges": len(rec.ranges), "shards": len({r.shard_id for r in rec.ranges}),
            "rows": sum(r.rows for r in rec.ranges), "bytes": sum(r.bytes for r in rec.ranges)}


# --- commands ---------------------------------------------------------------

EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())


@click.group(cls=_Group, epilog=EPILOG)
@click.version_option(package_name="memwal_datasource")
def main() -> None:
    """Inspect a Lance table's MemWAL (read-only).

    PATH is the table's root: a local path, file://... or s3://bucket/prefix.
    SHARD is a shard UUID or its first characters as tables print them.
    """


@main.command(epilog=EPILOG)
@click.argument("uri", metavar="PATH")
@json_opt
@storage_opt
def shards(uri: str, as_json: bool, storage: dict[str, str]) -> None:
    """List shards: status, epoch, WAL positions, commits, SSTables."""
    store = open_table(uri, storage)
    _, infos = _survey(store)
    if as_json:
        _emit_json({"table": uri, "shards": [asdict(s) for s in infos]})
        return
    console = _console()
    if not infos:
        console.print(Text(f"{uri}: no shards yet (nothing has been written to the MemWAL)"))
        return
    console.print(_shards_table(infos, lag=False))


@main.command(epilog=EPILOG)
@click.argument("uri", metavar="PATH")
@click.argument("shard")
@json_opt
@storage_opt
def manifest(uri: str, shard: str, as_json: bool, storage: dict[str, str]) -> None:
    """Show a shard's latest manifest."""
    store = open_table(uri, storage)
    shard = resolve_shard(store, uri, shard)
    m = ManifestStore(store, shard).latest()
    if m is None:
        raise CliError(f"shard {shard} has no manifest under {uri} (its writer never "
                       "claimed it)", EXIT_NOT_FOUND)
    body = {"shard_id": m.shard_id, "version": m.version, "writer_epoch": m.writer_epoch,
            "status": status_name(m.sealed),
            "replay_after_wal_entry_position": m.replay_after_wal_entry_position,
            "wal_entry_position_last_seen": m.wal_entry_position_last_seen,
            "current_generation": m.current_generation, "shard_spec_id": m.shard_spec_id,
            "sstables": [asdict(s) for s in m.sstables],
            "shard_field_entries": [{"field_id": f, "value_hex": v.hex()}
                                    for f, v in m.shard_field_entries]}
    if as_json:
        _emit_json(body)
        return
    table = _table("field", "value", min_widths={"field": 12})
    for key, value in body.items():
        if key in ("sstables", "shard_field_entries"):
            continue
        table.add_row(*_cells(key.replace("_", " "), value))
    for s in m.sstables:
        table.add_row(*_cells(f"sstable {s.generation}",
                              f"{s.path} ({s.physical_rows} rows, "
                              f"{human_size(s.in_memory_bytes)} in memory)"))
    for entry in body["shard_field_entries"]:
        table.add_row(*_cells(f"shard field {entry['field_id']}", entry["value_hex"]))
    _console().print(table)


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
    table = _table(*data.column_names)
    for row in data.slice(0, rows).to_pylist():
        table.add_row(*_cells(*[format_value(v) for v in row.values()]))
    console.print(table)
    if data.num_rows > rows:
        console.print(Text(f"({data.num_rows - rows} more rows; --rows N shows more)"))


@main.command(epilog=EPILOG)
@click.argument("uri", metavar="PATH")
@click.argument("shard")
@click.option("--from", "start", type=click.IntRange(min=1), default=None,
              help="first position (default: the first in the WAL)")
@click.option("--rows", type=click.IntRange(min=0), default=3, show_default=True,
              help="rows to show per entry")
@click.option("--follow", "-f", is_flag=True, help="keep polling for new entries (Ctrl-C stops)")
@click.option("--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="poll interval with --follow (seconds)")
@json_opt
@storage_opt
def tail(uri: str, shard: str, start: int | None, rows: int, follow: bool, interval: float,
         as_json: bool, storage: dict[str, str]) -> None:
    """Print a shard's WAL entries (fence sentinels marked).

    With --json, one JSON object per line per entry (position, writer_epoch,
    generation, sentinel, rows, bytes, sample).
    """
    store = open_table(uri, storage)
    shard = resolve_shard(store, uri, shard)
    tailer = WalTailer(store, shard)
    pos = start if start is not None else tailer.first_position()
    console = _console()
    shown = 0
    try:
        while True:
            for p, entry in tailer.entries(pos, include_sentinels=True):
                if as_json:
                    click.echo(json.dumps(_entry_json(p, entry, rows), default=_json_default))
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


@main.command(epilog=EPILOG)
@click.argument("uri", metavar="PATH")
@json_opt
@storage_opt
def commits(uri: str, as_json: bool, storage: dict[str, str]) -> None:
    """List commit records (what committed readers see)."""
    store = open_table(uri, storage)
    log = stored_records(CommitLog(store))
    records = log.records
    if as_json:
        _emit_json({"table": uri, "collected_through": log.collected,
                    "checkpoint": log.checkpoint.sequence if log.checkpoint else None,
                    "commits": [record_json(r) for r in records]})
        return
    console = _console()
    if log.collected:
        console.print(Text(f"records 1..{log.collected} were garbage-collected (checkpoint "
                           f"{log.checkpoint.sequence if log.checkpoint else '-'} stands for "
                           "them)"))
    if not records:
        console.print(Text(f"{uri}: no commit records yet (no job has committed)"))
        return
    table = _table("seq", "kind", "created", "job", "tasks", "rows", "size",
                   min_widths={"created": 19, "kind": 6})
    for rec in records:
        job = (f"{short(rec.query_id)}#{rec.batch_id}" if rec.query_id else short(rec.job_id))
        info = record_json(rec)
        table.add_row(*_cells(str(rec.sequence), rec.kind, local_time(rec.created_ms), job,
                              str(info["ranges"]), f"{info['rows']:,}",
                              human_size(info["bytes"])))
    console.print(table)


def _compaction_summary(uri: str, storage: dict[str, str], store: ObjectStore,
                        lance_info: dict | None) -> dict | None:
    """How far compaction into the base table got (``None`` without a base table)."""
    if lance_info is None:
        return None
    from ..table import MemWalTable

    try:
        snap = MemWalTable(uri, storage, store=store).snapshot(lance_info["version"])
    except MemWalError:
        return None
    return {"base_version": snap.base_version, "round": snap.compacted_round,
            "compacted_through": snap.compacted_seq,
            "pending_records": max(0, snap.last_seq - snap.compacted_seq)}


def _lance_summary(uri: str, storage: dict[str, str]) -> dict | None:
    """Version, columns and row count of the Lance dataset, or ``None`` if unreadable."""
    try:
        import lance

        from ..table import primary_key_of

        ds = lance.dataset(uri, storage_options=lance_storage_options(storage))
        return {"version": ds.version, "columns": ds.schema.names,
                "primary_key": primary_key_of(ds.schema), "rows": ds.count_rows()}
    except Exception:  # noqa: BLE001 - a MemWAL without a readable dataset is still shown
        return None


@main.command(epilog=EPILOG)
@click.argument("uri", metavar="PATH")
@json_opt
@storage_opt
def inspect(uri: str, as_json: bool, storage: dict[str, str]) -> None:
    """One-screen summary: shards, commits, lag, SSTables."""
    store = open_table(uri, storage)
    log, infos = _survey(store)
    records = log.records
    last = records[-1] if records else None
    kinds: dict[str, int] = {}
    for rec in records:
        kinds[rec.kind] = kinds.get(rec.kind, 0) + 1
    epochs = [s.writer_epoch for s in infos if s.writer_epoch is not None]
    totals = {
        "shards": len(infos), "active": sum(s.status == "ACTIVE" for s in infos),
        "sealed": sum(s.status == "SEALED" for s in infos),
        "min_epoch": min(epochs, default=None), "max_epoch": max(epochs, default=None),
        "wal_entries": sum(s.wal_entries for s in infos),
        "committed_entries": sum(s.committed_entries for s in infos),
        "uncommitted_entries": sum(s.uncommitted_entries for s in infos),
        "uncommitted_exact": all(s.uncommitted_exact for s in infos),
        "sentinel_entries": sum(s.sentinel_entries for s in infos),
        "committed_rows": sum(s.committed_rows for s in infos),
        "committed_bytes": sum(s.committed_bytes for s in infos),
        "sstables": sum(s.sstables for s in infos),
    }
    commit_summary = {
        "count": len(records), "kinds": kinds, "collected_through": log.collected,
        "last_sequence": last.sequence if last else None,
        "last_created_ms": last.created_ms if last else None,
        "last_overwrite_sequence": max((r.sequence for r in records if r.kind == OVERWRITE),
                                       default=None),
    }
    lance_info = _lance_summary(uri, storage)
    compaction = _compaction_summary(uri, storage, store, lance_info)
    if as_json:
        _emit_json({"table": uri, "lance": lance_info, "compaction": compaction,
                    "totals": totals, "commits": commit_summary,
                    "shards": [asdict(s) for s in infos]})
        return
    console = _console()
    facts = _table("what", "value", min_widths={"what": 9})
    facts.show_header = False
    if lance_info:
        pk = ", ".join(lance_info["primary_key"]) or "none"
        facts.add_row(*_cells("dataset", f"Lance version {lance_info['version']}, "
                              f"{lance_info['rows']:,} rows in the base table, "
                              f"primary key: {pk}"))
        facts.add_row(*_cells("columns", ", ".join(lance_info["columns"])))
    else:
        facts.add_row(*_cells("dataset", "no readable Lance dataset (MemWAL files only)"))
    epoch_text = ("-" if totals["max_epoch"] is None else
                  f"{totals['min_epoch']}..{totals['max_epoch']}")
    facts.add_row(*_cells("shards", f"{totals['shards']} ({totals['active']} active, "
                          f"{totals['sealed']} sealed), writer epochs {epoch_text}, "
                          f"{totals['wal_entries']:,} WAL entries"))
    kinds_text = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
    last_text = (f"; last #{last.sequence} at {local_time(last.created_ms)}" if last else "")
    gone = f"; 1..{log.collected} garbage-collected" if log.collected else ""
    facts.add_row(*_cells("commits", f"{len(records)} records ({kinds_text}){last_text}"
                          f"{gone}"))
    if compaction is not None:
        done = (f"records 1..{compaction['compacted_through']} in the base table (round "
                f"{compaction['round']})" if compaction["compacted_through"] else
                "nothing compacted yet")
        facts.add_row(*_cells("compacted", f"{done}; {compaction['pending_records']} "
                              "record(s) pending (memwal compact)"))
    facts.add_row(*_cells("committed", f"{totals['committed_entries']:,} entries, "
                          f"{totals['committed_rows']:,} rows, "
                          f"{human_size(totals['committed_bytes'])}"))
    lagging = sum(1 for s in infos if s.uncommitted_entries)
    plus = "" if totals["uncommitted_exact"] else "+"
    facts.add_row(*_cells("lag", f"{totals['uncommitted_entries']:,}{plus} uncommitted "
                          f"entries in {lagging} shard(s) (in-flight jobs or failed "
                          f"attempts); {totals['sentinel_entries']} fence sentinel(s)"))
    facts.add_row(*_cells("sstables", f"{totals['sstables']} (MemTable-mode flushes)"))
    console.print(Text(uri, style="bold"))
    console.print(facts)
    if infos:
        console.print(_shards_table(infos, lag=True))


@main.command(epilog=EPILOG, short_help="Fold committed WAL entries into the base Lance table.")
@click.argument("uri", metavar="PATH")
@click.option("--dry-run", is_flag=True, help="say how much is pending; change nothing")
@click.option("--max-records-per-round", type=click.IntRange(min=1), default=256,
              show_default=True, help="commit records folded by one base-table commit")
@click.option("--max-rounds", type=click.IntRange(min=1), default=None,
              help="stop after this many rounds (default: until up to date)")
@json_opt
@storage_opt
def compact(uri: str, dry_run: bool, max_records_per_round: int, max_rounds: int | None,
            as_json: bool, storage: dict[str, str]) -> None:
    """Fold committed WAL entries into the base Lance table, exactly once.

    Safe to run while jobs write, readers read and other compactors run, and to
    kill at any point: a re-run finishes what was started and never counts a
    row twice. Tables without a primary key get a hidden `_memwal_row` column in
    the base table on their first compaction. For tables too big for one process,
    run `memwal_datasource.spark.compact(spark, PATH)` from a Spark driver.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ..compact import compact as run_compaction
    from ..compact import planned_rounds
    from ..table import MemWalTable

    open_table(uri, storage)
    table = MemWalTable(uri, storage)
    plan = run_compaction(table, dry_run=True)
    pending = plan.pending_records
    if dry_run or not pending:
        rounds = planned_rounds(pending, max_records_per_round)
        if max_rounds is not None:
            rounds = min(rounds, max_rounds)
        key = (f"merged on primary key {plan.primary_key}" if plan.primary_key
               else "appended (no primary key: keyed by the hidden _memwal_row column)")
        if as_json:
            _emit_json({"table": uri, "dry_run": dry_run, "pending_records": pending,
                        "pending_rows": plan.pending_rows, "planned_rounds": rounds,
                        "primary_key": plan.primary_key, "rounds": []})
        else:
            _console().print(f"{uri}: {pending} commit record(s) to compact"
                             + (" (dry run: nothing changed)" if dry_run else "")
                             + (f": {plan.pending_rows:,} rows in {rounds} round(s), {key}"
                                if pending else ""), soft_wrap=True)
        return
    with Progress(TextColumn("compacting"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("records, round {task.fields[round]}"), TimeElapsedColumn(),
                  console=_console(), disable=as_json, transient=True) as bar:
        task = bar.add_task("compact", total=pending, round="-")
        summary = run_compaction(
            table, max_records_per_round=max_records_per_round, max_rounds=max_rounds,
            progress=lambda r, left: bar.update(task, completed=pending - left,
                                                round=r.number))
    if as_json:
        _emit_json({"table": uri, "dry_run": False, "pending_records": summary.pending_records,
                    "rounds": [asdict(r) for r in summary.rounds]})
        return
    mine = [r for r in summary.rounds if r.committed]
    seconds = sum(r.seconds for r in summary.rounds)
    _console().print(
        f"{uri}: {len(summary.rounds)} round(s), {summary.rows:,} rows merged in "
        f"{seconds:.1f}s ({len(summary.rounds) - len(mine)} already committed by another "
        f"compactor); {summary.pending_records} record(s) still pending", soft_wrap=True)


@main.command(epilog=EPILOG)
@click.argument("uri", metavar="PATH")
@click.option("--dry-run", is_flag=True, help="list what would be deleted, with sizes")
@click.option("--retain-hours", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="keep WAL entries and commit records committed more recently than this")
@click.option("--retain-manifest-versions", type=click.IntRange(min=1), default=10,
              show_default=True, help="shard manifest versions to keep per shard")
@json_opt
@storage_opt
def gc(uri: str, dry_run: bool, retain_hours: float, retain_manifest_versions: int,
       as_json: bool, storage: dict[str, str]) -> None:
    """Delete what compaction made unnecessary, behind a fence.

    Each shard that loses WAL entries is fenced first (a new epoch and a sentinel),
    so a writer stalled across the collection fails instead of landing in a freed
    slot, and a job committing released positions is refused. Run it after
    `memwal compact`, e.g. hourly; streams further behind than the retention must
    restart.
    """
    from ..gc import collect
    from ..table import MemWalTable

    open_table(uri, storage)
    done = collect(MemWalTable(uri, storage), retain_seconds=retain_hours * 3600,
                   retain_manifest_versions=retain_manifest_versions, dry_run=dry_run)
    groups = {"wal_entries": [i for s in done.shards for i in s.entries],
              "commit_records": done.records, "manifest_versions": done.manifests,
              "round_intents": done.rounds}
    if as_json:
        _emit_json({"table": uri, "dry_run": dry_run, "bytes": done.bytes,
                    "floors": {s.shard_id: s.floor for s in done.shards},
                    **{k: [{"key": key, "bytes": n} for key, n in v] for k, v in groups.items()}})
        return
    console = _console()
    if dry_run:
        for key, n in done.items():
            console.print(f"{human_size(n):>10}  {key}", soft_wrap=True)
    verb = "would delete" if dry_run else "deleted"
    counts = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in groups.items())
    console.print(f"{uri}: {verb} {counts} ({human_size(done.bytes)})", soft_wrap=True)


def run() -> None:
    """Console-script entry point (errors are already one line with an exit code)."""
    main(prog_name="memwal")
