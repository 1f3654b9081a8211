"""Small appends on a small driver: the JVM's optimising JIT (C2) vs C1 only.

A probe of `small_writes` found the driver JVM busy ~1.7 cores while one writer
appended 5,000 rows at a time, and most of it the C2 compiler thread (~50 ms of
CPU per append, every append, long after warm-up: each job's generated code is
compiled anew). ``spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1`` keeps
the JVM at C1, whose compiles are cheap. Driver JVM options apply only to a new
JVM, so each competitor runs in a child process with its own SparkSession (4
writers x N appends of 5,000 rows, one warm-up round first), alternated across
repeats: memwal (defaults) and the plain Lance append, each with the JVM's
defaults and with C1 only. Reported: rows/s, p99, CPU per append by process, and
the ratios C1 only / default per sink and memwal / Lance append per JVM setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import harness as h

NAME = "driver_jit"
WRITERS, ROWS = 4, 5_000
C1 = "-XX:TieredStopAtLevel=1"
SINKS = {"memwal": "memwal (defaults)", "lance": "Lance append (toArrow + write_dataset)"}
JVMS = {"default": "JVM defaults", "c1": f"C1 only ({C1})"}
KINDS = ("driver", "jvm", "python workers")


def _name(sink: str, jvm: str) -> str:
    return f"{SINKS[sink]}, {JVMS[jvm]}"


def _child(sink: str, jvm: str, n: int, workdir: str) -> dict[str, Any]:
    """In a fresh process: a SparkSession (its JVM with or without C1 only), one warm-up
    round, then the timed round of ``WRITERS`` x ``n`` appends."""
    import lance

    conf = {"spark.driver.extraJavaOptions": C1} if jvm == "c1" else {}
    ctx = h.Ctx(workdir=Path(workdir), scale="default", repeats=1,
                machine={}, log=lambda _m: None)
    spark = h.spark_session(ctx, **conf)
    try:
        def run(uri: str, k: int) -> dict[str, Any]:
            def append(start: int) -> None:
                df = h.frame(spark, start, ROWS)
                if sink == "memwal":
                    df.write.format("memwal").mode("append").save(uri)
                else:
                    lance.write_dataset(df.toArrow(), uri, mode="append")
            append(0)  # the table, untimed
            out = h.concurrent_appends(spark, WRITERS, k, ROWS, append)
            rows = (h.committed_rows(uri) if sink == "memwal"
                    else lance.dataset(uri).count_rows())
            assert rows == (WRITERS * k + 1) * ROWS, f"{rows} rows visible"
            return out

        run(os.path.join(workdir, "warm.lance"), 2)
        return run(os.path.join(workdir, "t.lance"), n)
    finally:
        spark.stop()


def run(ctx: h.Ctx) -> dict[str, Any]:
    n = ctx.pick(3, 25)

    def competitor(sink: str, jvm: str):
        def one(r: int) -> dict[str, Any]:
            with tempfile.TemporaryDirectory(dir=ctx.workdir) as d:
                proc = subprocess.run(
                    [sys.executable, "-m", "benchmarks.bench_driver_jit", sink, jvm, str(n), d],
                    capture_output=True, text=True, timeout=900, cwd=h.REPO_ROOT)
            if proc.returncode:
                raise RuntimeError(f"{_name(sink, jvm)}: child failed: {proc.stderr[-3000:]}")
            return json.loads(proc.stdout.strip().splitlines()[-1])
        return one

    names = {_name(s, j): (s, j) for s in SINKS for j in JVMS}
    runs = h.alternate(ctx, {k: competitor(*v) for k, v in names.items()}, warmup=0)
    comp = h.stats(runs)
    mem_c1, mem_def = _name("memwal", "c1"), _name("memwal", "default")
    lan_c1, lan_def = _name("lance", "c1"), _name("lance", "default")
    speed = {SINKS["memwal"]: h.ratios(runs, mem_c1, "rows_s", [mem_def])[mem_def],
             SINKS["lance"]: h.ratios(runs, lan_c1, "rows_s", [lan_def])[lan_def]}
    versus = {JVMS["default"]: h.ratios(runs, mem_def, "rows_s", [lan_def])[lan_def],
              JVMS["c1"]: h.ratios(runs, mem_c1, "rows_s", [lan_c1])[lan_c1]}
    cols = [("rows_s", "{:,.0f}"), ("p50_ms", "{:.0f}"), ("p99_ms", "{:.0f}"),
            *((f"cpu_s_per_append {k}", "{:.3f}") for k in KINDS)]
    return {"title": f"{WRITERS} Spark writers x {n} appends x {ROWS:,} rows: the driver JVM "
                     "with its JIT defaults vs C1 only",
            "config": {"writers": WRITERS, "appends": n, "rows": ROWS, "c1_option": C1,
                       "spark": "local[2], one SparkSession per child process"},
            "competitors": comp,
            "panels": [h.panel("rows/s", comp, "rows_s", "rows/s")],
            "table": {"columns": ["competitor", "rows/s", "p50 ms", "p99 ms",
                                  *(f"CPU s/append {k}" for k in KINDS)],
                      "rows": h.rows(comp, cols)},
            "targets": [*(h.target(f"{s}: C1 only / JVM defaults rows/s", v)
                          for s, v in speed.items()),
                        *(h.target(f"{j}: memwal / Lance append rows/s", v)
                          for j, v in versus.items())]}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]),
                     default=float))
