"""Run the benchmarks: ``python -m benchmarks.run [--only NAME ...] [--quick | --full]``.

Each competitor runs alternated with ours, 5 times by default; every goal is a
ratio of per-repeat pairs, reported as median and range. Writes
``benchmarks/results/<name>.json`` and ``<name>.png`` per benchmark and
regenerates ``benchmarks/results/summary.md`` from every JSON present (so
``--only`` refreshes one section and keeps the others), with a table of every
goal first. Three scales: the default (about 10 minutes in all on 2 cores),
``--full`` (the issue's sizes: 2 GB through one Spark worker, 256 MiB per
writer run, 5M-row compactions; about three times longer) and ``--quick`` (a
smoke run, 2 repeats, written to ``benchmarks/results/quick/``). Every output
names the machine it ran on and the load average. Nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import (
    bench_replay,
    bench_s3,
    bench_s3_client,
    bench_small_writes,
    bench_spark,
    bench_spark_pk,
    bench_stream_latency,
    bench_table,
    bench_writer,
)
from .common import (
    RESULTS_DIR,
    BenchContext,
    CpuContention,
    contention_line,
    machine_info,
    machine_line,
    rm_tree,
    set_results_dir,
    verdict,
)
from .common import write_json as _write_json

Bench = tuple[Callable[[BenchContext], dict[str, Any]], Callable[[dict, dict], None]]

BENCHMARKS: dict[str, Bench] = {
    "throughput": (bench_writer.bench_throughput, bench_writer.plot_throughput),
    "durable_latency": (bench_writer.bench_durable_latency, bench_writer.plot_durable_latency),
    "s3_conditional_put": (bench_s3.bench_s3_conditional_put,
                           bench_s3.plot_s3_conditional_put),
    "store_commits": (bench_s3.bench_store_commits, bench_s3.plot_store_commits),
    "s3_client_cpu": (bench_s3_client.bench_s3_client_cpu, bench_s3_client.plot_s3_client_cpu),
    "replay": (bench_replay.bench_replay, bench_replay.plot_replay),
    "spark_write": (bench_spark.bench_spark_write, bench_spark.plot_spark_write),
    "read": (bench_spark.bench_read, bench_spark.plot_read),
    "worker_rss": (bench_spark.bench_worker_rss, bench_spark.plot_worker_rss),
    "pk_write": (bench_spark_pk.bench_pk_write, bench_spark_pk.plot_pk_write),
    "table_plan": (bench_table.bench_table_plan, bench_table.plot_table_plan),
    "compaction": (bench_table.bench_compaction, bench_table.plot_compaction),
    "small_writes": (bench_small_writes.bench_small_writes,
                     bench_small_writes.plot_small_writes),
    "stream_latency": (bench_stream_latency.bench_stream_latency,
                       bench_stream_latency.plot_stream_latency),
    "writer_ceiling": (bench_writer.bench_writer_ceiling, bench_writer.plot_writer_ceiling),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=list(BENCHMARKS), metavar="NAME",
                   help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--quick", action="store_true",
                       help="small sizes and 2 repeats: a smoke run, not a measurement")
    scale.add_argument("--full", action="store_true",
                       help="the issue's sizes (2 GB through a Spark worker, ...): ~30 min")
    p.add_argument("--repeats", type=int, default=None,
                   help="repeats per competitor (default 5; 2 with --quick)")
    p.add_argument("--workdir", default=None,
                   help="parent of the scratch directory (default: the system temp dir)")
    p.add_argument("--results-dir", default=None,
                   help="where to write results (default benchmarks/results, or "
                        "benchmarks/results/quick with --quick so a smoke run never "
                        "overwrites a measurement)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return p.parse_args(argv)


def print_table(title: str, table: dict[str, Any], targets: list[dict[str, Any]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text fallback
        print(f"\n{title}")
        print(" | ".join(table["columns"]))
        for row in table["rows"]:
            print(" | ".join(row))
        for t in targets:
            print(f"  [{verdict(t['met'])}] {t['what']}: {t['value']}")
        return
    console = Console(width=160)
    tab = Table(title=title, title_justify="left", header_style="bold")
    for i, col in enumerate(table["columns"]):
        tab.add_column(col, justify="left" if i == 0 else "right")
    for row in table["rows"]:
        tab.add_row(*row)
    console.print(tab)
    style = {True: "green", False: "red", None: "dim"}
    for t in targets:
        s = style[t["met"]]
        console.print(f"  [{s}]{verdict(t['met'])}[/{s}] {t['what']}: {t['value']}",
                      highlight=False)


def _md_table(table: dict[str, Any]) -> str:
    cols = table["columns"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in table["rows"]]
    return "\n".join(lines)


def _mode(r: dict[str, Any]) -> str:
    scale = r.get("scale") or ("quick" if r.get("quick") else "full")
    return "quick (smoke run, not a measurement)" if scale == "quick" else scale


def _load(r: dict[str, Any]) -> str:
    c = r.get("contention") or {}
    if not c:
        return "?"
    busy = " (loaded)" if c["cpu_others_frac"] > 0.1 else ""
    return f"{c['loadavg_start'][0]:.1f} -> {c['loadavg_end'][0]:.1f}{busy}"


def _goals_table(found: dict[str, dict[str, Any]]) -> str:
    """Every goal of every benchmark: the ratio's median and range, and the load."""
    table = {"columns": ["benchmark", "goal", "median (range)", "verdict", "run", "load avg"],
             "rows": []}
    for name, r in found.items():
        for t in r.get("targets", []):
            if t["met"] is None:
                continue
            table["rows"].append([name, t["what"], t["value"], verdict(t["met"]), _mode(r),
                                  _load(r)])
    return _md_table(table)


def write_summary(results_dir: Path) -> Path:
    """summary.md from every <name>.json in ``results_dir``, in registry order."""
    found = {}
    for name in BENCHMARKS:
        path = results_dir / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    out = ["# memwal_datasource benchmarks", "",
           "Generated by `python -m benchmarks.run`. Medians over repeats; competitors run "
           "interleaved in the same run. MB = 10^6 bytes. Speed is never asserted in tests.",
           ""]
    machines = {machine_line(r["machine"]) for r in found.values() if "machine" in r}
    for m in sorted(machines):
        out.append(f"Machine: {m}")
    out += ["", "## Goals", "", _goals_table(found), ""]
    for name, r in found.items():
        mode = _mode(r)
        disk = r.get("machine", {}).get("disk", {})
        out += [f"## {name}: {r.get('title', '')}", "",
                f"Run {r.get('finished_at', '?')} ({mode}), {r.get('repeats', '?')} repeats, "
                f"{r.get('duration_s', 0):.0f} s; scratch on {disk.get('fstype', '?')} "
                f"({disk.get('device', '?')}, {disk.get('path', '?')}). "
                f"Plot: `{name}.png`, data: `{name}.json`.", "",
                f"CPU: {contention_line(r.get('contention'))}.", ""]
        if r.get("error"):
            out += ["**Failed:**", "", "```", r["error"][-3000:], "```", ""]
            continue
        if r.get("skipped"):
            out += [f"**Skipped:** {r['skipped']}", ""]
        if r.get("table"):
            out += [_md_table(r["table"]), ""]
        for t in r.get("targets", []):
            out.append(f"- **{verdict(t['met'])}**: {t['what']}: {t['value']}")
        out.append("")
    path = results_dir / "summary.md"
    path.write_text("\n".join(out))
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    names = args.only or list(BENCHMARKS)
    repeats = args.repeats or (2 if args.quick else 5)
    results_dir = Path(args.results_dir or (RESULTS_DIR / "quick" if args.quick else RESULTS_DIR))
    set_results_dir(results_dir)
    workdir = Path(tempfile.mkdtemp(prefix="memwal-bench-", dir=args.workdir))
    machine = machine_info(str(workdir))
    print(f"machine: {machine_line(machine)}")
    print(f"scratch: {workdir} ({machine['disk'].get('fstype')} on "
          f"{machine['disk'].get('device')}); repeats: {repeats}; "
          f"{'QUICK smoke run' if args.quick else 'full run'}", flush=True)
    ctx = BenchContext(workdir=workdir, quick=args.quick, repeats=repeats, machine=machine,
                       log=lambda s: print(s, flush=True), full=args.full)
    failed = []
    t_all = time.perf_counter()
    try:
        for name in names:
            run, plot = BENCHMARKS[name]
            print(f"\n== {name} ==", flush=True)
            t0 = time.perf_counter()
            with CpuContention() as cpu:
                try:
                    result = run(ctx)
                except Exception:  # noqa: BLE001 - one failure must not hide the others
                    failed.append(name)
                    result = {"name": name, "error": traceback.format_exc()}
                    print(result["error"], file=sys.stderr)
            print(f"  {contention_line(cpu.result)}".replace("**", ""), flush=True)
            result.update({
                "contention": cpu.result,
                "machine": machine, "quick": args.quick, "scale": ctx.scale,
                "repeats": repeats,
                "duration_s": time.perf_counter() - t0,
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "argv": sys.argv[1:] if argv is None else argv,
            })
            _write_json(name, result, results_dir)
            if "error" not in result:
                try:
                    plot(result, machine)
                except Exception:  # noqa: BLE001
                    failed.append(f"{name} (plot)")
                    traceback.print_exc()
                print_table(f"{name}: {result.get('title', '')} "
                            f"[{result['duration_s']:.0f} s]",
                            result["table"], result.get("targets", []))
    finally:
        if args.keep:
            print(f"scratch kept at {workdir}")
        else:
            rm_tree(workdir)
    summary = write_summary(results_dir)
    print(f"\nall done in {time.perf_counter() - t_all:.0f} s; results in {results_dir}, "
          f"summary {summary}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
