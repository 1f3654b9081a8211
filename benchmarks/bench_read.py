"""``spark.read.format("memwal")`` of many small entries vs Spark's parquet reader, and a
point lookup with and without filter pushdown.

Reads: the same rows committed as few and as many WAL entries over 4 shards, each
entry its own commit record (as small micro-batches leave them), read as the WAL tail
and as ``view=table`` (all tail); the ceiling ``memory_arrow`` yields each shard's rows
from the worker's memory in 64k-row batches (loaded in the warm-up). Every competitor
of both entry counts alternates in one run; each read goes to Spark's ``noop`` sink;
the driver's plan (``partitions()``) is timed apart, in-process.

Point lookup: ``view=table`` of a compacted table (rows appended by Lance, a BTREE on
the key) ``.where("id = k").collect()``, filter pushdown on and off, and parquet's.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
import uuid
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from memwal_datasource.format.memwal import all_false, wal_entry_schema
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.spark.options import ReadOptions
from memwal_datasource.spark.reader import MemWalBatchReader
from memwal_datasource.spark.worker_entry import enter, entry_point
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table, field_ids, open_table

from . import harness as h

NAME = "read"
PARQUET, CEILING = "spark.read parquet", "in-memory Python source, 64k-row batches"
TAIL, TABLE = "memwal tail", "memwal view=table"
PUSHED, NOT_PUSHED = "memwal view=table, filter pushed", "memwal view=table, not pushed"
PARQUET_LOOKUP = "spark.read parquet + filter"
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
SHARDS = 4
_MEMORY: dict[str, list[list[pa.RecordBatch]]] = {}  # per worker: path -> batches per shard


def _wal_files(path: str) -> list[list[str]]:
    return [sorted(glob.glob(os.path.join(s, "*.arrow")))
            for s in sorted(glob.glob(os.path.join(path, "_mem_wal", "*", "wal")))]


class MemoryReader(DataSourceReader):
    def __init__(self, path: str):
        self.path = path

    def partitions(self) -> list[InputPartition]:  # one per shard
        return [InputPartition(i) for i in range(len(_wal_files(self.path)))]

    def read(self, partition: InputPartition):
        enter()  # memwal's worker measures (heap freeze, socket), so the ceiling stays one
        if self.path not in _MEMORY:  # the worker's first read: load every shard once
            shards = []
            for fs in _wal_files(self.path):
                t = pa.Table.from_batches(
                    [pa.RecordBatch.from_arrays([b.column(n) for n in h.SCHEMA.names],
                                                schema=h.SCHEMA)
                     for f in fs for b in pa.ipc.open_stream(pa.memory_map(f))], h.SCHEMA)
                shards.append(t.combine_chunks().to_batches(max_chunksize=64 * 1024))
            _MEMORY[self.path] = shards
            with open(self.path + ".loads", "a") as f:
                f.write(f"{os.getpid()}\n")
        yield from _MEMORY[self.path][partition.value]


class MemorySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "memory_arrow"

    @entry_point
    def schema(self):
        return h.spark_schema()

    @entry_point
    def reader(self, schema) -> MemoryReader:
        return MemoryReader(self.options["path"])


def _loads(path: str) -> int:
    return len(open(path).readlines()) if os.path.exists(path) else 0


def small_entries(uri: str, rows: int, entries: int) -> float:
    """A table of ``rows`` rows as ``entries`` WAL entries over :data:`SHARDS` shards (a
    kept writer each), every entry committed by its own record; seconds it took."""
    t0 = time.perf_counter()
    ds = create_table(uri, h.SCHEMA)
    schema = wal_entry_schema(h.SCHEMA, field_ids(ds))
    store = open_store(uri)
    log = CommitLog(store)
    apps = [WalAppender.open(store, str(uuid.uuid4())) for _ in range(SHARDS)]
    per = rows // entries
    for i in range(entries):
        app, b = apps[i % SHARDS], h.arrow_rows(i * per, per).to_batches()[0]
        res = app.append(schema, [pa.RecordBatch.from_arrays([*b.columns, all_false(per)],
                                                             schema=schema)])
        log.append(APPEND, [CommittedRange(app.shard_id, app.epoch, res.position,
                                           res.position, per, res.nbytes)])
    return time.perf_counter() - t0


def compacted(uri: str, rows: int) -> None:
    """A compacted primary-key table of ``rows`` rows: the base appended by Lance, a
    BTREE on the key (as compaction keeps it), an empty tail."""
    import lance

    h.create_table(uri)
    chunks = (b for s in range(0, rows, 1_000_000)
              for b in h.arrow_rows(s, min(1_000_000, rows - s)).to_batches())
    lance.write_dataset(pa.RecordBatchReader.from_batches(h.SCHEMA, chunks), uri,
                        mode="append")
    open_table(uri).create_scalar_index("id", "BTREE")


def _plan(uri: str, **options: str) -> tuple[float, int]:
    """The driver's plan in-process: milliseconds and partitions."""
    reader = MemWalBatchReader(ReadOptions.parse({"path": uri, **options}), h.SCHEMA)
    t = time.perf_counter()
    parts = reader.partitions()
    return (time.perf_counter() - t) * 1e3, len(parts)


def run(ctx: h.Ctx) -> dict[str, Any]:
    rows = ctx.pick(200_000, 2_000_000, 4_000_000)
    few, many = ctx.pick((100, 1_000), (1_000, 10_000))
    lookup_rows = ctx.pick(1_000_000, 10_000_000)
    root = ctx.scratch("read")
    tables = {n: str(root / f"e{n}.lance") for n in (few, many)}
    pq, big, big_pq = str(root / "p"), str(root / "big.lance"), str(root / "bigp")
    built = {n: small_entries(t, rows, n) for n, t in tables.items()}
    ctx.log(f"  built: {', '.join(f'{n:,} entries in {s:.0f} s' for n, s in built.items())}")
    secs = h.seconds(lambda: compacted(big, lookup_rows))
    ctx.log(f"  compacted {lookup_rows:,}-row table built in {secs:.0f} s")
    key = lookup_rows * 3 // 7
    with h.spark_session(ctx, MemorySource) as spark:
        h.frame(spark, 0, rows, parts=SHARDS).write.parquet(pq)
        h.frame(spark, 0, lookup_rows, parts=SHARDS).write.parquet(big_pq)
        for t in tables.values():
            assert spark.read.format("memwal").load(t).count() == rows

        def timed(read, **plan):
            def go(_r: int) -> dict[str, Any]:
                out = {"rows_s": rows / h.seconds(
                    lambda: read().write.format("noop").mode("overwrite").save())}
                if plan:
                    out["plan_ms"], out["partitions"] = _plan(**plan)
                return out
            return go

        comps = {PARQUET: timed(lambda: spark.read.parquet(pq)),
                 CEILING: timed(lambda: spark.read.format("memory_arrow").load(tables[few]))}
        for n, t in tables.items():
            comps[f"{TAIL}, {n:,} entries"] = timed(
                lambda t=t: spark.read.format("memwal").load(t), uri=t)
            comps[f"{TABLE}, {n:,} entries"] = timed(
                lambda t=t: spark.read.format("memwal").option("view", "table").load(t),
                uri=t, view="table")
        h.alternate(ctx, comps, repeats=1)  # two warm-ups: every worker has loaded
        loads = _loads(tables[few] + ".loads")
        runs = h.alternate(ctx, comps, warmup=0)
        timed_loads = _loads(tables[few] + ".loads") - loads

        def lookup(read, pushdown: bool):
            def go(_r: int) -> dict[str, Any]:
                spark.conf.set(PUSHDOWN, str(pushdown).lower())
                try:
                    t = time.perf_counter()
                    got = read().where(f"id = {key}").collect()
                    secs = time.perf_counter() - t
                finally:
                    spark.conf.unset(PUSHDOWN)
                assert [r.id for r in got] == [key], got
                return {"seconds": secs}
            return go

        table = lambda: spark.read.format("memwal").option("view", "table").load(big)  # noqa: E731
        points = h.alternate(ctx, {PUSHED: lookup(table, True),
                                   NOT_PUSHED: lookup(table, False),
                                   PARQUET_LOOKUP: lookup(lambda: spark.read.parquet(big_pq),
                                                          False)}, label="lookup ")
    shutil.rmtree(root, ignore_errors=True)
    return _result(runs, points, rows, few, many, lookup_rows, timed_loads)


def _result(runs, points, rows, few, many, lookup_rows, timed_loads) -> dict[str, Any]:
    comp = h.stats(runs)
    ours = [n for n in runs if n.startswith("memwal")]
    vs = {n: h.paired([x["rows_s"] for x in runs[n]], [x["rows_s"] for x in runs[PARQUET]])
          for n in runs}
    vs_few = {f"{k}, {many:,} entries": h.paired(
        [x["rows_s"] for x in runs[f"{k}, {many:,} entries"]],
        [x["rows_s"] for x in runs[f"{k}, {few:,} entries"]]) for k in (TAIL, TABLE)}
    pcomp = h.stats(points)
    pvs = {n: h.paired([x["seconds"] for x in points[n]], [x["seconds"] for x in points[PUSHED]])
           for n in points}
    cases = [{"label": f"{rows:,} rows", "competitors": comp, "vs": vs},
             {"label": f"point lookup, {lookup_rows:,} rows", "competitors": pcomp, "vs": pvs}]

    def goals(case, label):
        if case["competitors"] is pcomp:
            return [h.target(f"{label}: time not pushed / pushed", pvs[NOT_PUSHED], 5),
                    h.target(f"{label}: time parquet / memwal pushed", pvs[PARQUET_LOOKUP])]
        out = []
        for k in (TAIL, TABLE):
            out.append(h.target(f"{k} / parquet rows/s, {few:,} entries",
                                vs[f"{k}, {few:,} entries"], 0.8))
            out.append(h.target(f"{k}: rows/s at {many:,} entries / at {few:,} entries",
                                vs_few[f"{k}, {many:,} entries"], round(1 / 1.5, 3)))
        out.append(h.target(f"{TAIL} / parquet rows/s, {many:,} entries",
                            vs[f"{TAIL}, {many:,} entries"]))
        out.append({"what": "the in-memory source loaded nothing in timed runs",
                    "value": f"{timed_loads} loads", "met": timed_loads == 0})
        return out

    return h.per_case(
        f"spark.read of {rows:,} rows as {few:,} / {many:,} one-commit WAL entries vs "
        f"parquet; a point lookup in {lookup_rows:,} compacted rows, pushed or not",
        {"rows": rows, "entries": [few, many], "shards": SHARDS, "lookup_rows": lookup_rows,
         "consumed_by": "format('noop'); lookups collect()"},
        cases, "case", [("rows/s", "rows_s", "{:,.0f}"), ("plan ms", "plan_ms", "{:.1f}"),
                        ("partitions", "partitions", "{:.0f}"), ("seconds", "seconds", "{:.3f}")],
        goals, [], {"ratio (rows/s: it / parquet; lookup: s / pushed)": "vs"},
        panels=[h.panel(f"spark.read of {rows:,} rows", comp, "rows_s", "rows/s"),
                h.panel(f"point lookup in {lookup_rows:,} rows", pcomp, "seconds", "s"),
                h.panel("the driver's plan", comp, "plan_ms", "ms")],
        competitors=comp, ratios=vs, lookup=pcomp, lookup_ratios=pvs, ours=ours,
        entries_ratio=vs_few)
