"""The benchmark harness; every scenario (``bench_<name>.py``: ``NAME``, ``run(ctx)``) uses it.

Competitors alternate in one run (an untimed warm-up round, then repeat ``r`` rotated by
``r``); goals are ratios of same-repeat pairs, median and range. A result is ``{"title",
"config", "table", "targets", "panels"}``; panels become ``<name>.png``. MB = 10^6 bytes.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import from_arrow_schema

from memwal_datasource import MemWalDataSource
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.store import ObjectStore, open_store
from memwal_datasource.table.view import create_table as _create_table

from . import durable_sink

MB = 1_000_000
KiB, MiB = 1024, 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SUFFIX = "-abcdefghijklmnopqrstuvwxyz0123"  # a row is ~58 Arrow bytes: id, ~38 B payload, score
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), ("payload", pa.string()),
                    ("score", pa.float64())])  # the one schema of every scenario's rows
Summary = dict[str, Any]  # median, min, max, n and the values
Runs = dict[str, list[dict[str, Any]]]  # each repeat's result, by competitor
Comp = dict[str, dict[str, Any]]  # a summary per key, by competitor
Cols = Sequence[tuple[str, str, str]]  # (header or title, key, format or unit)


@dataclass
class Ctx:
    """What every scenario gets: scale, repeats, scratch space, a logger."""
    workdir: Path
    scale: str  # "quick" (smoke run), "default" or "full"
    repeats: int
    machine: dict[str, Any]
    log: Callable[[str], None] = print
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the Spark settings

    def pick(self, quick: Any, default: Any, full: Any = None) -> Any:
        """The size for this run's scale (``full`` defaults to ``default``)."""
        return {"quick": quick, "full": full or default}.get(self.scale, default)

    def scratch(self, name: str) -> Path:
        """A fresh, empty directory under the work dir."""
        shutil.rmtree(p := self.workdir / name, ignore_errors=True)
        p.mkdir(parents=True)
        return p


def arrow_rows(start: int, rows: int) -> pa.Table:
    """Rows ``start .. start+rows-1`` (id, payload, score), freshly allocated."""
    return rows_of(np.arange(start, start + rows, dtype=np.int64))


def rows_of(ids: np.ndarray, word: str = SUFFIX[1:], scale: float = 0.001) -> pa.Table:
    """The rows of keys ``ids``: payload ``{id}-{word}``, score ``id * scale``."""
    ids = pa.array(ids, pa.int64())
    payload = pc.binary_join_element_wise(pc.cast(ids, pa.string()), word, "-")
    return pa.table([ids, payload, pc.multiply(pc.cast(ids, pa.float64()), scale)], schema=SCHEMA)


def spark_schema():
    """:data:`SCHEMA` as Spark hands it to a writer."""
    return from_arrow_schema(SCHEMA)


def inproc_append(uri: str, table: pa.Table, storage: dict[str, str] | None = None,
                  **options: str) -> None:
    """One Spark append without Spark: ``writer(schema, False)``, its ``write()`` of
    partition 0 (what a task runs) and ``commit([msg])`` (the driver's)."""
    opts = {"path": uri, **{f"storage.{k}": v for k, v in (storage or {}).items()}, **options}
    w = MemWalDataSource(opts).writer(spark_schema(), False)
    w.commit([w.write(iter(table.to_batches()))])


def committed_rows(uri: str, storage: dict[str, str] | None = None) -> int:
    """Rows in the table's visible commit records."""
    return sum(r.rows for r in CommitLog(open_store(uri, storage or {})).visible())


def create_table(uri: str, storage: dict[str, str] | None = None) -> None:
    """A memwal table of :func:`arrow_rows`' schema, primary key ``id``."""
    _create_table(uri, SCHEMA, primary_key=["id"], storage_options=storage)


def fsync_path(*paths: str) -> None:
    """fsync each path (a file or directory) in order."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # a rival's temp file, renamed since
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


@contextlib.contextmanager
def s3_bucket(ctx: Ctx, bucket: str) -> Iterator[tuple[Any, str | None]]:
    """``(server, None)`` with ``bucket`` created on a local SeaweedFS, or ``(None, why)``."""
    from tests.s3_server import start_s3_server

    server = None
    try:
        server = start_s3_server(ctx.scratch(f"s3-{bucket}"))
        server.create_bucket(bucket)
    except Exception as exc:  # noqa: BLE001 - the scenario reports the skip
        yield None, f"no S3 server, or no bucket {bucket!r}: {exc}"
    else:
        yield server, None
    finally:
        server and server.stop()  # a started server never outlives us


STORE_OPS = ("put_if_absent", "put_if_absent_unsynced", "sync", "put", "get", "head", "exists",
             "list", "list_after", "list_dirs", "delete", "delete_many", "modified_ms")


@contextlib.contextmanager
def io_trace() -> Iterator[list[str]]:
    """The name of every (outermost) ObjectStore call and every ``os.fsync`` ("fsync")."""
    events, local, lookup, fsync = [], threading.local(), ObjectStore.__getattribute__, os.fsync

    def traced(op: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            depth = getattr(local, "depth", 0)
            if depth == 0 or op == "fsync":  # not a store call's own store calls
                events.append(op)
            local.depth = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                local.depth = depth
        return call

    ObjectStore.__getattribute__ = lambda store, name: (
        traced(name, lookup(store, name)) if name in STORE_OPS else lookup(store, name))
    os.fsync = traced("fsync", fsync)
    try:
        yield events
    finally:
        ObjectStore.__getattribute__, os.fsync = lookup, fsync


def io_per_append(uri: str, storage: dict[str, str] | None = None, **options: str) -> dict:
    """Store calls and fsyncs per :func:`inproc_append` of 5,000 rows (5, after an untimed
    one), by call (``line``: in one line)."""
    inproc_append(uri, arrow_rows(0, 5_000), storage, **options)
    with io_trace() as events:
        for i in range(1, 6):
            inproc_append(uri, arrow_rows(i * 5_000, 5_000), storage, **options)
    per = {op: c / 5 for op, c in sorted(collections.Counter(events).items())}
    return {"per_append": per, "line": ", ".join(f"{op} {v:.1f}" for op, v in per.items())}


def seconds(fn: Callable[[], Any]) -> float:
    """How long ``fn()`` took."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def summarize(values: Sequence[float]) -> Summary:
    v = [float(x) for x in values] or [float("nan")]
    return {"median": float(np.median(v)), "min": min(v), "max": max(v), "n": len(values),
            "values": v}


def paired(num: Sequence[float], den: Sequence[float]) -> Summary:
    """Per-repeat ratios ``num[r] / den[r]`` summarised (drift cancels within a repeat)."""
    return summarize([a / b if b else float("nan") for a, b in zip(num, den, strict=True)])


def cell(s: Summary | float, fmt: str = "{:.3g}") -> str:
    """``median (min..max)`` of a summary; a plain value as it is."""
    return (f"{fmt.format(s['median'])} ({fmt.format(s['min'])}..{fmt.format(s['max'])})"
            if isinstance(s, dict) else fmt.format(s))


def target(what: str, s: Summary, goal: float | None = None, at_most: bool = False) -> dict:
    """A goal on a summary (a paired ratio or a value), met by its median; no goal: reported."""
    met = None if goal is None else s["median"] <= goal if at_most else s["median"] >= goal
    return {"what": f"{what} (reported, no goal)" if goal is None else
            f"{what} {'<=' if at_most else '>='} {goal}", "goal": goal, "met": met,
            "value": f"{s['median']:.3g} (range {s['min']:.3g}..{s['max']:.3g}, {s['n']} repeats)"}


def alternate(ctx: Ctx, competitors: dict[str, Callable[[int], dict]], warmup: int = 1,
              repeats: int | None = None, label: str = "") -> Runs:
    """``warmup`` untimed rounds (repeat index -1), then ``repeats`` rounds in rotated order."""
    names = list(competitors)
    out: Runs = {n: [] for n in names}
    for r in [-1] * warmup + list(range(repeats or ctx.repeats)):
        k = max(r, 0) % len(names)
        for name in names[k:] + names[:k]:
            gc.collect()
            res = competitors[name](r)
            brief = ", ".join(f"{k} {v:.3g}" for k, v in res.items()
                              if isinstance(v, (int, float)) and not isinstance(v, bool))
            ctx.log(f"  {label}{'warm-up' if r < 0 else f'repeat {r + 1}'} {name}: {brief[:140]}")
            if r >= 0:
                out[name].append(res)
    return out


def stats(runs: Runs) -> Comp:
    """``{competitor: {key: summarize(...) for every numeric key, "runs": raw}}``."""
    return {name: {**{k: summarize([x[k] for x in rs]) for k, v in rs[0].items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)},
                   "runs": [{k: v for k, v in x.items() if not isinstance(v, list)} for x in rs]}
            for name, rs in runs.items()}


def ratios(runs: Runs, ours: str, key: str, others: Sequence[str]) -> Comp:
    """``{other: paired(ours[key], other[key])}``."""
    return {o: paired([x[key] for x in runs[ours]], [x[key] for x in runs[o]]) for o in others}


def panel(title: str, comp: Comp, key: str, unit: str) -> list:
    """A bar panel of ``key`` for every competitor that has it."""
    return [title, {n: s[key] for n, s in comp.items() if key in s}, unit]


def per_case(title: str, config: dict, cases: list[dict], head: str, cols: Cols,
             goals: Callable[[dict, str], list], plots: Cols, vs: dict[str, str] | None = None,
             **extra: Any) -> dict[str, Any]:
    """A result by case (``label``, ``competitors``): a row per case and competitor
    (``head``, then ``cols``: header, key, format, "-" where missing; then per ``vs`` header
    the case's ratios at that key, ours / each competitor, "1" for ours), ``goals(case,
    label)``, a panel per ``plots`` (title, key, unit) a competitor has; ``extra`` added
    (or replacing)."""
    vs = vs or {}
    return {"title": title, "config": config, "cases": cases,
            "targets": [t for c in cases for t in goals(c, c["label"])],
            "panels": [panel(f"{c['label']}: {t}" if t else c["label"], c["competitors"], k, u)
                       for c in cases for t, k, u in plots
                       if any(k in s for s in c["competitors"].values())],
            "table": {"columns": [head, "competitor", *(c[0] for c in cols), *vs], "rows": [
                [c["label"], n, *(cell(s[k], f) if k in s else "-" for _h, k, f in cols),
                 *(cell(c[v][n], "{:.2f}") if n in c[v] else "1" for v in vs.values())]
                for c in cases for n, s in c["competitors"].items()]}, **extra}


def local_case(title: str, config: dict, comp: Comp, cols: Cols, targets: list, plots: Cols,
               vs: dict[str, Comp] | None = None, **extra: Any) -> dict[str, Any]:
    """:func:`per_case` of one ``local disk`` case: ``targets``, a column per ``vs`` ratios."""
    return per_case(title, config, [{"label": "local disk", "competitors": comp, **(vs or {})}],
                    "case", cols, lambda c, w: targets, plots, {k: k for k in vs or {}}, **extra)


def machine_info(workdir: str) -> dict[str, Any]:
    """CPU model, cores, RAM, disk, versions, git commit, load average."""
    from importlib.metadata import version

    with open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f
                      if ln.lower().startswith("model name")), platform.processor() or "?")
    path = os.path.join(os.path.realpath(workdir), "")
    m = max((p for p in psutil.disk_partitions(all=True) if path.startswith(
        os.path.join(p.mountpoint, ""))), key=lambda p: len(p.mountpoint))
    return {"cpu_model": model, "logical_cores": os.cpu_count(),
            "ram_gb": round(psutil.virtual_memory().total / 1e9, 1),
            "platform": platform.platform(), "python": sys.version.split()[0],
            "pyarrow": pa.__version__, "pylance": version("pylance"),
            "disk": {"device": m.device, "fstype": m.fstype},  # the scratch dir's
            "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                                         capture_output=True, text=True).stdout.strip(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}


def machine_line(m: dict[str, Any]) -> str:
    return (f"{m['cpu_model']}, {m['logical_cores']} cores, {m['ram_gb']} GB RAM, "
            f"{m['disk'].get('fstype')} on {m['disk'].get('device')}, py {m['python']}, "
            f"pyarrow {m['pyarrow']}, pylance {m['pylance']}")


@contextlib.contextmanager
def load() -> Iterator[dict[str, Any]]:
    """Load average and the CPU share other processes took while active (filled on exit)."""
    def own() -> float:  # with reaped children: a stopped JVM counts
        t = psutil.Process().cpu_times()
        return t.children_user + t.children_system + sum(cpu_tree().values())

    def busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - sum(getattr(t, f, 0.0) for f in ("iowait", "guest", "steal"))

    t0, load0, busy0, own0, out = time.perf_counter(), os.getloadavg(), busy(), own(), {}
    try:
        yield out
    finally:
        avail, mine = max((time.perf_counter() - t0) * (os.cpu_count() or 1), 1e-9), own() - own0
        out.update(loadavg_start=[round(x, 2) for x in load0],
                   loadavg_end=[round(x, 2) for x in os.getloadavg()],
                   cpu_own_frac=round(mine / avail, 3),
                   cpu_others_frac=round(max(0.0, busy() - busy0 - mine) / avail, 3))


def load_line(c: dict[str, Any] | None) -> str:
    if not c:
        return "load not measured"
    warn = " (measured under contention)" if c["cpu_others_frac"] > 0.1 else ""
    return (f"load avg {c['loadavg_start'][0]:.1f} -> {c['loadavg_end'][0]:.1f}; other "
            f"processes used {c['cpu_others_frac']:.0%} of all CPU, this run "
            f"{c['cpu_own_frac']:.0%}{warn}")


def cpu_tree() -> dict[str, float]:
    """CPU s (user + system) of this process (driver) and its descendants, by kind."""
    out, root = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0, "other": 0.0}, psutil.Process()
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            kind = ("driver" if p.pid == root.pid else "jvm" if "java" in p.name()
                    else "python workers" if "python" in p.name() else "other")
            out[kind] += t.user + t.system
    return out


@contextlib.contextmanager
def rss_peak() -> Iterator[dict[str, int]]:
    """``{"peak": bytes}``: peak RSS of the Python processes started below us (20 ms samples)."""
    out, stop, me = {"peak": 0}, threading.Event(), psutil.Process()
    old = {p.pid for p in me.children(recursive=True)}

    def sample() -> None:
        while not stop.wait(0.02):
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if p.pid not in old and "python" in p.name():
                        out["peak"] = max(out["peak"], p.memory_info().rss)

    (thread := threading.Thread(target=sample, daemon=True)).start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()


# Spark's Python workers talk to the JVM over TCP by default, where a task's last small
# write can wait ~40 ms for a delayed ACK; Unix domain sockets (a setting) have no such wait.
WORKER_SOCKETS = {"tcp (Spark's default)": {},
                  "unix socket": {"spark.python.unix.domain.socket.enabled": "true"}}


@contextlib.contextmanager
def spark_session(ctx: Ctx, *sources, master: str = "local[2]", **conf: str):
    """A ``master`` SparkSession (UI off, workers on this interpreter), ``memwal``, the
    sinks of :mod:`durable_sink` and ``sources`` registered; the settings made logged."""
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in path:  # workers import benchmarks for its sinks
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *path])
    from pyspark.sql import SparkSession

    made = {"spark.master": master, "spark.sql.shuffle.partitions": "2", **conf}
    spark = SparkSession.builder.appName("memwal-bench").config(map={
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        **made}).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for s in (MemWalDataSource, durable_sink.DurableSource, durable_sink.NoopSource, *sources):
        spark.dataSource.register(s)
    ctx.extra.setdefault("spark_settings", []).append(shown := {"spark": spark.version, **made})
    ctx.log("  spark: " + ", ".join(f"{k.replace('spark.', '')}={v}" for k, v in shown.items()))
    try:
        yield spark
    finally:
        spark.stop()


def columns(n: str = "id") -> tuple[str, ...]:
    """SQL for :func:`arrow_rows`' columns from a long column ``n``."""
    return (f"{n} as id", f"concat(cast({n} as string), '{SUFFIX}') as payload",
            f"cast({n} as double) * 0.001 as score")


def frame(spark, start: int, rows: int, parts: int = 1):
    """The Spark twin of :func:`arrow_rows`."""
    return spark.range(start, start + rows, numPartitions=parts).selectExpr(*columns())


def write_outputs(result: dict[str, Any], results_dir: Path) -> list[Path]:
    """``<name>.json`` and, if the result has panels, ``<name>.png``: a panel per ``[title,
    {name: summary or [(x, y, ...)]}, x label]``, medians with min-max bars (ours red) or
    lines; title with the load, footer with the machine."""
    results_dir.mkdir(parents=True, exist_ok=True)
    (path := results_dir / f"{result['name']}.json").write_text(json.dumps(
        result, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n")
    if not (panels := result.get("panels")):
        return [path]
    import matplotlib.pyplot as plt

    plt.switch_backend("Agg")
    cols = min(2, len(panels))
    height, nrows = 0.4 * max(len(p[1]) for p in panels) + 1.6, -(-len(panels) // cols)
    fig, grid = plt.subplots(nrows, cols, squeeze=False, figsize=(6.4 * cols, height * nrows + 1))
    for ax in grid.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, comp, xlabel) in zip(grid.flat, panels, strict=False):
        if isinstance(next(iter(comp.values())), list):  # series: [(x, y, ...)] per name
            for n, pts in comp.items():
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=n[:48], lw=1)
            ax.legend(fontsize=6)
        else:
            med, lo, hi = (np.array([s[k] for s in comp.values()])
                           for k in ("median", "min", "max"))
            ax.barh(range(len(med)), med, xerr=[np.maximum(med - lo, 0), np.maximum(hi - med, 0)],
                    capsize=3, color=["#d62728" if n.lower().startswith(("memwal", "ours"))
                                      else "#1f77b4" for n in comp])
            ax.set_yticks(range(len(med)), [n[:48] for n in comp], fontsize=7)
            ax.invert_yaxis()
            xlabel += " (median, min-max bars)"
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{result['title']}\n{load_line(result.get('load'))}", fontsize=9)
    fig.text(0.5, 0.005, machine_line(result["machine"]), ha="center", va="bottom", fontsize=7,
             color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 0.93))
    fig.savefig(png := results_dir / f"{result['name']}.png", dpi=100)
    plt.close(fig)
    return [path, png]
