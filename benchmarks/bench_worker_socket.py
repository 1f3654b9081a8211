"""The 40 ms delayed-ACK wait on Spark's Python worker socket, with and without memwal's fix.

A probe sink that only counts its input, appended to sequentially (one job at a
time, 5,000 rows in one partition): as is, and with memwal's worker measures
(``spark/worker_entry.entry_point`` and ``spark/worker_socket.prompted``: the heap
freeze, ``TCP_NODELAY`` and ``TCP_QUICKACK`` on the worker's socket to the JVM).
Per append: the job's wall time, and the task's wait for its input (from
``write()`` to the end of its input, as the task sees it). Both over Spark's
default TCP socket and over Unix domain sockets, every competitor in each session.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pyspark.sql import datasource as sds

from memwal_datasource.spark.worker_entry import entry_point
from memwal_datasource.spark.worker_socket import prompted

from . import harness as h

NAME = "worker_socket"
PLAIN, FIXED = "probe sink as is", "probe sink + memwal's worker measures"


class _Msg(sds.WriterCommitMessage):
    def __init__(self, wait_ms: float):
        self.wait_ms = wait_ms


class _ProbeWriter(sds.DataSourceArrowWriter):
    def __init__(self, out: str, fixed: bool):
        self.out, self.fixed = out, fixed

    def write(self, iterator) -> _Msg:
        if self.fixed:
            return entry_point(self._count)(prompted(iterator))
        return self._count(iterator)

    @staticmethod
    def _count(iterator) -> _Msg:
        t = time.perf_counter()
        sum(b.num_rows for b in iterator)
        return _Msg((time.perf_counter() - t) * 1e3)

    def commit(self, messages) -> None:
        (entry_point(self._record) if self.fixed else self._record)(messages)

    def _record(self, messages) -> None:
        with open(self.out, "a") as f:  # the commit runs in a worker: tell the driver by file
            f.write(json.dumps([m.wait_ms for m in messages]) + "\n")


class ProbeSource(sds.DataSource):
    """``format("socket_probe")``: counts rows; option ``fixed`` applies memwal's measures."""

    @classmethod
    def name(cls) -> str:
        return "socket_probe"

    def writer(self, schema, overwrite: bool) -> _ProbeWriter:
        fixed = self.options.get("fixed") == "true"

        def make() -> _ProbeWriter:
            return _ProbeWriter(self.options["out"], fixed)
        return entry_point(make)() if fixed else make()


def _case(ctx: h.Ctx, spark, socket: str, appends: int) -> dict[str, Any]:
    df = h.frame(spark, 0, 5_000).cache()
    df.count()

    def competitor(fixed: bool):
        def run(r: int) -> dict[str, Any]:
            out = ctx.scratch("socket") / f"waits-{fixed}-{r}.jsonl"
            out.unlink(missing_ok=True)
            jobs = []
            for _ in range(appends if r >= 0 else 3):
                t = time.perf_counter()
                df.write.format("socket_probe").option("out", str(out)) \
                    .option("fixed", str(fixed).lower()).mode("append").save()
                jobs.append((time.perf_counter() - t) * 1e3)
            waits = [w for line in out.read_text().splitlines() for w in json.loads(line)]
            return {"job_mean_ms": sum(jobs) / len(jobs), "job_p50_ms": h.pct(jobs, 50),
                    "job_p90_ms": h.pct(jobs, 90), "input_wait_mean_ms": sum(waits) / len(waits),
                    "input_wait_p50_ms": h.pct(waits, 50), "input_wait_p90_ms": h.pct(waits, 90)}
        return run

    runs = h.alternate(ctx, {PLAIN: competitor(False), FIXED: competitor(True)},
                       label=f"{socket}: ")
    df.unpersist()
    return {"socket": socket, "competitors": h.stats(runs),
            "job": h.ratios(runs, FIXED, "job_mean_ms", [PLAIN])[PLAIN],
            "wait": h.ratios(runs, FIXED, "input_wait_mean_ms", [PLAIN])[PLAIN],
            "wait_p90": h.ratios(runs, FIXED, "input_wait_p90_ms", [PLAIN])[PLAIN]}


def run(ctx: h.Ctx) -> dict[str, Any]:
    appends = ctx.pick(8, 20, 40)
    cases = []
    for socket, conf in h.WORKER_SOCKETS.items():
        spark = h.spark_session(ctx, ProbeSource, **conf)
        try:
            cases.append(_case(ctx, spark, socket, appends))
        finally:
            spark.stop()
    rows = [r for c in cases for r in h.rows(c["competitors"], [
        ("job_mean_ms", "{:.0f}"), ("job_p50_ms", "{:.0f}"), ("job_p90_ms", "{:.0f}"),
        ("input_wait_mean_ms", "{:.1f}"), ("input_wait_p50_ms", "{:.1f}"),
        ("input_wait_p90_ms", "{:.1f}")], c["socket"])]
    return {"title": "Spark's Python worker socket: a probe sink's input wait and job time, "
                     "with and without memwal's worker measures",
            "config": {"appends_per_round": appends, "rows_per_append": 5_000,
                       "partitions": 1, "jobs": "sequential"},
            "cases": cases,
            "panels": [h.panel(f"{c['socket']}: task input wait, mean", c["competitors"],
                               "input_wait_mean_ms", "ms") for c in cases]
            + [h.panel(f"{c['socket']}: append job, mean", c["competitors"], "job_mean_ms", "ms")
               for c in cases],
            "table": {"columns": ["socket", "sink", "job mean ms", "job p50 ms", "job p90 ms",
                                  "input wait mean ms", "input wait p50 ms",
                                  "input wait p90 ms"], "rows": rows},
            "targets": [t for c in cases for t in (
                h.target(f"{c['socket']}: task input wait, mean, with / without the measures",
                         c["wait"]),
                h.target(f"{c['socket']}: task input wait p90, with / without the measures",
                         c["wait_p90"]),
                h.target(f"{c['socket']}: append job time, mean, with / without the measures",
                         c["job"]))]}
