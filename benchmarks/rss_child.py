"""Subprocess of the peak-RSS benchmark: write N bytes through the WAL-only writer.

Data is generated batch by batch and dropped after ``put``, so whatever stays
resident is the writer's (queue, encode buffers) plus the interpreter's.
Prints one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import uuid

import psutil
import pyarrow as pa

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.writer import open_shard_writer

from .common import bench_schema, make_batch


def vm_hwm() -> int:
    """Peak RSS of this process image (``VmHWM``), in bytes.

    Not ``getrusage().ru_maxrss``: Linux carries the pre-``exec`` high-water
    mark over ``execve``, and before exec this process was a fork of the
    (large) benchmark runner, so ru_maxrss reports the parent's RSS.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--total-bytes", type=int, required=True)
    p.add_argument("--batch-rows", type=int, required=True)
    p.add_argument("--buffer", type=int, required=True)
    p.add_argument("--durable", action="store_true")
    p.add_argument("--max-unflushed", type=int, default=None)
    a = p.parse_args(argv)

    schema = bench_schema()
    make_batch(0, 10, schema)  # load compute kernels before the baseline
    baseline = psutil.Process().memory_info().rss
    kwargs = {"enable_memtable": False, "durable_write": a.durable,
              "max_wal_buffer_size": a.buffer}
    if a.max_unflushed:
        kwargs["max_unflushed_memtable_bytes"] = a.max_unflushed
    pool = pa.default_memory_pool()
    t0 = time.perf_counter()
    w = open_shard_writer(a.uri, str(uuid.uuid4()), schema, ShardWriterConfig(**kwargs))
    written = start = 0
    while written < a.total_bytes:
        batch = make_batch(start, a.batch_rows, schema)
        written += batch.get_total_buffer_size()
        start += a.batch_rows
        w.put(batch)
        del batch
    w.close()
    seconds = time.perf_counter() - t0
    stats = w.stats()
    print(json.dumps({
        "peak_rss": vm_hwm(),
        "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "baseline_rss": baseline,
        "final_rss": psutil.Process().memory_info().rss,
        "arrow_pool_peak": pool.max_memory(),
        "arrow_pool_backend": pool.backend_name,
        "bytes": written,
        "rows": start,
        "seconds": seconds,
        "wal_entries": stats.wal_entries,
        "wal_bytes": stats.wal_bytes,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
