"""Client CPU per GB of S3 put-if-absent: our store vs obstore vs boto3 (SeaweedFS).

``S3Store.put_if_absent`` (bytes, and a ``pyarrow.Buffer``), obstore's
``put(mode="create")`` (pylance's client; the reference) and boto3's
``put_object(IfNoneMatch="*")``; CPU = ``time.process_time()`` of this process. Goal:
ours / obstore <= 1.5. (One attempt per conditional PUT: tests/test_store.py checks it.)
"""

from __future__ import annotations

import os
import time
from typing import Any

import pyarrow as pa

from memwal_datasource.store import open_store

from . import harness as h

NAME = "s3_client_cpu"
BUCKET = "memwal-client-bench"
SIZES = {64 * h.KiB: (800, 40), 1 * h.MiB: (48, 8), 8 * h.MiB: (8, 2)}  # ops: default, quick
OURS, OURS_ARROW = "ours (S3Store.put_if_absent, bytes)", "ours (pyarrow.Buffer)"
OBSTORE, BOTO3 = "obstore put(mode=create)", "boto3 put_object(IfNoneMatch)"


def _clients(server) -> dict[str, Any]:
    import obstore as obs  # the clients compared: imported here, not by every run
    from obstore.store import S3Store as ObS3Store

    opts = server.storage_options()
    ours = open_store(f"s3://{BUCKET}", opts)
    ob = ObS3Store.from_url(f"s3://{BUCKET}", config={k: v for k, v in opts.items()
                                                       if k != "allow_http"},
                            client_options={"allow_http": True}, retry_config={"max_retries": 0})
    b3 = server.client(max_pool_connections=32, retries={"total_max_attempts": 1},
                       request_checksum_calculation="when_required",
                       response_checksum_validation="when_required")  # as S3Store had it
    return {OURS: ours.put_if_absent,
            OURS_ARROW: lambda k, d: ours.put_if_absent(k, pa.py_buffer(d)),
            OBSTORE: lambda k, d: obs.put(ob, k, d, mode="create"),
            BOTO3: lambda k, d: b3.put_object(Bucket=BUCKET, Key=k, Body=d, IfNoneMatch="*")}


def _enforced(put, key: str) -> bool:
    put(key, b"first")
    try:
        put(key, b"second")
    except Exception:  # noqa: BLE001 - each client has its own "exists" error
        return True
    return False


def run(ctx: h.Ctx) -> dict[str, Any]:
    ops = {size: n[ctx.quick] for size, n in SIZES.items()}
    with h.s3_bucket(ctx, BUCKET) as (server, skipped):
        if server is None:
            return {"title": "S3 client CPU per GB", "skipped": skipped, "targets": []}
        clients = _clients(server)
        enforced = {n: _enforced(put, f"probe/{i}") for i, (n, put) in enumerate(clients.items())}

        def competitor(i: int, put):
            def run(r: int) -> dict[str, Any]:
                out = {}
                for size, n in ops.items():
                    data, c0 = os.urandom(size), time.process_time()
                    for k in range(n):
                        put(f"r{r}/{i}/{size}/{k}", data)
                    out[f"{size // h.KiB} KiB"] = (time.process_time() - c0) / (n * size / 1e9)
                return out
            return run

        runs = h.alternate(ctx, {n: competitor(i, put)
                                 for i, (n, put) in enumerate(clients.items())})
    comp, rows, targets = h.stats(runs), [], []
    for key in runs[OURS][0]:
        rt = {n: h.paired([x[key] for x in runs[n]], [x[key] for x in runs[OBSTORE]])
              for n in comp}
        rows += [[*r, h.cell(rt[r[1]], "{:.2f}")] for r in h.rows(comp, [(key, "{:.2f}")], key)]
        targets += [h.target(f"{n} CPU/GB / obstore's, {key} objects", rt[n], None if n == BOTO3
                             else 1.5, at_most=True) for n in (OURS, OURS_ARROW, BOTO3)]
    targets.append({"what": "the server refuses a second create for every client",
                    "value": str(enforced), "met": all(enforced.values())})
    return {"title": "S3 put-if-absent: client CPU per GB, ours vs obstore vs boto3 (SeaweedFS)",
            "config": {"ops_per_repeat": ops, "cpu": "time.process_time(), every thread"},
            "competitors": comp, "targets": targets,
            "panels": [h.panel(f"{k} objects", comp, k, "client CPU s per GB")
                       for k in runs[OURS][0]],
            "table": {"columns": ["object", "client", "CPU s/GB", "/ obstore"], "rows": rows}}
