"""MemWalTable read plans against commit-log size, and compaction throughput.

* :func:`bench_table_plan` (``table_plan``): what a *new* reader pays to plan,
  as a function of the number of commit records of history: on a **living
  table** (the goal: those records compacted and collected, as an operator
  runs ``memwal compact`` and ``memwal gc``, then 10 new records), with
  checkpoints but never compacted (every range still visible, so the
  checkpoint grows with them: O(visible ranges), no goal), and without
  checkpoints (``checkpoint_interval=None``, no checkpoint files), on local
  disk and on a local S3 server (SeaweedFS from
  ``tests/s3_server.py``, 127.0.0.1 only). Three operations, each on freshly
  constructed objects (a new Spark read plan, a stream trigger in a new process,
  the CLI):

  - ``MemWalTable(uri, opts).committed_tail()``: the WAL-tail read plan;
  - ``CommitLog(open_store(uri, opts)).visible()``;
  - ``CommitLog(open_store(uri, opts)).committed_txn(Txn("x", 1))``: a stream
    commit's duplicate check (a key that is not in the log, so the whole log
    must be folded).

  Setup (untimed): ``create_table`` (primary key ``id``), one shard with 10
  real WAL entries (``WalAppender``), then N records written one at a time with
  ``CommitLog.append``, each one range of one entry (cycling over the 10). The
  store calls each operation makes (GET, HEAD/exists, LIST) are counted in a
  separate, untimed pass; Lance's own read of the base manifest is not counted.

* :func:`bench_compaction` (``compaction``): rows/s of
  ``compact(MemWalTable(uri))`` folding N rows, written by the WAL-only writer
  (``ShardWriterConfig(enable_memtable=False, durable_write=False)``) over 20
  commit records (4 shards, one writer session per record), into a base that
  already holds N rows; the incoming keys are ``N/2 .. 3N/2 - 1`` (half update,
  half insert). Against, on fresh copies of the same base:

  - ``merge_insert``: ``ds.merge_insert("id").when_matched_update_all()
    .when_not_matched_insert_all().execute(rows)`` of the same rows, already in
    memory as one Arrow table (what compaction's own merge costs, minus reading);
  - ``append``: ``lance.write_dataset(rows, uri, mode="append")``: no key work at all;
  - compaction's first two phases, timed apart on the untouched source:
    reading the WAL (``snapshot`` + ``range_rows``) and keeping the newest row
    per key (``last_per_key`` + the tombstone split and cast ``compact`` does).

  So compaction = read + dedup + merge_insert + the rest (intent, ledger mark,
  dataset re-opens). Local disk only.

Competitors run interleaved, order rotated every repeat; medians with min..max.
Run with ``python -m benchmarks.run --only table_plan`` / ``--only compaction``.
"""

from __future__ import annotations

import collections
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memwal_datasource import hooks
from memwal_datasource.commit import (
    APPEND,
    CHECKPOINTS_DIR,
    CommitLog,
    CommittedRange,
    Txn,
    checkpoint_key,
    record_key,
)
from memwal_datasource.store import ObjectStore, open_store
from memwal_datasource.table import (
    TOMBSTONE,
    TableView,
    create_table,
    data_schema,
    last_per_key,
)

from .common import (
    BenchContext,
    Stopwatch,
    bench_schema,
    interleaved,
    make_batch,
    ratio,
    rm_tree,
    save_figure,
    summarize,
)

# --- table_plan ------------------------------------------------------------------

PLAN = "table_plan"
BUCKET = "memwal-table-bench"
ENTRIES = 10  # real WAL entries the records point at
ENTRY_ROWS = 10
INTERVAL = 100  # CommitLog's default checkpoint_interval
LIVE = "living table"  # compacted and collected, as an operator runs it; the goal
WITH = "with checkpoints"  # never compacted: the checkpoint holds every visible range
WITHOUT = "without"
VARIANTS = {LIVE: INTERVAL, WITH: INTERVAL, WITHOUT: None}
LIVE_TAIL = 10  # records committed after the living table's compaction and collection
TAIL = "MemWalTable.committed_tail()"
VISIBLE = "CommitLog.visible()"
TXN = "CommitLog.committed_txn()"
OPS = (TAIL, VISIBLE, TXN)
PLAN_SIZES = {"local": (10, 1_000, 10_000), "s3": (10, 1_000, 10_000)}  # --full
PLAN_SIZES_DEFAULT = {"local": (10, 1_000, 10_000), "s3": (10, 1_000)}
PLAN_SIZES_QUICK = {"local": (10, 100, 300), "s3": (10, 100)}
FLAT = 2.0  # "flat": the largest log costs at most this many times the smallest


class CountingStore(ObjectStore):
    """Forwards to a real store and counts the calls that reach it."""

    def __init__(self, inner: ObjectStore):
        self.inner = inner
        self.uri = inner.uri
        self.calls: collections.Counter[str] = collections.Counter()

    def put_if_absent(self, key: str, data: bytes) -> None:
        self.calls["put"] += 1
        self.inner.put_if_absent(key, data)

    def put(self, key: str, data: bytes) -> None:
        self.calls["put"] += 1
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        self.calls["get"] += 1
        return self.inner.get(key)

    def head(self, key: str) -> int | None:
        self.calls["head"] += 1
        return self.inner.head(key)

    def exists(self, key: str) -> bool:
        self.calls["head"] += 1
        return self.inner.exists(key)

    def list(self, prefix: str) -> Iterator[str]:
        self.calls["list"] += 1
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str) -> list[str]:
        self.calls["list"] += 1
        return self.inner.list_dirs(prefix)

    def modified_ms(self, key: str) -> int | None:
        self.calls["head"] += 1
        return self.inner.modified_ms(key)

    def now_ms(self) -> int:
        return self.inner.now_ms()

    def delete(self, key: str) -> None:
        self.calls["delete"] += 1
        self.inner.delete(key)

    def describe(self, key: str) -> str:
        return self.inner.describe(key)


def _run_op(op: str, uri: str, opts: dict[str, str], store: ObjectStore | None = None) -> int:
    """One plan operation on fresh objects; returns its size (ranges, or 1 if txn found)."""
    if op == TAIL:
        return len(TableView(uri, opts, store=store).committed_tail())
    log = CommitLog(store or open_store(uri, opts))
    if op == VISIBLE:
        return len(log.visible())
    return 0 if log.committed_txn(Txn("x", 1)) is None else 1


def _build_log(uri: str, opts: dict[str, str], n: int, interval: int | None,
               live: bool = False) -> dict[str, Any]:
    """A real table, one shard of ``ENTRIES`` entries, ``n`` one-range records.

    ``live``: then compacted (every record folded into the base table) and
    collected (retention 0: the records and released ranges go, a checkpoint
    stands for them), and ``LIVE_TAIL`` more records committed: what a reader
    of a table that lives, with compaction and GC running, finds.
    """
    from memwal_datasource.wal import WalAppender

    schema = bench_schema()
    create_table(uri, schema, primary_key=["id"], storage_options=opts)
    store = open_store(uri, opts)
    shard = str(uuid.uuid4())

    def entries(appender: WalAppender) -> list[int]:
        return [appender.append(schema, [make_batch(i * ENTRY_ROWS, ENTRY_ROWS, schema)]).position
                for i in range(ENTRIES)]

    app = WalAppender.open(store, shard)
    positions = entries(app)
    log = CommitLog(store, checkpoint_interval=interval)
    nbytes = make_batch(0, ENTRY_ROWS, schema).get_total_buffer_size()

    def commit(count: int) -> None:
        for i in range(count):
            pos = positions[i % ENTRIES]
            log.append(APPEND, [CommittedRange(shard, app.epoch, pos, pos, rows=ENTRY_ROWS,
                                               bytes=nbytes, task=i % 8, attempt=0)])

    with Stopwatch() as t:
        commit(n)
        if live:
            from memwal_datasource.compact import compact
            from memwal_datasource.gc import collect

            compact(TableView(uri, opts), max_records_per_round=max(n, 1))
            collect(TableView(uri, opts), retain_seconds=0)
            log = CommitLog(store, checkpoint_interval=interval)
            app = WalAppender.open(store, shard)  # collection fenced the old writer
            positions = entries(app)
            commit(LIVE_TAIL)
    ckpts = sorted(k for k in store.list(CHECKPOINTS_DIR + "/") if k.endswith(".json"))
    latest = int(ckpts[-1].rsplit("/", 1)[-1][:-5]) if ckpts else None
    return {
        "append_seconds": t.seconds,
        "record_bytes": store.head(record_key(1)) if n else 0,
        "checkpoints": len(ckpts),
        "latest_checkpoint": latest,
        "latest_checkpoint_bytes": store.head(checkpoint_key(latest)) if latest else 0,
        "records_after_latest_checkpoint": n - (latest or 0),
    }


def _rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names)
    return names[k:] + names[:k]


def _plan_case(ctx: BenchContext, backend: str, root: str, opts: dict[str, str],
               n: int) -> dict[str, Any]:
    uris = {v: f"{root.rstrip('/')}/n{n}_{v.split()[0]}.lance" for v in VARIANTS}
    build = {}
    for variant, interval in VARIANTS.items():
        with Stopwatch() as t:
            build[variant] = _build_log(uris[variant], opts, n, interval, live=variant == LIVE)
        build[variant]["setup_seconds"] = t.seconds
    ctx.log(f"  {backend} N={n:,}: built in "
            + ", ".join(f"{v} {b['setup_seconds']:.1f} s" for v, b in build.items())
            + f"; latest checkpoint {build[WITH]['latest_checkpoint']} "
              f"({build[WITH]['latest_checkpoint_bytes'] / 1e3:.0f} kB)")
    assert build[WITHOUT]["checkpoints"] == 0, "the 'without' table has checkpoint files"

    def competitor(op: str, variant: str) -> Callable[[int], dict[str, Any]]:
        def run(r: int) -> dict[str, Any]:
            with Stopwatch() as t:
                size = _run_op(op, uris[variant], opts)
            return {"seconds": t.seconds, "result": size}
        return run

    names = [(op, v) for op in OPS for v in VARIANTS]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {k: [] for k in names}
    loadavg = []
    for r in range(ctx.repeats):
        loadavg.append([round(x, 2) for x in os.getloadavg()])
        order = _rotated(names, r)
        one = interleaved(1, {f"{op} | {v}": competitor(op, v) for op, v in order})
        for op, v in order:
            runs[(op, v)].append(one[f"{op} | {v}"][0])
    calls = {}
    for op, v in names:  # untimed: what reaches the store
        store = CountingStore(open_store(uris[v], opts))
        _run_op(op, uris[v], opts, store=store)
        calls[f"{op} | {v}"] = dict(store.calls)
    expected = {v: {TAIL: n, VISIBLE: n, TXN: 0} for v in VARIANTS}
    expected[LIVE] = {TAIL: LIVE_TAIL, VISIBLE: LIVE_TAIL, TXN: 0}
    ops: dict[str, Any] = {}
    for op in OPS:
        per = {}
        for v in VARIANTS:
            rs = runs[(op, v)]
            per[v] = {"seconds": summarize([x["seconds"] for x in rs]),
                      "calls": calls[f"{op} | {v}"],
                      "requests": sum(calls[f"{op} | {v}"].values()),
                      "correct": all(x["result"] == expected[v][op] for x in rs)}
        paired = [a["seconds"] / b["seconds"] for a, b in
                  zip(runs[(op, WITH)], runs[(op, WITHOUT)], strict=True)]
        ops[op] = {"variants": per,
                   "with_over_without": ratio(per[WITH]["seconds"]["median"],
                                              per[WITHOUT]["seconds"]["median"]),
                   "paired_with_over_without": summarize(paired)}
    return {"backend": backend, "records": n, "uris": uris, "build": build, "ops": ops,
            "loadavg_per_repeat": loadavg}


def bench_table_plan(ctx: BenchContext) -> dict[str, Any]:
    from tests.s3_server import start_s3_server

    sizes = ctx.pick(PLAN_SIZES_QUICK, PLAN_SIZES_DEFAULT, PLAN_SIZES)
    cases = []
    local_root = ctx.scratch("plan_local")
    for n in sizes["local"]:
        cases.append(_plan_case(ctx, "local", str(local_root), {}, n))
    rm_tree(local_root)
    s3_skipped = None
    backend_name = "?"
    try:
        server = start_s3_server(ctx.scratch("plan_s3"))
    except Exception as exc:  # noqa: BLE001 - reported, local results still count
        s3_skipped = f"no S3 server could start: {exc}"
        ctx.log(f"  {s3_skipped}")
    else:
        try:
            backend_name = server.backend
            server.create_bucket(BUCKET)
            for n in sizes["s3"]:
                cases.append(_plan_case(ctx, "s3", f"s3://{BUCKET}", server.storage_options(),
                                        n))
        finally:
            server.stop()

    rows, targets = [], []
    for c in cases:
        for op in OPS:
            o = c["ops"][op]
            w, wo = o["variants"][WITH], o["variants"][WITHOUT]
            lv = o["variants"][LIVE]
            p = o["paired_with_over_without"]
            rows.append([c["backend"], f"{c['records']:,}", op,
                         f"{lv['seconds']['median'] * 1e3:.1f}",
                         f"{lv['seconds']['min'] * 1e3:.1f}..{lv['seconds']['max'] * 1e3:.1f}",
                         f"{w['seconds']['median'] * 1e3:.1f}",
                         f"{w['seconds']['min'] * 1e3:.1f}..{w['seconds']['max'] * 1e3:.1f}",
                         f"{wo['seconds']['median'] * 1e3:.1f}",
                         f"{wo['seconds']['min'] * 1e3:.1f}..{wo['seconds']['max'] * 1e3:.1f}",
                         f"{o['with_over_without']:.3f} ({p['min']:.3f}..{p['max']:.3f})",
                         f"{lv['requests']} / {w['requests']} / {wo['requests']}",
                         f"{c['build'][WITH]['latest_checkpoint_bytes'] / 1e3:.0f}"])
    for backend in ("local", "s3"):
        bc = [c for c in cases if c["backend"] == backend]
        if len(bc) < 2:
            continue
        lo, hi = bc[0], bc[-1]
        for op in OPS:
            for variant, goal in ((LIVE, True), (WITH, False)):
                t_lo = lo["ops"][op]["variants"][variant]["seconds"]["median"]
                t_hi = hi["ops"][op]["variants"][variant]["seconds"]["median"]
                q_lo = lo["ops"][op]["variants"][variant]["requests"]
                q_hi = hi["ops"][op]["variants"][variant]["requests"]
                growth = ratio(t_hi, t_lo)
                target = {
                    "what": f"{backend}, {op}, {variant}: time at {hi['records']:,} records of "
                            f"history / at {lo['records']:,}"
                            + (f" (<= {FLAT})" if goal else " (no goal: O(visible ranges))"),
                    "value": f"{growth:.2f}x ({t_lo * 1e3:.1f} -> {t_hi * 1e3:.1f} ms; store "
                             f"requests {q_lo} -> {q_hi})",
                    "met": growth <= FLAT if goal else None}
                targets.append(target)
    targets.append({"what": "every run returned the expected result (N ranges; no txn)",
                    "value": str(all(v["correct"] for c in cases for o in c["ops"].values()
                                     for v in o["variants"].values())),
                    "met": all(v["correct"] for c in cases for o in c["ops"].values()
                               for v in o["variants"].values())})
    return {
        "name": PLAN,
        "title": "Read-plan cost vs commit-log size, with and without checkpoints",
        "config": {
            "records": {k: list(v) for k, v in sizes.items()},
            "s3_sizes_note": "S3 uses 1,000 records by default (10,000 with --full): without "
                             "checkpoints every record is one GET (~5 ms here), and each "
                             "repeat reads the log 4 times",
            "checkpoint_interval": INTERVAL,
            "record": "one range of one real WAL entry (10 entries of 10 rows, cycled)",
            "timed": {TAIL: "MemWalTable(uri, opts).committed_tail() (opens the store, the "
                            "Lance dataset, reads the MemWAL index, then the records)",
                      VISIBLE: "CommitLog(open_store(uri, opts)).visible()",
                      TXN: "CommitLog(open_store(uri, opts)).committed_txn(Txn('x', 1))"},
            "interleaving": "per repeat, the 9 (operation, variant) competitors run once each, "
                            "order rotated every repeat",
            "requests": "calls reaching memwal's store (GET, HEAD/exists, LIST), one untimed "
                        "pass; Lance's own manifest reads are not counted",
            "local_cache": "local files are page-cache hot (just written)",
            "s3_backend": backend_name, "s3_endpoint": "127.0.0.1 (loopback), plain http",
            "flat_threshold": FLAT,
        },
        "s3_skipped": s3_skipped,
        "cases": cases,
        "table": {"columns": ["store", "records", "operation", "living ms", "range",
                              "with ms", "range",
                              "without ms", "range", "with/without (paired range)",
                              "requests living / with / without", "checkpoint kB"],
                  "rows": rows},
        "targets": targets,
    }


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_table_plan(result: dict[str, Any], machine: dict[str, Any]) -> None:
    plt = _plt()
    from matplotlib.ticker import NullLocator

    cases = result["cases"]
    backends = [b for b in ("local", "s3") if any(c["backend"] == b for c in cases)]
    fig, axes = plt.subplots(len(backends), len(OPS), figsize=(15, 4.3 * len(backends)),
                             squeeze=False)
    styles = {WITH: ("#1f77b4", "o"), WITHOUT: ("#d62728", "s")}
    for i, backend in enumerate(backends):
        bc = [c for c in cases if c["backend"] == backend]
        xs = [c["records"] for c in bc]
        for j, op in enumerate(OPS):
            ax = axes[i][j]
            for v, (color, marker) in styles.items():
                st = [c["ops"][op]["variants"][v]["seconds"] for c in bc]
                med = [s["median"] * 1e3 for s in st]
                err = [[m - s["min"] * 1e3 for m, s in zip(med, st, strict=True)],
                       [s["max"] * 1e3 - m for m, s in zip(med, st, strict=True)]]
                ax.errorbar(xs, med, yerr=err, color=color, marker=marker, capsize=3,
                            label=v)
                for x, m, c in zip(xs, med, bc, strict=True):
                    q = c["ops"][op]["variants"][v]["requests"]
                    ax.annotate(f"{q} req", (x, m), textcoords="offset points",
                                xytext=(4, 6 if v == WITHOUT else -12), fontsize=7,
                                color=color)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(xs, [f"{c['records']:,}\nckpt "
                               f"{c['build'][WITH]['latest_checkpoint_bytes'] / 1e3:.0f} kB"
                               for c in bc], fontsize=7)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_title(f"{'local disk' if backend == 'local' else 'S3 (SeaweedFS)'}: {op}",
                         fontsize=9)
            ax.set_xlabel("commit records (latest checkpoint's size)", fontsize=8)
            ax.set_ylabel("ms, fresh objects (median, min-max)", fontsize=8)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7, loc="upper left")
    save_figure(fig, PLAN, result["title"], machine)


# --- compaction ------------------------------------------------------------------

COMPACTION = "compaction"
RECORDS = 20
SHARDS = 4
BATCH_ROWS = 10_000
COMPACT_SIZES = (200_000, 1_000_000, 5_000_000)  # --full
COMPACT_SIZES_DEFAULT = (200_000, 1_000_000)
COMPACT_SIZES_QUICK = (20_000, 100_000)
C_COMPACT = "compact(MemWalTable)"
C_PHASES = "read WAL + dedup (compact's first phases)"
C_MERGE = "merge_insert (Arrow in memory)"
C_APPEND = "write_dataset append (Arrow in memory)"
INSIDE = ("to_intent_s", "rows_s", "merge_s", "finish_s")  # compact() split at its hooks
_TABLE_ONLY = shutil.ignore_patterns("_mem_wal", "_memwal_commits", "_memwal_compaction")


def _build_compaction_source(uri: str, n: int) -> tuple[pa.Table, dict[str, Any]]:
    """Base of ``n`` rows (keys 0..n-1) plus ``n`` rows in the WAL (keys n/2..3n/2-1)."""
    import lance

    from memwal_datasource.config import ShardWriterConfig
    from memwal_datasource.shard_writer import open_shard_writer

    schema = bench_schema()
    create_table(uri, schema, primary_key=["id"])
    base = pa.Table.from_batches([make_batch(s, min(BATCH_ROWS * 10, n - s), schema)
                                  for s in range(0, n, BATCH_ROWS * 10)])
    with Stopwatch() as t_base:
        lance.write_dataset(base, uri, mode="append")
    ds = lance.dataset(uri)
    assert ds.mem_wal_index_details() is not None, "the base append dropped the MemWAL index"
    del base
    config = ShardWriterConfig(enable_memtable=False, durable_write=False)
    shards = [str(uuid.uuid4()) for _ in range(SHARDS)]
    log = CommitLog(open_store(uri))
    per = n // RECORDS
    incoming: list[pa.RecordBatch] = []
    entries = 0
    with Stopwatch() as t_wal:
        for r in range(RECORDS):
            start = n // 2 + r * per
            count = per if r < RECORDS - 1 else n - per * (RECORDS - 1)
            batches = [make_batch(start + j, min(BATCH_ROWS, count - j), schema)
                       for j in range(0, count, BATCH_ROWS)]
            incoming += batches
            with open_shard_writer(uri, shards[r % SHARDS], schema, config) as w:
                for b in batches:
                    w.put(b)
            s = w.stats()
            entries += s.last_wal_position - s.first_wal_position + 1
            log.append(APPEND, [CommittedRange(s.shard_id, s.epoch, s.first_wal_position,
                                               s.last_wal_position, s.rows, s.bytes, task=r)])
    rows = pa.Table.from_batches(incoming).combine_chunks()
    wal_bytes = sum(os.path.getsize(os.path.join(d, f))
                    for d, _, fs in os.walk(os.path.join(uri, "_mem_wal")) for f in fs)
    return rows, {"base_rows": n, "incoming_rows": rows.num_rows,
                  "incoming_arrow_bytes": rows.get_total_buffer_size(),
                  "wal_entries": entries, "wal_bytes_on_disk": wal_bytes,
                  "commit_records": RECORDS, "shards": SHARDS,
                  "base_write_seconds": t_base.seconds, "wal_write_seconds": t_wal.seconds,
                  "version_before": ds.version}


def _check_table(uri: str) -> dict[str, int]:
    import lance

    ids = lance.dataset(uri).to_table(columns=["id"]).column("id")
    return {"rows": len(ids), "distinct_ids": pc.count_distinct(ids).as_py()}


def _compaction_case(ctx: BenchContext, n: int) -> dict[str, Any]:
    import lance

    from memwal_datasource.compact import compact

    src_dir = ctx.scratch(f"compact_src_{n}")
    src = str(src_dir / "t.lance")
    rows, info = _build_compaction_source(src, n)
    ctx.log(f"  N={n:,}: base {info['base_write_seconds']:.1f} s, WAL "
            f"{info['wal_bytes_on_disk'] / 1e6:.0f} MB in {info['wal_entries']} entries "
            f"({info['wal_write_seconds']:.1f} s)")
    checks: dict[str, dict[str, int]] = {}

    def fresh_copy(name: str, r: int, table_only: bool) -> str:
        dst = ctx.workdir / f"compact_{name}_{n}_{r}"
        rm_tree(dst)
        shutil.copytree(src, dst / "t.lance", ignore=_TABLE_ONLY if table_only else None)
        return str(dst / "t.lance")

    def run_compact(r: int) -> dict[str, Any]:
        uri = fresh_copy("c", r, table_only=False)
        marks: dict[str, float] = {}
        removers = [hooks.register(p, lambda p=p, **_: marks.setdefault(p, time.perf_counter()))
                    for p in ("compact.intent", "compact.before_commit",
                              "compact.after_commit")]
        try:
            with Stopwatch() as t:
                summary = compact(TableView(uri))
        finally:
            for remove in removers:
                remove()
        intent = marks["compact.intent"]
        before, after = marks["compact.before_commit"], marks["compact.after_commit"]
        if r == 0:
            checks[C_COMPACT] = _check_table(uri)
        rm_tree(os.path.dirname(uri))
        return {"seconds": t.seconds, "rows": summary.rows, "rounds": len(summary.rounds),
                "round_seconds": [x.seconds for x in summary.rounds],
                "to_intent_s": intent - t.start, "rows_s": before - intent,
                "merge_s": after - before,
                "finish_s": t.start + t.seconds - after}

    def run_phases(r: int) -> dict[str, Any]:
        with Stopwatch() as t_read:
            table = TableView(src)
            snap = table.snapshot()
            schema = data_schema(table.dataset(snap.base_version).schema)
            wal = table.range_rows(snap.tail, schema)
        with Stopwatch() as t_dedup:  # what compact._round_rows does after reading
            newest = last_per_key(wal, ["id"])
            upserts = newest.filter(pc.invert(newest.column(TOMBSTONE)))
            upserts = upserts.drop_columns([TOMBSTONE]).cast(schema)
        with Stopwatch() as t_order:  # the row-number column last_per_key builds
            pa.array(range(wal.num_rows), pa.int64())
        return {"seconds": t_read.seconds + t_dedup.seconds, "read_s": t_read.seconds,
                "dedup_s": t_dedup.seconds, "order_column_s": t_order.seconds,
                "rows": upserts.num_rows, "wal_chunks": wal.column(0).num_chunks}

    def run_merge(r: int) -> dict[str, Any]:
        uri = fresh_copy("m", r, table_only=True)
        ds = lance.dataset(uri)
        with Stopwatch() as t:
            (ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
             .execute(rows))
        if r == 0:
            checks[C_MERGE] = _check_table(uri)
        rm_tree(os.path.dirname(uri))
        return {"seconds": t.seconds, "rows": rows.num_rows}

    def run_append(r: int) -> dict[str, Any]:
        uri = fresh_copy("a", r, table_only=True)
        with Stopwatch() as t:
            lance.write_dataset(rows, uri, mode="append")
        if r == 0:
            checks[C_APPEND] = _check_table(uri)
        rm_tree(os.path.dirname(uri))
        return {"seconds": t.seconds, "rows": rows.num_rows}

    competitors = {C_COMPACT: run_compact, C_PHASES: run_phases, C_MERGE: run_merge,
                   C_APPEND: run_append}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in competitors}
    loadavg = []
    for r in range(ctx.repeats):
        loadavg.append([round(x, 2) for x in os.getloadavg()])
        one = interleaved(1, {k: competitors[k] for k in _rotated(list(competitors), r)})
        for k, v in one.items():
            runs[k].append(v[0])
        ctx.log(f"    repeat {r + 1}/{ctx.repeats}: load {loadavg[-1][0]:.2f}; "
                + ", ".join(f"{k.split(' (')[0]} {v[0]['seconds']:.2f} s"
                            for k, v in one.items()))
    rm_tree(src_dir)

    comp: dict[str, Any] = {}
    for k, rs in runs.items():
        secs = [x["seconds"] for x in rs]
        comp[k] = {"seconds": summarize(secs), "rows_per_s": summarize([n / s for s in secs]),
                   "runs": rs}
    for key in INSIDE:
        comp[C_COMPACT][key] = summarize([x[key] for x in runs[C_COMPACT]])
    ph = runs[C_PHASES]
    comp[C_PHASES]["read_s"] = summarize([x["read_s"] for x in ph])
    comp[C_PHASES]["dedup_s"] = summarize([x["dedup_s"] for x in ph])
    comp[C_PHASES]["order_column_s"] = summarize([x["order_column_s"] for x in ph])
    med = {k: v["seconds"]["median"] for k, v in comp.items()}
    read_s = comp[C_PHASES]["read_s"]["median"]
    dedup_s = comp[C_PHASES]["dedup_s"]["median"]
    other_s = med[C_COMPACT] - read_s - dedup_s - med[C_MERGE]
    breakdown = {"read_wal_s": read_s, "dedup_s": dedup_s, "merge_insert_s": med[C_MERGE],
                 "other_s": other_s, "compact_s": med[C_COMPACT]}
    # compact's own run, split at its hooks (medians of each part; they need not add up)
    inside = {k: comp[C_COMPACT][k]["median"] for k in INSIDE}
    shares = {k[:-2] + "_share": ratio(v, med[C_COMPACT])
              for k, v in breakdown.items() if k != "compact_s"}
    ok = (all(x["rows"] == n and x["rounds"] == 1 for x in runs[C_COMPACT])
          and all(x["rows"] == n for x in ph)
          and checks.get(C_COMPACT) == {"rows": n * 3 // 2, "distinct_ids": n * 3 // 2}
          and checks.get(C_MERGE) == checks.get(C_COMPACT)
          and checks.get(C_APPEND, {}).get("rows") == 2 * n)
    return {"rows": n, "source": info, "competitors": comp, "breakdown": breakdown,
            "shares": shares, "compact_inside": inside, "checks": checks, "correct": ok,
            "ratios": {"compact_time/merge_insert_time": ratio(med[C_COMPACT], med[C_MERGE]),
                       "compact_time/append_time": ratio(med[C_COMPACT], med[C_APPEND]),
                       "merge_insert_time/append_time": ratio(med[C_MERGE], med[C_APPEND])},
            "loadavg_per_repeat": loadavg}


def bench_compaction(ctx: BenchContext) -> dict[str, Any]:
    sizes = ctx.pick(COMPACT_SIZES_QUICK, COMPACT_SIZES_DEFAULT, COMPACT_SIZES)
    cases = [_compaction_case(ctx, n) for n in sizes]
    rows = []
    for c in cases:
        cm = c["competitors"]
        for k in (C_COMPACT, C_MERGE, C_APPEND, C_PHASES):
            s, rps = cm[k]["seconds"], cm[k]["rows_per_s"]
            rows.append([f"{c['rows']:,}", k, f"{s['median']:.3f}",
                         f"{s['min']:.3f}..{s['max']:.3f}", f"{rps['median'] / 1e6:.2f}",
                         f"{rps['min'] / 1e6:.2f}..{rps['max'] / 1e6:.2f}",
                         f"{ratio(s['median'], cm[C_COMPACT]['seconds']['median']):.2f}"])
    b_rows = [[f"{c['rows']:,}", f"{c['breakdown']['compact_s']:.3f}",
               f"{c['breakdown']['read_wal_s']:.3f} ({c['shares']['read_wal_share']:.0%})",
               f"{c['breakdown']['dedup_s']:.3f} ({c['shares']['dedup_share']:.0%})",
               f"{c['breakdown']['merge_insert_s']:.3f} "
               f"({c['shares']['merge_insert_share']:.0%})",
               f"{c['breakdown']['other_s']:.3f} ({c['shares']['other_share']:.0%})",
               f"{c['competitors'][C_PHASES]['order_column_s']['median']:.3f}"]
              for c in cases]
    targets = [{"what": f"N={c['rows']:,}: compaction folds every row once (base + N/2 new "
                        "keys, no duplicate key; merge_insert agrees; append adds N)",
                "value": str(c["checks"]), "met": c["correct"]} for c in cases]
    for c in cases:
        targets.append({"what": f"N={c['rows']:,}: compact time / plain merge_insert time",
                        "value": f"{c['ratios']['compact_time/merge_insert_time']:.2f}x "
                                 f"(/ append: {c['ratios']['compact_time/append_time']:.2f}x)",
                        "met": None})
        ins = c["compact_inside"]
        targets.append({"what": f"N={c['rows']:,}: compact() split at its hooks (medians)",
                        "value": f"to the intent (dataset opens, snapshot, intent PUT) "
                                 f"{ins['to_intent_s']:.3f} s, intent to merge (read WAL, "
                                 f"dedup) {ins['rows_s']:.3f} s, merge_insert with ledger "
                                 f"mark {ins['merge_s']:.3f} s, after it "
                                 f"{ins['finish_s']:.3f} s",
                        "met": None})
        b, sh = c["breakdown"], c["shares"]
        targets.append({"what": f"N={c['rows']:,}: compact's time vs its phases measured "
                                "apart (medians; other = the difference)",
                        "value": f"read WAL {b['read_wal_s']:.3f} s ({sh['read_wal_share']:.0%}), "
                                 f"dedup {b['dedup_s']:.3f} s ({sh['dedup_share']:.0%}), "
                                 f"merge_insert {b['merge_insert_s']:.3f} s "
                                 f"({sh['merge_insert_share']:.0%}), other {b['other_s']:.3f} s "
                                 f"({sh['other_share']:.0%}) of {b['compact_s']:.3f} s",
                        "met": None})
    return {
        "name": COMPACTION,
        "title": "Compaction throughput vs plain Lance merge_insert and append (local disk)",
        "config": {
            "rows": list(sizes), "schema": "id int64 (primary key), value string, score "
                                            "float64 (~58 B of Arrow buffers per row)",
            "base": "N rows, keys 0..N-1, appended once to a create_table() table",
            "incoming": f"N rows, keys N/2..3N/2-1 (half update, half insert), {RECORDS} "
                        f"commit records over {SHARDS} shards, one WAL-only writer session "
                        f"per record (durable_write=False), {BATCH_ROWS:,}-row batches",
            "timed": {C_COMPACT: "compact(MemWalTable(copy)) on a fresh copy of the table",
                      C_PHASES: "on the untouched source: read = MemWalTable + snapshot + "
                                "range_rows; dedup = last_per_key + tombstone filter + cast; "
                                "order_column_s (not in seconds): pa.array(range(n)) alone, the "
                                "row-number column last_per_key builds",
                      C_MERGE: "merge_insert('id') update-all/insert-all .execute(rows) on a "
                               "fresh copy of the base (lance.dataset untimed)",
                      C_APPEND: "lance.write_dataset(rows, copy, mode='append')"},
            "fresh_copies": "shutil.copytree (untimed) per run; files are page-cache hot",
            "storage": "local disk only",
            "breakdown": "other = compact - read - dedup - merge_insert (medians): intent PUT, "
                         "ledger mark, dataset re-opens, snapshot, records",
            "interleaving": "per repeat every competitor runs once, order rotated every repeat",
        },
        "cases": cases,
        "table": {"columns": ["rows", "competitor", "seconds", "range", "Mrows/s", "range",
                              "time / compact"], "rows": rows},
        "breakdown_table": {"columns": ["rows", "compact s", "read WAL s", "dedup s",
                                        "merge_insert s", "other s",
                                        "pa.array(range(n)) s"], "rows": b_rows},
        "targets": targets,
    }


def plot_compaction(result: dict[str, Any], machine: dict[str, Any]) -> None:
    import numpy as np

    plt = _plt()
    cases = result["cases"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    names = [C_COMPACT, C_MERGE, C_APPEND, C_PHASES]
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]
    x = np.arange(len(cases))
    width = 0.8 / len(names)
    for i, (name, color) in enumerate(zip(names, colors, strict=True)):
        st = [c["competitors"][name]["rows_per_s"] for c in cases]
        med = [s["median"] / 1e6 for s in st]
        err = [[m - s["min"] / 1e6 for m, s in zip(med, st, strict=True)],
               [s["max"] / 1e6 - m for m, s in zip(med, st, strict=True)]]
        xs = x + (i - (len(names) - 1) / 2) * width
        ax1.bar(xs, med, width, yerr=err, capsize=2, color=color, label=name)
        for xi, m, s in zip(xs, med, st, strict=True):
            ax1.text(xi, s["max"] / 1e6, f"{m:.2f}", ha="center", va="bottom", fontsize=6)
    ax1.set_xticks(x, [f"N={c['rows']:,}" for c in cases])
    ax1.set_ylabel("million incoming rows / s (median, min-max)")
    ax1.set_ylim(0, max(c["competitors"][k]["rows_per_s"]["max"] for c in cases
                        for k in names) / 1e6 * 1.45)
    ax1.grid(axis="y", alpha=0.3)
    ax1.legend(fontsize=7, loc="upper left")
    ax1.set_title("throughput (N incoming rows / time)", fontsize=9)

    inside = [("to_intent_s", "compact: to its intent (dataset opens, snapshot, PUT)",
               "#c7c7c7"),
              ("rows_s", "compact: intent to merge (read WAL, dedup)", "#aec7e8"),
              ("merge_s", "compact: merge_insert with ledger mark", "#1f77b4"),
              ("finish_s", "compact: after the merge (re-open, next round?)", "#7f7f7f")]
    apart = [("read_wal_s", "measured apart: read WAL", "#17becf"),
             ("dedup_s", "measured apart: dedup by key", "#9467bd"),
             ("merge_insert_s", "measured apart: plain merge_insert", "#ff7f0e")]
    bw = 0.36
    tops = np.full(len(cases), 100.0)
    for offset, parts, source in ((-bw / 2 - 0.01, inside, "compact_inside"),
                                  (bw / 2 + 0.01, apart, "breakdown")):
        bottom = np.zeros(len(cases))
        for key, label, color in parts:
            secs = np.array([max(0.0, c[source][key]) for c in cases])
            pct = secs / np.array([c["breakdown"]["compact_s"] for c in cases]) * 100
            ax2.bar(x + offset, pct, bw, bottom=bottom, color=color, label=label)
            for xi, (b, p, sec) in enumerate(zip(bottom, pct, secs, strict=True)):
                if p > 6:
                    ax2.text(xi + offset, b + p / 2, f"{sec:.2f} s", ha="center",
                             va="center", fontsize=7)
            bottom += pct
        tops = np.maximum(tops, bottom)
    for xi, c in enumerate(cases):
        ax2.text(xi, tops[xi] + 1, f"compact {c['breakdown']['compact_s']:.2f} s", ha="center",
                 va="bottom", fontsize=8)
    ax2.axhline(100, color="k", lw=0.8, ls="--")
    ax2.set_xticks(x, [f"N={c['rows']:,}" for c in cases])
    ax2.set_xlabel("left bar: compact() split at its hooks; right bar: phases measured apart",
                   fontsize=8)
    ax2.set_ylabel("% of compact() median time (labels: seconds)")
    ax2.set_ylim(0, float(tops.max()) + 45)
    ax2.legend(fontsize=6.5, loc="upper center", ncol=2)
    ax2.set_title("where compaction's time goes (medians)", fontsize=9)
    ax2.grid(axis="y", alpha=0.3)
    save_figure(fig, COMPACTION, result["title"], machine)
