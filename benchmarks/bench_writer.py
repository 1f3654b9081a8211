"""ShardWriter against pylance's native writer and against the disk.

* :func:`bench_throughput`: WAL-only writer vs native (MemTable mode) vs a plain
  fsync-per-file loop writing the same pre-encoded IPC bytes.
* :func:`bench_durable_latency`: put latency with ``durable_write=True``.
* :func:`bench_peak_rss`: peak RSS while writing 4 GB through the WAL-only
  writer, measured in a subprocess (``benchmarks.rss_child``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.format import encode_wal_entry, wal_key
from memwal_datasource.store import LocalStore
from memwal_datasource.table import create_table
from memwal_datasource.writer import open_shard_writer

from .common import (
    MB,
    BenchContext,
    GiB,
    KiB,
    MiB,
    Stopwatch,
    bench_schema,
    fmt_bytes,
    group_like_writer,
    interleaved,
    make_batch,
    make_batches,
    nbytes_of,
    new_figure,
    percentile,
    ratio,
    rm_tree,
    save_figure,
    summarize,
)

OURS = "ours (WAL-only)"
NATIVE = "native (pylance MemTable)"
DISK = "disk (write+fsync per file)"
STORE = "LocalStore.put_if_absent loop"
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ---------------------------------------------------------------------------
# 1. throughput
# ---------------------------------------------------------------------------

def bench_throughput(ctx: BenchContext) -> dict[str, Any]:
    """Same Arrow data, four writers, several batch and WAL entry sizes."""
    import lance

    schema = bench_schema()
    if ctx.quick:
        batch_rows_list, buffers, total = (1_000, 10_000), (64 * KiB, 2 * MiB), 8 * MiB
    else:
        batch_rows_list = (1_000, 10_000, 100_000)
        buffers = (64 * KiB, 512 * KiB, 2 * MiB, 8 * MiB)
        total = 128 * MiB
    cases = []
    for rows in batch_rows_list:
        batches = make_batches(total, rows, schema)
        nbytes, nrows = nbytes_of(batches), sum(b.num_rows for b in batches)
        for size in buffers:
            one = fmt_bytes(batches[0].get_total_buffer_size())
            ctx.log(f"  throughput: batch {rows} rows ({one}), entry {fmt_bytes(size)}, "
                    f"{fmt_bytes(nbytes)} per run")
            encoded = [encode_wal_entry(schema, g, 1) for g in group_like_writer(batches, size)]
            cfg = ShardWriterConfig(enable_memtable=False, durable_write=False,
                                    max_wal_buffer_size=size)

            def ours(r: int, batches=batches, cfg=cfg) -> dict[str, Any]:
                root = ctx.scratch(f"tp_ours_{r}")
                uri = str(root / "t.lance")
                with Stopwatch() as t:
                    w = open_shard_writer(uri, str(uuid.uuid4()), schema, cfg)
                    for b in batches:
                        w.put(b)
                    w.close()
                files, on_disk = _dir_usage(uri)
                rm_tree(root)
                return {"seconds": t.seconds, "wal_entries": w.stats().wal_entries,
                        "files": files, "wal_bytes": on_disk}

            def native(r: int, size=size, batches=batches) -> dict[str, Any]:
                root = ctx.scratch(f"tp_native_{r}")
                uri = str(root / "t.lance")
                create_table(uri, schema)
                ds = lance.dataset(uri)
                with Stopwatch() as t:
                    w = ds.mem_wal_writer(str(uuid.uuid4()), durable_write=False,
                                          max_wal_buffer_size=size)
                    with Stopwatch() as tp:
                        for b in batches:
                            w.put(b)
                    w.close()
                stats = dict(w.stats())
                files, on_disk = _dir_usage(os.path.join(uri, "_mem_wal"))
                rm_tree(root)
                return {"seconds": t.seconds, "put_phase_seconds": tp.seconds,
                        "wal_entries": files, "wal_bytes": on_disk, "native_stats": stats}

            def disk(r: int, encoded=encoded) -> dict[str, Any]:
                root = ctx.scratch(f"tp_disk_{r}")
                shard = str(uuid.uuid4())
                with Stopwatch() as t:
                    wal = root / "_mem_wal" / shard / "wal"
                    os.makedirs(wal)
                    for i, data in enumerate(encoded, 1):
                        path = os.path.join(root, wal_key(shard, i))
                        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                        try:
                            _write_all(fd, data)
                            os.fsync(fd)
                        finally:
                            os.close(fd)
                rm_tree(root)
                return {"seconds": t.seconds, "wal_entries": len(encoded),
                        "wal_bytes": sum(map(len, encoded))}

            def store_loop(r: int, encoded=encoded) -> dict[str, Any]:
                root = ctx.scratch(f"tp_store_{r}")
                shard = str(uuid.uuid4())
                with Stopwatch() as t:
                    store = LocalStore(str(root))
                    for i, data in enumerate(encoded, 1):
                        store.put_if_absent(wal_key(shard, i), data)
                rm_tree(root)
                return {"seconds": t.seconds, "wal_entries": len(encoded),
                        "wal_bytes": sum(map(len, encoded))}

            def encode_only(r: int, batches=batches, size=size) -> dict[str, Any]:
                with Stopwatch() as t:
                    out = [encode_wal_entry(schema, g, 1)
                           for g in group_like_writer(batches, size)]
                return {"seconds": t.seconds, "wal_entries": len(out),
                        "wal_bytes": sum(map(len, out))}

            runs = interleaved(ctx.repeats, {OURS: ours, NATIVE: native, DISK: disk,
                                             STORE: store_loop, ENCODE: encode_only})
            comp = {}
            for name, rs in runs.items():
                secs = [x["seconds"] for x in rs]
                comp[name] = {
                    "seconds": summarize(secs),
                    "mb_s": summarize([nbytes / s / MB for s in secs]),
                    "rows_s": summarize([nrows / s for s in secs]),
                    "wal_entries": rs[0]["wal_entries"],
                    "wal_bytes": rs[0]["wal_bytes"],
                    "runs": rs,
                }
            med = {n: c["mb_s"]["median"] for n, c in comp.items()}
            cases.append({
                "batch_rows": rows,
                "batch_bytes": batches[0].get_total_buffer_size(),
                "buffer_size": size,
                "bytes": nbytes,
                "rows": nrows,
                "competitors": comp,
                "ratios": {
                    "ours/disk": ratio(med[OURS], med[DISK]),
                    "ours/native": ratio(med[OURS], med[NATIVE]),
                    "ours/store_loop": ratio(med[OURS], med[STORE]),
                    "store_loop/disk": ratio(med[STORE], med[DISK]),
                    # Serial model of our writer: encode, then the store protocol.
                    "serial_model/disk": ratio(1 / (1 / med[ENCODE] + 1 / med[STORE]),
                                               med[DISK]),
                },
            })
            del encoded

    rows_table = []
    for c in cases:
        cm = c["competitors"]
        rows_table.append([
            f"{c['batch_rows']:,}", fmt_bytes(c["buffer_size"]),
            f"{cm[OURS]['mb_s']['median']:.0f}", f"{cm[NATIVE]['mb_s']['median']:.0f}",
            f"{cm[DISK]['mb_s']['median']:.0f}", f"{cm[STORE]['mb_s']['median']:.0f}",
            f"{cm[ENCODE]['mb_s']['median']:.0f}",
            f"{cm[OURS]['rows_s']['median'] / 1e6:.2f}",
            f"{c['ratios']['ours/disk']:.2f}", f"{c['ratios']['ours/native']:.2f}",
        ])
    r_disk = [c["ratios"]["ours/disk"] for c in cases]
    r_native = [c["ratios"]["ours/native"] for c in cases]
    met_disk = sum(x >= 0.9 for x in r_disk)
    met_native = sum(x >= 1.0 for x in r_native)
    return {
        "name": "throughput",
        "title": "WAL-only ShardWriter throughput vs native writer vs the disk",
        "config": {
            "bytes_per_run": total, "batch_rows": list(batch_rows_list),
            "wal_entry_sizes": list(buffers), "durable_write": False,
            "ours": "open_shard_writer(enable_memtable=False, durable_write=False, "
                    "max_wal_buffer_size=S); put each batch; close",
            "native": "lance.dataset(uri).mem_wal_writer(shard, durable_write=False, "
                      "max_wal_buffer_size=S) on a table from create_table (primary key "
                      "'id'); put each batch; close (close also flushes the MemTable to an "
                      "SSTable; that is part of what the native writer does)",
            "disk": "the same IPC bytes, pre-encoded with encode_wal_entry and grouped as "
                    "our writer groups them, one file per entry, O_EXCL create + write + "
                    "fsync(file) (no directory fsync)",
            "store_loop": "the same bytes through LocalStore.put_if_absent (temp file, "
                          "fsync, link, unlink, fsync(dir)): our durability protocol "
                          "without the pipeline",
            "encode_only": "component, not a writer: encode_wal_entry of the same groups, "
                           "no I/O (CPU cost of the IPC encode and its copies)",
            "timed": "from open to the end of close; table creation and cleanup untimed",
            "MB": "10^6 Arrow buffer bytes of the input data",
        },
        "cases": cases,
        "table": {
            "columns": ["batch rows", "WAL entry", "ours MB/s", "native MB/s", "disk MB/s",
                        "store loop MB/s", "encode MB/s", "ours Mrows/s", "ours/disk",
                        "ours/native"],
            "rows": rows_table,
        },
        "targets": [
            {"what": "ours/disk >= 0.9", "value":
             f"median over cases {sorted(r_disk)[len(r_disk) // 2]:.2f}, min {min(r_disk):.2f}; "
             f"{met_disk}/{len(r_disk)} cases met", "met": met_disk == len(r_disk)},
            {"what": "ours/native >= 1.0", "value":
             f"median over cases {sorted(r_native)[len(r_native) // 2]:.2f}, "
             f"min {min(r_native):.2f}; {met_native}/{len(r_native)} cases met",
             "met": met_native == len(r_native)},
        ],
    }


def plot_throughput(result: dict[str, Any], machine: dict[str, Any]) -> None:
    cases = result["cases"]
    batch_rows = sorted({c["batch_rows"] for c in cases})
    fig, axes = new_figure(len(batch_rows), width=5.2, height=4.4)
    names = [OURS, NATIVE, STORE, DISK]
    colors = ["#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c"]
    for ax, rows in zip(axes, batch_rows, strict=True):
        sub = [c for c in cases if c["batch_rows"] == rows]
        width = 0.8 / len(names)
        for j, (name, color) in enumerate(zip(names, colors, strict=True)):
            xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(sub))]
            st = [c["competitors"][name]["mb_s"] for c in sub]
            med = [s["median"] for s in st]
            err = [[m - s["min"] for m, s in zip(med, st, strict=True)],
                   [s["max"] - m for m, s in zip(med, st, strict=True)]]
            ax.bar(xs, med, width, yerr=err, capsize=2, color=color, label=name)
        ax.set_xticks(range(len(sub)), [fmt_bytes(c["buffer_size"]) for c in sub])
        ax.set_xlabel("WAL entry size (max_wal_buffer_size)")
        ax.set_ylabel("MB/s (median, min-max bars)")
        kb = sub[0]["batch_bytes"] / 1e3
        ax.set_title(f"batches of {rows:,} rows (~{kb:,.0f} kB)", fontsize=10)
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
# 3. peak RSS
# ---------------------------------------------------------------------------

def _rss_variants(quick: bool) -> list[dict[str, Any]]:
    buf = 10 * MiB
    return [
        {"name": "async, default backpressure", "durable": False, "batch_rows": 65_536,
         "max_unflushed": None, "buffer": buf,
         "why": "durable_write=false, everything else default (max_unflushed_memtable_bytes "
                "= 1 GiB): the producer may queue up to 1 GiB ahead of the disk"},
        {"name": "async, backpressure 2 x buffer", "durable": False, "batch_rows": 65_536,
         "max_unflushed": 2 * buf, "buffer": buf,
         "why": "durable_write=false, max_unflushed_memtable_bytes = 2 x buffer"},
        {"name": "durable (library defaults)", "durable": True, "batch_rows": 200_000,
         "max_unflushed": None, "buffer": buf,
         "why": "ShardWriterConfig(enable_memtable=False) otherwise default "
                "(durable_write=true); batches of ~11.6 MB >= buffer so each put flushes at "
                "once instead of waiting the 100 ms interval"},
    ]


def _run_rss_child(ctx: BenchContext, uri: str, total: int, v: dict[str, Any]) -> dict[str, Any]:
    import psutil

    from .common import REPO_ROOT

    args = [sys.executable, "-m", "benchmarks.rss_child", "--uri", uri,
            "--total-bytes", str(total), "--batch-rows", str(v["batch_rows"]),
            "--buffer", str(v["buffer"])]
    if v["durable"]:
        args.append("--durable")
    if v["max_unflushed"]:
        args += ["--max-unflushed", str(v["max_unflushed"])]
    proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    samples: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss
            if rss:  # 0 once the child is a zombie
                samples.append((time.perf_counter() - t0, rss))
        except psutil.Error:
            break
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"rss child failed ({proc.returncode}): {err.decode()[-2000:]}")
    res = json.loads(out.decode().strip().splitlines()[-1])
    step = max(1, len(samples) // 400)
    res["sampled_peak_rss"] = max((s[1] for s in samples), default=0)
    res["timeline"] = samples[::step]
    return res


def bench_peak_rss(ctx: BenchContext) -> dict[str, Any]:
    """Peak RSS of a subprocess writing ``total`` bytes batch by batch."""
    total = 256 * MiB if ctx.quick else 4 * GiB
    variants = _rss_variants(ctx.quick)

    def runner(v: dict[str, Any]):
        def run(r: int) -> dict[str, Any]:
            root = ctx.scratch(f"rss_{r}")
            try:
                return _run_rss_child(ctx, str(root / "t.lance"), total, v)
            finally:
                rm_tree(root)
        return run

    ctx.log(f"  peak_rss: {fmt_bytes(total)} per run, {len(variants)} variants, "
            f"{ctx.repeats} repeats")
    runs = interleaved(ctx.repeats, {v["name"]: runner(v) for v in variants})
    out = []
    for v in variants:
        rs = runs[v["name"]]
        limit = 2 * v["buffer"] + 300 * MB
        peak = summarize([x["peak_rss"] for x in rs])
        out.append({
            **v, "limit_bytes": limit,
            "peak_rss": peak,
            "sampled_peak_rss": summarize([x["sampled_peak_rss"] for x in rs]),
            "baseline_rss": summarize([x["baseline_rss"] for x in rs]),
            "arrow_pool_peak": summarize([x["arrow_pool_peak"] for x in rs]),
            "mb_s": summarize([x["bytes"] / x["seconds"] / MB for x in rs]),
            "seconds": summarize([x["seconds"] for x in rs]),
            "wal_entries": rs[0]["wal_entries"],
            "runs": rs,
        })
    rows = [[v["name"], f"{v['peak_rss']['median'] / MB:.0f}",
             f"{v['baseline_rss']['median'] / MB:.0f}",
             f"{v['arrow_pool_peak']['median'] / MB:.0f}",
             f"{v['limit_bytes'] / MB:.0f}", f"{v['mb_s']['median']:.0f}",
             f"{v['seconds']['median']:.1f}"] for v in out]
    return {
        "name": "peak_rss",
        "title": f"Peak RSS writing {fmt_bytes(total)} through the WAL-only writer "
                 "(10 MiB WAL buffer)",
        "config": {"total_bytes": total, "measure": "subprocess; peak = VmHWM of the "
                   "child (/proc/self/status; ru_maxrss is not used because Linux carries the "
                   "forked parent's high-water mark across exec); psutil samples every 50 ms "
                   "for the timeline",
                   "data": "generated batch by batch inside the child; nothing retained",
                   "limit": "2 x max_wal_buffer_size + 300 MB"},
        "variants": out,
        "table": {"columns": ["variant", "peak RSS MB", "baseline RSS MB",
                              "Arrow pool peak MB", "limit MB", "MB/s", "seconds"],
                  "rows": rows},
        "targets": [{"what": f"{v['name']}: peak RSS <= {v['limit_bytes'] / MB:.0f} MB",
                     "value": f"{v['peak_rss']['median'] / MB:.0f} MB (median of "
                              f"{v['peak_rss']['n']})",
                     "met": v["peak_rss"]["median"] <= v["limit_bytes"]} for v in out],
    }


def plot_peak_rss(result: dict[str, Any], machine: dict[str, Any]) -> None:
    fig, axes = new_figure(2, width=6.0, height=4.4)
    ax = axes[0]
    for v in result["variants"]:
        runs = v["runs"]
        med = sorted(runs, key=lambda x: x["peak_rss"])[len(runs) // 2]
        ts = [t for t, _ in med["timeline"]]
        ax.plot(ts, [b / MB for _, b in med["timeline"]], label=v["name"])
    limit = result["variants"][0]["limit_bytes"] / MB
    ax.axhline(limit, color="red", ls="--", lw=1, label=f"limit {limit:.0f} MB")
    ax.set_xlabel("seconds (median-peak run)")
    ax.set_ylabel("RSS MB (psutil, 50 ms samples)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    names = [v["name"] for v in result["variants"]]
    peaks = [v["peak_rss"]["median"] / MB for v in result["variants"]]
    base = [v["baseline_rss"]["median"] / MB for v in result["variants"]]
    ax.bar(range(len(names)), peaks, color="#1f77b4", label="peak RSS (VmHWM)")
    ax.bar(range(len(names)), base, color="#aec7e8", label="RSS after imports")
    ax.axhline(limit, color="red", ls="--", lw=1)
    ax.set_xticks(range(len(names)), [n.replace(", ", ",\n") for n in names], fontsize=7)
    ax.set_ylabel("MB (median over repeats)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, "peak_rss", result["title"], machine)
