"""The price of S3 conditional writes: plain PUT vs put-if-absent (If-None-Match: *).

Runs against a local SeaweedFS (``tests/s3_server.py``; MinIO in Docker as a
fallback), through :class:`memwal_datasource.store.S3Store`, one thread, 64 KiB
objects at fresh WAL-style keys.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from typing import Any

from memwal_datasource.format import wal_key
from memwal_datasource.store import S3Store, open_store

from .common import (
    BenchContext,
    KiB,
    new_figure,
    percentile,
    ratio,
    save_figure,
    summarize,
)

PUT = "put (plain PUT)"
PIA = "put_if_absent (If-None-Match: *)"
CONFLICT = "put_if_absent on an existing key (412)"


def _server_version(server) -> str:
    if server.backend != "seaweedfs":
        return server.backend
    try:
        from tests.s3_server import _weed_binary as weed_binary

        out = subprocess.run([str(weed_binary()), "version"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        return out.splitlines()[0] if out else "seaweedfs"
    except Exception:  # noqa: BLE001 - only a label
        return "seaweedfs"


def bench_s3_conditional_put(ctx: BenchContext) -> dict[str, Any]:
    from tests.s3_server import start_s3_server

    size = 64 * KiB
    n_ops = 30 if ctx.quick else 300
    n_conflict = 10 if ctx.quick else 100
    payload = os.urandom(size)
    try:
        server = start_s3_server(ctx.scratch("s3"))
    except Exception as exc:  # noqa: BLE001 - reported, the rest of the suite runs
        return {"name": "s3_conditional_put", "title": "S3 conditional write cost",
                "skipped": f"no S3 server could start: {exc}",
                "table": {"columns": ["skipped"], "rows": [[str(exc)[:200]]]},
                "targets": []}
    try:
        bucket = "memwal-bench"
        server.create_bucket(bucket)
        store = open_store(f"s3://{bucket}/t.lance", server.storage_options())
        assert isinstance(store, S3Store)
        # Is the condition enforced? (a server ignoring If-None-Match would be unsafe)
        probe = wal_key(str(uuid.uuid4()), 1)
        store.put_if_absent(probe, payload)
        try:
            store.put_if_absent(probe, payload)
            enforced = False
        except FileExistsError:
            enforced = True
        warm = str(uuid.uuid4())
        for i in range(1, 11):
            store.put(wal_key(warm, 2 * i), payload)
            store.put_if_absent(wal_key(warm, 2 * i + 1), payload)

        def conflict(key: str) -> None:
            try:
                store.put_if_absent(probe, payload)
            except FileExistsError:
                return
            raise AssertionError("put_if_absent overwrote an existing key")

        ops = {PUT: lambda k: store.put(k, payload),
               PIA: lambda k: store.put_if_absent(k, payload),
               CONFLICT: conflict}
        counts = {PUT: n_ops, PIA: n_ops, CONFLICT: n_conflict}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ops}
        for r in range(ctx.repeats):
            # Op-by-op interleaving, order rotated every step: all three kinds see
            # the same moment-to-moment load, which block-wise repeats cannot give.
            shards = {name: str(uuid.uuid4()) for name in ops}
            lat: dict[str, list[float]] = {name: [] for name in ops}
            names = list(ops)
            for i in range(1, n_ops + 1):
                k = (i + r) % len(names)
                for name in names[k:] + names[:k]:
                    if len(lat[name]) >= counts[name]:
                        continue
                    t = time.perf_counter()
                    ops[name](wal_key(shards[name], i))
                    lat[name].append((time.perf_counter() - t) * 1e3)
            for name in ops:
                runs[name].append({"seconds": sum(lat[name]) / 1e3, "ops": len(lat[name]),
                                   "lat_ms": lat[name]})
        backend = server.backend
        version = _server_version(server)
    finally:
        server.stop()

    comp = {}
    for name, rs in runs.items():
        comp[name] = {
            "ops_s": summarize([x["ops"] / x["seconds"] for x in rs]),
            "mb_s": summarize([x["ops"] * size / x["seconds"] / 1e6 for x in rs]),
            "p50_ms": summarize([percentile(x["lat_ms"], 50) for x in rs]),
            "p99_ms": summarize([percentile(x["lat_ms"], 99) for x in rs]),
            "ops_per_repeat": rs[0]["ops"],
        }
    r = ratio(comp[PIA]["ops_s"]["median"], comp[PUT]["ops_s"]["median"])
    # put_if_absent entries/s over put entries/s, per repeat (same op count).
    paired = summarize([ratio(put["seconds"], pia["seconds"])
                        for pia, put in zip(runs[PIA], runs[PUT], strict=True)])
    rows = [[name, f"{c['ops_s']['median']:.0f}", f"{c['mb_s']['median']:.1f}",
             f"{c['p50_ms']['median']:.2f}", f"{c['p99_ms']['median']:.2f}"]
            for name, c in comp.items()]
    rows.append(["ratio put_if_absent / put (entries/s)", f"{r:.2f}",
                 f"per-repeat {paired['min']:.2f}..{paired['max']:.2f}", "", ""])
    return {
        "name": "s3_conditional_put",
        "title": f"S3 plain PUT vs put-if-absent, 64 KiB objects ({backend})",
        "config": {"object_bytes": size, "ops_per_repeat": n_ops, "conflict_ops": n_conflict,
                   "backend": backend, "server_version": version,
                   "endpoint": "127.0.0.1 (loopback), path-style, http",
                   "client": "S3Store (boto3, standard retries), one thread, sequential",
                   "interleaving": "op by op: each step issues one plain PUT, one "
                                   "put_if_absent and (for the first conflict_ops steps) one "
                                   "412 probe, in rotating order; entries/s = ops / sum of "
                                   "their latencies",
                   "conditional_write_enforced": enforced},
        "competitors": comp,
        "ratios": {"put_if_absent/put": r, "paired_per_repeat": paired},
        "table": {"columns": ["operation", "entries/s", "MB/s", "p50 ms", "p99 ms"],
                  "rows": rows},
        "targets": [
            {"what": "server enforces If-None-Match: * (second create fails)",
             "value": str(enforced), "met": enforced},
            {"what": "put_if_absent / put entries/s (no target; the cost of fencing)",
             "value": f"{r:.2f}", "met": None},
        ],
    }


def plot_s3_conditional_put(result: dict[str, Any], machine: dict[str, Any]) -> None:
    if result.get("skipped"):
        return
    fig, axes = new_figure(2, width=5.0, height=4.2)
    names = list(result["competitors"])
    comp = result["competitors"]
    colors = ["#1f77b4", "#ff7f0e", "#7f7f7f"]
    for ax, key, label in ((axes[0], "ops_s", "entries/s"), (axes[1], "p50_ms", "p50 ms")):
        med = [comp[n][key]["median"] for n in names]
        err = [[m - comp[n][key]["min"] for m, n in zip(med, names, strict=True)],
               [comp[n][key]["max"] - m for m, n in zip(med, names, strict=True)]]
        ax.bar(range(len(names)), med, yerr=err, capsize=3, color=colors[: len(names)])
        ax.set_xticks(range(len(names)), [n.replace(" (", "\n(").replace(" on ", "\non ")
                                          for n in names], fontsize=7)
        ax.set_ylabel(f"{label} (median, min-max bars)")
        ax.grid(axis="y", alpha=0.3)
    save_figure(fig, "s3_conditional_put", result["title"], machine)


# --- one row per store: S3 server, GCS emulator, Azure emulator ---------------------------

def _stores(ctx: BenchContext):
    """(label, uri, options, stop) for each store that starts; errors become rows."""
    from tests.cloud_emulators import start_azurite, start_fake_gcs
    from tests.s3_server import start_s3_server

    def s3():
        server = start_s3_server(ctx.scratch("s3-commits"))
        server.create_bucket("memwal-bench")
        return (f"S3 ({server.backend}, local server)", "s3://memwal-bench",
                server.storage_options(), server.stop)

    def gcs():
        emu = start_fake_gcs(ctx.scratch("gcs-commits"))
        return ("GCS (fake-gcs-server 1.54 emulator + XML gateway)", f"gs://{emu.bucket}",
                emu.storage_options(), emu.stop)

    def azure():
        emu = start_azurite(ctx.scratch("azure-commits"))
        return ("Azure Blob (Azurite 3.37.0 emulator)", f"az://{emu.container}",
                emu.storage_options(), emu.stop)

    for name, start in (("S3", s3), ("GCS", gcs), ("Azure", azure)):
        try:
            yield start()
        except Exception as exc:  # noqa: BLE001 - reported as a row, the others still run
            yield (f"{name} (did not start: {str(exc)[:80]})", None, None, None)


def _commit_rate(uri: str, opts: dict[str, str], appenders: int, per_appender: int) -> float:
    """Commit records/s: ``appenders`` threads, each its own CommitLog, one shared log."""
    import threading

    from memwal_datasource.commit import APPEND, CommitLog

    root = f"{uri}/{uuid.uuid4().hex}/t.lance"
    start = threading.Barrier(appenders + 1)
    errors: list[BaseException] = []

    def run() -> None:
        log = CommitLog(open_store(root, opts), retry_base_delay_ms=5)
        start.wait()
        try:
            for _ in range(per_appender):
                log.append(APPEND, [])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(appenders)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    records = list(CommitLog(open_store(root, opts)).records())
    assert len(records) == appenders * per_appender, "a commit record was lost or doubled"
    return len(records) / seconds


def bench_store_commits(ctx: BenchContext) -> dict[str, Any]:
    """Conditional PUT latency and commit records/s on each store (emulator figures)."""
    n_puts = ctx.pick(20, 100, 300)
    n_commits = ctx.pick(10, 40, 100)
    concurrent = 3
    payload = os.urandom(4 * KiB)
    rows, comp = [], {}
    for label, uri, opts, stop in _stores(ctx):
        if uri is None:
            rows.append([label, "-", "-", "-", "-"])
            continue
        try:
            store = open_store(f"{uri}/{uuid.uuid4().hex}", opts)
            shard = str(uuid.uuid4())
            lat = []
            for i in range(1, n_puts + 1):
                t = time.perf_counter()
                store.put_if_absent(wal_key(shard, i), payload)
                lat.append((time.perf_counter() - t) * 1e3)
            one = [_commit_rate(uri, opts, 1, n_commits) for _ in range(ctx.repeats)]
            many = [_commit_rate(uri, opts, concurrent, max(1, n_commits // concurrent))
                    for _ in range(ctx.repeats)]
        finally:
            stop()
        comp[label] = {"put_if_absent_p50_ms": percentile(lat, 50),
                       "put_if_absent_p99_ms": percentile(lat, 99),
                       "commits_s_1": summarize(one), f"commits_s_{concurrent}": summarize(many)}
        rows.append([label, f"{percentile(lat, 50):.2f}", f"{percentile(lat, 99):.2f}",
                     f"{summarize(one)['median']:.0f}", f"{summarize(many)['median']:.0f}"])
    return {
        "name": "store_commits",
        "title": "Conditional PUT and commit records/s per store (local servers and EMULATORS, "
                 "not cloud figures)",
        "config": {"object_bytes": 4 * KiB, "put_if_absent_ops": n_puts,
                   "commits_per_run": n_commits, "concurrent_appenders": concurrent,
                   "note": "emulators on 127.0.0.1: they have no per-object write limit; "
                           "published cloud figures for one contended key are about 15/s "
                           "(S3), 10/s (Azure), 1/s (GCS)"},
        "competitors": comp,
        "table": {"columns": ["store", "put_if_absent p50 ms", "p99 ms",
                              "commits/s (1 appender)",
                              f"commits/s ({concurrent} appenders, one log)"],
                  "rows": rows},
        "targets": [],
    }


def plot_store_commits(result: dict[str, Any], machine: dict[str, Any]) -> None:
    comp = result.get("competitors") or {}
    if not comp:
        return
    fig, axes = new_figure(1, width=6.0, height=3.6)
    ax = axes[0]
    names = list(comp)
    keys = [k for k in next(iter(comp.values())) if k.startswith("commits_s_")]
    width = 0.8 / len(keys)
    for j, key in enumerate(keys):
        ax.bar([i + j * width for i in range(len(names))],
               [comp[n][key]["median"] for n in names], width, label=key.replace("_", " "))
    ax.set_xticks([i + width / 2 for i in range(len(names))],
                  [n.split(" (")[0] for n in names], fontsize=8)
    ax.set_ylabel("commit records/s (median)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, "store_commits", result["title"], machine)
