"""Keep the garbage collector of Spark's Python workers off their imported modules.

PySpark's daemon (``pyspark/daemon.py``) forks the Python workers and, when
one is reused (``spark.python.worker.reuse``, the default), runs
``gc.collect()`` after every request the worker served. A full collection
walks every object the collector tracks, and a worker that has imported
pyspark, pyarrow, numpy, this package (and, where used, pandas and lance)
tracks hundreds of thousands: each collection costs tens of milliseconds of
CPU. A small append makes three such requests, each in its own kind of worker
(the planner's ``write_into_data_source``, the task's ``pyspark.worker``, the
driver-side ``commit_data_source_write``), so the collector alone cost
~130 ms of CPU per append.

``gc.freeze()`` moves every object alive now into a permanent generation that
collections skip. Modules live as long as the process, so after
``gc.collect(); gc.freeze()`` once the imports are done, the daemon's
collections only walk what later requests allocate. :func:`settle` does that
at the entry points of the data source (:mod:`.worker_entry`: the planner's ``writer()``,
``reader()``, ``schema()``; a task's ``write()`` and ``read()``; the
commit), and again, cheaply, whenever more modules were imported since (e.g.
lance on its first use): the check is one ``len(sys.modules)``.

Only in Spark's Python worker processes. The user's driver process runs user
code: frozen objects are never collected as cycles (reference counting still
frees the rest), so freezing there could keep a long-lived application's
cyclic garbage forever. Each worker freezes at most once per batch of new
imports, so whatever request state happened to be alive then is bounded.
"""

from __future__ import annotations

import gc
import sys

# The ``__main__`` of Spark's Python workers: the daemon that forks them
# (``python -m pyspark.daemon <worker module>``), or, without the daemon
# (``spark.python.use.daemon=false``), the worker module itself
# (``python -m pyspark.worker``, ``python -m pyspark.sql.worker.<planner>``).
WORKER_MAINS = ("pyspark.daemon", "pyspark.worker")
WORKER_MAIN_PACKAGE = "pyspark.sql.worker."

_in_worker: bool | None = None  # decided on first use: __main__ is set by then
_frozen_at = -1  # len(sys.modules) at the last freeze


def in_spark_worker() -> bool:
    """True in a Spark Python worker process (never in the user's driver)."""
    global _in_worker
    if _in_worker is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        name = getattr(spec, "name", None) or ""
        _in_worker = name in WORKER_MAINS or name.startswith(WORKER_MAIN_PACKAGE)
    return _in_worker


def settle() -> bool:
    """In a Spark worker, freeze the heap if modules were imported since the last freeze.

    Returns True if it froze. Elsewhere (the driver, a plain Python process)
    it does nothing.
    """
    global _frozen_at
    if not in_spark_worker():
        return False
    loaded = len(sys.modules)
    if loaded == _frozen_at:
        return False
    gc.collect()  # garbage alive now would otherwise be frozen with the modules
    gc.freeze()
    _frozen_at = loaded
    return True
