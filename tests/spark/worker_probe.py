"""A ``memwal`` source that records something of every Python worker a write goes through.

Subclass :class:`WorkerProbeSource` with a ``name()`` and a ``state()`` (what
to record, run in the worker). A write with the ``worker_probe`` option (a
file) records ``state()`` in the planner after ``writer()``, in every task
after ``write()`` and in the commit worker; the commit writes them as JSON
(``{"planner": ..., "tasks": [...], "commit": ...}``) where the driver reads them.
"""

from __future__ import annotations

import json
import sys

from pyspark import cloudpickle

from memwal_datasource.spark.source import MemWalDataSource, SparkBatchWriter

PROBE_OPTION = "worker_probe"


class WorkerProbeWriter(SparkBatchWriter):
    probe_file: str
    planner: dict
    state: staticmethod

    def write(self, iterator):
        msg = super().write(iterator)
        msg.probe_state = self.state()
        return msg

    def commit(self, messages) -> None:
        super().commit(messages)
        with open(self.probe_file, "w") as f:
            json.dump({"planner": self.planner, "tasks": [m.probe_state for m in messages],
                       "commit": self.state()}, f)


class WorkerProbeSource(MemWalDataSource):
    """``memwal`` with one more option, ``worker_probe`` (the file the commit writes)."""

    @staticmethod
    def state() -> dict:
        raise NotImplementedError

    def writer(self, schema, overwrite):
        probe = self.options[PROBE_OPTION]
        self.options = {k: v for k, v in self.options.items() if k.lower() != PROBE_OPTION}
        writer = super().writer(schema, overwrite)
        writer.__class__ = WorkerProbeWriter
        writer.probe_file = probe
        writer.state = type(self).state
        writer.planner = self.state()  # after writer(): its entry point ran
        return writer


def probed_write(spark, source: type[WorkerProbeSource], df, probe_file, path) -> dict:
    """Append ``df`` to ``path`` through ``source``; what every worker recorded."""
    spark.dataSource.register(source)
    df.write.format(source.name()).option(PROBE_OPTION, str(probe_file)).mode("append") \
        .save(str(path))
    return json.loads(probe_file.read_text())


# Spark's workers need not be able to import the tests package: ship these classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
