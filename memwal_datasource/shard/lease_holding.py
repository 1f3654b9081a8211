"""Holding a shard lease: renewed in the background until it is released.

:meth:`memwal_datasource.shard.leases.Leases.hold` returns a :class:`HeldLease`. One
scheduler thread per process renews every held lease (each a heap entry) on a
small reused pool, every TTL/3 by default. A renewal that finds the lease taken,
or cannot land before the lease expires, stops the renewals and is raised by
:meth:`HeldLease.check` as :class:`~memwal_datasource.format.lease_records.LeaseLost`.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
from concurrent import futures
from typing import Protocol

from ..errors import raised_again
from ..format.lease_records import Holder, Lease, LeaseLost

log = logging.getLogger("memwal_datasource.shard.leases")


class LeaseWriter(Protocol):
    """What a held lease needs of :class:`~memwal_datasource.shard.leases.Leases`."""

    def _now_ms(self) -> int: ...

    def renew(self, lease: Lease) -> Lease: ...

    def relabel(self, lease: Lease, holder: Holder) -> Lease: ...

    def release(self, lease: Lease) -> bool: ...


class _Renewer:
    """One scheduler thread for every held lease of this process.

    Starting a thread per lease cost each task about a millisecond; here a lease
    is a heap entry, and its renewal runs on a small reused pool, so one slow
    renewal delays no other lease's.
    """

    def __init__(self) -> None:
        self._reset()
        # A forked child has none of the parent's threads: it starts its own on first use.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, HeldLease]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._pool: futures.ThreadPoolExecutor | None = None

    def schedule(self, held: HeldLease, at: float) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._due, (at, self._seq, held))
            if self._thread is None:
                self._pool = futures.ThreadPoolExecutor(4, thread_name_prefix="lease-renewal")
                self._thread = threading.Thread(target=self._run, name="lease-renewer",
                                                daemon=True)
                self._thread.start()
            elif self._due[0][2] is held:
                # Only a new earliest entry moves the scheduler's wake-up: waking it for
                # every lease (due a TTL/3 later than the kept ones before it) handed the
                # GIL to it and back on each task's lease.
                self._cond.notify()

    def forget(self, held: HeldLease) -> None:
        """Drop ``held``'s pending renewal (it was released or abandoned).

        A stopped lease would otherwise stay in the heap until its renewal came
        due, and with it everything it holds (its store, records, locks): in a
        reused Spark worker one per task, for a TTL/3, every one of them walked by
        the collection PySpark's daemon runs after each request.
        """
        with self._cond:
            kept = [e for e in self._due if e[2] is not held]
            if len(kept) != len(self._due):
                heapq.heapify(kept)
                self._due = kept

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _at, _seq, held = heapq.heappop(self._due)
            if not held.stopped:
                try:
                    self._pool.submit(held._tick)
                except RuntimeError:  # the interpreter is shutting down: nothing to renew for
                    return


_RENEWER = _Renewer()


class HeldLease:
    """A lease kept alive in the background (every ``renew_every_s``) until :meth:`release`.

    A renewal that finds the lease taken, or that cannot land before the lease
    expires, is recorded and stops the renewals. :meth:`check` then raises it as
    :class:`LeaseLost`. Other renewal failures are logged and retried at the
    next tick.
    """

    def __init__(self, leases: LeaseWriter, lease: Lease, renew_every_s: float):
        self._leases = leases
        self._lease = lease
        self._every = renew_every_s
        self._lock = threading.Lock()
        self._busy = threading.Lock()  # held through a renewal
        self._stop = threading.Event()  # no more renewals
        self._error: LeaseLost | None = None
        self._released = False
        self.renewals = 0
        _RENEWER.schedule(self, time.monotonic() + renew_every_s)

    @property
    def stopped(self) -> bool:
        """Renewals have ended (released, abandoned, or the lease was lost)."""
        return self._stop.is_set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Wait until renewals have ended; ``True`` if they have."""
        return self._stop.wait(timeout)

    def _tick(self) -> None:
        with self._busy:
            if self._stop.is_set():
                return
            lease = self.lease
            try:
                new = self._leases.renew(lease)
            except LeaseLost as exc:
                self._fail(exc)
                return
            except Exception as exc:  # noqa: BLE001 - retried until the lease would expire
                if self._leases._now_ms() > lease.expires_ms:
                    self._fail(LeaseLost(lease.shard, lease, None,
                                         f"could not renew it before it expired: {exc}"))
                    return
                log.warning("shard %s: lease renewal failed, retrying: %s", lease.shard, exc)
            else:
                with self._lock:
                    self._lease = new
                    self.renewals += 1
        if not self._stop.is_set():
            _RENEWER.schedule(self, time.monotonic() + self._every)

    def _fail(self, exc: LeaseLost) -> None:
        with self._lock:
            self._error = exc
        self._stop.set()

    def _halt(self) -> None:
        """No more renewals; one in flight lands first."""
        self._stop.set()
        with self._busy:
            pass
        _RENEWER.forget(self)

    @property
    def lease(self) -> Lease:
        """The latest record of this lease (a new generation after each renewal)."""
        with self._lock:
            return self._lease

    @property
    def shard(self) -> str:
        """The shard this lease covers."""
        return self._lease.shard

    def check(self) -> None:
        """Raise :class:`LeaseLost` if a renewal found the lease lost."""
        with self._lock:
            error = self._error
        if error is not None:
            raise raised_again(error)

    def relabel(self, holder: Holder) -> None:
        """Name ``holder`` as the lease's holder from now on (raises :class:`LeaseLost`)."""
        self.check()
        with self._lock:
            if self._released:  # a relabel racing the release (the close's fence check failed)
                raise LeaseLost(self.shard, self._lease, None, "it was released")
            self._lease = self._leases.relabel(self._lease, holder)

    def abandon(self) -> None:
        """Stop renewing without releasing: a newer lease of ours replaced this one."""
        self._halt()
        with self._lock:
            self._released = True

    def release(self) -> bool:
        """Stop renewing and release the lease (best effort, never raises). Idempotent."""
        self._halt()
        with self._lock:
            if self._released:
                return True
            self._released = True
        # Safe even when lost: release() only touches a record with our lease_id.
        return self._leases.release(self.lease)

    def __enter__(self) -> HeldLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
