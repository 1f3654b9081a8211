"""Commands that change a table: ``compact`` (fold the WAL into the base), ``gc``, and
``maintain`` (both, when the backlog passes a threshold, in a loop)."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from ..log.rounds import DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS
from ..maintenance.thresholds import Thresholds
from .errors import EPILOG, EXIT_ERROR, EXIT_RETRY, CliError
from .params import json_opt, open_table, storage_opt
from .render import emit_json, human_size, new_console


@click.command(epilog=EPILOG, short_help="Fold committed WAL entries into the base Lance table.")
@click.argument("uri", metavar="PATH")
@click.option("--dry-run", is_flag=True, help="say how much is pending; change nothing")
@click.option("--max-records-per-round", type=click.IntRange(min=1),
              default=DEFAULT_MAX_RECORDS, show_default=True,
              help="commit records folded by one base-table commit")
@click.option("--max-bytes-per-round", type=click.IntRange(min=1), default=DEFAULT_MAX_BYTES,
              show_default=True, help="Arrow bytes of rows one round holds in memory (a "
              "larger commit record is a round of its own)")
@click.option("--max-rounds", type=click.IntRange(min=1), default=None,
              help="stop after this many rounds (default: until up to date)")
@json_opt
@storage_opt
def compact(uri: str, dry_run: bool, max_records_per_round: int, max_bytes_per_round: int,
            max_rounds: int | None,
            as_json: bool, storage: dict[str, str]) -> None:
    """Fold committed WAL entries into the base Lance table, exactly once.

    Safe to run while jobs write, readers read and other compactors run, and to
    kill at any point: a re-run finishes what was started and never counts a
    row twice. Tables without a primary key get a hidden `_memwal_row` column in
    the base table on their first compaction. For tables too big for one process,
    run `memwal_datasource.spark.compact(spark, PATH)` from a Spark driver or a Spark
    Connect client.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ..maintenance.compact import compact as run_compaction
    from ..maintenance.compact import planned_rounds
    from ..table.view import TableView

    open_table(uri, storage)
    table = TableView(uri, storage)
    plan = run_compaction(table, dry_run=True)
    pending = plan.pending_records
    if dry_run or not pending:
        rounds = planned_rounds(pending, max_records_per_round, plan.pending_bytes,
                                max_bytes_per_round)
        if max_rounds is not None:
            rounds = min(rounds, max_rounds)
        key = (f"merged on primary key {plan.primary_key}" if plan.primary_key
               else "appended (no primary key: keyed by the hidden _memwal_row column)")
        if as_json:
            emit_json({"table": uri, "dry_run": dry_run, "pending_records": pending,
                        "pending_rows": plan.pending_rows, "planned_rounds": rounds,
                        "primary_key": plan.primary_key, "rounds": []})
        else:
            new_console().print(f"{uri}: {pending} commit record(s) to compact"
                             + (" (dry run: nothing changed)" if dry_run else "")
                             + (f": {plan.pending_rows:,} rows in {rounds} round(s), {key}"
                                if pending else ""), soft_wrap=True)
        return
    with Progress(TextColumn("compacting"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("records, round {task.fields[round]}"), TimeElapsedColumn(),
                  console=new_console(), disable=as_json, transient=True) as bar:
        task = bar.add_task("compact", total=pending, round="-")
        summary = run_compaction(
            table, max_records_per_round=max_records_per_round,
            max_bytes_per_round=max_bytes_per_round, max_rounds=max_rounds,
            progress=lambda r, left: bar.update(task, completed=pending - left,
                                                round=r.number))
    if as_json:
        emit_json({"table": uri, "dry_run": False, "pending_records": summary.pending_records,
                    "rounds": [asdict(r) for r in summary.rounds]})
        return
    mine = [r for r in summary.rounds if r.committed]
    seconds = sum(r.seconds for r in summary.rounds)
    new_console().print(
        f"{uri}: {len(summary.rounds)} round(s), {summary.rows:,} rows merged in "
        f"{seconds:.1f}s ({len(summary.rounds) - len(mine)} already committed by another "
        f"compactor); {summary.pending_records} record(s) still pending", soft_wrap=True)


@click.command(epilog=EPILOG)
@click.argument("uri", metavar="PATH")
@click.option("--dry-run", is_flag=True, help="list what would be deleted, with sizes")
@click.option("--retain-hours", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="keep what compaction made unnecessary less than this long ago "
                   "(counted from the compaction, on the store's clock; at least 30 s)")
@click.option("--retain-manifest-versions", type=click.IntRange(min=1), default=10,
              show_default=True, help="shard manifest versions to keep per shard")
@json_opt
@storage_opt
def gc(uri: str, dry_run: bool, retain_hours: float, retain_manifest_versions: int,
       as_json: bool, storage: dict[str, str]) -> None:
    """Delete what compaction made unnecessary; safe beside live jobs.

    Shards a live job holds are skipped until the next run. Each shard that
    loses WAL entries is fenced first (a new epoch and a sentinel), so a writer
    stalled across the collection fails instead of landing in a freed slot, and
    a job committing released positions is refused. What a live stream has
    yet to read is kept (its hold is named). Run it after `memwal compact`,
    e.g. hourly.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..errors import Fenced
    from ..maintenance.gc import collect
    from ..table.view import TableView

    open_table(uri, storage)
    try:
        with Progress(TextColumn("deleting"), BarColumn(), MofNCompleteColumn(),
                      console=new_console(), disable=as_json or dry_run, transient=True) as bar:
            task = bar.add_task("gc", total=None)
            done = collect(TableView(uri, storage), retain_seconds=retain_hours * 3600,
                           retain_manifest_versions=retain_manifest_versions, dry_run=dry_run,
                           progress=lambda i, n: bar.update(task, completed=i, total=n))
    except Fenced as exc:
        # gc skips a shard a live writer claims while it fences; this is a claim racing
        # it elsewhere (a manifest update): nothing was deleted, a re-run retries.
        raise CliError(f"Run gc again: a live writer claimed shard {exc.shard_id} (epoch "
                       f"{exc.stored_epoch}) while gc was fencing it, a harmless race; nothing "
                       "was deleted and the writer goes on.", EXIT_RETRY) from None
    groups = {"wal_entries": [i for s in done.shards for i in s.entries],
              "commit_records": done.records, "manifest_versions": done.manifests,
              "round_files": done.rounds, "expired_stream_holds": done.holds}
    if as_json:
        emit_json({"table": uri, "dry_run": dry_run, "bytes": done.bytes,
                   "floors": {s.shard_id: s.floor for s in done.shards},
                   "retain_seconds": done.retain_seconds,
                   "released_through_record": done.releasable_seq,
                   "compacted_through_record": done.pending_seq,
                   "skipped_busy_shards": done.skipped_busy, "kept": done.kept_reason(),
                   **{k: [{"key": key, "bytes": n} for key, n in v] for k, v in groups.items()}})
        return
    console = new_console()
    if dry_run:
        for key, n in done.items():
            console.print(f"{human_size(n):>10}  {key}", soft_wrap=True)
    verb = "would delete" if dry_run else "deleted"
    counts = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in groups.items())
    console.print(f"{uri}: {verb} {counts} ({human_size(done.bytes)})", soft_wrap=True)
    kept = done.kept_reason()
    if kept:
        console.print(f"kept: {kept}", soft_wrap=True)
    elif not done.items() and not done.pending_seq:
        console.print("kept: nothing is compacted yet (run memwal compact first)", soft_wrap=True)


@click.command(epilog=EPILOG, short_help="Compact and collect when the backlog passes a "
               "threshold, in a loop.")
@click.argument("uri", metavar="PATH")
@click.option("--interval", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="seconds between passes")
@click.option("--once", is_flag=True, help="one pass, then exit (for cron)")
@click.option("--force", is_flag=True, help="compact whatever is pending and collect, "
              "whatever the thresholds")
@click.option("--pending-records", type=click.IntRange(min=1),
              default=Thresholds.pending_records, show_default=True,
              help="compact once this many commit records are pending")
@click.option("--pending-bytes", type=click.IntRange(min=1), default=Thresholds.pending_bytes,
              show_default=True, help="... or once they hold this many Arrow bytes")
@click.option("--pending-age-s", type=click.FloatRange(min=0), default=Thresholds.pending_age_s,
              show_default=True, help="... or once the oldest is this many seconds old")
@click.option("--retain-hours", type=click.FloatRange(min=0),
              default=Thresholds.gc_retain_s / 3600, show_default=True,
              help="gc's retention (as memwal gc)")
@click.option("--gc-every-s", type=click.FloatRange(min=0), default=Thresholds.gc_every_s,
              show_default=True, help="collect garbage at most this often")
@json_opt
@storage_opt
def maintain(uri: str, interval: float, once: bool, force: bool, pending_records: int,
             pending_bytes: int, pending_age_s: float, retain_hours: float, gc_every_s: float,
             as_json: bool, storage: dict[str, str]) -> None:
    """Keep a table maintained: compaction rounds, then gc, when a threshold is passed.

    The same passes a stream's automatic maintenance runs (one maintainer per
    table at a time: a pass that finds another one working skips). One line per
    pass (a JSON object per line with --json). Ctrl-C or SIGTERM stops cleanly
    between two rounds; a second Ctrl-C stops at once (safe too: the next
    maintainer finishes the round).
    """
    import signal
    import threading
    import time

    from ..maintenance.auto import maintain_once
    from ..table.view import TableView

    open_table(uri, storage)
    thresholds = Thresholds(pending_records=pending_records, pending_bytes=pending_bytes,
                            pending_age_s=pending_age_s, gc_retain_s=retain_hours * 3600,
                            gc_every_s=gc_every_s, check_every_s=interval)
    stop = threading.Event()
    previous = {}

    def asked_to_stop(signum, _frame) -> None:
        stop.set()
        for sig, handler in previous.items():  # a second signal acts at once
            signal.signal(sig, handler)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, asked_to_stop)
    table = TableView(uri, storage)
    console = new_console()
    try:
        while True:
            result = maintain_once(table, thresholds, force=force, stop=stop,
                                   label=f"memwal maintain ({'once' if once else 'loop'})")
            if as_json:
                click.echo(json.dumps(_pass_json(result), default=str))
            else:
                console.print(f"{time.strftime('%H:%M:%S')} {result.line()}", soft_wrap=True)
            if once:
                if result.error is not None:
                    raise CliError(f"Run memwal maintain again: the pass failed "
                                   f"({type(result.error).__name__}: {result.error}); what "
                                   "it started is finished by the next pass.", EXIT_ERROR)
                return
            if stop.is_set() or stop.wait(interval):
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not as_json:
        console.print(f"{uri}: stopped", soft_wrap=True)


def _pass_json(result) -> dict:
    """One pass as a JSON line."""
    c, g = result.compaction, result.gc
    return {"table": result.uri, "seconds": round(result.seconds, 3), "reason": result.reason,
            "busy_by": result.busy_by, "stopped": result.stopped,
            "error": None if result.error is None else f"{type(result.error).__name__}: "
                                                       f"{result.error}",
            "backlog": result.before.to_json() if result.before is not None else None,
            "compaction": None if c is None else {"rounds": len(c.rounds), "rows": c.rows,
                                                  "pending_records": c.pending_records},
            "gc": None if g is None else {"deleted_objects": len(g.items()),
                                          "deleted_bytes": g.bytes}}
