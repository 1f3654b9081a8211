"""Reopening a shard with N unflushed WAL entries: native replay vs our WalTailer.

Setup (untimed, once per N): a table from ``create_table`` (primary key
``id``), a claim through ``WalAppender.open`` (epoch 1) and N appended entries
of 1,000 rows each, never flushed to an SSTable. Then, interleaved:

* native: on a fresh copy of that table, ``ds.mem_wal_writer(shard)``
  (claims epoch 2, drops a fence sentinel, replays the N entries into its
  MemTable). MemTable limits are raised so that replay does not also flush
  SSTables: the time is replay, not flush.
* tailer: ``WalTailer(store, shard).entries(1)`` over the original, decoding
  every entry to Arrow (what our readers do).
"""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any

from memwal_datasource.store import LocalStore
from memwal_datasource.table import create_table
from memwal_datasource.wal import WalAppender, WalTailer

from .common import (
    BenchContext,
    MiB,
    Stopwatch,
    bench_schema,
    interleaved,
    make_batch,
    new_figure,
    ratio,
    rm_tree,
    save_figure,
    summarize,
)

ROWS_PER_ENTRY = 1_000
NATIVE = "native open (claim + sentinel + replay)"
TAILER = "WalTailer.entries (read + decode)"


def bench_replay(ctx: BenchContext) -> dict[str, Any]:
    import lance

    schema = bench_schema()
    ns = (20, 100) if ctx.quick else (100, 1000)
    cases = []
    for n in ns:
        src = ctx.scratch(f"replay_src_{n}")
        uri = str(src / "t.lance")
        create_table(uri, schema)
        shard = str(uuid.uuid4())
        app = WalAppender.open(LocalStore(uri), shard)
        for i in range(n):
            app.append(schema, [make_batch(i * ROWS_PER_ENTRY, ROWS_PER_ENTRY, schema)])
        wal_dir = os.path.join(uri, "_mem_wal", shard, "wal")
        wal_bytes = sum(os.path.getsize(os.path.join(wal_dir, f)) for f in os.listdir(wal_dir))
        ctx.log(f"  replay: {n} entries, {wal_bytes / 1e6:.1f} MB of WAL")
        total_rows = n * ROWS_PER_ENTRY

        def native(r: int, uri=uri, shard=shard, total_rows=total_rows, n=n) -> dict[str, Any]:
            dst = ctx.scratch(f"replay_native_{n}_{r}")
            copy = str(dst / "t.lance")
            shutil.copytree(uri, copy)
            ds = lance.dataset(copy)
            with Stopwatch() as t:
                w = ds.mem_wal_writer(shard, max_memtable_rows=total_rows + 1,
                                      max_memtable_size=512 * MiB,
                                      max_memtable_batches=max(8_000, n + 1))
            rows = int(w.memtable_stats()["row_count"])
            manifests = len([f for f in os.listdir(os.path.join(copy, "_mem_wal", shard,
                                                                   "manifest"))
                             if f.endswith(".binpb")])
            w.close()
            rm_tree(dst)
            return {"seconds": t.seconds, "rows": rows, "manifest_versions_after": manifests}

        def tailer(r: int, uri=uri, shard=shard) -> dict[str, Any]:
            with Stopwatch() as t:
                tl = WalTailer(LocalStore(uri), shard)
                rows = entries = 0
                for _pos, entry in tl.entries(1):
                    rows += entry.num_rows
                    entries += 1
            return {"seconds": t.seconds, "rows": rows, "entries": entries}

        runs = interleaved(ctx.repeats, {NATIVE: native, TAILER: tailer})
        rm_tree(src)
        comp = {}
        for name, rs in runs.items():
            secs = [x["seconds"] for x in rs]
            comp[name] = {"seconds": summarize(secs),
                          "entries_s": summarize([n / s for s in secs]),
                          "mb_s": summarize([wal_bytes / s / 1e6 for s in secs]),
                          "rows_seen": [x["rows"] for x in rs], "runs": rs}
        cases.append({
            "entries": n, "rows_per_entry": ROWS_PER_ENTRY, "wal_bytes": wal_bytes,
            "rows_expected": total_rows, "competitors": comp,
            "all_rows_replayed": all(x == total_rows for c in comp.values()
                                     for x in c["rows_seen"]),
            "ratios": {"native_time/tailer_time": ratio(comp[NATIVE]["seconds"]["median"],
                                                        comp[TAILER]["seconds"]["median"])},
        })
    rows = []
    for c in cases:
        cm = c["competitors"]
        rows.append([f"{c['entries']:,}", f"{c['wal_bytes'] / 1e6:.1f}",
                     f"{cm[NATIVE]['seconds']['median'] * 1e3:.1f}",
                     f"{cm[TAILER]['seconds']['median'] * 1e3:.1f}",
                     f"{cm[NATIVE]['entries_s']['median']:.0f}",
                     f"{cm[TAILER]['entries_s']['median']:.0f}",
                     f"{c['ratios']['native_time/tailer_time']:.2f}",
                     "yes" if c["all_rows_replayed"] else "NO"])
    return {
        "name": "replay",
        "title": "Reopen with N unflushed WAL entries: native replay vs WalTailer",
        "config": {"entries": list(ns), "rows_per_entry": ROWS_PER_ENTRY,
                   "written_by": "WalAppender (epoch 1 from a real claim)",
                   "native_kwargs": "max_memtable_rows=N*1000+1, max_memtable_size=512 MiB, "
                                    "max_memtable_batches>=N (no SSTable flush during replay)",
                   "native_fresh_copy": "shutil.copytree of the table per repeat (untimed); "
                                        "both competitors read page-cache-hot files",
                   "timed_native": "ds.mem_wal_writer(shard) only; lance.dataset() untimed",
                   "timed_tailer": "WalTailer construction + entries(1) to the tip"},
        "cases": cases,
        "table": {"columns": ["entries", "WAL MB", "native open ms", "tailer ms",
                              "native entries/s", "tailer entries/s", "native/tailer time",
                              "all rows"], "rows": rows},
        "targets": [{"what": f"N={c['entries']}: every row replayed/read by both",
                     "value": "yes" if c["all_rows_replayed"] else "no",
                     "met": c["all_rows_replayed"]} for c in cases],
    }


def plot_replay(result: dict[str, Any], machine: dict[str, Any]) -> None:
    fig, (ax,) = new_figure(1, width=6.5, height=4.4)
    cases = result["cases"]
    names = [NATIVE, TAILER]
    width = 0.38
    for j, (name, color) in enumerate(zip(names, ["#ff7f0e", "#1f77b4"], strict=True)):
        st = [c["competitors"][name]["seconds"] for c in cases]
        med = [s["median"] * 1e3 for s in st]
        err = [[m - s["min"] * 1e3 for m, s in zip(med, st, strict=True)],
               [s["max"] * 1e3 - m for m, s in zip(med, st, strict=True)]]
        xs = [i + (j - 0.5) * width for i in range(len(cases))]
        ax.bar(xs, med, width, yerr=err, capsize=3, color=color, label=name)
    ax.set_xticks(range(len(cases)), [f"N={c['entries']:,}\n({c['wal_bytes'] / 1e6:.0f} MB)"
                                      for c in cases])
    ax.set_ylabel("ms (median, min-max bars)")
    ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, "replay", result["title"], machine)
