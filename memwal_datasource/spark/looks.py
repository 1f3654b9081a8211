"""A batch job's commit look, made on the driver while the job's tasks run.

A commit's first look (the next record number, and whether intents are
pending: :meth:`~memwal_datasource.log.commit.CommitLog.look`) does not depend
on what the tasks write, so on an object store the driver makes it when the job
is planned, beside the tasks, and the commit starts with its PUT: one round trip
less on the commit's path. A look is only ever staler than a fresh one, never
wrong (docs/protocol.md, "Committing at scale"); the commit uses it only when
nobody else had committed since this process's previous commit, and looks again
otherwise.

Looks are kept here, by job id, because the writer object is pickled to the
executors; a job that neither commits nor aborts leaves at most :data:`KEPT`.
Only where the commit runs in the process that planned the job (the writer's
code called in-process, as the benchmarks' in-process appends do): Spark plans
a write in one kind of Python worker and commits it in another, so in a Spark
worker no look is made ahead (it would cost its requests for nothing) and the
commit looks for itself.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

from ..log.commit import CommitLog, Look
from ..store import beside, open_store
from .options import WriteOptions
from .worker_heap import in_spark_worker

log = logging.getLogger(__name__)

Ahead = tuple[CommitLog, "Future[Look]"]
KEPT = 64

_LOOKS: dict[str, Ahead] = {}
_LOCK = threading.Lock()


def start(job_id: str, opts: WriteOptions) -> None:
    """Start job ``job_id``'s commit look, on an object store, for an unsharded table."""
    if opts.sharding is not None or in_spark_worker():
        return
    try:
        commits = CommitLog(open_store(opts.path, opts.storage))
        if not commits.store.remote:
            return  # a local look costs no round trip worth saving
        ahead = (commits, beside(commits.store, commits.look))
    except Exception as exc:  # noqa: BLE001 - the commit looks for itself
        log.debug("memwal job %s: no commit look ahead: %s", job_id, exc)
        return
    with _LOCK:
        while len(_LOOKS) >= KEPT:
            del _LOOKS[next(iter(_LOOKS))]
        _LOOKS[job_id] = ahead


def take(job_id: str) -> Ahead | None:
    """Job ``job_id``'s look, if one was started (each is taken once)."""
    with _LOCK:
        return _LOOKS.pop(job_id, None)


def result(ahead: Ahead | None) -> tuple[CommitLog | None, Look | None]:
    """The log the look was made on and the look, or ``(None, None)`` when there is none
    or it failed (the commit then looks for itself)."""
    if ahead is None:
        return None, None
    commits, future = ahead
    try:
        return commits, future.result()
    except Exception as exc:  # noqa: BLE001 - a store error: the commit looks again
        log.debug("memwal: the commit look made ahead failed: %s", exc)
        return None, None
