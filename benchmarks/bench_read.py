"""``spark.read.format("memwal")`` vs a Python source serving the same batches from memory.

A table written by memwal (WAL-only) and a parquet copy; the ceiling ``memory_arrow``
yields each shard's WAL batches from the worker's memory (loaded in the warm-up; timed
runs must load nothing). Each read is consumed by Spark's ``noop`` sink.
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from memwal_datasource.spark.worker_entry import enter, entry_point

from . import harness as h

NAME = "read"
MEMWAL, CEILING = "spark.read memwal", "in-memory Python source, same batches"
PARQUET = "spark.read parquet"
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
            _MEMORY[self.path] = [[pa.RecordBatch.from_arrays(
                [b.column(n) for n in h.SCHEMA.names], schema=h.SCHEMA)
                for f in fs for b in pa.ipc.open_stream(pa.memory_map(f))]
                for fs in _wal_files(self.path)]
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


def run(ctx: h.Ctx) -> dict[str, Any]:
    rows, root = ctx.pick(200_000, 2_000_000, 4_000_000), ctx.scratch("read")
    table, pq = str(root / "t.lance"), str(root / "p")
    with h.spark_session(ctx, MemorySource) as spark:
        df = h.frame(spark, 0, rows, parts=4)
        df.write.format("memwal").mode("append").save(table)
        df.write.parquet(pq)
        assert spark.read.format("memwal").load(table).count() == rows
        comps = {name: lambda r, read=read: {"rows_s": rows / h.seconds(
                     lambda: read().write.format("noop").mode("overwrite").save())}
                 for name, read in ((MEMWAL, lambda: spark.read.format("memwal").load(table)),
                                    (CEILING, lambda: spark.read.format("memory_arrow").load(
                                        table)), (PARQUET, lambda: spark.read.parquet(pq)))}
        h.alternate(ctx, comps, repeats=1)  # two warm-ups: every worker has loaded
        loads = _loads(table + ".loads")
        runs = h.alternate(ctx, comps, warmup=0)
        timed_loads, entries = _loads(table + ".loads") - loads, sum(map(len, _wal_files(table)))
    shutil.rmtree(root, ignore_errors=True)
    comp, rt = h.stats(runs), h.ratios(runs, MEMWAL, "rows_s", [CEILING, PARQUET])
    return h.per_case(
        f"spark.read of {rows:,} WAL rows vs a Python source serving them from memory",
        {"rows": rows, "wal_entries": entries, "consumed_by": "format('noop')"},
        [{"label": "local disk", "competitors": comp, "vs": rt}], "case",
        [("rows/s", "rows_s", "{:,.0f}")], lambda c, w: [
            h.target("spark.read memwal / in-memory Python source rows/s", rt[CEILING], 0.9),
            {"what": "the in-memory source loaded nothing in timed runs",
             "value": f"{timed_loads} loads", "met": timed_loads == 0}],
        [("spark.read rows/s", "rows_s", "rows/s")], {"memwal / it": "vs"},
        competitors=comp, ratios=rt)
