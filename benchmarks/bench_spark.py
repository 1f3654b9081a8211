"""The ``memwal`` Spark source end to end, against Spark's own ceilings.

* :func:`bench_spark_write`: one cached DataFrame written by memwal (WAL-only, Spark's
  defaults), by a no-op ``DataSourceArrowWriter`` (the ceiling for any Python sink) and
  by Spark's parquet writer, with 10k- and 100k-row Arrow batches.
* :func:`bench_read`: ``spark.read.format("memwal")`` vs a Python data source yielding
  the same Arrow batches from memory (the ceiling for any Python source), and parquet.
* :func:`bench_worker_rss`: peak RSS of the executor Python worker writing with default
  options (memwal WAL-only vs the no-op sink), sampled from outside.

One SparkSession per benchmark (``local[2]``, UI off, workers on ``sys.executable``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import threading
import time
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
from memwal_datasource.spark import partition_for_table
from memwal_datasource.spark.options import ReadOptions
from memwal_datasource.spark.reader import plan_partitions, read_partition
from memwal_datasource.store import LocalStore
from memwal_datasource.table import open_table

from .common import (
    MB,
    REPO_ROOT,
    BenchContext,
    MiB,
    Stopwatch,
    fsync_tree,
    interleaved,
    new_figure,
    paired,
    ratio_target,
    rm_tree,
    save_figure,
    summarize,
)

PARTS = 4
SUFFIX = "-abcdefghijklmnopqrstuvwxyz0123"  # ~58 Arrow bytes a row, as in common.make_batch
ROW_BYTES = 58
BATCH_ROWS = (10_000, 100_000)  # spark.sql.execution.arrow.maxRecordsPerBatch
W_WAL = "memwal WAL-only (Spark defaults)"
W_MEMT = "memwal MemTable (Spark defaults)"
W_NOOP = "no-op DataSourceArrowWriter"
W_PARQUET = "Spark parquet"
W_PARQUET_SYNC = "Spark parquet, then fsync (durable, like memwal)"
R_MEMWAL = "spark.read memwal"
R_CEIL = "in-memory Python source, same batches"
R_PARQUET = "spark.read parquet"
R_INPROC = "memwal read_partition, no Spark"


# --- format "noop_arrow": the ceiling for any Python sink / source -------------

@dataclass
class NoopCommit(WriterCommitMessage):
    rows: int


class NoopArrowWriter(DataSourceArrowWriter):
    """Counts the rows of every batch; ``commit``/``abort``: the base class's no-ops."""

    def write(self, iterator) -> NoopCommit:
        return NoopCommit(sum(batch.num_rows for batch in iterator))


@dataclass(frozen=True)
class ShardPartition(InputPartition):
    index: int


def _wal_files(table: str) -> list[list[str]]:
    """Every ``_mem_wal/*/wal/*.arrow`` file of ``table``, one list per shard."""
    shards = sorted(glob.glob(os.path.join(table, "_mem_wal", "*", "wal")))
    return [sorted(glob.glob(os.path.join(s, "*.arrow"))) for s in shards]


# Per Python worker: {table path: one list of batches per shard}. Workers are reused
# across tasks and jobs, so after warm-up every read is served from memory.
_MEMORY: dict[str, list[list[pa.RecordBatch]]] = {}


class MemoryReader(DataSourceReader):
    """Yields the table's WAL batches from this worker's memory, one partition per shard.

    The first read in a worker loads every shard (and appends a line to
    ``<path>.loads``, so the benchmark can prove timed runs loaded nothing).
    """

    def __init__(self, path: str, schema: pa.Schema):
        self.path, self.schema = path, schema

    def partitions(self) -> list[ShardPartition]:
        return [ShardPartition(i) for i in range(len(_wal_files(self.path)))]

    def read(self, partition: ShardPartition):
        shards = _MEMORY.get(self.path)
        if shards is None:
            shards = _MEMORY[self.path] = [
                [pa.RecordBatch.from_arrays(b.columns, schema=self.schema)
                 for name in files for b in pa.ipc.open_stream(pa.memory_map(name))]
                for files in _wal_files(self.path)]
            with open(self.path + ".loads", "a") as f:
                f.write(f"{os.getpid()}\n")
        yield from shards[partition.index]


class NoopArrowSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "noop_arrow"

    def schema(self) -> str:
        return "id bigint, payload string, score double"

    def writer(self, schema, overwrite: bool) -> NoopArrowWriter:
        return NoopArrowWriter()

    def reader(self, schema) -> MemoryReader:
        from pyspark.sql.pandas.types import to_arrow_schema

        return MemoryReader(self.options["path"], to_arrow_schema(schema))


# --- helpers ------------------------------------------------------------------

def _session(**conf: str):
    """local[2] SparkSession with memwal and noop_arrow registered (plus ``conf``)."""
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in path:  # workers import this module to run noop_arrow
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *path])
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("memwal-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2"))
    for k, v in conf.items():
        spark = spark.config(k, v)
    spark = spark.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MemWalDataSource)
    spark.dataSource.register(NoopArrowSource)
    return spark


def _spark_config(spark, rows: int) -> dict[str, Any]:
    return {"spark": spark.version, "master": spark.sparkContext.master, "rows": rows,
            "partitions": PARTS,
            "schema": "id bigint (non-null), payload string (~38 B), score double",
            "cores_busy": "CPU seconds of driver + JVM + Python workers, / wall"}


def _frame(spark, rows: int, parts: int = PARTS, cache: bool = True):
    """The benchmark DataFrame; cached and materialised once (generation untimed)."""
    df = spark.range(0, rows, numPartitions=parts).selectExpr(
        "id", f"concat(cast(id as string), '{SUFFIX}') as payload",
        "cast(id as double) * 0.001 as score")
    if cache:
        df = df.cache()
        if df.count() != rows:
            raise RuntimeError("cached DataFrame lost rows")
    return df


def _python_tree() -> list:
    """This process's descendant Python processes (the daemon and its workers)."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "python" in p.name():
                out.append(p)
    return out


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


def _summarize_runs(runs, rows: int, nbytes: int) -> dict[str, Any]:
    comp = {}
    for name, rs in runs.items():
        secs = [x["seconds"] for x in rs]
        comp[name] = {"seconds": summarize(secs), "rows_s": summarize([rows / s for s in secs]),
                      "mb_s": summarize([nbytes / s / MB for s in secs]),
                      "cores_busy": summarize([x["cpu_s"] / x["seconds"] for x in rs]),
                      "runs": rs}
    return comp


def _speed_ratio(runs, a: str, b: str) -> dict[str, Any]:
    """Per-repeat rows/s ratio ``a / b`` (equal rows, so the inverse time ratio)."""
    return paired([x["seconds"] for x in runs[b]], [x["seconds"] for x in runs[a]])


def _table_rows(comp: dict[str, Any], ref: str, label: str = "") -> list[list[str]]:
    out = []
    for n, c in comp.items():
        r = paired([x["seconds"] for x in comp[ref]["runs"]], [x["seconds"] for x in c["runs"]])
        out.append([*([label] if label else []), n, f"{c['rows_s']['median'] / 1e6:.3g}",
                    f"{c['mb_s']['median']:.4g}", f"{c['seconds']['median']:.3g}",
                    f"{c['cores_busy']['median']:.2f}" if c["seconds"]["median"] > 0.2 else "-",
                    f"{r['median']:.3g} ({r['min']:.3g}..{r['max']:.3g})"])
    return out


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
    rows = ctx.pick(200_000, 2_000_000, 4_000_000)
    spark = _session()
    seen_bytes: list[int] = []
    cases = []
    try:
        df = _frame(spark, rows)
        ctx.log(f"  spark_write: {rows:,} rows in {PARTS} partitions, cached")

        def memwal(label: str, **opts: str):
            def run(r: int) -> dict[str, Any]:
                root = ctx.scratch(f"sw_{label}_{r}")
                path, src = str(root / "t.lance"), df
                if "primary_key" in opts:  # one bucket per task, as a PK table needs
                    src = partition_for_table(df, path, create_options=opts,
                                              num_partitions=df.rdd.getNumPartitions())
                w = src.write.format("memwal").mode("append")
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

        def parquet(label: str, durable: bool):
            def run(r: int) -> dict[str, Any]:
                root = ctx.scratch(f"sw_{label}_{r}")

                def write() -> None:
                    df.write.mode("overwrite").parquet(str(root / "p"))
                    if durable:  # Spark's committer never fsyncs; memwal's rows are durable
                        fsync_tree(root / "p")

                out = _timed(write)
                rm_tree(root)
                return out
            return run

        competitors = {W_WAL: memwal("wal", enable_memtable="false"), W_NOOP: noop,
                       W_PARQUET: parquet("parquet", durable=False),
                       W_PARQUET_SYNC: parquet("parquet_sync", durable=True)}
        if ctx.full:
            competitors[W_MEMT] = memwal("memt", enable_memtable="true", primary_key="id")
        for batch_rows in BATCH_ROWS:
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_rows))
            for name, fn in competitors.items():  # warm-up: Python workers, imports, JIT
                ctx.log(f"  {batch_rows:,}-row batches, warm-up {name}: "
                        f"{fn(-1)['seconds']:.2f} s")
            runs = interleaved(ctx.repeats, competitors)
            cases.append({"batch_rows": batch_rows, "runs": runs})
        config = _spark_config(spark, rows)
    finally:
        spark.stop()
    nbytes = seen_bytes[0]
    table_rows, targets = [], []
    for c in cases:
        runs, br = c.pop("runs"), c["batch_rows"]
        c["competitors"] = _summarize_runs(runs, rows, nbytes)
        c["ratios"] = {"wal_only/noop": _speed_ratio(runs, W_WAL, W_NOOP),
                       "wal_only/parquet": _speed_ratio(runs, W_WAL, W_PARQUET),
                       "wal_only/durable_parquet": _speed_ratio(runs, W_WAL, W_PARQUET_SYNC),
                       "noop/parquet": _speed_ratio(runs, W_NOOP, W_PARQUET)}
        if W_MEMT in runs:
            c["ratios"]["memtable/noop"] = _speed_ratio(runs, W_MEMT, W_NOOP)
        table_rows += _table_rows(c["competitors"], W_NOOP, f"{br:,}")
        targets += [
            ratio_target(f"{br:,}-row batches: WAL-only / no-op Arrow writer rows/s",
                         c["ratios"]["wal_only/noop"], 0.97),
            ratio_target(f"{br:,}-row batches: WAL-only / Spark parquet rows/s",
                         c["ratios"]["wal_only/parquet"], 1.0),
            ratio_target(f"{br:,}-row batches: WAL-only / Spark parquet made durable (fsync of "
                         "its files and directories) rows/s, like with like",
                         c["ratios"]["wal_only/durable_parquet"], 1.0),
            ratio_target(f"{br:,}-row batches: no-op Arrow writer / Spark parquet rows/s "
                         "(the most any Python sink can reach)",
                         c["ratios"]["noop/parquet"], None)]
    return {
        "name": "spark_write",
        "title": f"Spark df.write of {rows:,} rows: memwal vs no-op Python sink vs parquet",
        "config": {**config, "arrow_bytes": nbytes, "batch_rows": list(BATCH_ROWS),
                   "MB": "10^6 Arrow bytes (memwal's count)",
                   "timed": "df.write...save(path) wall (table creation, tasks, commit); fresh "
                            "path per repeat; one untimed warm-up write per competitor first",
                   "memwal": "enable_memtable=false and nothing else: Spark's defaults "
                             "(durable_write=false: every row durable before the task's "
                             "commit message; max_unflushed_memtable_bytes = 2 x buffer)"},
        "cases": cases,
        "table": {"columns": ["batch rows", "competitor", "Mrows/s", "MB/s", "seconds",
                              "cores busy", f"/ {W_NOOP} (range)"], "rows": table_rows},
        "targets": targets,
    }


def plot_spark_write(result: dict[str, Any], machine: dict[str, Any]) -> None:
    cases = result["cases"]
    fig, axes = new_figure(len(cases), width=6.5, height=4.0)
    for ax, c in zip(axes, cases, strict=True):
        _bar_panel(ax, c["competitors"], "rows_s", 1e6, "Mrows/s")
        noop = c["competitors"][W_NOOP]["rows_s"]["median"] / 1e6
        ax.axvline(0.97 * noop, color="green", ls="--", lw=1, label="0.97 x no-op (goal)")
        ax.set_title(f"{c['batch_rows']:,}-row Arrow batches", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, "spark_write", result["title"], machine)


# --- 2. read -------------------------------------------------------------------

def bench_read(ctx: BenchContext) -> dict[str, Any]:
    rows = ctx.pick(200_000, 2_000_000, 4_000_000)
    root = ctx.scratch("read")
    table, pq = str(root / "t.lance"), str(root / "p")
    spark = _session()
    try:
        df = _frame(spark, rows)
        df.write.format("memwal").mode("append").option("enable_memtable", "false").save(table)
        df.write.parquet(pq)
        df.unpersist()
        flat = [f for fs in _wal_files(table) for f in fs]
        nbytes = sum(b.get_total_buffer_size() for f in flat
                     for b in pa.ipc.open_stream(pa.memory_map(f)))
        ctx.log(f"  read: {rows:,} rows, {len(flat)} WAL entries, {nbytes / MB:.0f} MB Arrow")
        if spark.read.format("memwal").load(table).count() != rows:
            raise RuntimeError("memwal read lost rows")

        def spark_read(reader):
            def run(r: int) -> dict[str, Any]:
                return _timed(lambda: reader().write.format("noop").mode("overwrite").save())
            return run

        def inproc(r: int) -> dict[str, Any]:  # what the Spark tasks run, minus Spark
            opts = ReadOptions.parse({"path": table})
            schema = open_table(table).schema
            return _timed(lambda: {"rows": sum(
                b.num_rows for p in plan_partitions(opts, LocalStore(table))
                for b in read_partition(opts, schema, p))})

        competitors = {
            R_MEMWAL: spark_read(lambda: spark.read.format("memwal").load(table)),
            R_CEIL: spark_read(lambda: spark.read.format("noop_arrow").load(table)),
            R_PARQUET: spark_read(lambda: spark.read.parquet(pq)),
            R_INPROC: inproc}
        for _ in range(2):  # warm-up: workers, their in-memory copies, the page cache
            for name, fn in competitors.items():
                ctx.log(f"  warm-up {name}: {fn(-1)['seconds']:.2f} s")
        loads = _count_lines(table + ".loads")
        runs = interleaved(ctx.repeats, competitors)
        timed_loads = _count_lines(table + ".loads") - loads
        if any(x["rows"] != rows for x in runs[R_INPROC]):
            raise RuntimeError(f"{R_INPROC} did not see {rows} rows")
        config = _spark_config(spark, rows)
    finally:
        spark.stop()
        rm_tree(root)
    comp = _summarize_runs(runs, rows, nbytes)
    ratios = {"memwal/in_memory_source": _speed_ratio(runs, R_MEMWAL, R_CEIL),
              "memwal/parquet": _speed_ratio(runs, R_MEMWAL, R_PARQUET),
              "memwal_no_spark/in_memory_source": _speed_ratio(runs, R_INPROC, R_CEIL)}
    return {
        "name": "read",
        "title": f"spark.read of {rows:,} WAL rows vs a Python source serving them from memory",
        "config": {**config, "wal_entries": len(flat), "arrow_bytes": nbytes,
                   "table": "written by memwal WAL-only with Spark's defaults; parquet of the "
                            "same DataFrame",
                   "spark_consumption": "<df>.write.format('noop').mode('overwrite').save()",
                   "in_memory_source": "noop_arrow DataSourceReader: one partition per shard, "
                                       "yielding the same Arrow batches from the Python "
                                       "worker's memory (loaded once per worker in warm-up)",
                   "in_memory_loads_during_timed_runs": timed_loads,
                   "warm_up": "two untimed rounds of every competitor first",
                   "MB": "10^6 Arrow buffer bytes of the WAL files' batches"},
        "competitors": comp, "ratios": ratios,
        "table": {"columns": ["competitor", "Mrows/s", "MB/s", "seconds", "cores busy",
                              f"/ {R_CEIL} (range)"], "rows": _table_rows(comp, R_CEIL)},
        "targets": [
            ratio_target("spark.read memwal / in-memory Python source rows/s",
                         ratios["memwal/in_memory_source"], 0.9),
            ratio_target("spark.read memwal / spark.read parquet rows/s",
                         ratios["memwal/parquet"], None),
            {"what": "the in-memory source loaded nothing during timed runs",
             "value": f"{timed_loads} loads", "met": timed_loads == 0}],
    }


def _count_lines(path: str) -> int:
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def plot_read(result: dict[str, Any], machine: dict[str, Any]) -> None:
    fig, (ax,) = new_figure(1, width=8.0, height=4.0)
    comp = result["competitors"]
    _bar_panel(ax, comp, "rows_s", 1e6, "Mrows/s")
    ceil = comp[R_CEIL]["rows_s"]["median"] / 1e6
    ax.axvline(0.9 * ceil, color="green", ls="--", lw=1, label="0.9 x in-memory source (goal)")
    ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, "read", result["title"], machine)


# --- 3. peak RSS of a writing Python worker -------------------------------------

BUFFER = 10 * MiB  # max_wal_buffer_size default
RSS_LIMIT = 2 * BUFFER + 300 * MB


class _RssSampler:
    """Samples every 20 ms the RSS of the Python processes below this one that
    did not exist when it started (the run's workers, not the daemon)."""

    def __enter__(self) -> _RssSampler:
        self.peak, self.start, self._stop = 0, None, threading.Event()
        self._old = {p.pid for p in _python_tree()}
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            for p in _python_tree():
                if p.pid in self._old:
                    continue
                with contextlib.suppress(psutil.Error):
                    rss = p.memory_info().rss
                    self.peak = max(self.peak, rss)
                    if self.start is None:
                        self.start = rss
            time.sleep(0.02)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def bench_worker_rss(ctx: BenchContext) -> dict[str, Any]:
    total = ctx.pick(64 * MB, 512 * MB, 2_000 * MB)
    rows = total // ROW_BYTES
    # A fresh worker per task, so each run's peak is its own (not a reused worker's).
    spark = _session(**{"spark.python.worker.reuse": "false"})
    try:
        df = _frame(spark, rows, parts=1, cache=False)  # one task: one worker writes it all

        def sampled(label: str, write):
            def run(r: int) -> dict[str, Any]:
                root = ctx.scratch(f"rss_{label}_{r}")
                with _RssSampler() as s:
                    out = _timed(lambda: write(str(root / "t.lance")))
                rm_tree(root)
                return {**out, "peak_rss": s.peak, "rss_before": s.start or 0}
            return run

        competitors = {
            W_WAL: sampled("wal", lambda p: df.write.format("memwal").mode("append")
                           .option("enable_memtable", "false").save(p)),
            W_NOOP: sampled("noop", lambda p: df.write.format("noop_arrow").mode("append")
                            .save())}
        for name, fn in competitors.items():
            ctx.log(f"  worker_rss: {total / MB:,.0f} MB in one task, warm-up {name}: "
                    f"{fn(-1)['seconds']:.2f} s")
        runs = interleaved(ctx.repeats, competitors)
        config = _spark_config(spark, rows)
    finally:
        spark.stop()
    comp = {}
    for name, rs in runs.items():
        comp[name] = {"peak_rss": summarize([x["peak_rss"] for x in rs]),
                      "rss_before": summarize([x["rss_before"] for x in rs]),
                      "seconds": summarize([x["seconds"] for x in rs]),
                      "mb_s": summarize([total / x["seconds"] / MB for x in rs]), "runs": rs}
    peak = comp[W_WAL]["peak_rss"]
    extra = paired([x["peak_rss"] for x in runs[W_WAL]], [x["peak_rss"] for x in runs[W_NOOP]])
    rows_table = [[n, f"{c['peak_rss']['median'] / MB:.0f}",
                   f"{c['peak_rss']['min'] / MB:.0f}..{c['peak_rss']['max'] / MB:.0f}",
                   f"{c['rss_before']['median'] / MB:.0f}", f"{c['mb_s']['median']:.0f}"]
                  for n, c in comp.items()]
    return {
        "name": "worker_rss",
        "title": f"Peak RSS of the Python worker writing {total / MB:,.0f} MB in one Spark task",
        "config": {**config, "partitions": 1, "bytes": total, "limit_bytes": RSS_LIMIT,
                   "limit": "2 x max_wal_buffer_size (10 MiB default) + 300 MB",
                   "measure": "psutil RSS of the Python workers the run starts "
                              "(spark.python.worker.reuse=false: one fresh worker per task), "
                              "sampled every 20 ms; 'RSS before' is its first sample",
                   "data": "spark.range(rows, numPartitions=1), not cached (the JVM makes "
                           "the rows as the task consumes them)",
                   "memwal": "enable_memtable=false and nothing else (Spark's defaults)"},
        "competitors": comp,
        "table": {"columns": ["writer", "peak RSS MB", "range", "RSS before MB", "MB/s"],
                  "rows": rows_table},
        "targets": [
            {"what": f"memwal worker peak RSS <= {RSS_LIMIT / MB:.0f} MB",
             "value": f"{peak['median'] / MB:.0f} MB (range {peak['min'] / MB:.0f}.."
                      f"{peak['max'] / MB:.0f}, {peak['n']} repeats)",
             "met": peak["median"] <= RSS_LIMIT},
            ratio_target("memwal / no-op worker peak RSS", extra, None)],
    }


def plot_worker_rss(result: dict[str, Any], machine: dict[str, Any]) -> None:
    fig, (ax,) = new_figure(1, width=7.0, height=3.6)
    comp = {n: {"peak_rss": c["peak_rss"]} for n, c in result["competitors"].items()}
    _bar_panel(ax, comp, "peak_rss", MB, "peak RSS, MB")
    ax.axvline(RSS_LIMIT / MB, color="red", ls="--", lw=1, label="limit (goal)")
    ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, "worker_rss", result["title"], machine)
