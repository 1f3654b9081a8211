"""What each entry point of the data source does first in a Spark Python worker.

Spark calls the data source's planner methods, a task's ``write()`` and
``read()``, and the commit in its Python workers, each a request over the
worker's socket to the JVM. Before each: keep the daemon's collector off the
imported modules (:mod:`.worker_heap`) and the delayed-ACK stall off the
socket (:mod:`.worker_socket`). Outside Spark's workers both do nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from .worker_heap import settle
from .worker_socket import prompt

F = TypeVar("F", bound=Callable)


def enter() -> None:
    """Settle the heap and prompt the socket (for generators and other hand-made entries)."""
    settle()
    prompt()


def entry_point(fn: F) -> F:
    """``fn`` with :func:`enter` before it and the heap settled after it (what ``fn``
    imported on first use)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        enter()
        try:
            return fn(*args, **kwargs)
        finally:
            settle()
    return wrapper  # type: ignore[return-value]
