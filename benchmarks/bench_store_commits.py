"""Plain PUT vs put-if-absent latency, and commit records/s, on each store.

On the local S3 server, the GCS and the Azure emulators: p50 of a plain ``put`` and of
``put_if_absent`` (4 KiB, fresh WAL keys, alternated op by op; replaces
``s3_conditional_put``), and commit records/s with 1 and 3 appenders on one log.
Emulators on 127.0.0.1 have no per-object write limit: not cloud figures.
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memwal_datasource.format.memwal import wal_key
from memwal_datasource.log.commit import APPEND, CommitLog
from memwal_datasource.store import open_store

from . import harness as h

NAME = "store_commits"
APPENDERS = 3


def _stores(ctx: h.Ctx):
    """(label, uri, options, stop) per store; one that does not start is a row of its own."""
    from tests.cloud_emulators import start_azurite, start_fake_gcs
    from tests.s3_server import start_s3_server

    for label, start, scheme, attr in (("S3 (SeaweedFS)", start_s3_server, "s3", None),
                                       ("GCS (fake-gcs-server)", start_fake_gcs, "gs", "bucket"),
                                       ("Azure (Azurite)", start_azurite, "az", "container")):
        try:
            emu = start(ctx.scratch(scheme))
            if attr is None:
                emu.create_bucket("memwal-bench")
            bucket = getattr(emu, attr) if attr else "memwal-bench"
            yield label, f"{scheme}://{bucket}", emu.storage_options(), emu.stop
        except Exception as exc:  # noqa: BLE001 - reported as a row; the others still run
            yield f"{label} (did not start: {str(exc)[:80]})", None, None, None


def _commit_rate(uri: str, opts: dict[str, str], appenders: int, each: int) -> float:
    """Commit records/s of ``appenders`` threads, each its own CommitLog on one log."""
    root = f"{uri}/{uuid.uuid4().hex}/t.lance"
    logs = [CommitLog(open_store(root, opts), retry_base_delay_ms=5) for _ in range(appenders)]
    with ThreadPoolExecutor(appenders) as pool:
        t0 = time.perf_counter()
        for f in [pool.submit(lambda log=log: [log.append(APPEND, []) for _ in range(each)])
                  for log in logs]:
            f.result()
        secs = time.perf_counter() - t0
    assert len(list(CommitLog(open_store(root, opts)).records())) == appenders * each
    return appenders * each / secs


def run(ctx: h.Ctx) -> dict[str, Any]:
    n_puts, n_commits = ctx.pick(20, 100, 300), ctx.pick(10, 40, 100)
    payload, rows, comp = os.urandom(4096), [], {}
    for label, uri, opts, stop in _stores(ctx):
        if uri is None:
            rows.append([label, "-", "-", "-", "-"])
            continue
        try:
            store, shard = open_store(f"{uri}/{uuid.uuid4().hex}", opts), str(uuid.uuid4())
            lat: dict[str, list[float]] = {"put": [], "put_if_absent": []}
            for i in range(2 * n_puts):  # alternated op by op
                op, t = ("put", "put_if_absent")[i % 2], time.perf_counter()
                getattr(store, op)(wal_key(shard, i + 1), payload)
                lat[op].append((time.perf_counter() - t) * 1e3)
            c = comp[label] = {
                "put_p50_ms": h.pct(lat["put"], 50), "pia_p50_ms": h.pct(lat["put_if_absent"], 50),
                "pia_p99_ms": h.pct(lat["put_if_absent"], 99),
                "commits_s_1": h.summarize([_commit_rate(uri, opts, 1, n_commits)
                                            for _ in range(ctx.repeats)]),
                "commits_s_n": h.summarize([_commit_rate(uri, opts, APPENDERS,
                                                         max(1, n_commits // APPENDERS))
                                            for _ in range(ctx.repeats)])}
        finally:
            stop()
        rows.append([label, f"{c['put_p50_ms']:.2f}", f"{c['pia_p50_ms']:.2f} (p99 "
                     f"{c['pia_p99_ms']:.2f})", h.cell(c["commits_s_1"], "{:.0f}"),
                     h.cell(c["commits_s_n"], "{:.0f}")])
    return {"title": "PUT vs put-if-absent latency and commit records/s per store (local "
                     "servers and EMULATORS, not cloud figures)",
            "config": {"object_bytes": 4096, "puts_each": n_puts, "commits_per_run": n_commits},
            "competitors": comp, "targets": [],
            "panels": [h.panel(f"commit records/s, {k}", comp, key, "records/s") for k, key in
                       (("1 appender", "commits_s_1"), (f"{APPENDERS} appenders", "commits_s_n"))]
            if comp else [],
            "table": {"columns": ["store", "put p50 ms", "put_if_absent p50 ms",
                                  "commits/s (1 appender)",
                                  f"commits/s ({APPENDERS} appenders, one log)"], "rows": rows}}
