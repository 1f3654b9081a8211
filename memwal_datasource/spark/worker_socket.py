"""Keep the 40 ms delayed-ACK stall off the TCP socket between Spark's JVM and a Python worker.

By default (``spark.python.unix.domain.socket.enabled=false``) a Python worker
talks to its JVM over TCP on the loopback interface, and neither end turns
Nagle's algorithm off. A task's input arrives as a few small writes: the JVM
holds the last one back until the worker acknowledges the one before it, and
the worker's kernel delays that acknowledgement by up to 40 ms because the
worker has nothing to send back yet. Measured with a sink that only counts its
input (5,000 rows, one batch): from ``write()`` to the end of its input took
44 ms (p50) this way and 2.3 ms with this module; the append job 122 -> 78 ms.
Every Python data source meets it, a no-op one too.

:func:`prompt` sets, on the worker's own socket to the JVM (found as the
``infile``/``outfile``/``sock`` of PySpark's worker frames on the stack):

* ``TCP_QUICKACK``: acknowledge what arrives at once. Linux leaves quick-ACK
  mode again on its own, so it is set again before each input batch is read
  (:func:`prompted`), one system call.
* ``TCP_NODELAY``: send the worker's own last small write (a commit message,
  a result) without waiting for the JVM's acknowledgement; set once, when
  :func:`worker_sockets` first finds the socket.

Only in Spark's Python worker processes and only on TCP sockets; on a Unix
domain socket, or where the stack holds no worker socket, it does nothing.
An option the kernel refuses is ignored: the socket then works as before.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Iterator
from typing import TypeVar

from .worker_heap import in_spark_worker

T = TypeVar("T")

_PYSPARK_DIR = os.sep + "pyspark" + os.sep
# Names PySpark's worker entry points give the JVM's socket (or files over it):
# ``daemon.worker(sock, ...)``, ``worker.main(infile, outfile)``,
# ``sql.worker.*.main(infile, outfile)``, ``with get_sock_file_to_executor() as sock_file``.
_SOCKET_NAMES = ("sock", "infile", "outfile", "sock_file")

_found: tuple[int, tuple[int, ...]] | None = None  # (pid, TCP socket fds) of this worker
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def _fd_of(value: object) -> int | None:
    try:
        fd = value.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def _stack_sockets() -> tuple[int, ...] | None:
    """File descriptors of the TCP sockets PySpark's worker frames on the stack hold, one
    per socket (PySpark opens its files over dups of the socket's descriptor); ``None``
    if no PySpark frame is on the stack (another thread: nothing to conclude)."""
    by_socket: dict[int, int] = {}
    seen = False
    frame = sys._getframe(1)
    while frame is not None:
        if _PYSPARK_DIR in frame.f_code.co_filename:
            seen = True
            for name in _SOCKET_NAMES:
                fd = _fd_of(frame.f_locals.get(name))
                inode = _tcp_inode(fd) if fd is not None else None
                if inode is not None:
                    by_socket.setdefault(inode, fd)  # type: ignore[arg-type]
        frame = frame.f_back
    return tuple(sorted(by_socket.values())) if seen else None


def _tcp_inode(fd: int) -> int | None:
    """The socket's inode if ``fd`` is a TCP socket, else None."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            return None
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        tcp = sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
        return st.st_ino if tcp else None
    finally:
        sock.detach()  # the fd stays PySpark's


def worker_sockets() -> tuple[int, ...]:
    """The TCP socket(s) to the JVM of this Spark Python worker; () elsewhere."""
    global _found
    if not in_spark_worker():
        return ()
    pid = os.getpid()
    if _found is None or _found[0] != pid:
        # A worker keeps one connection for its life (PySpark's daemon forks one
        # process per connection), so what the stack shows once stays true.
        fds = _stack_sockets()
        if fds is None:
            return ()  # called off PySpark's request path: look again next time
        for fd in fds:  # found once per socket: Nagle off for the worker's life
            _setsockopt(fd, socket.TCP_NODELAY)
        _found = (pid, fds)
    return _found[1]


def _setsockopt(fd: int, option: int) -> None:
    """Set a TCP option to 1 on PySpark's ``fd``; a refusal leaves the socket as it was."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, 1)
    except OSError:
        pass
    finally:
        sock.detach()  # the fd stays PySpark's


def prompt() -> None:
    """In a Spark worker on TCP: acknowledge the JVM at once and send without Nagle's wait
    (``TCP_NODELAY`` was set when the socket was found)."""
    for fd in worker_sockets():
        if _QUICKACK is not None:  # Linux only
            _setsockopt(fd, _QUICKACK)


def prompted(items: Iterator[T]) -> Iterator[T]:
    """``items`` (a task's input batches), with :func:`prompt` before reading each one."""
    if not worker_sockets():
        yield from items
        return
    while True:
        prompt()
        try:
            item = next(items)
        except StopIteration:
            return
        yield item
