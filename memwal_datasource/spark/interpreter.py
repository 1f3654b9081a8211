"""Catch, on the driver, Python workers that would run an interpreter without this package.

Spark starts its Python workers (the ones that plan a data source's reads and
writes, and the executors' ones) with the interpreter the SparkContext
recorded when it started: ``PYSPARK_PYTHON`` as the environment had it then,
else ``python3`` from the PATH. When that is not an interpreter with
memwal_datasource installed, every write or read fails inside a worker with a
Java stack trace around ``ModuleNotFoundError``. :func:`check_python_workers`
finds this in the driver process (``MemWalDataSource.name()`` calls it when
``spark.dataSource.register`` does) and fails with one line naming the fix.

Setting ``spark.pyspark.python`` on ``SparkSession.builder`` in a plain
``python script.py`` does not change the workers' interpreter (spark-submit
turns it into ``PYSPARK_PYTHON`` before the driver starts), so the fix named
is the environment variable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ..errors import ConfigError
from .connect import is_connect

# Modules a worker must import: ours and the native pieces it loads.
REQUIRED_MODULES = ("memwal_datasource", "lance", "pyarrow")
PROBE_TIMEOUT_S = 30.0
_PROBE = (
    "import importlib.util, sys\n"
    "missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]\n"
    "print('%d.%d' % sys.version_info[:2], ','.join(missing))\n"
)
# interpreter -> problem (None: fine); one probe per interpreter per process.
_checked: dict[str, str | None] = {}


def worker_problem(python_exec: str) -> str | None:
    """Why ``python_exec`` cannot run this package's Spark workers, or ``None``.

    The same interpreter as this process is fine without a probe; another one
    is started once (``find_spec`` of :data:`REQUIRED_MODULES`, its Python
    version) from this process's working directory, as Spark starts workers.
    """
    if python_exec in _checked:
        return _checked[python_exec]
    found = shutil.which(python_exec)
    if not found and not os.path.isabs(python_exec) and os.sep in python_exec:
        # ./environment/bin/python: an archive (--archives env.tar.gz#environment)
        # unpacked in the executors' working directories; the driver cannot look.
        _checked[python_exec] = None
        return None
    if found and os.path.abspath(found) == os.path.abspath(sys.executable):
        problem = None
    elif not found:
        problem = f"'{python_exec}' is not an executable on the PATH"
    else:
        problem = _probe(found)
    _checked[python_exec] = problem
    return problem


def _probe(executable: str) -> str | None:
    try:
        done = subprocess.run([executable, "-c", _PROBE, *REQUIRED_MODULES],
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"'{executable}' could not be started ({type(exc).__name__})"
    words = done.stdout.split() if done.returncode == 0 else []
    if not words:
        return f"'{executable}' is not a working Python interpreter"
    version, missing = words[0], (words[1].split(",") if len(words) > 1 else [])
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if version != ours:
        return f"'{executable}' is Python {version} but the driver runs Python {ours}"
    if missing:
        return f"'{executable}' cannot import {', '.join(missing)}"
    return None


def check_python_workers(spark_context=None) -> None:
    """Fail if the session's Python workers would run an interpreter without this package.

    ``spark_context`` defaults to the active one in this process; without one
    (inside a Spark worker, or under Spark Connect) there is nothing to check.
    A Spark Connect client is skipped even when its process also holds a
    SparkContext: the workers that matter are the Connect server's, which a
    client cannot see (a server whose interpreter lacks the package fails the
    first memwal read or write with ``DATA_SOURCE_NOT_FOUND``).
    """
    sc = spark_context
    if sc is not None and is_connect(sc):
        raise ConfigError(
            "Install memwal_datasource in the Spark Connect server's Python workers' "
            "interpreter (spark.pyspark.python where the server starts) and on its executors, "
            "and call check_python_workers() without arguments (it does nothing on a Connect "
            "client): this check reads a classic SparkContext, and a Spark Connect session has "
            "none (a server that lacks the package fails the first memwal read or write with "
            "DATA_SOURCE_NOT_FOUND).")
    if sc is None:
        if _connect_client():
            return
        try:
            from pyspark import SparkContext

            sc = SparkContext._active_spark_context
        except ImportError:
            return
    python_exec = getattr(sc, "pythonExec", None) if sc is not None else None
    if not python_exec:
        return
    problem = worker_problem(python_exec)
    if problem is None:
        return
    now = os.environ.get("PYSPARK_PYTHON")
    if now and now != python_exec:
        when = (f"PYSPARK_PYTHON was set to '{now}' after the SparkSession started, and "
                f"Spark keeps the interpreter it started with ('{python_exec}')")
    elif now:
        when = f"PYSPARK_PYTHON is '{now}'"
    else:
        when = f"PYSPARK_PYTHON is unset, so Spark runs '{python_exec}' from the PATH"
    raise ConfigError(
        f"Set PYSPARK_PYTHON={sys.executable} in the environment before creating the "
        f"SparkSession (os.environ['PYSPARK_PYTHON'] = sys.executable before "
        f"SparkSession.builder...getOrCreate(), or spark-submit --conf "
        f"spark.pyspark.python=...): Spark's Python workers would not run an interpreter "
        f"with memwal_datasource ({when}; {problem}).")


def _connect_client() -> bool:
    """True in a process that talks to Spark through Spark Connect (pyspark marks it)."""
    try:
        from pyspark.sql.utils import is_remote
    except ImportError:
        return False
    return is_remote()
