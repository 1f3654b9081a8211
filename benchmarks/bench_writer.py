"""The core ShardWriter against the disk and against pylance's native writer.

* :func:`bench_throughput`: WAL-only writer vs a raw open/write/fsync loop of the
  same pre-encoded IPC bytes (durable vs durable), and pylance's native writer
  (which makes no fsync on local disk).
* :func:`bench_durable_latency`: put latency with ``durable_write=True``.

The peak RSS of a writing Spark worker is in :mod:`benchmarks.bench_spark`.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.format import encode_wal_buffer, encode_wal_entry, wal_key
from memwal_datasource.shard_writer import open_shard_writer
from memwal_datasource.store import LocalStore
from memwal_datasource.table import create_table

from .common import (
    MB,
    BenchContext,
    KiB,
    MiB,
    Stopwatch,
    bars_figure,
    bench_schema,
    cell,
    fmt_bytes,
    group_like_writer,
    interleaved,
    make_batch,
    make_batches,
    nbytes_of,
    new_figure,
    paired,
    percentile,
    ratio_target,
    rm_tree,
    run_alternated,
    save_figure,
    summarize,
    summarize_runs,
)

OURS = "ours (WAL-only, durable at close)"
NATIVE = "pylance native (MemTable, no fsync)"
DISK = "raw loop (open+write+fsync per file)"
ENCODE = "encode only (CPU, no I/O)"


def _dir_usage(path: str) -> tuple[int, int]:
    """(files, bytes) under ``path`` whose name ends with ``.arrow``."""
    files = size = 0
    for dirpath, _d, names in os.walk(path):
        for n in names:
            if n.endswith(".arrow"):
                files += 1
                size += os.path.getsize(os.path.join(dirpath, n))
    return files, size


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ---------------------------------------------------------------------------
# 1. throughput
# ---------------------------------------------------------------------------

def _throughput_case(ctx: BenchContext, schema, batches, size: int) -> dict[str, Any]:
    """One (batch size, entry size) case: every competitor, interleaved."""
    import lance

    nbytes, nrows = nbytes_of(batches), sum(b.num_rows for b in batches)
    groups = group_like_writer(batches, size)
    encoded = [encode_wal_buffer(schema, g, 1) for g in groups]
    cfg = ShardWriterConfig(enable_memtable=False, durable_write=False, max_wal_buffer_size=size)

    def ours(r: int) -> dict[str, Any]:
        root = ctx.scratch(f"tp_ours_{r}")
        uri = str(root / "t.lance")
        with Stopwatch() as t:
            w = open_shard_writer(uri, str(uuid.uuid4()), schema, cfg)
            for b in batches:
                w.put(b)
            w.close()
        files, on_disk = _dir_usage(uri)
        rm_tree(root)
        return {"seconds": t.seconds, "wal_entries": w.stats().wal_entries, "files": files,
                "wal_bytes": on_disk}

    def native(r: int) -> dict[str, Any]:
        root = ctx.scratch(f"tp_native_{r}")
        uri = str(root / "t.lance")
        create_table(uri, schema)
        ds = lance.dataset(uri)
        with Stopwatch() as t:
            w = ds.mem_wal_writer(str(uuid.uuid4()), durable_write=False,
                                  max_wal_buffer_size=size)
            for b in batches:
                w.put(b)
            w.close()
        files, on_disk = _dir_usage(os.path.join(uri, "_mem_wal"))
        rm_tree(root)
        return {"seconds": t.seconds, "wal_entries": files, "wal_bytes": on_disk}

    def disk(r: int) -> dict[str, Any]:
        root = ctx.scratch(f"tp_disk_{r}")
        shard = str(uuid.uuid4())
        with Stopwatch() as t:
            os.makedirs(root / "_mem_wal" / shard / "wal")
            for i, data in enumerate(encoded, 1):
                fd = os.open(os.path.join(root, wal_key(shard, i)),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
        rm_tree(root)
        return {"seconds": t.seconds, "wal_entries": len(encoded),
                "wal_bytes": sum(e.size for e in encoded)}

    def encode_only(r: int) -> dict[str, Any]:
        with Stopwatch() as t:
            out = [encode_wal_buffer(schema, g, 1) for g in groups]
        return {"seconds": t.seconds, "wal_entries": len(out),
                "wal_bytes": sum(e.size for e in out)}

    runs = interleaved(ctx.repeats, {OURS: ours, DISK: disk, NATIVE: native,
                                     ENCODE: encode_only})
    comp = {}
    for name, rs in runs.items():
        secs = [x["seconds"] for x in rs]
        comp[name] = {"seconds": summarize(secs),
                      "mb_s": summarize([nbytes / s / MB for s in secs]),
                      "wal_entries": rs[0]["wal_entries"], "wal_bytes": rs[0]["wal_bytes"],
                      "runs": rs}
    speed = {n: [nbytes / x["seconds"] for x in rs] for n, rs in runs.items()}
    return {"batch_rows": batches[0].num_rows, "batch_bytes": batches[0].get_total_buffer_size(),
            "buffer_size": size, "bytes": nbytes, "rows": nrows,
            "mean_entry_bytes": sum(e.size for e in encoded) / len(encoded),
            "competitors": comp,
            "ratios": {"ours/disk": paired(speed[OURS], speed[DISK]),
                       "ours/native": paired(speed[OURS], speed[NATIVE]),
                       "encode/disk": paired(speed[ENCODE], speed[DISK])}}


def bench_throughput(ctx: BenchContext) -> dict[str, Any]:
    """The core WAL-only writer against a raw fsync loop of the same IPC bytes."""
    schema = bench_schema()
    batch_rows_list = ctx.pick((1_000, 10_000), (1_000, 10_000), (1_000, 10_000, 100_000))
    buffers = (64 * KiB, 1 * MiB, 8 * MiB)
    total = ctx.pick(8 * MiB, 128 * MiB, 256 * MiB)  # the claim (~4 fsyncs) is fixed
    cases = []
    for rows in batch_rows_list:
        batches = make_batches(total, rows, schema)
        for size in buffers:
            ctx.log(f"  throughput: batches of {rows} rows "
                    f"({fmt_bytes(batches[0].get_total_buffer_size())}), "
                    f"max_wal_buffer_size {fmt_bytes(size)}, {fmt_bytes(total)} per run")
            cases.append(_throughput_case(ctx, schema, batches, size))
    rows_table = []
    for c in cases:
        cm, rt = c["competitors"], c["ratios"]
        rows_table.append([
            f"{c['batch_rows']:,}", fmt_bytes(c["buffer_size"]),
            fmt_bytes(c["mean_entry_bytes"]),
            f"{cm[OURS]['mb_s']['median']:.0f}", f"{cm[DISK]['mb_s']['median']:.0f}",
            f"{cm[NATIVE]['mb_s']['median']:.0f}", f"{cm[ENCODE]['mb_s']['median']:.0f}",
            _ratio_cell(rt["ours/disk"]), _ratio_cell(rt["ours/native"])])
    targets = [ratio_target(f"ours / raw fsync loop MB/s, {c['batch_rows']:,}-row batches, "
                            f"{fmt_bytes(c['buffer_size'])} entries", c["ratios"]["ours/disk"],
                            0.9) for c in cases]
    targets += [ratio_target(f"ours / pylance native MB/s, {c['batch_rows']:,}-row batches, "
                             f"{fmt_bytes(c['buffer_size'])} entries (native makes no fsync "
                             "and also builds a MemTable: not equal work)",
                             c["ratios"]["ours/native"], None) for c in cases]
    return {
        "name": "throughput",
        "title": "Core WAL-only writer vs a raw open/write/fsync loop of the same bytes",
        "config": {
            "bytes_per_run": total, "batch_rows": list(batch_rows_list),
            "max_wal_buffer_size": list(buffers), "scale": ctx.scale,
            "ours": "open_shard_writer(enable_memtable=False, durable_write=False, "
                    "max_wal_buffer_size=S); put each batch; close(). Durable when close() "
                    "returns: every entry file fsynced (by the sync thread, behind the PUTs) "
                    "and its directory",
            "disk": "the same IPC bytes, encoded beforehand (untimed) and grouped as our "
                    "writer groups them: per entry O_EXCL create + write + fsync(file) + close "
                    "(no directory fsync, so slightly less durable work than ours)",
            "native": "lance.dataset(uri).mem_wal_writer(shard, durable_write=False, "
                      "max_wal_buffer_size=S); put; close. pylance's local object store makes "
                      "no fsync at all, and the native writer also builds a MemTable and an "
                      "SSTable at close: reported, no goal",
            "encode_only": "component: encode_wal_buffer of the same groups, no I/O",
            "timed": "from open to the end of close; table creation and cleanup untimed",
            "ratios": "per repeat (same repeat, rotated order), then median and range",
            "MB": "10^6 Arrow buffer bytes of the input data",
        },
        "cases": cases,
        "table": {"columns": ["batch rows", "max_wal_buffer_size", "mean entry", "ours MB/s",
                              "raw loop MB/s", "native MB/s", "encode MB/s",
                              "ours / raw (range)", "ours / native (range)"],
                  "rows": rows_table},
        "targets": targets,
    }


def _ratio_cell(r: dict[str, Any]) -> str:
    return f"{r['median']:.2f} ({r['min']:.2f}..{r['max']:.2f})"


def plot_throughput(result: dict[str, Any], machine: dict[str, Any]) -> None:
    cases = result["cases"]
    batch_rows = sorted({c["batch_rows"] for c in cases})
    fig, axes = new_figure(len(batch_rows), width=5.2, height=4.4)
    for ax, rows in zip(axes, batch_rows, strict=True):
        sub = [c for c in cases if c["batch_rows"] == rows]
        for key, color in (("ours/disk", "#1f77b4"), ("ours/native", "#ff7f0e")):
            st = [c["ratios"][key] for c in sub]
            med = [s["median"] for s in st]
            err = [[m - s["min"] for m, s in zip(med, st, strict=True)],
                   [s["max"] - m for m, s in zip(med, st, strict=True)]]
            off = -0.2 if key == "ours/disk" else 0.2
            ax.bar([i + off for i in range(len(sub))], med, 0.4, yerr=err, capsize=3,
                   color=color, label=key.replace("disk", "raw fsync loop"))
        ax.axhline(0.9, color="red", ls="--", lw=1, label="goal ours/raw >= 0.9")
        ax.set_xticks(range(len(sub)), [fmt_bytes(c["buffer_size"]) for c in sub])
        ax.set_xlabel("max_wal_buffer_size")
        ax.set_ylabel("MB/s ratio (median, min-max bars)")
        ax.set_title(f"batches of {rows:,} rows", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    save_figure(fig, "throughput", result["title"], machine)


# ---------------------------------------------------------------------------
# 2. durable put latency
# ---------------------------------------------------------------------------

INTERVAL_MS = 10


def bench_durable_latency(ctx: BenchContext) -> dict[str, Any]:
    """Closed-loop small durable puts, one thread; per-put wall time."""
    import lance

    schema = bench_schema()
    rows = 1_000
    n_puts = 40 if ctx.quick else 300
    warmup = 5
    batches = [make_batch(i * rows, rows, schema) for i in range(n_puts + warmup)]
    entry = encode_wal_entry(schema, [batches[0]], 1)

    def timed_puts(put) -> list[float]:
        lat = []
        for i, b in enumerate(batches):
            t0 = time.perf_counter()
            put(b)
            if i >= warmup:
                lat.append((time.perf_counter() - t0) * 1e3)
        return lat

    def ours(r: int) -> dict[str, Any]:
        root = ctx.scratch(f"lat_ours_{r}")
        cfg = ShardWriterConfig(enable_memtable=False, durable_write=True,
                                max_wal_flush_interval_ms=INTERVAL_MS)
        w = open_shard_writer(str(root / "t.lance"), str(uuid.uuid4()), schema, cfg)
        lat = timed_puts(w.put)
        w.close()
        st = w.stats()
        fl = st.flushes[warmup:]
        rm_tree(root)
        return {"lat_ms": lat, "wal_entries": st.wal_entries,
                "flush_queue_wait_ms": percentile([f.queue_wait_s * 1e3 for f in fl], 50),
                "flush_put_ms": percentile([f.put_s * 1e3 for f in fl], 50),
                "flush_total_ms": percentile([f.total_s * 1e3 for f in fl], 50),
                "flush_total_p99_ms": percentile([f.total_s * 1e3 for f in fl], 99)}

    def native(r: int) -> dict[str, Any]:
        root = ctx.scratch(f"lat_native_{r}")
        uri = str(root / "t.lance")
        create_table(uri, schema)
        w = lance.dataset(uri).mem_wal_writer(str(uuid.uuid4()), durable_write=True,
                                              max_wal_flush_interval_ms=INTERVAL_MS)
        lat = timed_puts(w.put)
        w.close()
        stats = dict(w.stats())
        rm_tree(root)
        return {"lat_ms": lat, "wal_entries": stats.get("wal_flush_count")}

    def store(r: int) -> dict[str, Any]:
        root = ctx.scratch(f"lat_store_{r}")
        s, shard, pos = LocalStore(str(root)), str(uuid.uuid4()), iter(range(1, 1 << 30))
        lat = timed_puts(lambda _b: s.put_if_absent(wal_key(shard, next(pos)), entry))
        rm_tree(root)
        return {"lat_ms": lat, "wal_entries": len(lat) + warmup}

    names = {OURS: ours, NATIVE: native,
             "LocalStore.put_if_absent (no batching wait)": store}
    runs = interleaved(ctx.repeats, names)
    comp = {}
    for name, rs in runs.items():
        comp[name] = {
            "p50_ms": summarize([percentile(x["lat_ms"], 50) for x in rs]),
            "p99_ms": summarize([percentile(x["lat_ms"], 99) for x in rs]),
            "mean_ms": summarize([sum(x["lat_ms"]) / len(x["lat_ms"]) for x in rs]),
            "max_ms": summarize([max(x["lat_ms"]) for x in rs]),
            "pooled_p50_ms": percentile([v for x in rs for v in x["lat_ms"]], 50),
            "pooled_p99_ms": percentile([v for x in rs for v in x["lat_ms"]], 99),
            "wal_entries": [x["wal_entries"] for x in rs],
            "lat_ms": [x["lat_ms"] for x in rs],
        }
        if "flush_put_ms" in rs[0]:
            # Our writer's own FlushTiming: enqueue -> flush start, the PUT, enqueue -> durable.
            comp[name]["flush_breakdown_ms"] = {
                k: summarize([x[k] for x in rs])["median"]
                for k in ("flush_queue_wait_ms", "flush_put_ms", "flush_total_ms",
                          "flush_total_p99_ms")}
    target = INTERVAL_MS + 5
    table_rows = [[name, f"{c['p50_ms']['median']:.2f}", f"{c['p99_ms']['median']:.2f}",
                   f"{c['max_ms']['median']:.1f}", f"{c['mean_ms']['median']:.2f}",
                   f"{c['pooled_p99_ms']:.2f}"] for name, c in comp.items()]
    targets = [{"what": f"{name} p99 <= {target} ms (interval {INTERVAL_MS} ms + 5 ms)",
                "value": f"median p99 {comp[name]['p99_ms']['median']:.2f} ms "
                         f"(p50 {comp[name]['p50_ms']['median']:.2f} ms)",
                "met": comp[name]["p99_ms"]["median"] <= target}
               for name in (OURS, NATIVE)]
    return {
        "name": "durable_latency",
        "title": f"Durable put latency, {rows:,}-row puts, max_wal_flush_interval_ms={INTERVAL_MS}",
        "config": {"rows_per_put": rows, "puts_per_repeat": n_puts, "warmup_puts": warmup,
                   "durable_write": True, "max_wal_flush_interval_ms": INTERVAL_MS,
                   "pattern": "one thread, closed loop: each put returns when durable, "
                              "then the next put starts",
                   "entry_bytes": len(entry)},
        "competitors": comp,
        "table": {"columns": ["writer", "p50 ms", "p99 ms", "max ms", "mean ms",
                              "pooled p99 ms"], "rows": table_rows},
        "targets": targets,
    }


def plot_durable_latency(result: dict[str, Any], machine: dict[str, Any]) -> None:
    fig, (ax,) = new_figure(1, width=7.5, height=4.6)
    for name, c in result["competitors"].items():
        vals = sorted(v for run in c["lat_ms"] for v in run)
        n = len(vals)
        ax.plot(vals, [(i + 1) / n for i in range(n)], label=name)
    target = result["config"]["max_wal_flush_interval_ms"] + 5
    ax.axvline(target, color="red", ls="--", lw=1, label=f"target p99 <= {target} ms")
    ax.axhline(0.99, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("put latency (ms, log scale), all repeats pooled")
    ax.set_ylabel("cumulative fraction")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, "durable_latency", result["title"], machine)


# ---------------------------------------------------------------------------
# 3. the writer's ceiling: the fastest durable raw loop on this disk (issue 21)
# ---------------------------------------------------------------------------

RAW_PAR = "raw (a): write all, parallel fsync of files, then dir fsync"
RAW_DSYNC = "raw (b): O_DSYNC writes, then dir fsync"
RAW_SERIAL = "raw (c): one file at a time, write + fsync, then dir fsync"
FSYNC_THREADS = 8


def _fsync_path(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw_files(ctx: BenchContext, tag: str, r: int, encoded, mode: str) -> dict[str, Any]:
    """The same IPC bytes as the writer's entries, at the writer's keys, made durable
    ``mode`` = ``parallel`` | ``dsync`` | ``serial``; every file O_EXCL (put-if-absent)."""
    from concurrent.futures import ThreadPoolExecutor

    root = ctx.scratch(f"wc_{tag}_{r + 1}")
    shard = str(uuid.uuid4())
    wal_dir = root / "_mem_wal" / shard / "wal"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DSYNC if mode == "dsync" else 0)
    pool = ThreadPoolExecutor(FSYNC_THREADS) if mode == "parallel" else None
    try:
        with Stopwatch() as t:
            os.makedirs(wal_dir)
            pending = []
            for i, data in enumerate(encoded, 1):
                path = os.path.join(root, wal_key(shard, i))
                fd = os.open(path, flags, 0o644)
                try:
                    _write_all(fd, data)
                    if mode == "serial":
                        os.fsync(fd)
                finally:
                    os.close(fd)
                if pool is not None:
                    pending.append(pool.submit(_fsync_path, path))
            for f in pending:
                f.result()
            _fsync_path(str(wal_dir))
    finally:
        if pool is not None:
            pool.shutdown()
        rm_tree(root)
    return {"seconds": t.seconds, "files": len(encoded)}


def bench_writer_ceiling(ctx: BenchContext) -> dict[str, Any]:
    """The core WAL-only writer vs the fastest durable raw loop of the same bytes."""
    schema = bench_schema()
    rows = 1_000
    entries = (64 * KiB, 1 * MiB)
    total = ctx.pick(8 * MiB, 64 * MiB, 256 * MiB)
    batches = make_batches(total, rows, schema)
    nbytes = nbytes_of(batches)
    cases, table_rows, targets = [], [], []
    for size in entries:
        encoded = [encode_wal_buffer(schema, g, 1) for g in group_like_writer(batches, size)]
        cfg = ShardWriterConfig(enable_memtable=False, durable_write=False,
                                max_wal_buffer_size=size)

        def ours(r: int, cfg=cfg) -> dict[str, Any]:
            root = ctx.scratch(f"wc_ours_{r + 1}")
            try:
                with Stopwatch() as t:
                    w = open_shard_writer(str(root / "t.lance"), str(uuid.uuid4()), schema, cfg)
                    for b in batches:
                        w.put(b)
                    w.close()
            finally:
                rm_tree(root)
            return {"seconds": t.seconds, "files": w.stats().wal_entries}

        def raw(mode: str, encoded=encoded):
            return lambda rep: _raw_files(ctx, mode, rep, encoded, mode)

        comps = {OURS: ours, RAW_PAR: raw("parallel"), RAW_DSYNC: raw("dsync"),
                 RAW_SERIAL: raw("serial")}
        runs = run_alternated(ctx, comps, label=f"{fmt_bytes(size)} entries: ")
        for rs in runs.values():
            for x in rs:
                x["mb_s"] = nbytes / x["seconds"] / MB
        comp = summarize_runs(runs, ("mb_s", "seconds", "files"))
        winner = max((RAW_PAR, RAW_DSYNC, RAW_SERIAL), key=lambda k: comp[k]["mb_s"]["median"])
        vs = paired([x["mb_s"] for x in runs[OURS]], [x["mb_s"] for x in runs[winner]])
        cases.append({"entry_bytes": size, "mean_entry_bytes": sum(e.size for e in encoded)
                      / len(encoded), "competitors": comp, "winner": winner,
                      "ratios": {"ours/winner": vs, **{
                          f"ours/{k.split(':')[0]}": paired(
                              [x["mb_s"] for x in runs[OURS]], [x["mb_s"] for x in runs[k]])
                          for k in (RAW_PAR, RAW_DSYNC, RAW_SERIAL)}}})
        for name, c in comp.items():
            r = paired([x["mb_s"] for x in runs[OURS]], [x["mb_s"] for x in c["runs"]])
            table_rows.append([fmt_bytes(size), name + (" (winner)" if name == winner else ""),
                               cell(c["mb_s"], "{:.0f}"), str(int(c["files"]["median"])),
                               cell(r, "{:.2f}")])
        targets.append(ratio_target(f"{fmt_bytes(size)} entries: ours / fastest durable raw loop "
                                    f"({winner.split(':')[0]}) MB/s", vs, 0.9))
    return {
        "name": "writer_ceiling",
        "title": "Core WAL-only writer vs the fastest durable way to write the same bytes",
        "config": {"bytes_per_run": total, "arrow_bytes": nbytes, "batch_rows": rows,
                   "entry_sizes": list(entries),
                   "ours": "open_shard_writer(enable_memtable=False, durable_write=False, "
                           "max_wal_buffer_size=S); put every batch; close() (durable at close: "
                           "claim, sentinel, entries, fsyncs)",
                   "raw": "the same encoded IPC entries (encoding untimed), O_EXCL create at "
                          "the WAL keys; (a) write every file then fsync them on "
                          f"{FSYNC_THREADS} threads as they are written, (b) O_DSYNC writes, "
                          "(c) write+fsync one file at a time; each then fsyncs the WAL dir",
                   "MB": "10^6 Arrow buffer bytes of the input batches"},
        "cases": cases,
        "table": {"columns": ["entries", "competitor", "MB/s", "files", "ours / it (range)"],
                  "rows": table_rows},
        "targets": targets,
    }


def plot_writer_ceiling(result: dict[str, Any], machine: dict[str, Any]) -> None:
    bars_figure(result, machine,
                [(f"{fmt_bytes(c['entry_bytes'])} entries",
                  {n.split(":")[0]: s["mb_s"] for n, s in c["competitors"].items()}, "MB/s", 1.0)
                 for c in result["cases"]])
