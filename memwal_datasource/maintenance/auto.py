"""Automatic maintenance: compaction rounds, then gc, when the backlog passes a threshold.

One **pass** (:func:`maintain_once`) reads the cheap backlog
(:func:`~memwal_datasource.maintenance.backlog.backlog` with ``full=False``),
and when a :class:`~memwal_datasource.maintenance.thresholds.Thresholds` bound is
passed (or gc is due) takes the table's **maintainer lease**, runs
:func:`~memwal_datasource.maintenance.compact.compact` (at most ``max_rounds``
rounds) and then :func:`~memwal_datasource.maintenance.gc.collect`, recording each
outcome in the table (:mod:`memwal_datasource.maintenance.status`).

**One maintainer per table.** The lease is a shard lease
(:mod:`memwal_datasource.shard.leases`) on the fixed id :data:`MAINTAINER_LEASE`
(no shard has it, so no writer or gc ever takes it), renewed in the background
while a pass runs and checked between rounds. A pass that finds it held does
nothing. Correctness never rests on it: compaction and gc are exactly once and
crash-safe among themselves, so the lease only saves duplicate work. A maintainer
killed mid-round leaves its lease to expire (``lease_ttl_s``); the next one then
finishes the round from its intent, as any compactor does.

**In the background** (:class:`BackgroundMaintainer`, :func:`nudge`): one daemon
thread per table and process, woken by a commit and looking at the backlog at
most every ``check_every_s``; its passes run in one child process at the lowest
CPU priority (:mod:`memwal_datasource.maintenance.child`: Lance's compaction
threads then yield to the writers'). It never blocks the caller, and a failing
pass is logged, recorded in the status (so the backlog shows it) and retried
later with backoff. A thread left without nudges and with
nothing pending ends by itself.

Hook points (:mod:`memwal_datasource.hooks`): ``maintain.leased`` (uri, label),
``maintain.round`` (uri, round, remaining), ``maintain.gc`` (uri),
``maintain.released`` (uri, label), ``maintain.pass`` (uri, result).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .. import hooks
from ..shard.leases import Holder, Leases
from ..table.view import TableView
from . import status
from .backlog import Backlog, backlog
from .child import ChildPasses
from .compact import CompactionSummary, compact
from .gc import GcPlan, collect
from .thresholds import Thresholds

log = logging.getLogger(__name__)

# The lease every maintainer of a table takes (a UUID, as lease ids are; never a shard's).
MAINTAINER_LEASE = str(uuid.uuid5(uuid.NAMESPACE_URL, "memwal:maintainer"))
IDLE_EXIT_S = 600.0  # a background thread without nudges and backlog ends after this
MAX_BACKOFF_S = 600.0


@dataclass
class PassResult:
    """What one pass found and did."""

    uri: str
    before: Backlog | None = None
    reason: str = ""  # why compaction ran ("" when it did not)
    gc_due: bool = False
    busy_by: str | None = None  # the maintainer holding the lease, when it was not ours
    compaction: CompactionSummary | None = None
    gc: GcPlan | None = None
    error: BaseException | None = None
    seconds: float = 0.0
    stopped: bool = False  # asked to stop: it ended between two rounds


    @property
    def ran(self) -> bool:
        """Whether this pass held the lease and worked."""
        return self.compaction is not None or self.gc is not None

    def line(self) -> str:
        """The pass as one progress/log line."""
        head = self.before.describe() if self.before is not None else "backlog unknown"
        parts = [head]
        if self.busy_by:
            parts.append(f"another maintainer works on it ({self.busy_by})")
        if self.compaction is not None:
            c = self.compaction
            parts.append(f"compacted {len(c.rounds)} round(s), {c.rows:,} rows ({self.reason}); "
                         f"{c.pending_records} record(s) left")
        if self.gc is not None:
            g = self.gc
            parts.append(f"gc deleted {len(g.items())} object(s), {g.bytes:,} bytes")
        if self.stopped:
            parts.append("stopped between rounds, as asked")
        if self.error is not None:
            parts.append(f"FAILED: {type(self.error).__name__}: {self.error}")
        if not (self.ran or self.busy_by or self.stopped or self.error):
            parts.append("nothing to do (below the thresholds)")
        return f"{self.uri}: " + "; ".join(parts) + f" [{self.seconds:.1f}s]"


def _gc_due(before: Backlog, thresholds: Thresholds, force: bool, now: float) -> bool:
    """gc without compaction first: on a table a maintainer compacted before (its
    retention may have passed since), at most every ``gc_every_s``. A table nobody
    maintains automatically is collected only after a pass compacts it."""
    if not before.compacted_round:
        return False  # nothing compacted: nothing gc could release
    if force:
        return True
    done = before.maintenance
    if "compaction" not in done:
        return False
    last = (done.get("gc") or {}).get("started_ms")
    return last is None or now * 1000 - last >= thresholds.gc_every_s * 1000


class _Stop(Exception):
    """Asked to stop: raised between two rounds, never inside one."""


def maintain_once(table: TableView, thresholds: Thresholds = Thresholds(), *,
                  force: bool = False, label: str = "memwal maintainer",
                  leases: Leases | None = None, stop: threading.Event | None = None,
                  gc_clock: Callable[[], int] | None = None) -> PassResult:
    """One pass: compaction (if a threshold is passed, or ``force`` and anything is
    pending), then gc (if due), under the maintainer lease. Never raises an
    ``Exception``: the result carries it (and the table's status records it).
    ``stop`` set ends the pass at the next point between rounds (before gc too);
    ``leases`` and ``gc_clock`` (gc's store clock, ms) let tests move time."""
    t0 = time.time()
    out = PassResult(table.uri)
    try:
        out.before = before = backlog(table, full=False)
        out.reason = thresholds.passed(before.pending_records, before.pending_bytes,
                                       before.oldest_pending_age_s)
        if force and before.pending_records and not out.reason:
            out.reason = "asked to (--force)"
        out.gc_due = _gc_due(before, thresholds, force, t0)
        if out.reason or out.gc_due:
            _leased_pass(table, thresholds, out, label, leases, stop, gc_clock)
            if out.ran and not out.stopped:
                status.record(table.store, "maintainer", t0, time.time() - t0,
                              {"reason": out.reason or "gc due", "label": label})
    except _Stop:
        out.stopped = True
    except Exception as exc:  # noqa: BLE001 - a pass reports; its caller decides
        out.error = exc
        status.record(table.store, "maintainer", t0, time.time() - t0, error=exc)
    out.seconds = time.time() - t0
    _report(out)
    return out


def _report(out: PassResult) -> None:
    """A pass's log line (a warning when it failed) and its hook point."""
    log.log(logging.WARNING if out.error else logging.INFO if out.ran else logging.DEBUG,
            "memwal maintenance %s", out.line())
    hooks.point("maintain.pass", uri=out.uri, result=out)


def _leased_pass(table: TableView, thresholds: Thresholds, out: PassResult, label: str,
                 leases: Leases | None, stop: threading.Event | None,
                 gc_clock: Callable[[], int] | None) -> None:
    leases = leases or Leases(table.store, ttl_s=thresholds.lease_ttl_s)
    holder = Holder(job_id=f"maintainer-{uuid.uuid4().hex}", partition=-1, label=label,
                    job_started_ms=int(time.time() * 1000))
    lease, blocker = leases.try_take(MAINTAINER_LEASE, holder)
    if lease is None:
        out.busy_by = blocker.holder.describe() if blocker is not None else "?"
        return
    hooks.point("maintain.leased", uri=table.uri, label=label)
    try:
        with leases.hold(lease) as held:
            if out.reason:
                out.compaction = _timed(table, "compaction", lambda: compact(
                    table, max_rounds=thresholds.max_rounds,
                    max_records_per_round=thresholds.max_records_per_round,
                    progress=lambda r, left: _between_rounds(table, held, r.number, left,
                                                             stop)), _compaction_json)
                out.gc_due = out.gc_due or bool(out.compaction.rounds)
            if out.gc_due:
                held.check()
                if stop is not None and stop.is_set():
                    raise _Stop
                hooks.point("maintain.gc", uri=table.uri)
                out.gc = _timed(table, "gc", lambda: collect(
                    table, retain_seconds=thresholds.gc_retain_s, clock=gc_clock), _gc_json)
    finally:
        hooks.point("maintain.released", uri=table.uri, label=label)


def _between_rounds(table: TableView, held, number: int, remaining: int,
                    stop: threading.Event | None) -> None:
    held.check()  # a lost lease stops the pass here (another maintainer took over)
    hooks.point("maintain.round", uri=table.uri, round=number, remaining=remaining)
    if stop is not None and stop.is_set() and remaining:
        raise _Stop


def _timed(table: TableView, operation: str, run: Callable, as_json: Callable):
    t0 = time.time()
    try:
        result = run()
    except _Stop:
        raise
    except Exception as exc:
        status.record(table.store, operation, t0, time.time() - t0, error=exc)
        raise
    status.record(table.store, operation, t0, time.time() - t0, as_json(result))
    return result


def _compaction_json(s: CompactionSummary) -> dict:
    return {"rounds": len(s.rounds), "rows": s.rows,
            "records": sum(r.upto_seq - r.after_seq for r in s.rounds),
            "committed_rounds": sum(r.committed for r in s.rounds),
            "pending_records_after": s.pending_records}


def _gc_json(g: GcPlan) -> dict:
    return {"deleted_objects": len(g.items()), "deleted_bytes": g.bytes,
            "wal_entries": sum(len(s.entries) for s in g.shards),
            "commit_records": len(g.records), "gc_record": g.gc_sequence,
            "skipped_busy_shards": len(g.skipped_busy), "kept": g.kept_reason()}


# --- in the background of a long-lived process --------------------------------------

class BackgroundMaintainer:
    """A daemon thread running passes over one table when nudged (see the module doc)."""

    def __init__(self, uri: str, storage: Mapping[str, str] | None, thresholds: Thresholds,
                 label: str = "memwal auto maintainer",
                 on_exit: Callable[[BackgroundMaintainer], None] | None = None,
                 isolated: bool = True):
        self.uri = uri
        # Passes in a child process at the lowest priority (maintenance/child.py); in
        # this thread with ``isolated=False`` (tests that hook into a pass).
        self._child = ChildPasses() if isolated else None
        self.storage = dict(storage or {})
        self.thresholds = thresholds
        self.label = label
        self.last: PassResult | None = None
        self.passes = 0
        self.failures = 0
        self._on_exit = on_exit
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._nudged = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"memwal-maintainer {uri}",
                                        daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def nudge(self) -> None:
        """A commit landed: look at the backlog soon (never blocks)."""
        self._nudged = time.monotonic()
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """End the thread after its current pass (a pass is safe to abandon anyway)."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        _lower_priority()
        next_at = 0.0
        try:
            while not self._stopping.is_set():
                self._wake.wait(self.thresholds.check_every_s)
                self._wake.clear()
                idle = time.monotonic() - self._nudged > IDLE_EXIT_S
                if idle and self.last is not None and self.last.error is None and not (
                        self.last.before and self.last.before.pending_records):
                    return
                wait = next_at - time.monotonic()
                if wait > 0 and self._stopping.wait(wait):
                    return
                self.last = result = self._pass()
                self.passes += 1
                self.failures = self.failures + 1 if result.error is not None else 0
                # Failing: back off (10 s, 20 s, ... 10 min); the stream goes on regardless.
                next_at = time.monotonic() + min(MAX_BACKOFF_S, self.thresholds.check_every_s
                                                 * (2 ** min(self.failures, 10)))
        except BaseException as exc:  # noqa: BLE001 - a thread's last word is a log line
            log.warning("memwal maintainer of %s stopped: %s", self.uri, exc)
        finally:
            if self._child is not None:
                self._child.close()
            if self._on_exit is not None:
                self._on_exit(self)

    def _pass(self) -> PassResult:
        if self._child is None:
            # A fresh view each pass: the path may have been dropped and created again
            # since (a view caches the dataset and the log it read).
            return maintain_once(TableView(self.uri, self.storage), self.thresholds,
                                 label=self.label)
        try:
            result = self._child.run(self.uri, self.storage, self.thresholds, self.label)
        except Exception as exc:  # noqa: BLE001 - a pass reports; the thread tries again
            result = PassResult(self.uri, error=exc)
        _report(result)  # the child's log lines and hooks stay in the child: said here
        return result


def _lower_priority() -> None:
    """This thread (Linux: one thread's nice value) yields the CPU to the writers; Lance's
    worker threads created from it inherit that."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


_running: dict[str, BackgroundMaintainer] = {}
_lock = threading.Lock()


def _registry_key(uri: str, storage: Mapping[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(sorted(storage.items())).encode()).hexdigest()[:16]
    return f"{uri}|{digest}"


def _forget(m: BackgroundMaintainer) -> None:
    with _lock:
        key = _registry_key(m.uri, m.storage)
        if _running.get(key) is m:
            del _running[key]


def nudge(uri: str, storage: Mapping[str, str] | None = None,
          thresholds: Thresholds = Thresholds(), isolated: bool = True) -> BackgroundMaintainer:
    """Start this process's background maintainer of ``uri`` (once) and wake it."""
    storage = dict(storage or {})
    key = _registry_key(uri, storage)
    with _lock:
        m = _running.get(key)
        if m is None or not m.alive or m._stopping.is_set():  # noqa: SLF001
            m = _running[key] = BackgroundMaintainer(uri, storage, thresholds, on_exit=_forget,
                                                     isolated=isolated)
        m.thresholds = thresholds  # the newest writer's settings
    m.nudge()
    return m


def stop_all(timeout: float | None = None) -> None:
    """Stop every background maintainer of this process (tests, clean shutdowns)."""
    with _lock:
        running = list(_running.values())
        _running.clear()
    for m in running:
        m.stop(timeout)


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    _running.clear()  # a forked child has none of the parent's threads


os.register_at_fork(after_in_child=_after_fork)
