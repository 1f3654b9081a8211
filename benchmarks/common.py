"""Shared benchmark plumbing: machine description, data, repeats, statistics, output.

Conventions used by every benchmark:

* Competitors run side by side in one process and one run, interleaved: repeat
  ``r`` runs them in an order rotated by ``r`` so slow drift on a noisy machine
  does not favour whoever runs first.
* Every number reported is the median over the repeats; min and max are kept
  in the JSON. Ratios are ratios of medians.
* MB means 10^6 bytes. Throughput counts the Arrow buffer bytes of the data
  put (``RecordBatch.get_total_buffer_size``), identical for every competitor.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
MB = 1_000_000

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

# A row is ~58 bytes of Arrow buffers: int64 key, float64, ~38-byte string.
_SUFFIX = "abcdefghijklmnopqrstuvwxyz0123"


# --- data ---------------------------------------------------------------------

def bench_schema() -> pa.Schema:
    """``id`` (the Lance primary key, non-nullable), ``value`` (string), ``score``."""
    from memwal_datasource.table import with_primary_key

    base = pa.schema([("id", pa.int64()), ("value", pa.string()), ("score", pa.float64())])
    return with_primary_key(base, ["id"])


def make_batch(start: int, rows: int, schema: pa.Schema) -> pa.RecordBatch:
    """Rows ``start .. start+rows-1``, every buffer freshly allocated (no sharing)."""
    ids = pa.array(np.arange(start, start + rows, dtype=np.int64))
    value = pc.binary_join_element_wise(pc.cast(ids, pa.string()), _SUFFIX, "-")
    score = pc.multiply(pc.cast(ids, pa.float64()), 0.001)
    return pa.RecordBatch.from_arrays([ids, value, score], schema=schema)


def make_batches(total_bytes: int, rows: int, schema: pa.Schema) -> list[pa.RecordBatch]:
    """Batches of ``rows`` rows until at least ``total_bytes`` Arrow bytes."""
    out, size, start = [], 0, 0
    while size < total_bytes:
        b = make_batch(start, rows, schema)
        out.append(b)
        size += b.get_total_buffer_size()
        start += rows
    return out


def nbytes_of(batches: Sequence[pa.RecordBatch]) -> int:
    return sum(b.get_total_buffer_size() for b in batches)


def group_like_writer(batches: Sequence[pa.RecordBatch], buffer_size: int) -> list[list]:
    """Group batches into WAL entries exactly as ``WalOnlyShardWriter`` does
    when the producer outruns the flusher: batches until the entry holds at
    least ``buffer_size`` Arrow bytes (as Lance cuts entries)."""
    groups: list[list] = []
    cur: list = []
    size = 0
    for b in batches:
        cur.append(b)
        size += b.get_total_buffer_size()
        if size >= buffer_size:
            groups.append(cur)
            cur, size = [], 0
    if cur:
        groups.append(cur)
    return groups


# --- statistics ---------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=float), q))


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """median / min / max / n plus the raw values."""
    vals = [float(v) for v in values]
    return {
        "median": statistics.median(vals) if vals else float("nan"),
        "min": min(vals) if vals else float("nan"),
        "max": max(vals) if vals else float("nan"),
        "n": len(vals),
        "values": vals,
    }


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def paired(num: Sequence[float], den: Sequence[float]) -> dict[str, Any]:
    """Summary of per-repeat ratios ``num[r] / den[r]`` (same-repeat pairs, so slow
    drift on a loaded machine cancels); its median is the headline ratio."""
    return summarize([ratio(a, b) for a, b in zip(num, den, strict=True)])


def ratio_target(what: str, r: dict[str, Any], goal: float | None,
                 at_most: bool = False) -> dict[str, Any]:
    """A goal on a ratio summarised by :func:`paired`: met by its median."""
    value = f"{r['median']:.3g} (range {r['min']:.3g}..{r['max']:.3g}, {r['n']} repeats)"
    if goal is None:
        return {"what": f"{what} (reported, no goal)", "value": value, "met": None, "ratio": r}
    met = r["median"] <= goal if at_most else r["median"] >= goal
    return {"what": f"{what} {'<=' if at_most else '>='} {goal}", "value": value, "met": met,
            "ratio": r, "goal": goal}


def interleaved(
    repeats: int, competitors: dict[str, Callable[[int], dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """Run each competitor ``repeats`` times, rotating their order every repeat.

    Each callable gets the repeat index and returns a dict of measurements.
    ``gc.collect()`` runs (untimed) before each call.
    """
    names = list(competitors)
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            gc.collect()
            out[name].append(competitors[name](r))
    return out


def rm_tree(path: str | os.PathLike) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --- the machine --------------------------------------------------------------

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mount_of(path: str) -> dict[str, str]:
    """Device, mount point and filesystem type of ``path`` from /proc/mounts."""
    path = os.path.realpath(path)
    best = {"device": "?", "mount": "/", "fstype": "?"}
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype, opts = line.split()[:4]
                mnt = mnt.replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                    best["mount"]
                ):
                    best = {"device": dev, "mount": mnt, "fstype": fstype, "options": opts}
    except OSError:
        pass
    return best


def disk_info(path: str) -> dict[str, Any]:
    """Where benchmark data lives: filesystem, device, size, rotational flag."""
    info: dict[str, Any] = {"path": str(path), **_mount_of(path)}
    try:
        usage = shutil.disk_usage(path)
        info["size_gb"] = round(usage.total / 1e9, 1)
        info["free_gb"] = round(usage.free / 1e9, 1)
    except OSError:
        pass
    dev = os.path.basename(info.get("device", ""))
    for name in (dev, dev.rstrip("0123456789"), dev.rstrip("0123456789").rstrip("p")):
        rot = Path(f"/sys/block/{name}/queue/rotational")
        if name and rot.exists():
            info["rotational"] = rot.read_text().strip() == "1"
            model = Path(f"/sys/block/{name}/device/model")
            if model.exists():
                info["model"] = model.read_text().strip()
            break
    return info


def machine_info(workdir: str) -> dict[str, Any]:
    """Platform, CPU, cores, RAM, versions and the disk of ``workdir``."""
    import lance
    import psutil

    mem = psutil.virtual_memory()
    return {
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_gb": round(mem.total / 1e9, 1),
        "python": sys.version.split()[0],
        "pyarrow": pa.__version__,
        "pylance": getattr(lance, "__version__", "?"),
        "numpy": np.__version__,
        "disk": disk_info(workdir),
        "loadavg_at_start": list(os.getloadavg()),
        "git_commit": _git_commit(),
    }


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


class CpuContention:
    """How much CPU other processes took while a benchmark ran.

    ``others`` = system busy CPU time minus this process's and its reaped
    children's, as a fraction of ``cores x wall``. On a 2-core box anything
    above ~0.1 means the numbers were measured under contention.
    """

    def __enter__(self) -> CpuContention:
        import psutil

        self._p = psutil.Process()
        self.t0 = time.perf_counter()
        self.load0 = os.getloadavg()
        self.sys0 = psutil.cpu_times()
        self.own0 = self._own()
        return self

    def _own(self) -> float:
        c = self._p.cpu_times()
        return c.user + c.system + c.children_user + c.children_system

    @staticmethod
    def _busy(t) -> float:
        # guest time is already inside user; steal is the hypervisor's, reported apart.
        return sum(t) - t.idle - sum(getattr(t, f, 0.0) for f in
                                     ("iowait", "guest", "guest_nice", "steal"))

    def __exit__(self, *exc) -> None:
        import psutil

        wall = time.perf_counter() - self.t0
        sys1 = psutil.cpu_times()
        cores = psutil.cpu_count() or 1
        avail = max(wall * cores, 1e-9)
        busy = self._busy(sys1) - self._busy(self.sys0)
        own = self._own() - self.own0
        self.result = {
            "loadavg_start": [round(x, 2) for x in self.load0],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "cpu_own_frac": round(own / avail, 3),
            "cpu_others_frac": round(max(0.0, busy - own) / avail, 3),
            "cpu_steal_frac": round((getattr(sys1, "steal", 0.0)
                                     - getattr(self.sys0, "steal", 0.0)) / avail, 3),
            "iowait_frac": round((getattr(sys1, "iowait", 0.0)
                                  - getattr(self.sys0, "iowait", 0.0)) / avail, 3),
        }


def contention_line(c: dict[str, Any] | None) -> str:
    if not c:
        return "contention not measured"
    warn = " **(measured under contention)**" if c["cpu_others_frac"] > 0.1 else ""
    return (f"other processes (and kernel threads) used {c['cpu_others_frac']:.0%} of all CPU "
            f"(this benchmark {c['cpu_own_frac']:.0%}, steal {c['cpu_steal_frac']:.0%}, "
            f"iowait {c['iowait_frac']:.0%}); load avg {c['loadavg_start'][0]:.1f} -> "
            f"{c['loadavg_end'][0]:.1f}{warn}")


def machine_line(m: dict[str, Any]) -> str:
    """One line naming the machine, for plots and tables."""
    d = m["disk"]
    rot = {True: "rotational=1", False: "rotational=0"}.get(d.get("rotational"), "?")
    return (f"{m['cpu_model']}, {m['logical_cores']} cores, {m['ram_gb']} GB RAM, "
            f"{d.get('fstype')} on {d.get('device')} ({rot}), {m['platform']}, "
            f"py {m['python']}, pyarrow {m['pyarrow']}, pylance {m['pylance']}")


# --- running context and output -------------------------------------------------

@dataclass
class BenchContext:
    """What every benchmark function receives."""

    workdir: Path
    quick: bool
    repeats: int
    machine: dict[str, Any]
    log: Callable[[str], None] = print
    extra: dict[str, Any] = field(default_factory=dict)
    full: bool = False  # the sizes (--full); the default finishes in minutes

    @property
    def scale(self) -> str:
        """``quick`` (smoke run), ``default`` or ``full``."""
        return "quick" if self.quick else "full" if self.full else "default"

    def pick(self, quick: Any, default: Any, full: Any) -> Any:
        """The size for this run's scale."""
        return {"quick": quick, "default": default, "full": full}[self.scale]

    def scratch(self, name: str) -> Path:
        """A fresh, empty directory under the work dir."""
        p = self.workdir / name
        rm_tree(p)
        p.mkdir(parents=True)
        return p


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every directory (so names are durable too)."""
    def fsync(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    dirs = []
    for here, _subdirs, files in os.walk(root):
        dirs.append(here)
        for name in files:
            fsync(os.path.join(here, name))
    for d in reversed(dirs):
        fsync(d)


class Stopwatch:
    """``with Stopwatch() as t: ...``; then ``t.seconds``."""

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.start


def write_json(name: str, result: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def new_figure(nplots: int = 1, width: float = 6.0, height: float = 4.2):
    """A matplotlib figure (Agg backend) with ``nplots`` side-by-side axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, nplots, figsize=(width * nplots, height), squeeze=False)
    return fig, list(axes[0])


_OUTPUT = {"results_dir": RESULTS_DIR}


def set_results_dir(path: Path) -> None:
    """Where :func:`save_figure` writes (``run.py --results-dir``)."""
    _OUTPUT["results_dir"] = Path(path)


def save_figure(fig, name: str, title: str, machine: dict[str, Any],
                results_dir: Path | None = None) -> Path:
    import matplotlib.pyplot as plt

    results_dir = results_dir or _OUTPUT["results_dir"]
    results_dir.mkdir(parents=True, exist_ok=True)
    fig.suptitle(title, fontsize=11)
    fig.text(0.5, 0.005, machine_line(machine), ha="center", va="bottom", fontsize=7,
             color="#555555", wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    path = results_dir / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def verdict(ok: bool | None) -> str:
    return {True: "MET", False: "MISSED", None: "n/a"}[ok]


# --- the scenario harness (small_writes, stream_latency, writer_ceiling) --------

def run_alternated(ctx: BenchContext, competitors: dict[str, Callable[[int], dict[str, Any]]],
                   warmup: int = 1, label: str = "",
                   repeats: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """``warmup`` untimed rounds of every competitor (repeat index -1), then
    :func:`interleaved` over ``repeats`` (default ``ctx.repeats``); logs one line
    per call."""
    def logged(name: str, fn: Callable[[int], dict[str, Any]]):
        def run(r: int) -> dict[str, Any]:
            out = fn(r)
            brief = ", ".join(f"{k} {v:.3g}" for k, v in out.items()
                              if isinstance(v, (int, float)) and not isinstance(v, bool))[:150]
            ctx.log(f"  {label}{'warm-up' if r < 0 else f'repeat {r}'} {name}: {brief}")
            return out
        return run

    wrapped = {n: logged(n, fn) for n, fn in competitors.items()}
    for _ in range(warmup):
        for fn in wrapped.values():
            gc.collect()
            fn(-1)
    return interleaved(repeats or ctx.repeats, wrapped)


def summarize_runs(runs: dict[str, list[dict[str, Any]]],
                   keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{competitor: {key: summarize(per-repeat values), "runs": raw}}`` for every
    numeric ``key`` the runs report."""
    return {name: {**{k: summarize([x[k] for x in rs]) for k in keys if k in rs[0]},
                   "runs": rs}
            for name, rs in runs.items()}


def cell(s: dict[str, Any], fmt: str = "{:.3g}") -> str:
    """``median (min..max)`` of a :func:`summarize` result."""
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}..{fmt.format(s['max'])})"


def value_target(what: str, s: dict[str, Any], goal: float, at_most: bool = True,
                 unit: str = "") -> dict[str, Any]:
    """A goal on an absolute value summarised by :func:`summarize`: met by its median."""
    value = f"{s['median']:.3g}{unit} (range {s['min']:.3g}..{s['max']:.3g}, {s['n']} repeats)"
    met = s["median"] <= goal if at_most else s["median"] >= goal
    return {"what": f"{what} {'<=' if at_most else '>='} {goal}", "value": value, "met": met,
            "goal": goal}


def bars_figure(result: dict[str, Any], machine: dict[str, Any],
                panels: Sequence[tuple[str, dict[str, dict[str, Any]], str, float]]) -> Path:
    """``<result name>.png``: one horizontal bar panel per ``(panel title, {competitor:
    summarize()}, x label, scale)``, medians with min-max error bars; the title carries
    the run's load (``result["contention"]``), the footer the machine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    height = 0.45 * max(len(p[1]) for p in panels) + 1.6
    fig, grid = plt.subplots(rows, cols, figsize=(6.2 * cols, height * rows + 0.6),
                             squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, (sub, stats, xlabel, scale) in zip(axes, panels, strict=True):
        names = list(stats)
        med = [stats[n]["median"] / scale for n in names]
        err = [[max(0.0, m - stats[n]["min"] / scale) for m, n in zip(med, names, strict=True)],
               [max(0.0, stats[n]["max"] / scale - m) for m, n in zip(med, names, strict=True)]]
        colors = ["#d62728" if n.lower().startswith(("memwal", "ours")) else "#1f77b4"
                  for n in names]
        ax.barh(range(len(names)), med, xerr=err, capsize=3, color=colors)
        ax.set_yticks(range(len(names)), [n if len(n) < 48 else n[:46] + "..." for n in names],
                      fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"{xlabel} (median, min-max bars)", fontsize=8)
        ax.set_title(sub, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    c = result.get("contention")
    load = (f"\nload avg {c['loadavg_start'][0]:.1f} -> {c['loadavg_end'][0]:.1f} on "
            f"{machine.get('logical_cores')} cores; other processes used "
            f"{c['cpu_others_frac']:.0%} of all CPU" if c else "")
    return save_figure(fig, result["name"], result["title"] + load, machine)
