"""Maintenance passes in a child process at the lowest CPU priority.

A background maintainer (:mod:`memwal_datasource.maintenance.auto`) runs beside live
writers in the user's process. Lance's compaction runs on Lance's own thread pool,
made by whichever thread first used Lance in the process, so a lowered priority of
the maintainer's thread does not reach it, and a merge then competes with the
stream's micro-batches for every core. A child process at ``nice 19`` does: the
writers get the CPU first and maintenance takes what is left.

The child is ``python -m memwal_datasource.maintenance.child_main`` (a new interpreter,
not ``multiprocessing``: spawning by ``multiprocessing`` imports the user's main
script again in the child, which for a script that starts a stream at top level
means a second stream). It reads requests from stdin and answers on the stdout it
was started with (Python's own ``print`` goes to stderr), each a length-prefixed
pickle, and ends when its stdin closes: with the parent, whatever way that ends.
A pass cut short there is finished by the next maintainer, as any pass killed
mid-round is.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import IO, Any

NICE = 19
CHILD_MODULE = "memwal_datasource.maintenance.child_main"
_LEN = struct.Struct("<Q")


def _send(out: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj)
    out.write(_LEN.pack(len(data)) + data)
    out.flush()


def _recv(inp: IO[bytes]) -> Any:
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError("the other side closed the pipe")
    size = _LEN.unpack(head)[0]
    data = inp.read(size)
    if len(data) < size:
        raise EOFError("the other side closed the pipe mid-message")
    return pickle.loads(data)  # noqa: S301 - our own process's bytes, over a private pipe


def _picklable(result: Any) -> Any:
    """``result``, or it with an unpicklable error replaced by one that says the same."""
    try:
        pickle.dumps(result)
        return result
    except Exception:  # noqa: BLE001 - any error object must reach the parent somehow
        err = result.error
        result.error = RuntimeError(f"{type(err).__name__}: {err}")
        return result


class ChildPasses:
    """The parent's end: one child process, started on the first pass, reused after."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def run(self, uri: str, storage: dict[str, str], thresholds: Any, label: str) -> Any:
        """One :func:`~memwal_datasource.maintenance.auto.maintain_once` pass in the
        child; its ``PassResult``. A child that died is started again next time."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                proc = self._proc = _start()
            try:
                _send(proc.stdin, (uri, storage, thresholds, label))
                return _recv(proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                self.close()
                raise RuntimeError(f"the maintenance child process ended mid-pass "
                                   f"(exit code {proc.poll()}): {exc}") from exc

    def close(self) -> None:
        """End the child (closing its stdin ends it after its current pass)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass


def _start() -> subprocess.Popen:
    env = dict(os.environ)
    # The child imports this package from wherever the parent did (an editable
    # install, a zip Spark shipped, a path the application added).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.Popen([sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, close_fds=True)
