"""Client CPU per GB of S3 conditional writes: our store vs obstore vs boto3.

The performance goal: client CPU seconds per GB written with put-if-absent,
ours / obstore's ``put(mode="create")`` (the Rust ``object_store`` client
pylance uses), at most 1.5. Competitors, all writing fresh keys with
``If-None-Match: *`` to a local SeaweedFS (``tests/s3_server.py``):

* ``ours``: :meth:`memwal_datasource.store.S3Store.put_if_absent` exactly as
  the working tree configures it (obstore since issue 12; its client config is
  read back into the JSON), called with ``bytes``.
* ``ours, pyarrow.Buffer``: the same call with a ``pyarrow.Buffer`` payload
  (what the WAL writer hands over to avoid a copy).
* ``obstore``: ``obstore.put(store, key, data, mode="create")`` with
  ``retry_config={"max_retries": 0}``, default (signed) payload: the
  reference every ratio divides by.
* ``boto3``: ``put_object(IfNoneMatch="*")`` with the client ``S3Store`` used
  before (one attempt, checksums only when required, a 32-connection pool).

CPU is ``time.process_time()`` of this process (every thread, so obstore's
tokio workers count; SeaweedFS is another process and does not), split into
user and system time with ``getrusage``. Each repeat runs every competitor
once per entry size, in an order rotated every repeat; the objects are deleted
(untimed) after each repeat. A stub HTTP endpoint checks that each
exactly-once candidate sends a conditional PUT exactly once on 412, 409, 500
and 503, and that only 412 reads as "already exists".

Standalone: ``python -m benchmarks.bench_s3_client [--quick] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .common import (
    RESULTS_DIR,
    BenchContext,
    CpuContention,
    KiB,
    MiB,
    contention_line,
    fmt_bytes,
    interleaved,
    machine_info,
    machine_line,
    new_figure,
    ratio,
    rm_tree,
    save_figure,
    set_results_dir,
    summarize,
    write_json,
)

NAME = "s3_client_cpu"
GOAL = 1.5  # ours / obstore, client CPU s per GB
SIZES = (64 * KiB, 1 * MiB, 8 * MiB)
# ~50 / 48 / 64 MiB per competitor and repeat; 64 KiB gets the most ops (least CPU per op)
OPS = {64 * KiB: 800, 1 * MiB: 48, 8 * MiB: 8}
OPS_QUICK = {64 * KiB: 40, 1 * MiB: 8, 8 * MiB: 2}
BUCKET = "memwal-client-bench"
STUB_STATUSES = (412, 409, 500, 503)

STORE = "ours (S3Store.put_if_absent, bytes)"
STORE_ARROW = "ours arrow (S3Store.put_if_absent, pyarrow.Buffer)"
OBSTORE = "obstore (put mode=create, max_retries=0)"
BOTO3 = "boto3 (put_object, 1 attempt, no CRC)"
REFERENCE = OBSTORE


@dataclass
class Endpoint:
    """Where and as whom to connect (the SeaweedFS server or the stub)."""

    url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def storage_options(self) -> dict[str, str]:
        return {"aws_endpoint": self.url, "aws_access_key_id": self.access_key,
                "aws_secret_access_key": self.secret_key, "aws_region": self.region,
                "allow_http": "true", "aws_virtual_hosted_style_request": "false"}


@dataclass
class Client:
    """One competitor bound to an endpoint: a put-if-absent and its error reading."""

    put: Callable[[str, bytes], Any]
    classify: Callable[[BaseException], str]  # "exists" or a short name of the failure
    config: dict[str, Any] = field(default_factory=dict)


# --- competitors -------------------------------------------------------------------

def _boto3_client(ep: Endpoint, **config: Any):
    import boto3
    from botocore.config import Config

    s3 = {"addressing_style": "path", **config.pop("s3", {})}
    return boto3.session.Session().client(
        "s3", endpoint_url=ep.url, region_name=ep.region, aws_access_key_id=ep.access_key,
        aws_secret_access_key=ep.secret_key,
        config=Config(s3=s3, connect_timeout=10, read_timeout=60, **config))


def _boto3_classify(exc: BaseException) -> str:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        return "exists" if status == 412 else f"ClientError {status} {code}"
    return type(exc).__name__


def _boto3(ep: Endpoint, **config: Any) -> Client:
    client = _boto3_client(ep, **dict(config))

    def put(key: str, data: bytes) -> None:
        client.put_object(Bucket=BUCKET, Key=key, Body=data, IfNoneMatch="*")

    return Client(put, _boto3_classify, {"client": "boto3 put_object(IfNoneMatch='*')",
                                         "botocore_config": _jsonable(config)})


def make_boto3(ep: Endpoint) -> Client:
    """boto3 as ``S3Store`` configured it before obstore: one attempt, lean checksums."""
    return _boto3(ep, retries={"total_max_attempts": 1, "mode": "standard"},
                  request_checksum_calculation="when_required",
                  response_checksum_validation="when_required",
                  max_pool_connections=32)


def _make_store(ep: Endpoint, arrow: bool) -> Client:
    import pyarrow as pa

    from memwal_datasource.store import S3Store, open_store
    from memwal_datasource.store.s3_clients import obstore_config

    store = open_store(f"s3://{BUCKET}", ep.storage_options())
    assert isinstance(store, S3Store)

    def classify(exc: BaseException) -> str:
        return "exists" if isinstance(exc, FileExistsError) else type(exc).__name__

    def put_arrow(key: str, data: bytes) -> None:
        store.put_if_absent(key, pa.py_buffer(data))  # wraps the bytes; no copy


    config, client_options = obstore_config(store.options)
    return Client(put_arrow if arrow else store.put_if_absent, classify, {
        "client": "memwal_datasource.store.S3Store.put_if_absent",
        "data_client": store.data_client(),
        "payload": "pyarrow.Buffer" if arrow else "bytes",
        "obstore_config": {k: ("***" if "secret" in k or "token" in k else v)
                           for k, v in config.items()},
        "client_options": _jsonable(client_options), "retry_config": {"max_retries": 0}})


def make_store(ep: Endpoint) -> Client:
    return _make_store(ep, arrow=False)


def make_store_arrow(ep: Endpoint) -> Client:
    return _make_store(ep, arrow=True)


def make_obstore(ep: Endpoint) -> Client:
    import obstore as obs
    from obstore.exceptions import AlreadyExistsError
    from obstore.store import S3Store as ObS3Store

    # Lance-style ``aws_*`` keys are accepted as they are; ``allow_http`` must go in
    # client_options (in ``config`` it makes obstore 0.12 panic).
    opts = ep.storage_options()
    config = {k: v for k, v in opts.items() if k != "allow_http"}
    client_options = {"allow_http": True, "connect_timeout": "10s", "timeout": "60s"}
    retry_config = {"max_retries": 0}
    store = ObS3Store.from_url(f"s3://{BUCKET}", config=config, client_options=client_options,
                               retry_config=retry_config)

    def put(key: str, data: bytes) -> None:
        obs.put(store, key, data, mode="create")

    def classify(exc: BaseException) -> str:
        # object_store maps 412 and 304 to AlreadyExists for mode="create", but also
        # 409 Conflict: only the message tells them apart.
        if isinstance(exc, AlreadyExistsError):
            msg = str(exc)
            if "412 Precondition Failed" in msg or "304 Not Modified" in msg:
                return "exists"
            return "AlreadyExistsError (not 412: " + ("409)" if " 409 " in msg else "?)")
        return type(exc).__name__

    return Client(put, classify, {
        "client": "obstore.put(store, key, data, mode='create')",
        "config": {k: ("***" if "secret" in k else v) for k, v in config.items()},
        "client_options": client_options, "retry_config": retry_config})


FACTORIES: dict[str, Callable[[Endpoint], Client]] = {
    STORE: make_store,
    STORE_ARROW: make_store_arrow,
    OBSTORE: make_obstore,
    BOTO3: make_boto3,
}
# Configured to send a conditional PUT once: these get the stub check.
EXACTLY_ONCE_CANDIDATES = (STORE, OBSTORE, BOTO3)


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


# --- exactly-once check against a stub endpoint ------------------------------------

class _Stub:
    """127.0.0.1 HTTP endpoint answering every PUT with ``status``; counts PUTs."""

    def __init__(self) -> None:
        self.status = 200
        self.puts = 0
        self.user_agents: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_PUT(self) -> None:  # noqa: N802 - http.server naming
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                stub.puts += 1
                stub.user_agents.append(self.headers.get("User-Agent", ""))
                codes = {409: "ConditionalRequestConflict", 412: "PreconditionFailed",
                         500: "InternalError", 503: "SlowDown"}
                body = b""
                if stub.status != 200:
                    body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>'
                            f'{codes.get(stub.status, "Error")}</Code><Message>stub</Message>'
                            f'</Error>').encode()
                self.send_response(stub.status)
                if stub.status == 200:
                    self.send_header("ETag", '"stub"')  # obstore requires one
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def check_exactly_once(names: tuple[str, ...]) -> dict[str, Any]:
    """HTTP attempts per conditional PUT and how the outcome is reported, per status."""
    stub = _Stub()
    out: dict[str, Any] = {}
    try:
        ep = Endpoint(stub.url, "stub-key", "stub-secret")
        for name in names:
            client = FACTORIES[name](ep)
            rows = {}
            for status in STUB_STATUSES:
                stub.status, stub.puts = status, 0
                try:
                    client.put(f"stub/{status}", b"x" * 100)
                    outcome = "ok"
                except Exception as exc:  # noqa: BLE001 - classified, that is the point
                    outcome = client.classify(exc)
                rows[str(status)] = {"attempts": stub.puts, "outcome": outcome}
            once = all(r["attempts"] == 1 for r in rows.values())
            exists_only_412 = (rows["412"]["outcome"] == "exists" and all(
                r["outcome"] != "exists" for s, r in rows.items() if s != "412"))
            out[name] = {"statuses": rows, "exactly_once": once,
                         "412_distinguishable": exists_only_412}
        out["_user_agents"] = sorted(set(stub.user_agents))
    finally:
        stub.close()
    return out


# --- the benchmark -------------------------------------------------------------------

def _rusage() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def _measure(put: Callable[[str, bytes], Any], keys: list[str], payload: bytes) -> dict:
    u0, s0 = _rusage()
    c0 = time.process_time()
    w0 = time.perf_counter()
    for key in keys:
        put(key, payload)
    wall = time.perf_counter() - w0
    cpu = time.process_time() - c0
    u1, s1 = _rusage()
    return {"cpu_s": cpu, "user_s": u1 - u0, "sys_s": s1 - s0, "wall_s": wall,
            "ops": len(keys), "bytes": len(keys) * len(payload)}


def _enforced(client: Client, key: str) -> bool:
    """A second create of ``key`` must fail with the competitor's "exists" signal."""
    client.put(key, b"first")
    try:
        client.put(key, b"second")
    except Exception as exc:  # noqa: BLE001
        return client.classify(exc) == "exists"
    return False


def _clear_bucket(admin) -> int:
    import obstore as obs

    paths = [m["path"] for batch in obs.list(admin) for m in batch]
    for i in range(0, len(paths), 1000):
        obs.delete(admin, paths[i:i + 1000])
    return len(paths)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.split(" (")[0]).strip("-").lower()


def bench_s3_client_cpu(ctx: BenchContext) -> dict[str, Any]:
    import boto3
    import botocore
    import obstore
    from obstore.store import S3Store as ObS3Store

    from tests.s3_server import start_s3_server

    ops = OPS_QUICK if ctx.quick else OPS
    payloads = {size: os.urandom(size) for size in SIZES}
    exactly_once = check_exactly_once(EXACTLY_ONCE_CANDIDATES)
    ctx.log("  exactly-once check: " + ", ".join(
        f"{n.split(' (')[0]}: once={v['exactly_once']} 412-only={v['412_distinguishable']}"
        for n, v in exactly_once.items() if not n.startswith("_")))
    try:
        server = start_s3_server(ctx.scratch("s3_client"))
    except Exception as exc:  # noqa: BLE001 - reported, the rest of the suite runs
        return {"name": NAME, "title": "S3 client CPU per GB", "skipped":
                f"no S3 server could start: {exc}", "exactly_once": exactly_once,
                "table": {"columns": ["skipped"], "rows": [[str(exc)[:200]]]}, "targets": []}
    loadavg: list[list[float]] = []
    try:
        server.create_bucket(BUCKET)
        ep = Endpoint(server.endpoint, server.access_key, server.secret_key, server.region)
        clients = {name: make(ep) for name, make in FACTORIES.items()}
        admin = ObS3Store.from_url(f"s3://{BUCKET}", config={
            k: v for k, v in ep.storage_options().items() if k != "allow_http"},
            client_options={"allow_http": True})
        enforced = {name: _enforced(c, f"probe/{_slug(name)}") for name, c in clients.items()}
        for name, c in clients.items():  # warm: connections, lazy imports, tokio runtime
            for size in SIZES:
                for i in range(2):
                    c.put(f"warm/{_slug(name)}/{size}/{i}", payloads[size])
        _clear_bucket(admin)

        def competitor(name: str) -> Callable[[int], dict[str, Any]]:
            client = clients[name]

            def run(r: int) -> dict[str, Any]:
                out = {}
                for size in SIZES:
                    keys = [f"r{r}/{_slug(name)}/{size}/{i:05d}" for i in range(ops[size])]
                    gc.collect()
                    out[str(size)] = _measure(client.put, keys, payloads[size])
                return out

            return run

        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in clients}
        for r in range(ctx.repeats):
            loadavg.append([round(x, 2) for x in os.getloadavg()])
            # One repeat at a time so the bucket can be emptied in between (untimed).
            one = interleaved(1, {name: competitor(name) for name in _rotated(list(clients), r)})
            for name, res in one.items():
                runs[name].append(res[0])
            deleted = _clear_bucket(admin)
            ctx.log(f"  repeat {r + 1}/{ctx.repeats}: load {loadavg[-1][0]:.2f}, "
                    f"deleted {deleted} objects")
        backend = server.backend
    finally:
        server.stop()

    comp: dict[str, Any] = {}
    for name, rs in runs.items():
        per_size = {}
        for size in SIZES:
            xs = [x[str(size)] for x in rs]
            ref = [x[str(size)] for x in runs[REFERENCE]]
            per_size[str(size)] = {
                "cpu_s_per_gb": summarize([x["cpu_s"] / (x["bytes"] / 1e9) for x in xs]),
                "user_s_per_gb": summarize([x["user_s"] / (x["bytes"] / 1e9) for x in xs]),
                "sys_s_per_gb": summarize([x["sys_s"] / (x["bytes"] / 1e9) for x in xs]),
                "cpu_ms_per_op": summarize([x["cpu_s"] / x["ops"] * 1e3 for x in xs]),
                "wall_mb_s": summarize([x["bytes"] / x["wall_s"] / 1e6 for x in xs]),
                # Same repeat, same moment: this competitor's CPU over obstore's.
                "paired_ratio_to_obstore": summarize(
                    [ratio(a["cpu_s"] / a["bytes"], b["cpu_s"] / b["bytes"])
                     for a, b in zip(xs, ref, strict=True)]),
                "ops_per_repeat": xs[0]["ops"],
            }
        comp[name] = {"config": clients[name].config, "sizes": per_size}
    ref_med = {s: comp[REFERENCE]["sizes"][str(s)]["cpu_s_per_gb"]["median"] for s in SIZES}
    for name in comp:
        for s in SIZES:
            d = comp[name]["sizes"][str(s)]
            d["ratio_to_obstore"] = ratio(d["cpu_s_per_gb"]["median"], ref_med[s])

    rows = []
    for name in comp:
        for s in SIZES:
            d = comp[name]["sizes"][str(s)]
            c = d["cpu_s_per_gb"]
            pr = d["paired_ratio_to_obstore"]
            rows.append([name, fmt_bytes(s), f"{c['median']:.2f}",
                         f"{c['min']:.2f}..{c['max']:.2f}",
                         f"{d['user_s_per_gb']['median']:.2f} / {d['sys_s_per_gb']['median']:.2f}",
                         f"{d['cpu_ms_per_op']['median']:.3f}",
                         f"{d['ratio_to_obstore']:.2f} ({pr['min']:.2f}..{pr['max']:.2f})",
                         f"{d['wall_mb_s']['median']:.1f}"])
    targets = []
    for name in (STORE, STORE_ARROW):
        for s in SIZES:
            rr = comp[name]["sizes"][str(s)]["ratio_to_obstore"]
            targets.append({"what": f"{name} CPU/GB / obstore, {fmt_bytes(s)} entries "
                                    f"(goal <= {GOAL})",
                            "value": f"{rr:.2f}", "met": rr <= GOAL})
    for name in EXACTLY_ONCE_CANDIDATES:
        e = exactly_once[name]
        targets.append({"what": f"{name}: one HTTP attempt per conditional PUT on "
                                f"{'/'.join(map(str, STUB_STATUSES))}, and only 412 reads as "
                                "'already exists'",
                        "value": ", ".join(f"{s}: {v['attempts']}x {v['outcome']}"
                                           for s, v in e["statuses"].items()),
                        "met": e["exactly_once"] and e["412_distinguishable"]})
    targets.append({"what": "server enforces If-None-Match: * for every competitor",
                    "value": str(enforced), "met": all(enforced.values())})
    return {
        "name": NAME,
        "title": f"S3 put-if-absent: client CPU per GB, ours vs obstore vs boto3 ({backend})",
        "config": {
            "entry_bytes": list(SIZES), "ops_per_repeat": {str(k): v for k, v in ops.items()},
            "backend": backend, "endpoint": "127.0.0.1 (loopback), path-style, plain http",
            "cpu_clock": "time.process_time() of this process, every thread (user/sys from "
                         "getrusage); the S3 server is another process and is not counted",
            "interleaving": "per repeat, every competitor writes all sizes once, order rotated "
                            "every repeat; bucket emptied (untimed) between repeats",
            "obstore": getattr(obstore, "__version__", "?"),
            "object_store_user_agent": [u for u in exactly_once.get("_user_agents", [])
                                        if u.startswith("object_store")],
            "boto3": boto3.__version__, "botocore": botocore.__version__,
            "reference": REFERENCE, "goal_ratio": GOAL,
        },
        "loadavg_per_repeat": loadavg,
        "conditional_write_enforced": enforced,
        "exactly_once": {k: v for k, v in exactly_once.items() if not k.startswith("_")},
        "competitors": comp,
        "table": {"columns": ["competitor", "entry", "CPU s/GB", "range", "user / sys s/GB",
                              "CPU ms/op", "x obstore (paired range)", "wall MB/s"],
                  "rows": rows},
        "targets": targets,
    }


def _rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names)
    return names[k:] + names[:k]


def plot_s3_client_cpu(result: dict[str, Any], machine: dict[str, Any]) -> None:
    if result.get("skipped"):
        return
    import numpy as np

    comp = result["competitors"]
    names = list(comp)
    sizes = result["config"]["entry_bytes"]
    fig, axes = new_figure(3, width=5.2, height=4.6)
    colors = ["#1f77b4", "#aec7e8", "#d62728", "#7f7f7f"]
    width = 0.8 / len(names)
    x = np.arange(len(sizes))
    panels = ((axes[0], "cpu_s_per_gb", "client CPU s per GB (median, min-max)", True),
              (axes[1], "paired_ratio_to_obstore", "CPU / obstore's (median, min-max)", True),
              (axes[2], "wall_mb_s", "wall MB/s, one thread (median, min-max)", False))
    for ax, key, label, log in panels:
        for i, name in enumerate(names):
            st = [comp[name]["sizes"][str(s)][key] for s in sizes]
            med = [v["median"] for v in st]
            err = [[m - v["min"] for m, v in zip(med, st, strict=True)],
                   [v["max"] - m for m, v in zip(med, st, strict=True)]]
            ax.bar(x + (i - (len(names) - 1) / 2) * width, med, width, yerr=err, capsize=2,
                   color=colors[i % len(colors)], label=name)
        if key == "paired_ratio_to_obstore":
            ax.axhline(result["config"]["goal_ratio"], color="k", ls="--", lw=1)
            ax.text(len(sizes) - 0.5, result["config"]["goal_ratio"], " goal", va="bottom",
                    ha="right", fontsize=7)
        if log:
            ax.set_yscale("log")
        ax.set_xticks(x, [fmt_bytes(s) for s in sizes])
        ax.set_xlabel("entry size")
        ax.set_ylabel(label, fontsize=8)
        ax.grid(axis="y", alpha=0.3, which="both")
    axes[0].legend(fontsize=6, loc="upper right")
    save_figure(fig, NAME, result["title"], machine)


# --- standalone run (same envelope as benchmarks.run) -------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_s3_client",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small counts, 2 repeats (smoke run)")
    p.add_argument("--repeats", type=int, default=None, help="default 5; 2 with --quick")
    p.add_argument("--workdir", default=None, help="parent of the scratch directory")
    p.add_argument("--results-dir", default=None,
                   help="default benchmarks/results (benchmarks/results/quick with --quick)")
    args = p.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    results_dir = Path(args.results_dir or (RESULTS_DIR / "quick" if args.quick else RESULTS_DIR))
    set_results_dir(results_dir)
    workdir = Path(tempfile.mkdtemp(prefix="memwal-bench-", dir=args.workdir))
    machine = machine_info(str(workdir))
    print(f"machine: {machine_line(machine)}; load avg {machine['loadavg_at_start']}", flush=True)
    ctx = BenchContext(workdir=workdir, quick=args.quick, repeats=repeats, machine=machine,
                       log=lambda s: print(s, flush=True))
    t0 = time.perf_counter()
    try:
        with CpuContention() as cpu:
            try:
                result = bench_s3_client_cpu(ctx)
            except Exception:  # noqa: BLE001 - written to the JSON like run.py does
                result = {"name": NAME, "error": traceback.format_exc()}
                print(result["error"], file=sys.stderr)
    finally:
        rm_tree(workdir)
    print(f"  {contention_line(cpu.result)}".replace("**", ""), flush=True)
    result.update({"contention": cpu.result, "machine": machine, "quick": args.quick,
                   "repeats": repeats, "duration_s": time.perf_counter() - t0,
                   "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "argv": sys.argv[1:] if argv is None else argv})
    path = write_json(NAME, result, results_dir)
    if "error" in result:
        return 1
    plot_s3_client_cpu(result, machine)
    try:
        from .run import print_table
    except Exception:  # noqa: BLE001 - the table is a convenience
        print(result["table"])
    else:
        print_table(f"{NAME}: {result['title']} [{result['duration_s']:.0f} s]",
                    result["table"], result["targets"])
    print(f"results: {path} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
