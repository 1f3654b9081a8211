"""The heap of Spark's Python workers is frozen (memwal_datasource.spark.worker_heap); the
driver's never is.

A real ``df.write`` through a probe of the ``memwal`` source (``worker_probe``) records, in each
Python worker the write goes through (the planner's ``writer()``, every task's
``write()``, the commit), whether it runs in a Spark worker and its
``gc.get_freeze_count()``; the commit writes them where the driver reads them.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

from pyspark import cloudpickle

from memwal_datasource.spark import worker_heap

from .worker_probe import WorkerProbeSource, probed_write

REPO = str(Path(__file__).resolve().parents[2])


def heap_state() -> dict:
    """What a process's collector looks like (the probe's record of one worker)."""
    return {"pid": os.getpid(), "worker": worker_heap.in_spark_worker(),
            "frozen": gc.get_freeze_count()}


class HeapProbeSource(WorkerProbeSource):
    @classmethod
    def name(cls) -> str:
        return "memwal_heap_probe"

    state = staticmethod(heap_state)


# Spark's workers need not be able to import the tests package: ship these classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_every_python_worker_of_a_write_freezes_its_heap_and_the_driver_does_not(
        spark, tmp_path):
    df = spark.range(0, 40, numPartitions=2).selectExpr("id", "cast(id as string) as v")
    seen = probed_write(spark, HeapProbeSource, df, tmp_path / "heap.json", tmp_path / "t.lance")
    workers = [seen["planner"], *seen["tasks"], seen["commit"]]
    assert len(seen["tasks"]) == 2
    for state in workers:
        assert state["worker"] is True, state
        assert state["pid"] != os.getpid(), state
        assert state["frozen"] > 0, state  # the modules moved out of the collector's walk
    # The driver ran the same data source code (register(), name()) and froze nothing.
    assert not worker_heap.in_spark_worker()
    assert worker_heap.settle() is False
    assert gc.get_freeze_count() == 0
    assert sorted(r.id for r in spark.read.format("memwal").load(str(tmp_path / "t.lance"))
                  .collect()) == list(range(40))


def test_a_plain_python_process_is_not_a_spark_worker():
    code = ("import gc, sys\n"
            "from memwal_datasource.spark import worker_heap\n"
            "import memwal_datasource.spark.source\n"
            "print(worker_heap.in_spark_worker(), worker_heap.settle(), gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": REPO})
    assert out.stdout.split() == ["False", "False", "0"]
