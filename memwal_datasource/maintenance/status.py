"""What the last compaction and gc did, kept in the table for any process to read.

``_memwal_maintenance/status.json`` holds one entry per operation
(``compaction``, ``gc``, and ``maintainer`` for a pass as a whole): when the last
run started, how long it took, what it did, which process ran it, and the last
error (kept after a later success, with
``failing`` saying whether the newest run failed). The automatic maintainer
(:mod:`memwal_datasource.maintenance.auto`) writes it while it holds the
maintainer lease, so there is one writer at a time; ``memwal compact`` and
``memwal gc`` run by hand write it too (a read-modify-write that a maintainer
writing at the same moment may overwrite: it is a report, never a decision).
Garbage collection never deletes it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

from ..store import ObjectStore

log = logging.getLogger(__name__)

MAINTENANCE_DIR = "_memwal_maintenance"
STATUS_KEY = f"{MAINTENANCE_DIR}/status.json"
OPERATIONS = ("compaction", "gc", "maintainer")


def whoami() -> str:
    """This process, as the status names it."""
    return f"{socket.gethostname()} pid {os.getpid()}"


def read_status(store: ObjectStore) -> dict[str, Any]:
    """The stored status (``{}`` when none was written or it is unreadable)."""
    try:
        body = json.loads(store.get(STATUS_KEY))
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        log.warning("ignoring damaged maintenance status %s: %s", store.describe(STATUS_KEY), exc)
        return {}
    return body if isinstance(body, dict) else {}


def record(store: ObjectStore, operation: str, started: float, seconds: float,
           result: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
    """Store the outcome of one ``operation`` run (best effort: a report never fails work).

    ``started`` is ``time.time()`` at its start; ``result`` what it did (kept from
    the last success when ``error`` is given).
    """
    if operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {OPERATIONS}, got {operation!r}")
    try:
        status = read_status(store)
        entry = dict(status.get(operation) or {})
        entry.update(started_ms=int(started * 1000), seconds=round(seconds, 3), by=whoami(),
                     failing=error is not None)
        if error is None:
            entry["result"] = result or {}
            entry["ok_ms"] = int((started + seconds) * 1000)
        else:
            entry["last_error"] = f"{type(error).__name__}: {error}"[:2000]
            entry["last_error_ms"] = int(time.time() * 1000)
        status[operation] = entry
        store.put(STATUS_KEY, json.dumps(status, sort_keys=True).encode())
    except Exception as exc:  # noqa: BLE001 - a report must not fail the work it reports
        log.warning("could not record the %s status in %s: %s", operation,
                    store.describe(STATUS_KEY), exc)
