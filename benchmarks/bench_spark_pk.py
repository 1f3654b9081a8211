"""Writing a primary-key table from Spark: any DataFrame vs ``partition_for_table``.

* :func:`bench_pk_write`: one cached DataFrame (4 partitions, every bucket of the
  table's default ``bucket(id, 16)`` spec in every partition) written to a fresh
  primary-key table as it is (each task writes the shards it can take, spills
  the rest to local disk and writes them in turns with its siblings) and
  prepared with ``partition_for_table(num_partitions=4)`` (each bucket in one
  task: no waiting, no spill), in WAL-only and MemTable mode, alternated. Then
  the peak RSS of the Python workers while they spill (a fresh worker per
  task, sampled from outside with psutil).

A module of its own (``bench_spark.py`` is near the size limit); it reuses that
module's session, frame, timing and RSS sampler.
"""

from __future__ import annotations

from typing import Any

from memwal_datasource.commit import CommitLog
from memwal_datasource.sharding import DEFAULT_NUM_BUCKETS
from memwal_datasource.spark import partition_for_table
from memwal_datasource.store import LocalStore

from .bench_spark import PARTS, _bar_panel, _frame, _RssSampler, _session, _spark_config, _timed
from .common import (
    MB,
    BenchContext,
    interleaved,
    new_figure,
    paired,
    ratio_target,
    rm_tree,
    save_figure,
    summarize,
)

MODES = {"WAL-only": "false", "MemTable": "true"}
UNPREPARED = "any DataFrame (turns + spill)"
PREPARED = "partition_for_table"


def _name(mode: str, how: str) -> str:
    return f"{mode}: {how}"


def bench_pk_write(ctx: BenchContext) -> dict[str, Any]:
    rows = ctx.pick(200_000, 2_000_000, 4_000_000)
    repeats = max(3, ctx.repeats)
    runs, rss_runs = {}, {}
    spark = _session()
    try:
        df = _frame(spark, rows)
        ctx.log(f"  pk_write: {rows:,} rows in {PARTS} partitions, cached; primary key id, "
                f"bucket(id, {DEFAULT_NUM_BUCKETS})")

        def write(mode: str, prepared: bool, r: int, sampler=None) -> dict[str, Any]:
            root = ctx.scratch(f"pk_{mode}_{prepared}_{r}")
            path = str(root / "t.lance")
            opts = {"primary_key": "id", "enable_memtable": MODES[mode]}
            # Creates the table (untimed, the same for both) and plans the shuffle.
            src = partition_for_table(df, path, create_options=opts, num_partitions=PARTS)
            w = (src if prepared else df).write.format("memwal").mode("append").options(**opts)
            out = _timed(lambda: w.save(path))
            vis = CommitLog(LocalStore(path)).visible()
            if sum(x.rows for x in vis) != rows:
                raise RuntimeError(f"{mode} prepared={prepared}: committed "
                                   f"{sum(x.rows for x in vis)} rows")
            rm_tree(root)
            return {**out, "ranges": len(vis)}

        competitors = {_name(m, how): (lambda r, m=m, p=(how == PREPARED): write(m, p, r))
                       for m in MODES for how in (UNPREPARED, PREPARED)}
        for name, fn in competitors.items():  # warm-up: workers, imports
            ctx.log(f"  warm-up {name}: {fn(-1)['seconds']:.2f} s")
        runs = interleaved(repeats, competitors)
        config = _spark_config(spark, rows)
    finally:
        spark.stop()
    # Peak RSS while spilling: a fresh Python worker per task, so each run's peak is its own.
    spark = _session(**{"spark.python.worker.reuse": "false"})
    try:
        df = _frame(spark, rows)

        def sampled(prepared: bool, r: int) -> dict[str, Any]:
            root = ctx.scratch(f"pk_rss_{prepared}_{r}")
            path = str(root / "t.lance")
            opts = {"primary_key": "id", "enable_memtable": "false"}
            src = partition_for_table(df, path, create_options=opts, num_partitions=PARTS)
            w = (src if prepared else df).write.format("memwal").mode("append").options(**opts)
            with _RssSampler() as s:
                out = _timed(lambda: w.save(path))
            rm_tree(root)
            return {**out, "peak_rss": s.peak}

        rss_comp = {_name("WAL-only", UNPREPARED): lambda r: sampled(False, r),
                    _name("WAL-only", PREPARED): lambda r: sampled(True, r)}
        for fn in rss_comp.values():
            fn(-1)
        rss_runs = interleaved(repeats, rss_comp)
    finally:
        spark.stop()

    comp = {}
    for name, rs in runs.items():
        secs = [x["seconds"] for x in rs]
        comp[name] = {"seconds": summarize(secs), "rows_s": summarize([rows / s for s in secs]),
                      "ranges": summarize([x["ranges"] for x in rs]), "runs": rs}
    rss = {n: {"peak_rss": summarize([x["peak_rss"] for x in rs]), "runs": rs}
           for n, rs in rss_runs.items()}
    ratios = {m: paired([x["seconds"] for x in runs[_name(m, UNPREPARED)]],
                        [x["seconds"] for x in runs[_name(m, PREPARED)]]) for m in MODES}
    table = [[n, f"{c['rows_s']['median'] / 1e6:.3g}", f"{c['seconds']['median']:.3g}",
              f"{c['ranges']['median']:.0f}",
              f"{rss[n]['peak_rss']['median'] / MB:.0f}" if n in rss else "-"]
             for n, c in comp.items()]
    return {
        "name": "pk_write",
        "title": f"Spark df.write of {rows:,} rows to a primary-key table: any DataFrame vs "
                 "partition_for_table",
        "config": {**config, "repeats": repeats,
                   "table": f"fresh per repeat, primary key id, bucket(id, "
                            f"{DEFAULT_NUM_BUCKETS}) (the default), created untimed",
                   "unprepared": "the cached DataFrame as it is: every bucket in every "
                                 "partition (tasks take turns per shard, spill to local disk)",
                   "prepared": f"partition_for_table(df, path, num_partitions={PARTS}) (its "
                               "shuffle is timed)",
                   "timed": "df.write...save(path) wall (tasks and commit)",
                   "rss": "psutil RSS of the Python workers a WAL-only write starts "
                          "(spark.python.worker.reuse=false), sampled every 20 ms"},
        "competitors": comp, "rss": rss,
        "ratios": {f"{m}: partition_for_table/unprepared rows/s": r for m, r in ratios.items()},
        "table": {"columns": ["write", "Mrows/s", "seconds", "committed ranges",
                              "peak worker RSS MB"], "rows": table},
        "targets": [ratio_target(f"{m}: partition_for_table / any DataFrame rows/s", r, None)
                    for m, r in ratios.items()],
    }


def plot_pk_write(result: dict[str, Any], machine: dict[str, Any]) -> None:
    fig, (ax, ax2) = new_figure(2, width=7.0, height=3.6)
    _bar_panel(ax, result["competitors"], "rows_s", 1e6, "Mrows/s")
    _bar_panel(ax2, result["rss"], "peak_rss", MB, "peak worker RSS, MB")
    save_figure(fig, "pk_write", result["title"], machine)
