"""Writing a primary-key table from Spark: any DataFrame vs ``partition_for_table``.

One cached DataFrame (4 partitions, every bucket in each) written to a fresh primary-key
table as it is (tasks take turns per shard, spill) and through ``partition_for_table``
(its shuffle timed), WAL-only and MemTable: rows/s and committed ranges. Then, WAL-only,
a fresh worker per task: the workers' peak RSS (goal <= 2 x 10 MiB buffers + 300 MB).
"""

from __future__ import annotations

from typing import Any

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.spark import partition_for_table
from memwal_datasource.store import open_store

from . import harness as h

NAME = "pk_write"
MODES = {"WAL-only": "false", "MemTable": "true"}
ANY, PREPARED = "any DataFrame (turns + spill)", "partition_for_table"
LIMIT_MB = round((2 * 10 * h.MiB + 300 * h.MB) / h.MB)  # 2 x max_wal_buffer_size + 300 MB


def _writes(ctx: h.Ctx, spark, rows: int, modes: dict[str, str], rss: bool) -> dict[str, Any]:
    df = h.frame(spark, 0, rows, parts=4).cache()  # one cached DataFrame
    assert df.count() == rows

    def timed(prepare):
        def run(r: int) -> dict[str, Any]:
            path = str(ctx.scratch("pk") / "t.lance")
            write = prepare(path)  # untimed: partition_for_table creates the table
            with h.rss_peak() as peak:
                secs = h.seconds(lambda: write.save(path))
            ranges = CommitLog(open_store(path)).visible()
            assert sum(x.rows for x in ranges) == rows
            return {"rows_s": rows / secs, "ranges": len(ranges),
                    **({"peak_rss_mb": peak["peak"] / h.MB} if rss else {})}
        return run

    def pk(mode: str, prepared: bool):
        opts = {"primary_key": "id", "enable_memtable": modes[mode]}

        def prepare(path: str):
            src = partition_for_table(df, path, create_options=opts, num_partitions=4)
            return (src if prepared else df).write.format("memwal").mode("append").options(**opts)
        return prepare

    comps = {f"{m}: {how}": timed(pk(m, how == PREPARED)) for m in modes for how in (ANY, PREPARED)}
    return h.stats(h.alternate(ctx, comps, repeats=max(3, ctx.repeats)))


def run(ctx: h.Ctx) -> dict[str, Any]:
    rows = ctx.pick(200_000, 2_000_000, 4_000_000)
    with h.spark_session(ctx) as spark:
        comp = _writes(ctx, spark, rows, MODES, False)
    with h.spark_session(ctx, **{"spark.python.worker.reuse": "false"}) as spark:
        rss = _writes(ctx, spark, rows, {"WAL-only": "false"}, True)
    rt = {m: h.paired(comp[f"{m}: {PREPARED}"]["rows_s"]["values"],
                      comp[f"{m}: {ANY}"]["rows_s"]["values"]) for m in MODES}
    both = {n: {**s, **rss.get(n, {})} for n, s in comp.items()}
    return h.local_case(
        f"Spark df.write of {rows:,} rows to a primary-key table: any DataFrame vs "
        "partition_for_table; the Python workers' peak RSS",
        {"rows": rows, "table": "fresh per repeat, primary key id, bucket(id, 16)",
         "rss": "a fresh worker per task (worker.reuse=false), sampled every 20 ms",
         "rss_limit_mb": LIMIT_MB}, both,
        [("rows/s", "rows_s", "{:,.0f}"), ("committed ranges", "ranges", "{:.0f}"),
         ("peak worker RSS MB", "peak_rss_mb", "{:.0f}")],
        [*(h.target(f"{m}: partition_for_table / any DataFrame rows/s", r) for m, r in rt.items()),
         *(h.target(f"{n}: memwal worker peak RSS MB", rss[n]["peak_rss_mb"], LIMIT_MB,
                    at_most=True) for n in rss)], [],
        competitors=comp, rss=rss, ratios=rt,
        panels=[h.panel("rows/s", comp, "rows_s", "rows/s"),
                h.panel("peak worker RSS (WAL-only)", rss, "peak_rss_mb", "MB")])
