"""What differs under Spark Connect: where a relative path is, and which kind of session a call got.

**Where Spark resolves a relative path.** Spark's JVM resolves a relative path
(its own sources' ``save("x")``, a stream's ``checkpointLocation``) against
Hadoop's local file system's working directory: the JVM's working directory.
In a classic session the Python workers that plan our reads and writes run in
that same directory, so ``os.path.abspath`` there agrees with Spark. Under
Spark Connect every server-side Python worker of a session runs in that
session's artifact directory (``.../userFiles-<id>/<session uuid>``, deleted
with the session, or the server) and has ``SPARK_JOB_ARTIFACT_UUID=<session
uuid>`` in its environment (a classic session's workers have ``default``).
A relative path resolved there would write a table into a directory that
disappears, and give one checkpoint a different identity in every session.

:func:`resolve_local` therefore resolves a relative local path against the
working directory of the JVM that started the worker (its ancestor process,
read from ``/proc``), exactly where Spark puts its own files; where that cannot
be read (no ``/proc``, another user's JVM), it refuses the relative path with
an error whose first sentence is the fix. Nothing is ever resolved into, or
written under, a session's artifact directory.

**Client-side calls.** :func:`partition_for_table` and :func:`compact` run in the
user's process. On a Connect client that process is not Spark's driver: its
working directory is not the server's, so a relative local path is refused
there too (:func:`client_path`).

Not covered: a cluster whose ``fs.defaultFS`` is not the local file system
(HDFS) resolves Spark's own relative paths there; this source supports local
paths and object stores only, and resolves relative ones on local disk.
"""

from __future__ import annotations

import functools
import os
from urllib.parse import unquote, urlparse

from ..errors import ConfigError
from ..store import local_path

__all__ = ["client_path", "is_connect", "jvm_working_dir", "resolve_local",
           "session_artifact_uuid"]

ARTIFACT_UUID_ENV = "SPARK_JOB_ARTIFACT_UUID"
CLASSIC_ARTIFACT_UUID = "default"
# Worker -> daemon -> JVM; a few more levels for launchers that wrap the worker.
MAX_ANCESTORS = 6
EXAMPLES = "such as /data/events.lance, file:///data/events.lance or s3://bucket/events.lance"


def is_connect(obj: object) -> bool:
    """True for a Spark Connect session or DataFrame (the client's objects).

    By the class's module, so a classic-only environment (no grpc) never
    imports pyspark's Connect modules to ask.
    """
    return type(obj).__module__.startswith("pyspark.sql.connect.")


def session_artifact_uuid() -> str | None:
    """The Spark Connect session this process serves as a Python worker, or ``None``
    (a classic session's worker, the user's driver or client, a plain process)."""
    value = os.environ.get(ARTIFACT_UUID_ENV, "")
    return value if value and value != CLASSIC_ARTIFACT_UUID else None


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    return int(stat[stat.rindex(")") + 2:].split()[1])


@functools.lru_cache(maxsize=1)
def jvm_working_dir() -> str | None:
    """The working directory of the JVM that started this Python worker, or ``None``.

    The nearest ancestor process whose executable is ``java`` (the worker's
    daemon's parent); read from ``/proc`` (Linux). ``None`` when there is no
    such ancestor, ``/proc`` cannot be read, or the directory was deleted.
    Cached: a worker's JVM, and its working directory, do not change.
    """
    pid = os.getppid()
    try:
        for _ in range(MAX_ANCESTORS):
            if pid <= 1:
                return None
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "java":
                cwd = os.readlink(f"/proc/{pid}/cwd")
                return None if cwd.endswith(" (deleted)") or not os.path.isabs(cwd) else cwd
            pid = _parent(pid)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _split_local(location: str) -> tuple[str, bool] | None:
    """(the path of a local location, whether it is absolute); ``None`` for other URIs."""
    parsed = urlparse(location)
    scheme = parsed.scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter
        return location, True
    if scheme == "":
        return location, os.path.isabs(location)
    if scheme != "file":
        return None
    path = unquote(parsed.path)
    return path, os.path.isabs(path) or parsed.netloc not in ("", "localhost")


def _relative_refused(option: str, location: str, why: str) -> ConfigError:
    return ConfigError(f"Use an absolute path or a URI for {option}, {EXAMPLES}: "
                       f"'{location}' is relative, and {why}.")


def spark_working_dir(option: str, location: str) -> str:
    """The directory Spark resolves ``location`` (relative) against, seen from this process.

    A Connect session's worker: the JVM's working directory, or a refusal
    naming ``option`` when it cannot be read. Anywhere else: this process's.
    """
    if session_artifact_uuid() is None:
        return os.getcwd()
    cwd = jvm_working_dir()
    if cwd is None:
        raise _relative_refused(
            option, location,
            "under Spark Connect this source cannot read the working directory of Spark's "
            "JVM, where Spark resolves it (its Python worker runs in the session's artifact "
            "directory, which Spark deletes with the session)")
    return cwd


def refuse_artifact_dir(path: str, option: str) -> None:
    """In a Connect session's worker, refuse a local path inside the session's artifact
    directory: Spark deletes it (with every session's) when the session or server ends."""
    session = session_artifact_uuid()
    here = os.getcwd()
    if session is None or os.path.basename(here) != session:
        return
    root = os.path.dirname(here)  # userFiles-<id>: every Connect session's artifacts
    if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
        raise ConfigError(
            f"Use a location outside Spark's artifact directory for {option}, {EXAMPLES}: "
            f"'{path}' is inside {root}, where Spark keeps Spark Connect sessions' files and "
            "which it deletes when the session or the server ends, table and all.")


def resolve_local(location: str, option: str) -> str | None:
    """``location`` as one plain absolute path if it is local (a path or ``file:`` URI),
    resolved where Spark resolves it in this session; ``None`` for other URIs.

    ``option`` names the location in errors (``option 'path'``,
    ``option 'checkpointLocation'``). See the module doc for the rule.
    """
    split = _split_local(location)
    if split is None:
        return None
    path, absolute = split
    if absolute:
        resolved = local_path(location)  # decodes file: URIs, refuses file://host/
    else:
        resolved = os.path.normpath(os.path.join(spark_working_dir(option, location), path))
    assert resolved is not None
    refuse_artifact_dir(resolved, option)
    return resolved


def client_path(session: object, path: str, argument: str) -> str:
    """``path`` for code that runs in the user's process (not in Spark's workers).

    On a Spark Connect client (``session`` is a Connect session or DataFrame)
    a relative local path is refused: the client's working directory is not
    the server's, where Spark resolves the same path for the write or read.
    Elsewhere a local path becomes absolute (the driver is Spark's JVM's
    process, in its working directory). Other URIs are returned as given.
    """
    split = _split_local(path)
    if split is not None and not split[1] and is_connect(session):
        raise _relative_refused(
            argument, path,
            "this Spark Connect client's working directory is not the Spark server's, where "
            "Spark resolves the same path for the job")
    return local_path(path) or path
