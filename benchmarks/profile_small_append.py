"""Where one small memwal append spends its time, and which objects it writes.

``python -m benchmarks.profile_small_append [--appends N] [--s3]``

1. In-process, the exact calls Spark makes for one 5,000-row append, without Spark:
   the driver's ``MemWalDataSource.writer()`` (options, table checks), the task's
   ``write()`` (lease, epoch claim, fence sentinel, WAL PUT, fsyncs, lease release)
   and the driver's ``commit()`` (the commit record). Every object-store call and
   every ``os.fsync`` is timed and its key kept, so the JSON lists each object an
   append writes and each round trip it makes. Median over ``--appends`` appends
   into one table (the first, which creates the table, is left out).
2. Through Spark, one writer thread: memwal vs the no-op Python sink vs the driver
   Lance append, ``--appends`` sequential appends each, so the Spark job's own cost
   (plan, schedule, Python worker round trip) is separated from memwal's.

Writes ``benchmarks/results/small_append_profile.json``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .common import RESULTS_DIR, machine_info, machine_line, rm_tree, write_json

ROWS = 5_000
SUFFIX = "-abcdefghijklmnopqrstuvwxyz0123"
STORE_OPS = ("put_if_absent", "put_if_absent_unsynced", "sync", "put", "get", "head", "exists",
             "list", "list_dirs", "delete", "modified_ms", "now_ms")


class Tracer:
    """Times every ObjectStore call (outermost only) and every os.fsync."""

    def __init__(self):
        self.events: list[dict[str, Any]] = []
        self.local = threading.local()
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()

    def record(self, kind: str, op: str, key: str, t: float, dt: float) -> None:
        with self.lock:
            self.events.append({"kind": kind, "op": op, "key": key,
                                "thread": threading.current_thread().name,
                                "at_ms": (t - self.t0) * 1e3, "ms": dt * 1e3})

    def install(self) -> None:
        from memwal_datasource import store as store_mod

        for cls in {store_mod.LocalStore, store_mod.S3Store}:
            for op in STORE_OPS:
                fn = cls.__dict__.get(op)
                if fn is not None:
                    setattr(cls, op, self._wrap(fn, op))
        real_fsync = os.fsync

        def fsync(fd):
            t = time.perf_counter()
            try:
                return real_fsync(fd)
            finally:
                try:
                    name = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    name = "?"
                self.record("fsync", "fsync", name, t, time.perf_counter() - t)
        os.fsync = fsync

    def _wrap(self, fn, op: str):
        tracer = self

        @functools.wraps(fn)
        def wrapper(self_, *args, **kwargs):
            depth = getattr(tracer.local, "depth", 0)
            tracer.local.depth = depth + 1
            t = time.perf_counter()
            try:
                return fn(self_, *args, **kwargs)
            finally:
                tracer.local.depth = depth
                if depth == 0:
                    key = args[0] if args and isinstance(args[0], str) else (
                        f"{len(args[0])} keys" if args and isinstance(args[0], list) else "")
                    tracer.record("store", op, key, t, time.perf_counter() - t)
        return wrapper


def _category(key: str) -> str:
    for pat, name in ((r"_mem_wal/[^/]+/wal$", "WAL dir (fsync)"),
                      (r"_mem_wal/[^/]+/manifest$", "shard manifest dir (fsync)"),
                      (r"_mem_wal/[^/]+$", "shard dir (fsync)"),
                      (r"_mem_wal$", "_mem_wal dir (fsync)"),
                      (r"_mem_wal/[^/]+/wal/", "WAL entry / sentinel"),
                      (r"_mem_wal/[^/]+/manifest/version_hint", "shard manifest hint"),
                      (r"_mem_wal/[^/]+/manifest/", "shard manifest (epoch claim)"),
                      (r"lease", "lease"), (r"commit", "commit record"),
                      (r"_versions|_transactions|\.lance$|data/", "Lance table")):
        if re.search(pat, key):
            return name
    return key.rsplit("/", 2)[-2] if "/" in key else key or "-"


def _frame_table(start: int):
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pa.array(np.arange(start, start + ROWS, dtype=np.int64))
    return pa.table({"id": ids,
                     "payload": pc.binary_join_element_wise(pc.cast(ids, pa.string()),
                                                            SUFFIX[1:], "-"),
                     "score": pc.multiply(pc.cast(ids, pa.float64()), 0.001)})


def in_process(root: Path, appends: int, storage: dict[str, str] | None,
               uri: str | None = None) -> dict[str, Any]:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    from memwal_datasource import MemWalDataSource

    schema = StructType([StructField("id", LongType(), False),
                         StructField("payload", StringType()),
                         StructField("score", DoubleType())])
    uri = uri or str(root / "t.lance")
    opts = {"path": uri, "enable_memtable": "false",
            **{f"storage.{k}": v for k, v in (storage or {}).items()}}
    tracer = Tracer()
    tracer.install()
    appends_out = []
    for i in range(appends + 1):
        tracer.events.clear()
        batches = _frame_table(i * ROWS).to_batches()
        t0 = time.perf_counter()
        w = MemWalDataSource(dict(opts)).writer(schema, False)
        t1 = time.perf_counter()
        msg = w.write(iter(batches))
        t2 = time.perf_counter()
        w.commit([msg])
        t3 = time.perf_counter()
        if i == 0:
            continue  # created the table
        ev = list(tracer.events)
        appends_out.append({
            "total_ms": (t3 - t0) * 1e3, "driver_writer_ms": (t1 - t0) * 1e3,
            "task_write_ms": (t2 - t1) * 1e3, "driver_commit_ms": (t3 - t2) * 1e3,
            "task_lease_ms": msg.lease_s * 1e3, "task_open_ms": (msg.open_s - msg.lease_s) * 1e3,
            "task_put_ms": msg.write_s * 1e3, "task_close_ms": msg.close_s * 1e3,
            "events": ev,
            "phase_of_event": [("writer()" if e["at_ms"] < (t1 - tracer.t0) * 1e3 else
                                "write()" if e["at_ms"] < (t2 - tracer.t0) * 1e3 else "commit()")
                               for e in ev]})
    return {"uri": uri, "appends": appends_out}


def summarize_in_process(res: dict[str, Any]) -> dict[str, Any]:
    aps = res["appends"]
    med = {k: statistics.median(a[k] for a in aps) for k in aps[0] if k.endswith("_ms")}
    # per (phase, category, op): count per append and median time per append
    per: dict[tuple, list[tuple[int, float]]] = collections.defaultdict(list)
    for a in aps:
        acc: dict[tuple, list[float]] = collections.defaultdict(list)
        for e, ph in zip(a["events"], a["phase_of_event"], strict=True):
            acc[(ph, _category(e["key"]), e["op"], e["thread"].split("-")[0])].append(e["ms"])
        for k, v in acc.items():
            per[k].append((len(v), sum(v)))
    ops = [{"phase": k[0], "object": k[1], "op": k[2], "thread": k[3],
            "count_per_append": statistics.median(c for c, _ in v) * len(v) / len(aps),
            "ms_per_append": statistics.median(s for _, s in v) * len(v) / len(aps)}
           for k, v in per.items()]
    ops.sort(key=lambda o: ("writer()", "write()", "commit()").index(o["phase"]))
    last = aps[-1]
    written = sorted({(_category(e["key"]), e["op"], re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}",
                                                              "<shard>", e["key"]))
                      for e in last["events"]
                      if e["op"] in ("put_if_absent", "put_if_absent_unsynced", "put",
                                     "delete")})
    return {"median_ms": med, "ops": ops,
            "objects_written_by_one_append": [{"object": c, "op": o, "key": k}
                                              for c, o, k in written]}


def through_spark(root: Path, appends: int) -> dict[str, Any]:
    import lance

    from .bench_spark import _session

    spark = _session()
    out: dict[str, list[float]] = {}
    try:
        def frame(start):
            return spark.range(start, start + ROWS, numPartitions=1).selectExpr(
                "id", f"concat(cast(id as string), '{SUFFIX}') as payload",
                "cast(id as double) * 0.001 as score")

        mw, ln = str(root / "sp_memwal"), str(root / "sp_lance")
        ways = {
            "memwal": lambda s: frame(s).write.format("memwal").mode("append")
            .option("enable_memtable", "false").save(mw),
            "no-op Python sink": lambda s: frame(s).write.format("noop_arrow")
            .mode("append").save(),
            "driver toArrow only": lambda s: frame(s).toArrow(),
            "Lance append (toArrow + write_dataset)": lambda s: lance.write_dataset(
                frame(s).toArrow(), ln, mode="append"),
        }
        for name, fn in ways.items():
            fn(0)
            fn(0)  # warm-up (and table creation)
            out[name] = []
        for i in range(appends):
            for name, fn in ways.items():
                t = time.perf_counter()
                fn((i + 2) * ROWS)
                out[name].append((time.perf_counter() - t) * 1e3)
    finally:
        spark.stop()
    return {name: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)}
            for name, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_small_append")
    p.add_argument("--appends", type=int, default=20)
    p.add_argument("--no-spark", action="store_true")
    p.add_argument("--s3", action="store_true", help="also profile against the local S3 server")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="memwal-profile-"))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    load0 = os.getloadavg()
    try:
        result: dict[str, Any] = {"rows_per_append": ROWS, "appends": args.appends,
                                  "machine": machine_info(str(root))}
        result["local"] = summarize_in_process(in_process(root / "local", args.appends, None))
        if args.s3:
            from tests.s3_server import start_s3_server

            server = start_s3_server(root / "s3")
            try:
                server.create_bucket("memwal-prof")
                result["s3"] = summarize_in_process(in_process(
                    root, args.appends, server.storage_options(), "s3://memwal-prof/t.lance"))
            finally:
                server.stop()
        if not args.no_spark:
            result["spark_one_writer_ms"] = through_spark(root, args.appends)
        result["loadavg"] = {"start": load0, "end": os.getloadavg()}
    finally:
        rm_tree(root)
    path = write_json("small_append_profile", result, RESULTS_DIR)
    print(f"machine: {machine_line(result['machine'])}; load {load0[0]:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    for where in ("local", "s3"):
        if where not in result:
            continue
        r = result[where]
        print(f"\n[{where}] median ms per append: "
              + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in r["median_ms"].items()))
        for o in r["ops"]:
            print(f"  {o['phase']:9} {o['thread']:12} {o['op']:24} {o['object']:30} "
                  f"x{o['count_per_append']:.1f}  {o['ms_per_append']:7.2f} ms")
        print("  objects written by one append:")
        for o in r["objects_written_by_one_append"]:
            print(f"    {o['op']:24} {o['key']}")
    if "spark_one_writer_ms" in result:
        print("\nthrough Spark, one writer, sequential appends (median ms):")
        print(json.dumps(result["spark_one_writer_ms"], indent=1))
    print(f"\n{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
