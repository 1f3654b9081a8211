"""What each entry point of the data source does first in a Spark Python worker.

Spark calls the data source's planner methods, a task's ``write()`` and
``read()``, and the commit in its Python workers, each a request over the
worker's socket to the JVM. Before each: keep the daemon's collector off the
imported modules (:mod:`.worker_heap`) and the delayed-ACK stall off the
socket (:mod:`.worker_socket`). Outside Spark's workers both do nothing.

**Errors lead with their fix.** A worker sends Spark its error as a Python
traceback followed by the exception; Spark puts that text after its own
prefix (``[PYTHON_DATA_SOURCE_ERROR] Failed to ...: ``), and a Spark Connect
client shows it with the server's JVM stack after it. Our own errors
(:class:`~memwal_datasource.errors.MemWalError`) start with the fix and name
what they are about, so for them the worker sends the exception line alone
(:func:`plain_errors`): the client's message then reads ``...: memwal_datasource
.errors.ConfigError: <the fix>: <why>``. Other exceptions keep their traceback.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

from ..errors import MemWalError
from .worker_heap import in_spark_worker, settle
from .worker_socket import prompt

F = TypeVar("F", bound=Callable)
T = TypeVar("T")
log = logging.getLogger("memwal_datasource")

# pyspark.util.handle_worker_exception sends only the exception's line when this is set.
HIDE_TRACEBACK_ENV = "SPARK_HIDE_TRACEBACK"


def plain_error(exc: BaseException) -> None:
    """In a Spark worker, have ``exc`` (one of ours) reach Spark without a traceback.

    Every PySpark worker that reports an exception exits right after
    (``sys.exit(-1)`` after ``handle_worker_exception``), so the variable set
    here ends with the process and never hides another error's traceback.
    """
    if isinstance(exc, MemWalError) and in_spark_worker():
        log.debug("memwal error in a Spark worker", exc_info=exc)
        os.environ[HIDE_TRACEBACK_ENV] = "1"


def plain_errors(batches: Iterator[T]) -> Iterator[T]:
    """``batches``, passing through :func:`plain_error` what they raise (a task's reads)."""
    try:
        yield from batches
    except MemWalError as exc:
        plain_error(exc)
        raise


def enter() -> None:
    """Settle the heap and prompt the socket (for generators and other hand-made entries)."""
    settle()
    prompt()


def entry_point(fn: F) -> F:
    """``fn`` with :func:`enter` before it and the heap settled after it (what ``fn``
    imported on first use); its own errors reach Spark without a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        enter()
        try:
            return fn(*args, **kwargs)
        except MemWalError as exc:
            plain_error(exc)
            raise
        finally:
            settle()
    return wrapper  # type: ignore[return-value]
