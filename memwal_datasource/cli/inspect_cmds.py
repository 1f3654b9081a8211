"""Read-only commands that summarise a table: ``shards``, ``manifest``, ``commits``, ``inspect``."""

from __future__ import annotations

from dataclasses import asdict

import click
from rich.table import Table
from rich.text import Text

from ..errors import MemWalError
from ..log.commit import OVERWRITE, CommitLog
from ..options import lance_storage_options
from ..shard.manifest import ManifestStore
from ..store import ObjectStore
from .errors import EPILOG, EXIT_NOT_FOUND, CliError
from .params import json_opt, open_table, resolve_shard, storage_opt
from .render import (
    cells,
    emit_json,
    human_size,
    local_time,
    new_console,
    new_table,
    short,
    short_ids,
)
from .survey import ShardInfo, record_json, status_name, stored_records, survey


def table_command(f):
    """A read-only command on the table at PATH, with ``--json`` and ``--storage``."""
    return click.command(epilog=EPILOG)(
        click.argument("uri", metavar="PATH")(json_opt(storage_opt(f))))


def shards_table(infos: list[ShardInfo], lag: bool) -> Table:
    cols = ["shard", "status", "epoch", "WAL", "committed"]
    cols += ["uncommitted"] if lag else []
    cols += ["size", "sst"]
    table = new_table(*cols, min_widths={"shard": 8, "status": 6})
    names = short_ids([s.shard_id for s in infos])
    for s in infos:
        row: list[object] = [names[s.shard_id], s.status,
                             "-" if s.writer_epoch is None else str(s.writer_epoch),
                             s.wal_span(), str(s.committed_entries)]
        if lag:
            row.append(f"{s.uncommitted_entries}{'' if s.uncommitted_exact else '+'}")
        row += [human_size(s.committed_bytes), str(s.sstables)]
        table.add_row(*cells(*row))
    return table


@table_command
def shards(uri: str, as_json: bool, storage: dict[str, str]) -> None:
    """List shards: status, epoch, WAL positions, commits, SSTables."""
    store = open_table(uri, storage)
    _, infos = survey(store)
    if as_json:
        emit_json({"table": uri, "shards": [asdict(s) for s in infos]})
        return
    console = new_console()
    if not infos:
        console.print(Text(f"{uri}: no shards yet (nothing has been written to the MemWAL)"))
        return
    console.print(shards_table(infos, lag=False))


@click.command(epilog=EPILOG)
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
            "shard_field_entries": [{"field_id": f, "value": value, "value_hex": v.hex()}
                                    for f, v, value in _field_values(uri, storage,
                                                                     m.shard_field_entries)]}
    if as_json:
        emit_json(body)
        return
    table = new_table("field", "value", min_widths={"field": 12})
    for key, value in body.items():
        if key in ("sstables", "shard_field_entries"):
            continue
        table.add_row(*cells(key.replace("_", " "), value))
    for s in m.sstables:
        table.add_row(*cells(f"sstable {s.generation}",
                              f"{s.path} ({s.physical_rows} rows, "
                              f"{human_size(s.in_memory_bytes)} in memory)"))
    for entry in body["shard_field_entries"]:
        value = entry["value"]
        table.add_row(*cells(f"shard field {entry['field_id']}",
                             f"0x{entry['value_hex']}" if value is None else value))
    new_console().print(table)


def _field_values(uri: str, storage: dict[str, str],
                  entries: list[tuple[str, bytes]]) -> list[tuple[str, bytes, object]]:
    """Each ``(field id, raw bytes, value)``: a bucket number as an integer, a string as
    text, decoded by the table's sharding spec (value ``None`` when it cannot be read)."""
    if not entries:
        return []
    spec = None
    try:
        import lance

        from ..table.sharding import table_sharding

        spec = table_sharding(lance.dataset(uri, storage_options=lance_storage_options(storage)))
    except Exception:  # noqa: BLE001 - the raw bytes are still shown
        spec = None
    out = []
    for field_id, raw in entries:
        value = None
        if spec is not None and spec.recorded and spec.field_id == field_id:
            decoded = spec.decode_value(raw)
            value = None if isinstance(decoded, bytes) else decoded
        out.append((field_id, raw, value))
    return out


@table_command
def commits(uri: str, as_json: bool, storage: dict[str, str]) -> None:
    """List commit records (what committed readers see)."""
    store = open_table(uri, storage)
    log = stored_records(CommitLog(store))
    records = log.records
    if as_json:
        emit_json({"table": uri, "collected_through": log.collected,
                    "checkpoint": log.checkpoint.sequence if log.checkpoint else None,
                    "commits": [record_json(r) for r in records]})
        return
    console = new_console()
    if log.collected:
        console.print(Text(f"records 1..{log.collected} were garbage-collected (checkpoint "
                           f"{log.checkpoint.sequence if log.checkpoint else '-'} stands for "
                           "them)"))
    if not records:
        console.print(Text(f"{uri}: no commit records yet (no job has committed)"))
        return
    table = new_table("seq", "kind", "created", "job", "tasks", "rows", "size",
                   min_widths={"created": 19, "kind": 6})
    for rec in records:
        job = (f"{short(rec.query_id)}#{rec.batch_id}" if rec.query_id else short(rec.job_id))
        info = record_json(rec)
        table.add_row(*cells(str(rec.sequence), rec.kind, local_time(rec.created_ms), job,
                              str(info["ranges"]), f"{info['rows']:,}",
                              human_size(info["bytes"])))
    console.print(table)


def _compaction_summary(uri: str, storage: dict[str, str], store: ObjectStore,
                        lance_info: dict | None) -> dict | None:
    """How far compaction into the base table got (``None`` without a base table)."""
    if lance_info is None:
        return None
    from ..table.view import TableView

    try:
        snap = TableView(uri, storage, store=store).snapshot(lance_info["version"])
    except MemWalError:
        return None
    return {"base_version": snap.base_version, "round": snap.compacted_round,
            "compacted_through": snap.compacted_seq,
            "pending_records": snap.pending_records}


def _backlog(uri: str, storage: dict[str, str], store: ObjectStore) -> dict | None:
    """The backlog (:meth:`MemWalTable.stats`), or ``None`` without a readable commit log."""
    from ..maintenance.backlog import backlog
    from ..table.view import TableView

    try:
        return backlog(TableView(uri, storage, store=store)).to_json()
    except MemWalError:
        return None


def _backlog_rows(b: dict) -> list[tuple[str, str]]:
    """The backlog as ``(what, value)`` rows for people."""
    age = b["oldest_pending_age_s"]
    rows = [("backlog", f"{b['pending_records']} commit record(s) pending, "
             f"{b['pending_rows']:,} rows, {human_size(b['pending_bytes'])}"
             + (f", oldest {age:.0f}s old" if age is not None else "")
             + (f"; round {b['round_in_progress']} in progress"
                if b["round_in_progress"] else "")),
            ("WAL", f"{b['wal_objects']:,} objects, {human_size(b['wal_bytes'])} in "
             f"{len(b['shards'])} shard(s); {b['checkpoints']} checkpoint(s); "
             f"{b['pending_intents']} pending commit intent(s)")]
    holds = [h for h in b["stream_holds"] if h["live"]]
    if b["stream_holds"]:
        rows.append(("holds", f"{len(holds)} live stream hold(s)" + "".join(
            f"; {h['label'] or h['hold_id']} after record {h['after_seq']}, "
            f"{h['age_s']:.0f}s ago" for h in holds)))
    for op in ("compaction", "gc"):
        entry = b["maintenance"].get(op)
        if not entry:
            rows.append((f"last {op}", "never recorded (memwal maintain, or a stream's "
                         "automatic maintenance, records it)"))
            continue
        text = (f"{local_time(entry.get('started_ms'))}, {entry.get('seconds', 0):.1f}s, by "
                f"{entry.get('by', '?')}: " + ", ".join(
                    f"{k.replace('_', ' ')} {v}" for k, v in (entry.get("result") or {}).items()
                    if v not in (None, "")))
        if entry.get("last_error"):
            text += (f"; {'FAILING' if entry.get('failing') else 'last error'} "
                     f"{local_time(entry.get('last_error_ms'))}: {entry['last_error']}")
        rows.append((f"last {op}", text))
    return rows


def _lance_summary(uri: str, storage: dict[str, str]) -> dict | None:
    """Version, columns and row count of the Lance dataset, or ``None`` if unreadable."""
    try:
        import lance

        from ..format.table_schema import primary_key_of

        ds = lance.dataset(uri, storage_options=lance_storage_options(storage))
        return {"version": ds.version, "columns": ds.schema.names,
                "primary_key": primary_key_of(ds.schema), "rows": ds.count_rows()}
    except Exception:  # noqa: BLE001 - a MemWAL without a readable dataset is still shown
        return None


@table_command
def inspect(uri: str, as_json: bool, storage: dict[str, str]) -> None:
    """One-screen summary: shards, commits, lag, SSTables."""
    store = open_table(uri, storage)
    log, infos = survey(store)
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
    backlog = _backlog(uri, storage, store)
    if as_json:
        emit_json({"table": uri, "lance": lance_info, "compaction": compaction,
                    "backlog": backlog, "totals": totals, "commits": commit_summary,
                    "shards": [asdict(s) for s in infos]})
        return
    console = new_console()
    facts = new_table("what", "value", min_widths={"what": 9})
    facts.show_header = False
    if lance_info:
        pk = ", ".join(lance_info["primary_key"]) or "none"
        facts.add_row(*cells("dataset", f"Lance version {lance_info['version']}, "
                              f"{lance_info['rows']:,} rows in the base table, "
                              f"primary key: {pk}"))
        facts.add_row(*cells("columns", ", ".join(lance_info["columns"])))
    else:
        facts.add_row(*cells("dataset", "no readable Lance dataset (MemWAL files only)"))
    epoch_text = ("-" if totals["max_epoch"] is None else
                  f"{totals['min_epoch']}..{totals['max_epoch']}")
    facts.add_row(*cells("shards", f"{totals['shards']} ({totals['active']} active, "
                          f"{totals['sealed']} sealed), writer epochs {epoch_text}, "
                          f"{totals['wal_entries']:,} WAL entries"))
    kinds_text = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
    last_text = (f"; last #{last.sequence} at {local_time(last.created_ms)}" if last else "")
    gone = f"; 1..{log.collected} garbage-collected" if log.collected else ""
    facts.add_row(*cells("commits", f"{len(records)} records ({kinds_text}){last_text}"
                          f"{gone}"))
    if compaction is not None:
        done = (f"records 1..{compaction['compacted_through']} in the base table (round "
                f"{compaction['round']})" if compaction["compacted_through"] else
                "nothing compacted yet")
        facts.add_row(*cells("compacted", f"{done}; {compaction['pending_records']} "
                              "record(s) pending (memwal compact)"))
    facts.add_row(*cells("committed", f"{totals['committed_entries']:,} entries, "
                          f"{totals['committed_rows']:,} rows, "
                          f"{human_size(totals['committed_bytes'])}"))
    lagging = sum(1 for s in infos if s.uncommitted_entries)
    plus = "" if totals["uncommitted_exact"] else "+"
    facts.add_row(*cells("lag", f"{totals['uncommitted_entries']:,}{plus} uncommitted "
                          f"entries in {lagging} shard(s) (in-flight jobs or failed "
                          f"attempts); {totals['sentinel_entries']} fence sentinel(s)"))
    facts.add_row(*cells("sstables", f"{totals['sstables']} (MemTable-mode flushes)"))
    for what, value in _backlog_rows(backlog) if backlog is not None else []:
        facts.add_row(*cells(what, value))
    console.print(Text(uri, style="bold"))
    console.print(facts)
    if infos:
        console.print(shards_table(infos, lag=True))
