"""The ``memwal`` Spark source end to end, against Spark's own ceilings.

* :func:`bench_spark_write`: one cached DataFrame written by memwal (WAL-only, MemTable),
  by a no-op ``DataSourceArrowWriter`` (the ceiling for any Python sink) and by parquet.
* :func:`bench_tail_read`: ``spark.read.format("memwal")`` vs pyarrow reading the same WAL
  files (1 and 2 processes), a minimal Python source over them, and parquet.

One SparkSession per benchmark (``local[2]``, UI off, workers on ``sys.executable``). The
2-process read uses a ``spawn`` pool: the calling script needs an ``if __name__ ==
"__main__":`` guard (``benchmarks.run`` has one).
"""

from __future__ import annotations

import contextlib
import glob
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from memwal_datasource import MemWalDataSource
from memwal_datasource.commit import CommitLog
from memwal_datasource.spark.options import ReadOptions
from memwal_datasource.spark.reader import plan_partitions, read_partition
from memwal_datasource.store import LocalStore
from memwal_datasource.table import open_table

from .common import (
    MB,
    REPO_ROOT,
    BenchContext,
    Stopwatch,
    interleaved,
    new_figure,
    ratio,
    rm_tree,
    save_figure,
    summarize,
)

PARTS = 4
SUFFIX = "-abcdefghijklmnopqrstuvwxyz0123"  # ~58 Arrow bytes a row, as in common.make_batch
W_WAL = "memwal WAL-only (durable_write=true)"
W_WAL_ND = "memwal WAL-only, durable_write=false"
W_MEMT = "memwal MemTable (durable_write=true)"
W_MEMT_ND = "memwal MemTable, durable_write=false"
W_NOOP = "no-op DataSourceArrowWriter"
W_PARQUET = "Spark parquet"
R_MEMWAL = "spark.read memwal"
R_CEIL = "minimal Python source, same files"
R_INPROC = "memwal read_partition, no Spark"
R_RAW1 = "pyarrow raw read, 1 process"
R_RAW2 = "pyarrow raw read, 2 processes"
R_PARQUET = "spark.read parquet"


# --- format "noop_arrow": the ceiling for any Python sink / source -------------

@dataclass
class NoopCommit(WriterCommitMessage):
    rows: int


class NoopArrowWriter(DataSourceArrowWriter):
    """Counts the rows of every batch; ``commit``/``abort``: the base class's no-ops."""

    def write(self, iterator) -> NoopCommit:
        return NoopCommit(sum(batch.num_rows for batch in iterator))


@dataclass(frozen=True)
class FilesPartition(InputPartition):
    files: tuple[str, ...]


def _wal_files(table: str) -> list[list[str]]:
    """Every ``_mem_wal/*/wal/*.arrow`` file of ``table``, one list per shard."""
    shards = sorted(glob.glob(os.path.join(table, "_mem_wal", "*", "wal")))
    return [sorted(glob.glob(os.path.join(s, "*.arrow"))) for s in shards]


class ArrowFilesReader(DataSourceReader):
    """Yields the WAL files' batches (schema metadata dropped), one partition per shard."""

    def __init__(self, path: str, schema: pa.Schema):
        self.path, self.schema = path, schema

    def partitions(self) -> list[FilesPartition]:
        return [FilesPartition(tuple(f)) for f in _wal_files(self.path)]

    def read(self, partition: FilesPartition):
        for name in partition.files:
            with pa.OSFile(name) as src:
                for b in pa.ipc.open_stream(src):
                    yield pa.RecordBatch.from_arrays(b.columns, schema=self.schema)


class NoopArrowSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "noop_arrow"

    def schema(self) -> str:
        return "id bigint, payload string, score double"

    def writer(self, schema, overwrite: bool) -> NoopArrowWriter:
        return NoopArrowWriter()

    def reader(self, schema) -> ArrowFilesReader:
        from pyspark.sql.pandas.types import to_arrow_schema

        return ArrowFilesReader(self.options["path"], to_arrow_schema(schema))


# --- helpers ------------------------------------------------------------------

def _session():
    """local[2] SparkSession with memwal and noop_arrow registered."""
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in path:  # workers import this module to run noop_arrow
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *path])
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("memwal-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MemWalDataSource)
    spark.dataSource.register(NoopArrowSource)
    return spark


def _spark_config(spark, rows: int) -> dict[str, Any]:
    batch = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
    return {"spark": spark.version, "master": spark.sparkContext.master, "rows": rows,
            "partitions": PARTS, "arrow_max_records_per_batch": batch,
            "schema": "id bigint (non-null), payload string (~38 B), score double",
            "cores_busy": "CPU seconds of driver + JVM + Python workers, / wall"}


def _frame(spark, rows: int):
    """The benchmark DataFrame, cached and materialised once (generation untimed)."""
    df = spark.range(0, rows, numPartitions=PARTS).selectExpr(
        "id", f"concat(cast(id as string), '{SUFFIX}') as payload",
        "cast(id as double) * 0.001 as score").cache()
    if df.count() != rows:
        raise RuntimeError("cached DataFrame lost rows")
    return df


def _cpu_tree() -> float:
    """CPU seconds of this process and its descendants (the JVM, Python workers)."""
    import psutil

    me, total = psutil.Process(), 0.0
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += sum(p.cpu_times()[:4])  # user, system, children_user, children_system
    return total


def _timed(fn) -> dict[str, Any]:
    cpu0 = _cpu_tree()
    with Stopwatch() as t:
        out = fn() or {}
    return {"seconds": t.seconds, "cpu_s": _cpu_tree() - cpu0, **out}


def _read_files(files: list[str]) -> tuple[int, int]:
    """(rows, Arrow bytes) of IPC stream files, every batch read into memory."""
    rows = nbytes = 0
    for name in files:
        with pa.OSFile(name) as src:
            for b in pa.ipc.open_stream(src):
                rows += b.num_rows
                nbytes += b.get_total_buffer_size()
    return rows, nbytes


def _summarize_runs(runs, rows: int, nbytes: int) -> dict[str, Any]:
    comp = {}
    for name, rs in runs.items():
        secs = [x["seconds"] for x in rs]
        comp[name] = {"seconds": summarize(secs), "rows_s": summarize([rows / s for s in secs]),
                      "mb_s": summarize([nbytes / s / MB for s in secs]),
                      "cores_busy": summarize([x["cpu_s"] / x["seconds"] for x in rs]),
                      "runs": rs}
    return comp


def _table(comp: dict[str, Any], ref: str, entries: bool) -> dict[str, Any]:
    rows = [[n, f"{c['rows_s']['median'] / 1e6:.3g}", f"{c['mb_s']['median']:.4g}",
             f"{c['seconds']['median']:.3g}",  # CPU ticks are 10 ms: no cores for short runs
             f"{c['cores_busy']['median']:.2f}" if c["seconds"]["median"] > 0.2 else "-",
             *([str(c["runs"][0].get("wal_entries", "-"))] if entries else []),
             f"{ratio(c['rows_s']['median'], comp[ref]['rows_s']['median']):.3g}"]
            for n, c in comp.items()]
    return {"columns": ["competitor", "Mrows/s", "MB/s", "seconds", "cores busy",
                        *(["WAL entries"] if entries else []), f"/ {ref}"], "rows": rows}


def _target(what: str, value: float, goal: float) -> dict[str, Any]:
    return {"what": f"{what} >= {goal}", "value": f"{value:.3g}", "met": value >= goal}


def _bar_panel(ax, comp: dict[str, Any], key: str, scale: float, label: str) -> None:
    names = list(comp)
    st = [comp[n][key] for n in names]
    med = [s["median"] / scale for s in st]
    err = [[m - s["min"] / scale for m, s in zip(med, st, strict=True)],
           [s["max"] / scale - m for m, s in zip(med, st, strict=True)]]
    ax.barh(range(len(names)), med, xerr=err, capsize=3, color="#1f77b4")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{label} (median, min-max bars)")
    ax.grid(axis="x", alpha=0.3)


# --- 1. Spark write ------------------------------------------------------------

def bench_spark_write(ctx: BenchContext) -> dict[str, Any]:
    rows = 200_000 if ctx.quick else 2_000_000
    spark = _session()
    seen_bytes: list[int] = []
    try:
        df = _frame(spark, rows)
        ctx.log(f"  spark_write: {rows:,} rows in {PARTS} partitions, cached")

        def memwal(label: str, **opts: str):
            def run(r: int) -> dict[str, Any]:
                root = ctx.scratch(f"sw_{label}_{r}")
                path, w = str(root / "t.lance"), df.write.format("memwal").mode("append")
                for k, v in opts.items():
                    w = w.option(k, v)
                out = _timed(lambda: w.save(path))
                vis = CommitLog(LocalStore(path)).visible()  # what the tasks reported
                if sum(x.rows for x in vis) != rows:
                    raise RuntimeError(f"{label}: committed {sum(x.rows for x in vis)} rows")
                seen_bytes.append(sum(x.bytes for x in vis))
                entries = sum(len(fs) for fs in _wal_files(path))
                rm_tree(root)
                return {**out, "wal_entries": entries}
            return run

        def noop(r: int) -> dict[str, Any]:
            return _timed(lambda: df.write.format("noop_arrow").mode("append").save())

        def parquet(r: int) -> dict[str, Any]:
            root = ctx.scratch(f"sw_parquet_{r}")
            out = _timed(lambda: df.write.mode("overwrite").parquet(str(root / "p")))
            rm_tree(root)
            return out

        competitors = {
            W_WAL: memwal("wal", enable_memtable="false"),
            W_WAL_ND: memwal("walnd", enable_memtable="false", durable_write="false"),
            W_MEMT: memwal("memt", enable_memtable="true", primary_key="id"),
            W_MEMT_ND: memwal("memtnd", enable_memtable="true", primary_key="id",
                              durable_write="false"),
            W_NOOP: noop, W_PARQUET: parquet}
        for name, fn in competitors.items():  # warm-up: Python workers, imports, JIT
            ctx.log(f"  warm-up {name}: {fn(-1)['seconds']:.2f} s")
        runs = interleaved(ctx.repeats, competitors)
        config = _spark_config(spark, rows)
    finally:
        spark.stop()
    nbytes = seen_bytes[0]
    comp = _summarize_runs(runs, rows, nbytes)
    med = {n: c["rows_s"]["median"] for n, c in comp.items()}
    ratios = {"wal_only/noop": ratio(med[W_WAL], med[W_NOOP]),
              "memtable/noop": ratio(med[W_MEMT], med[W_NOOP]),
              "wal_only_nondurable/noop": ratio(med[W_WAL_ND], med[W_NOOP]),
              "memtable_nondurable/noop": ratio(med[W_MEMT_ND], med[W_NOOP]),
              "wal_only/parquet": ratio(med[W_WAL], med[W_PARQUET]),
              "memtable/parquet": ratio(med[W_MEMT], med[W_PARQUET]),
              "noop/parquet": ratio(med[W_NOOP], med[W_PARQUET])}
    return {
        "name": "spark_write",
        "title": f"Spark df.write of {rows:,} rows: memwal vs no-op Python sink vs parquet",
        "config": {**config, "arrow_bytes": nbytes, "MB": "10^6 Arrow bytes (memwal's count)",
                   "timed": "df.write...save(path) wall (table creation, tasks, commit); fresh "
                            "path per repeat; one untimed warm-up write per competitor first",
                   "memwal": "enable_memtable=false, or true with primary_key=id; defaults "
                             "otherwise (durable_write=false rows are diagnostics)"},
        "competitors": comp, "ratios": ratios, "table": _table(comp, W_NOOP, True),
        "targets": [_target("WAL-only / no-op rows/s", ratios["wal_only/noop"], 0.9),
                    _target("MemTable / no-op rows/s", ratios["memtable/noop"], 0.6)],
    }


def plot_spark_write(result: dict[str, Any], machine: dict[str, Any]) -> None:
    fig, (ax,) = new_figure(1, width=8.5, height=4.4)
    comp = result["competitors"]
    _bar_panel(ax, comp, "rows_s", 1e6, "Mrows/s")
    noop = comp[W_NOOP]["rows_s"]["median"] / 1e6
    for goal, color, who in ((0.9, "green", "WAL-only"), (0.6, "orange", "MemTable")):
        ax.axvline(goal * noop, color=color, ls="--", lw=1, label=f"{goal} x no-op ({who})")
    ax.legend(fontsize=7, loc="upper right")
    save_figure(fig, "spark_write", result["title"], machine)


# --- 2. WAL tail read ----------------------------------------------------------

def bench_tail_read(ctx: BenchContext) -> dict[str, Any]:
    rows = 200_000 if ctx.quick else 2_000_000
    root = ctx.scratch("tail_read")
    table, pq = str(root / "t.lance"), str(root / "p")
    spark = _session()
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    try:
        df = _frame(spark, rows)
        df.write.format("memwal").mode("append").option("enable_memtable", "false").save(table)
        df.write.parquet(pq)
        df.unpersist()
        files = _wal_files(table)
        flat = [f for fs in files for f in fs]
        halves = [[f for fs in files[i::2] for f in fs] for i in range(2)]
        raw_rows, nbytes = _read_files(flat)
        wal_bytes = sum(os.path.getsize(f) for f in flat)
        ctx.log(f"  tail_read: {rows:,} rows, {len(flat)} WAL entries in {len(files)} shards, "
                f"{nbytes / MB:.0f} MB Arrow, {wal_bytes / MB:.0f} MB on disk")
        seen = spark.read.format("memwal").load(table).count()
        if not raw_rows == seen == rows:
            raise RuntimeError(f"rows: raw {raw_rows}, memwal {seen}, expected {rows}")

        def spark_read(reader):
            def run(r: int) -> dict[str, Any]:
                return _timed(lambda: reader().write.format("noop").mode("overwrite").save())
            return run

        def inproc() -> dict[str, Any]:  # what the Spark tasks run, minus Spark
            opts = ReadOptions.parse({"path": table})
            schema = open_table(table).schema
            return {"rows": sum(b.num_rows for p in plan_partitions(opts, LocalStore(table))
                                for b in read_partition(opts, schema, p))}

        competitors = {
            R_MEMWAL: spark_read(lambda: spark.read.format("memwal").load(table)),
            R_CEIL: spark_read(lambda: spark.read.format("noop_arrow").load(table)),
            R_PARQUET: spark_read(lambda: spark.read.parquet(pq)),
            R_INPROC: lambda r: _timed(inproc),
            R_RAW1: lambda r: _timed(lambda: {"rows": _read_files(flat)[0]}),
            R_RAW2: lambda r: _timed(lambda: {"rows": sum(
                x[0] for x in pool.map(_read_files, halves))})}
        for name, fn in competitors.items():  # warm-up: workers, pool processes, page cache
            ctx.log(f"  warm-up {name}: {fn(-1)['seconds']:.2f} s")
        runs = interleaved(ctx.repeats, competitors)
        for name in (R_INPROC, R_RAW1, R_RAW2):
            if any(x["rows"] != rows for x in runs[name]):
                raise RuntimeError(f"{name} did not see {rows} rows")
        config = _spark_config(spark, rows)
    finally:
        pool.shutdown()
        spark.stop()
        rm_tree(root)
    comp = _summarize_runs(runs, rows, nbytes)
    med = {n: c["rows_s"]["median"] for n, c in comp.items()}
    ratios = {"memwal/raw_1proc": ratio(med[R_MEMWAL], med[R_RAW1]),
              "memwal/raw_2proc": ratio(med[R_MEMWAL], med[R_RAW2]),
              "memwal/parquet": ratio(med[R_MEMWAL], med[R_PARQUET]),
              "memwal/python_source_ceiling": ratio(med[R_MEMWAL], med[R_CEIL]),
              "python_source_ceiling/raw_1proc": ratio(med[R_CEIL], med[R_RAW1]),
              "memwal_no_spark/raw_1proc": ratio(med[R_INPROC], med[R_RAW1])}
    return {
        "name": "tail_read",
        "title": f"WAL tail read of {rows:,} rows: spark.read memwal vs raw pyarrow vs parquet",
        "config": {**config, "shards": len(files), "wal_entries": len(flat),
                   "arrow_bytes": nbytes, "wal_file_bytes": wal_bytes,
                   "table": "memwal WAL-only, durable_write default; parquet of the same df",
                   "spark_consumption": "<df>.write.format('noop').mode('overwrite').save()",
                   "raw": "pa.OSFile + pa.ipc.open_stream of every _mem_wal/*/wal/*.arrow; "
                          "2 processes: spawn pool (started in warm-up), shards in halves",
                   "python_source_ceiling": "noop_arrow DataSourceReader: a partition per "
                                            "shard yielding the files' batches",
                   "memwal_no_spark": "plan_partitions + read_partition here, one thread",
                   "warm_up": "one untimed run per competitor first (page cache hot)",
                   "MB": "10^6 Arrow buffer bytes of the WAL files' batches"},
        "competitors": comp, "ratios": ratios, "table": _table(comp, R_RAW1, False),
        "targets": [_target("memwal / raw 1-process rows/s", ratios["memwal/raw_1proc"], 0.8),
                    {"what": "memwal / parquet rows/s (reported, no target)",
                     "value": f"{ratios['memwal/parquet']:.3g}", "met": None}],
    }


def plot_tail_read(result: dict[str, Any], machine: dict[str, Any]) -> None:
    fig, axes = new_figure(2, width=6.0, height=4.2)
    comp = result["competitors"]
    _bar_panel(axes[0], comp, "rows_s", 1e6, "Mrows/s, log scale")
    _bar_panel(axes[1], comp, "mb_s", 1.0, "MB/s (Arrow bytes), log scale")
    raw = comp[R_RAW1]["rows_s"]["median"] / 1e6
    axes[0].axvline(0.8 * raw, color="green", ls="--", lw=1, label="target: 0.8 x raw 1-process")
    axes[0].legend(fontsize=7, loc="lower right")
    for ax in axes:
        ax.set_xscale("log")
    save_figure(fig, "tail_read", result["title"], machine)
