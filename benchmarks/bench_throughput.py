"""Core WAL-only writer vs raw durable loops of the same bytes: MB/s.

Ours (``open_shard_writer``, durable at ``close()``) vs the same encoded entries written
``O_EXCL`` by (a) parallel fsyncs, (b) ``O_DSYNC``, (c) write+fsync per file, each then
fsyncing the directory.
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memwal_datasource import ShardWriterConfig, open_shard_writer
from memwal_datasource.format.memwal import encode_wal_buffer, wal_key

from . import harness as h

NAME = "throughput"
OURS = "ours (WAL-only, durable at close)"
RAW = {"parallel": "raw (a): parallel fsync of files, then dir",
       "dsync": "raw (b): O_DSYNC writes, then dir",
       "serial": "raw (c): write + fsync per file, then dir"}


def _groups(batches, size: int) -> list[list]:
    """Batches grouped into entries as the writer cuts them (at least ``size`` bytes)."""
    groups, n = [[]], 0
    for b in batches:
        groups, n = (groups, n) if n < size else ([*groups, []], 0)
        groups[-1].append(b)
        n += b.get_total_buffer_size()
    return groups


def _raw(root: str, encoded, mode: str) -> None:
    os.makedirs(wal := os.path.join(root, "_mem_wal", shard := str(uuid.uuid4()), "wal"))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DSYNC if mode == "dsync" else 0)
    with ThreadPoolExecutor(8) as pool:
        for i, data in enumerate(encoded, 1):
            path = os.path.join(root, wal_key(shard, i))
            fd, view = os.open(path, flags, 0o644), memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if mode == "serial":
                os.fsync(fd)
            os.close(fd)
            if mode == "parallel":
                pool.submit(h.fsync_path, path)
    h.fsync_path(wal)  # after the pool's fsyncs


def _case(ctx: h.Ctx, batches, size: int) -> dict[str, Any]:
    schema, nbytes = batches[0].schema, sum(b.get_total_buffer_size() for b in batches)
    encoded = [encode_wal_buffer(schema, g, 1) for g in _groups(batches, size)]
    cfg = ShardWriterConfig(enable_memtable=False, durable_write=False, max_wal_buffer_size=size)

    def timed(body):
        def run(r: int) -> dict[str, Any]:
            root = str(ctx.scratch("tp"))
            return {"mb_s": nbytes / h.seconds(lambda: body(root)) / h.MB}
        return run

    def ours(root: str) -> None:
        w = open_shard_writer(root + "/t.lance", str(uuid.uuid4()), schema, cfg)
        for b in batches:
            w.put(b)
        w.close()

    comps = {OURS: timed(ours), **{name: timed(lambda root, m=m: _raw(root, encoded, m))
                                   for m, name in RAW.items()}}
    label = f"{batches[0].num_rows:,}-row batches, {size // h.KiB:,} KiB"
    comp = h.stats(runs := h.alternate(ctx, comps, label=f"{label}: "))
    return {"label": label, "entry_bytes": size, "entries": len(encoded), "competitors": comp,
            "ratios": h.ratios(runs, OURS, "mb_s", list(comp)),
            "fastest_raw": max(RAW.values(), key=lambda k: comp[k]["mb_s"]["median"])}


def run(ctx: h.Ctx) -> dict[str, Any]:
    total = ctx.pick(8 * h.MiB, 64 * h.MiB, 256 * h.MiB)
    cases = [_case(ctx, [b for i in range(0, total // 58, rows)  # ~58 Arrow bytes a row
                         for b in h.arrow_rows(i, rows).to_batches()], size)
             for rows in (1_000, 10_000) for size in (64 * h.KiB, 1 * h.MiB, 8 * h.MiB)]
    return h.per_case(
        "Core WAL-only writer vs raw durable loops of the same bytes (local disk)",
        {"bytes_per_run": total, "MB": "10^6 Arrow buffer bytes of the input",
         "timed": "open to close (ours); create to dir fsync (raw)"},
        cases, "case", [("MB/s", "mb_s", "{:.0f}")], lambda c, w: [
            h.target(f"{w}: ours / raw serial fsync loop MB/s", c["ratios"][RAW["serial"]], 0.9),
            h.target(f"{w}: ours / fastest raw loop ({c['fastest_raw'][:7]}) MB/s",
                     c["ratios"][c["fastest_raw"]], 0.9)],
        [("", "mb_s", "MB/s")], {"memwal / it": "ratios"})
