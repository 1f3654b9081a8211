"""Shard leases: keep live writers of different jobs (and tasks) off one shard.

Correctness never rests on a lease. Each writer still claims a new epoch on
the shard manifest, and that claim fences every older writer. Leases only
stop live writers from fencing each other. A stale or lost lease costs a
wait or a retry, never data.

Layout: ``_memwal_leases/{shard_id}/{generation:020d}.json``. Every state
change (acquire, renew, release) writes the next generation put-if-absent
through :func:`~memwal_datasource.store.put_resolved`. A lost acknowledgement
is read back: each body carries a random nonce, so our bytes are never taken
for a rival's. The current lease is the highest generation. An acquisition
deletes, in one request, every generation three or more below its own once
there are ``PRUNE_AT`` of them (a release or relabel deletes none, a renewal
one), so a shard's listing stays at three to ten keys and stays cheap. These
are not WAL files, so deleting them is safe.
Because of that deletion, a writer whose listing is very stale could create a
freed low generation, so an acquisition lists again afterwards and counts as
won only if nothing higher exists. A holder renewing or releasing writes its
own next generation without reading first: a rival's record there makes it
read the current one.

Rules for a lease that is live for another holder (not released, and
``now <= expires_ms``):

* same job and same partition (a retried or speculative attempt): take it
  over. The older attempt is fenced by the newer attempt's epoch claim.
* same job, other partition (a sibling task): not available, and worth
  waiting for: the sibling is running and releases the shard when its turn
  ends (a dead one's lease expires). :meth:`Leases.acquire` waits for it
  without counting the time against ``wait_s``. The caller must not hold
  another shard while it waits, or two siblings could wait for each other.
* another job: not available. :meth:`Leases.acquire` waits up to
  ``wait_s``, then raises :class:`LeaseHeld` naming the holder. Its
  ``may_wait`` predicate lets a caller refuse to wait for a given holder: a
  caller that waits while holding other shards needs wait-die there (see
  :meth:`Holder.precedes`). The Spark writer never waits while it holds a
  shard (``spark/shard_turns.py``), so no cycle of waits can form at all.

Clocks: ``expires_ms`` is set from the writer's clock and compared with the
reader's. The TTL must be well above the clock skew between hosts, and above
the pauses a holder may take between renewals. The default is 120 s, renewed
every TTL/3 by :meth:`Leases.held`. If skew makes a lease look expired too
early, two writers share a shard for a while and fence each other: a retry,
never lost data.

Hook points (:mod:`memwal_datasource.hooks`):
``lease.before_put`` (shard, generation, kind = acquire/renew/release, job_id,
partition), ``lease.acquired`` (shard, generation, job_id, partition),
``lease.renewed`` (shard, generation, expires_ms), ``lease.released`` (shard,
generation), ``lease.waiting`` (shard, job_id, partition, blocker_job_id,
waited_s: a taker found the shard, or every shard of a pool, held by another
live job and is about to wait before trying again).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from .. import hooks
from ..errors import StoreError
from ..format.lease_records import (  # noqa: F401 - the lease module's public names
    _HOLDER_FIELDS,
    _LEASE_FIELDS,
    Holder,
    Lease,
    LeaseError,
    LeaseHeld,
    LeaseLost,
    NoFreeShard,
)
from ..store import ObjectStore, put_resolved
from .lease_holding import HeldLease

log = logging.getLogger(__name__)

LEASES_DIR = "_memwal_leases"
DEFAULT_TTL_S = 120.0
KEEP_GENERATIONS = 3  # the current one and the two below it (g-2 .. g)
# An acquisition deletes old generations only once this many are three or more below it:
# one request every few acquisitions instead of one each (a kept writer's append makes two
# generations), and a listing of at most KEEP_GENERATIONS + PRUNE_AT + 1 keys.
PRUNE_AT = 6
_NAME = re.compile(r"(\d{20})\.json$")
# A lost race means a rival wrote the same generation. Between live holders
# that happens a handful of times. This only bounds a pathological livelock.
_MAX_RACES = 100


class Leases:
    """Shard leases of one table. Thread-safe: it has no mutable state of its own.

    ``clock`` returns seconds (``time.time``). ``sleep`` is what waiting
    calls. Tests inject both to move time without sleeping. ``retries`` and
    ``retry_base_delay_ms`` bound each conditional write (see
    :func:`put_resolved`).
    """

    def __init__(self, store: ObjectStore, ttl_s: float = DEFAULT_TTL_S, *,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 retries: int = 3, retry_base_delay_ms: int = 50,
                 max_backoff_s: float = 2.0):
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be positive, got {ttl_s}")
        self.store = store
        self.ttl_s = ttl_s
        self.clock = clock
        self.sleep = sleep
        self.retries = retries
        self.retry_base_delay_ms = retry_base_delay_ms
        self.max_backoff_s = max_backoff_s
        # shard: the record our last acquisition there replaced (None: no lease before)
        self.replaced: dict[str, Lease | None] = {}

    # -- reading ---------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _key(self, shard: str, generation: int) -> str:
        return f"{LEASES_DIR}/{shard}/{generation:020d}.json"

    def _generations(self, shard: str) -> list[int]:
        gens = []
        for key in self.store.list(f"{LEASES_DIR}/{shard}/"):
            m = _NAME.search(key)
            if m:
                gens.append(int(m.group(1)))
        return sorted(gens)

    def _latest(self, shard: str) -> tuple[int, Lease | None]:
        """(highest generation, its lease). A damaged body reads as no lease.

        A damaged lease keeps nobody off the shard."""
        for _ in range(_MAX_RACES):
            gens = self._generations(shard)
            if not gens:
                return 0, None
            gen = gens[-1]
            key = self._key(shard, gen)
            try:
                data = self.store.get(key)
            except FileNotFoundError:
                continue  # cleaned up after a newer generation landed: list again
            try:
                return gen, Lease.decode(data, shard, gen)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("ignoring damaged lease file %s (%d bytes): %s",
                            self.store.describe(key), len(data), exc)
                return gen, None
        raise StoreError(f"shard {shard}: lease files kept changing under {LEASES_DIR}/")

    def current(self, shard: str) -> Lease | None:
        """The shard's latest lease record (possibly released or expired), or ``None``."""
        return self._latest(_shard_id(shard))[1]

    # -- writing ---------------------------------------------------------------

    def _write(self, lease: Lease, kind: str, after: Lease | None = None,
               prove: bool = True) -> bool:
        """Put ``lease`` at its generation.

        Returns ``True`` only if it landed and is still the highest (an
        acquisition ``after`` a record read no listing first: only if that
        record's generation is still there too; without ``prove``, an acquisition's
        listing is the caller's: :meth:`prove_taken`)."""
        hooks.point("lease.before_put", shard=lease.shard, generation=lease.generation,
                    kind=kind, job_id=lease.holder.job_id, partition=lease.holder.partition)
        key = self._key(lease.shard, lease.generation)
        # No fsync: a lease only saves a fenced retry (the epoch claim is the
        # guarantee), so one lost to a power cut costs at most that retry.
        # A generation deleted before our collision could be read back was pruned by a
        # writer three or more above it: lost, whoever wrote it (never OutcomeUnknown).
        if not put_resolved(self.store, key, lease.encode(), retries=self.retries,
                            base_delay_ms=self.retry_base_delay_ms, sync=False,
                            what=f"shard {lease.shard} lease generation {lease.generation}",
                            superseded_if_gone=True):
            return False
        if kind == "acquire":
            return self._still_highest(lease, after) if prove else True
        # A holder renewing or releasing its own lease writes the next generation unread
        # (see _extend); in the rare freed slot it holds nothing, and its next renewal
        # reads the current lease (LeaseLost). Releases leave older generations to the next
        # acquisition's listing; a long-held lease's renewals each delete one.
        if kind == "renew" and lease.generation > KEEP_GENERATIONS:
            self._delete(lease.shard, [lease.generation - KEEP_GENERATIONS])
        return True

    def _still_highest(self, lease: Lease, after: Lease | None = None) -> bool:
        """An acquisition's proof, after its put landed: ``lease`` is the highest
        generation (and ``after``'s is still there). A lost one's record is deleted.

        Acquiring follows a listing, which may be stale: list again, so a writer that
        filled a freed generation below the current one never thinks it won.
        """
        hooks.point("lease.proving", shard=lease.shard, generation=lease.generation,
                    job_id=lease.holder.job_id, partition=lease.holder.partition)
        gens = self._generations(lease.shard)
        if (gens and gens[-1] > lease.generation) or (
                after is not None and after.generation not in gens):
            self._delete(lease.shard, [lease.generation])  # our stray record
            return False
        # Generations KEEP_GENERATIONS and more below ours go, in one request, once
        # there are PRUNE_AT of them.
        stale = [g for g in gens if g <= lease.generation - KEEP_GENERATIONS]
        if len(stale) >= PRUNE_AT:
            self._delete(lease.shard, stale)
        return True

    def _delete(self, shard: str, generations: Iterable[int]) -> None:
        gens = list(generations)
        if not gens:
            return
        try:
            self.store.delete_many([self._key(shard, gen) for gen in gens])
        except (StoreError, OSError) as exc:  # history only; the next writer retries
            log.debug("shard %s: could not delete lease generations %s: %s", shard, gens, exc)

    def _verdict(self, cur: Lease | None, holder: Holder, now_ms: int) -> str:
        if cur is None or not cur.live(now_ms) or cur.holder.kept:
            return "free"
        if cur.holder.job_id == holder.job_id and cur.holder.partition == holder.partition:
            return "takeover"
        return "busy"  # another job, or a sibling task of this job

    def _try(self, shard: str, holder: Holder) -> tuple[Lease | None, Lease | None]:
        """(our new lease, None), or (None, the live lease that keeps us off)."""
        for _ in range(_MAX_RACES):
            gen, cur = self._latest(shard)
            now = self._now_ms()
            verdict = self._verdict(cur, holder, now)
            if verdict == "busy":
                return None, cur
            if verdict == "takeover":
                log.info("shard %s: %s takes the lease over from %s (an earlier attempt)",
                         shard, holder.describe(), cur.describe() if cur else "?")
            new = self._new_lease(shard, gen + 1, holder, now)
            if self._write(new, "acquire"):
                return self._acquired(new, cur), None
        raise StoreError(f"shard {shard}: gave up taking a lease after {_MAX_RACES} races")

    def _new_lease(self, shard: str, generation: int, holder: Holder, now_ms: int) -> Lease:
        """A new acquisition's record at ``generation``, a TTL from ``now_ms``."""
        return Lease(shard=shard, generation=generation, holder=holder,
                     lease_id=uuid.uuid4().hex, acquired_ms=now_ms,
                     expires_ms=now_ms + int(self.ttl_s * 1000), nonce=uuid.uuid4().hex)

    def _acquired(self, new: Lease, replaced: Lease | None) -> Lease:
        """``new`` landed and won, replacing ``replaced``: remember it, announce it."""
        self.replaced[new.shard] = replaced
        hooks.point("lease.acquired", shard=new.shard, generation=new.generation,
                    job_id=new.holder.job_id, partition=new.holder.partition)
        return new

    def take_after(self, record: Lease, holder: Holder, *, prove_later: bool = False
                   ) -> Lease | None:
        """Take ``record``'s shard, believing ``record`` (one this process wrote: a kept
        writer's idle lease) is still its current record; ``None`` (nothing held) if not.

        One put at the next generation and the listing every acquisition makes,
        no read first. The listing is the proof: ours is the highest generation
        and ``record``'s is still there. A generation is deleted only once one
        three above it exists, and the highest never, so nothing came between.
        (A table made anew at the path breaks that: the caller checks the table.)

        With ``prove_later`` only the put is made here: the lease is held only once
        :meth:`prove_taken` says so (the caller lists while it does other work, and
        must not report success before; correctness never rests on a lease).
        """
        now = self._now_ms()
        if self._verdict(record, holder, now) != "free":
            return None
        new = self._new_lease(record.shard, record.generation + 1, holder, now)
        if not self._write(new, "acquire", after=record, prove=not prove_later):
            return None
        return self._acquired(new, record)

    def prove_taken(self, lease: Lease, record: Lease) -> bool:
        """The listing :meth:`take_after` deferred: ``True`` if ``lease``, put right
        after ``record``, holds the shard; else its record is deleted."""
        return self._still_highest(lease, record)

    def try_acquire(self, shard: str, holder: Holder) -> Lease | None:
        """Take the shard's lease now, or return ``None`` if another live holder has it.

        See :meth:`try_take`.
        """
        return self.try_take(shard, holder)[0]

    def try_take(self, shard: str, holder: Holder) -> tuple[Lease | None, Lease | None]:
        """``(our new lease, None)`` now, or ``(None, the live lease that keeps us off)``.

        The blocker is another job's or a sibling task's (same job, other
        partition). Takes over a lease of the same job and partition (an
        earlier attempt), and any expired or released lease. Never waits.
        """
        return self._try(_shard_id(shard), holder)

    def _backoff(self) -> Iterator[float]:
        delay = 0.05
        while True:
            yield delay
            delay = min(delay * 2, self.max_backoff_s)

    def acquire(self, shard: str, holder: Holder, wait_s: float = 0.0,
                may_wait: Callable[[Lease], str] | None = None) -> Lease:
        """Take the shard's lease; wait up to ``wait_s`` (capped backoff) while another job has it.

        Raises :class:`LeaseHeld` (naming the holder, the shard and the wait)
        when the wait ends. A sibling task's lease (same job, other
        partition) is waited for without counting against ``wait_s``: the
        sibling releases it when its turn ends, a dead one's expires. The
        caller must hold no other shard meanwhile (siblings could otherwise
        wait for each other). ``may_wait(blocker)`` is asked before every wait
        for another job: a non-empty answer (why not, and what to do instead)
        raises :class:`LeaseHeld` with it at once.
        """
        shard = _shard_id(shard)
        start = self.clock()
        sibling_s = 0.0  # time spent waiting for this job's own tasks: not bounded by wait_s
        for delay in self._backoff():
            lease, blocker = self._try(shard, holder)
            if lease is not None:
                return lease
            assert blocker is not None
            if blocker.holder.job_id == holder.job_id:
                self._waiting(shard, holder, blocker, start)
                t0 = self.clock()
                self.sleep(delay)
                sibling_s += self.clock() - t0
                continue
            refusal = may_wait(blocker) if may_wait is not None else ""
            if refusal:
                raise LeaseHeld(shard, blocker, self.clock() - start, fix=refusal)
            left = start + sibling_s + wait_s - self.clock()
            if left <= 0:
                raise LeaseHeld(shard, blocker, self.clock() - start)
            self._waiting(shard, holder, blocker, start)
            self.sleep(min(delay, left))
        raise AssertionError("unreachable")

    def _waiting(self, shard: str, holder: Holder, blocker: Lease | None, start: float) -> None:
        hooks.point("lease.waiting", shard=shard, job_id=holder.job_id,
                    partition=holder.partition,
                    blocker_job_id=blocker.holder.job_id if blocker else None,
                    waited_s=self.clock() - start)

    def pick_free(self, shards: Iterable[str], holder: Holder, wait_s: float = 0.0
                  ) -> tuple[str, Lease]:
        """Lease the first shard (in the given preference order) no other live writer holds.

        Shards held by sibling tasks or other jobs are skipped. A shard leased by
        an earlier attempt of this job and partition is taken over. Each shard
        is atomic: of concurrent takers exactly one gets it, and the others
        move on. If every shard is held, it waits up to ``wait_s``, then raises
        :class:`NoFreeShard`.
        """
        order = [_shard_id(s) for s in shards]
        if not order:
            raise ValueError("pick_free needs at least one shard")
        start = self.clock()
        for delay in self._backoff():
            blockers: list[Lease] = []
            for shard in order:
                lease, blocker = self._try(shard, holder)
                if lease is not None:
                    return shard, lease
                blockers.append(blocker)
            left = start + wait_s - self.clock()
            if left <= 0:
                raise NoFreeShard(order, blockers, self.clock() - start)
            self._waiting(order[0], holder, blockers[0] if blockers else None, start)
            self.sleep(min(delay, left))
        raise AssertionError("unreachable")

    def renew(self, lease: Lease) -> Lease:
        """Extend ``lease`` by a TTL from now. Returns the new record.

        Raises :class:`LeaseLost` if another holder took the shard or the
        lease was released. A renewal that landed although its
        acknowledgement was lost is recognised by ``lease_id`` and renewed on.
        """
        new = self._extend(lease, "renew")
        hooks.point("lease.renewed", shard=new.shard, generation=new.generation,
                    expires_ms=new.expires_ms)
        return new

    def relabel(self, lease: Lease, holder: Holder) -> Lease:
        """``lease`` renewed under ``holder`` (same acquisition): who holds it now.

        A kept writer's lease names the kept writer, in use or idle
        (``holder.kept``). Raises :class:`LeaseLost` as :meth:`renew` does.
        """
        return self._extend(lease, "relabel", holder)

    def _put_after(self, base: Lease, generation: int, kind: str, **changes) -> Lease | None:
        """``base`` with ``changes`` written at ``generation + 1`` (a fresh nonce); the new
        record, or ``None`` if another record holds that generation."""
        new = dataclasses.replace(base, generation=generation + 1, nonce=uuid.uuid4().hex,
                                  **changes)
        return new if self._write(new, kind) else None

    def _extend(self, lease: Lease, kind: str, holder: Holder | None = None) -> Lease:
        """The next generation of ``lease``'s acquisition, a TTL from now (``holder``: named
        as its holder from now on)."""
        shard = lease.shard
        # We know our generation: write the next one unread (a race lost to another
        # holder reads the current one below).
        base, gen = lease, lease.generation
        for _ in range(_MAX_RACES):
            if not base.released:
                new = self._put_after(base, gen, kind, holder=holder or base.holder,
                                      expires_ms=self._now_ms() + int(self.ttl_s * 1000))
                if new is not None:
                    return new
            gen, base = self._latest(shard)
            if base is None or base.lease_id != lease.lease_id or base.released:
                raise LeaseLost(shard, lease, base)
        raise StoreError(f"shard {shard}: gave up {kind}ing a lease after {_MAX_RACES} races")

    def release(self, lease: Lease) -> bool:
        """Mark ``lease`` released so others can take the shard at once. Best effort.

        Returns ``True`` when a released record is current. It never raises:
        a release that fails leaves a lease that expires at ``expires_ms``, and
        a retry of the same job and partition takes it over at once.
        """
        shard = lease.shard
        try:
            base, gen = lease, lease.generation  # first unread, as _extend
            for _ in range(_MAX_RACES):
                if not base.released:
                    new = self._put_after(base, gen, "release", released=True,
                                          expires_ms=self._now_ms())
                    if new is not None:
                        hooks.point("lease.released", shard=shard, generation=new.generation)
                        return True
                gen, base = self._latest(shard)
                if base is None or base.lease_id != lease.lease_id:
                    return False  # someone else holds it now: nothing of ours to release
                if base.released:
                    return True
            return False
        except Exception as exc:  # noqa: BLE001 - releasing is best effort by contract
            log.warning("shard %s: could not release the lease of %s (it expires by itself): %s",
                        shard, lease.holder.describe(), exc)
            return False

    # -- holding -----------------------------------------------------------------

    def hold(self, lease: Lease, renew_every_s: float | None = None) -> HeldLease:
        """Keep ``lease`` alive in the background (every TTL/3 by default)."""
        return HeldLease(self, lease, renew_every_s or self.ttl_s / 3)

    @contextmanager
    def held(self, shard: str, holder: Holder, wait_s: float = 0.0,
             renew_every_s: float | None = None) -> Iterator[HeldLease]:
        """``acquire`` the shard, renew it in the background, release it on exit."""
        with self.hold(self.acquire(shard, holder, wait_s), renew_every_s) as held:
            yield held

    @contextmanager
    def held_free(self, shards: Iterable[str], holder: Holder, wait_s: float = 0.0,
                  renew_every_s: float | None = None) -> Iterator[HeldLease]:
        """``pick_free`` a shard of the pool, renew it in the background, release it on exit."""
        _shard, lease = self.pick_free(shards, holder, wait_s)
        with self.hold(lease, renew_every_s) as held:
            yield held


def _shard_id(shard: str) -> str:
    try:
        return str(uuid.UUID(str(shard)))
    except ValueError:
        raise ValueError(f"'{shard}' is not a shard id (a UUID)") from None
