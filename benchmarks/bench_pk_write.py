"""Writing a primary-key table from Spark: any DataFrame vs ``partition_for_table``.

One cached DataFrame (4 partitions, every bucket of the default ``bucket(id, 16)`` in
every partition) written to a fresh primary-key table as it is (tasks take turns per
shard and spill to local disk) and prepared with ``partition_for_table(num_partitions=4)``
(its shuffle timed), in WAL-only and MemTable mode, alternated. Then the peak RSS of
the Python workers of a WAL-only write (a fresh worker per task, in a second session).
"""

from __future__ import annotations

import time
from typing import Any

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.spark import partition_for_table
from memwal_datasource.store import open_store

from . import harness as h

NAME = "pk_write"
MODES = {"WAL-only": "false", "MemTable": "true"}
ANY, PREPARED = "any DataFrame (turns + spill)", "partition_for_table"


def _writes(ctx: h.Ctx, df, rows: int, modes: dict[str, str], rss: bool) -> dict[str, Any]:
    def write(mode: str, prepared: bool):
        def run(r: int) -> dict[str, Any]:
            path = str(ctx.scratch("pk") / "t.lance")
            opts = {"primary_key": "id", "enable_memtable": modes[mode]}
            src = partition_for_table(df, path, create_options=opts, num_partitions=4)
            w = (src if prepared else df).write.format("memwal").mode("append").options(**opts)
            with h.RssSampler() as s:
                t = time.perf_counter()
                w.save(path)
                secs = time.perf_counter() - t
            ranges = CommitLog(open_store(path)).visible()
            assert sum(x.rows for x in ranges) == rows
            return {"rows_s": rows / secs, "ranges": len(ranges),
                    **({"peak_rss_mb": s.peak / h.MB} if rss else {})}
        return run

    return h.alternate(ctx, {f"{m}: {how}": write(m, how == PREPARED) for m in modes
                           for how in (ANY, PREPARED)}, repeats=max(3, ctx.repeats))


def run(ctx: h.Ctx) -> dict[str, Any]:
    rows = ctx.pick(200_000, 2_000_000, 4_000_000)
    for conf, modes, rss in (({}, MODES, False),
                             ({"spark.python.worker.reuse": "false"}, {"WAL-only": "false"}, True)):
        spark = h.spark_session(ctx, **conf)
        try:
            df = h.frame(spark, 0, rows, parts=4).cache()
            assert df.count() == rows
            runs = _writes(ctx, df, rows, modes, rss)
        finally:
            spark.stop()
        if rss:
            rss_comp = h.stats(runs)
        else:
            comp = h.stats(runs)
            rt = {m: h.paired([x["rows_s"] for x in runs[f"{m}: {PREPARED}"]],
                            [x["rows_s"] for x in runs[f"{m}: {ANY}"]]) for m in MODES}
    return {"title": f"Spark df.write of {rows:,} rows to a primary-key table: any DataFrame vs "
                     "partition_for_table",
            "config": {"rows": rows, "table": "fresh per repeat, primary key id, bucket(id, 16)"},
            "competitors": comp, "rss": rss_comp, "ratios": rt,
            "panels": [h.panel("rows/s", comp, "rows_s", "rows/s"),
                       h.panel("peak worker RSS (WAL-only)", rss_comp, "peak_rss_mb", "MB")],
            "table": {"columns": ["write", "rows/s", "committed ranges", "peak worker RSS MB"],
                      "rows": h.rows({n: {**s, **rss_comp.get(n, {})} for n, s in comp.items()},
                                     [("rows_s", "{:,.0f}"), ("ranges", "{:.0f}"),
                                      ("peak_rss_mb", "{:.0f}")])},
            "targets": [h.target(f"{m}: partition_for_table / any DataFrame rows/s", r)
                        for m, r in rt.items()]}
