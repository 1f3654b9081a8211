"""Shard leases: the rules, races between threads and processes, lost acknowledgements,
renewal, and a kill -9'd holder. The core tests run on memory, local disk and S3."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from memwal_datasource import hooks
from memwal_datasource.errors import OutcomeUnknown
from memwal_datasource.shard.leases import (
    LEASES_DIR,
    PRUNE_AT,
    HeldLease,
    Holder,
    Lease,
    LeaseHeld,
    LeaseLost,
    Leases,
    NoFreeShard,
)
from memwal_datasource.store import MemoryStore, open_store
from tests.fault_proxy import FaultRule
from tests.helpers import DelegatingStore, FlakyStore, new_shard

REPO = Path(__file__).resolve().parents[2]
TTL = 10.0
LEASE_KEY = r"/_memwal_leases/[0-9a-f-]{36}/\d{20}\.json$"


class FakeClock:
    """Seconds since the epoch, moved only by the test (or by :meth:`sleep`)."""

    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t
        self.sleeps: list[float] = []
        self.on_sleep = None

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))


def job(job_id: str, partition: int = 0, attempt: int = 0) -> Holder:
    return Holder(job_id, partition, attempt, label=f"job {job_id}")


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mem():
    name = uuid.uuid4().hex
    yield MemoryStore(name)
    MemoryStore.reset(name)


def leases_on(store, clock: FakeClock, ttl: float = TTL, **kw) -> Leases:
    return Leases(store, ttl_s=ttl, clock=clock, sleep=clock.sleep, retry_base_delay_ms=1, **kw)


def lease_keys(store, shard: str) -> list[str]:
    return sorted(store.list(f"{LEASES_DIR}/{shard}/"))


# -- the rules, on every store ------------------------------------------------------


def test_free_shard_gets_generation_one_with_everything_recorded(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    assert leases.current(shard) is None
    holder = Holder("j1", 3, attempt=1, label="stream q batch 7")
    lease = leases.try_acquire(shard, holder)
    assert lease is not None and lease.generation == 1 and lease.holder == holder
    assert lease.expires_ms == int(clock.t * 1000) + int(TTL * 1000) and not lease.released
    assert lease_keys(any_store, shard) == [f"{LEASES_DIR}/{shard}/{1:020d}.json"]
    assert leases.current(shard) == lease  # the body round-trips, nonce included
    body = json.loads(any_store.get(f"{LEASES_DIR}/{shard}/{1:020d}.json"))
    assert body["holder"]["host"] == holder.host and body["holder"]["pid"] == os.getpid()
    assert len(body["nonce"]) == 32


def test_another_job_is_kept_off_until_release(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    a = leases.try_acquire(shard, job("A"))
    assert leases.try_acquire(shard, job("B")) is None
    with pytest.raises(LeaseHeld) as err:
        leases.acquire(shard, job("B"), wait_s=0)
    assert shard in str(err.value) and "'job A'" in str(err.value)
    assert a.holder.host in str(err.value) and err.value.holder == a.holder
    assert leases.release(a)
    released = leases.current(shard)
    assert released.released and released.generation == 2 and released.lease_id == a.lease_id
    b = leases.try_acquire(shard, job("B"))
    assert b is not None and b.generation == 3 and leases.current(shard) == b


def test_expired_lease_is_taken_and_its_holder_loses_it(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    a = leases.try_acquire(shard, job("A"))
    clock.advance(TTL)  # exactly at expiry: still live
    assert leases.try_acquire(shard, job("B")) is None
    clock.advance(0.001)
    b = leases.try_acquire(shard, job("B"))
    assert b is not None
    with pytest.raises(LeaseLost, match="taken by 'job B'") as err:
        leases.renew(a)
    assert err.value.by == b
    assert not leases.release(a)  # a's release leaves b's lease alone
    assert leases.current(shard) == b


def test_same_job_and_partition_takes_over_at_once(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    first = leases.try_acquire(shard, job("J", 2, attempt=0))
    retry = leases.acquire(shard, job("J", 2, attempt=1), wait_s=0)
    assert retry.generation == first.generation + 1 and retry.holder.attempt == 1
    with pytest.raises(LeaseLost):
        leases.renew(first)
    assert not leases.release(first)
    assert leases.current(shard) == retry


def test_a_sibling_partition_is_waited_for_beyond_wait_s_until_it_releases(any_store, clock):
    """A sibling task (same job, other partition) is running and ends its turn: waiting
    for it is not bounded by wait_s (another job's holder would be, see below)."""
    leases = leases_on(any_store, clock)
    shard = new_shard()
    sibling = leases.try_acquire(shard, job("J", 0))
    lease, blocker = leases.try_take(shard, job("J", 1))
    assert lease is None and blocker == sibling
    waits = []

    def sibling_ends_its_turn(**context):
        waits.append(context["blocker_job_id"])
        if len(waits) == 6:
            leases.release(sibling)

    hooks.register("lease.waiting", sibling_ends_its_turn)
    got = leases.acquire(shard, job("J", 1), wait_s=0.1)
    assert got.holder.partition == 1 and waits == ["J"] * 6
    assert sum(clock.sleeps) > 0.1  # past wait_s: only other jobs' time counts


def test_renew_extends_the_lease_and_history_stays_small(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    lease = leases.try_acquire(shard, job("A"))
    for _ in range(8):
        clock.advance(TTL * 0.9)
        lease = leases.renew(lease)
        assert leases.try_acquire(shard, job("B")) is None  # kept alive past many TTLs
    assert lease.generation == 9 and lease.expires_ms == int(clock.t * 1000) + int(TTL * 1000)
    assert leases.release(lease)
    for i in range(5):
        leases.release(leases.try_acquire(shard, job(f"C{i}")))
    # Renewals deleted 1..6 (each the one three below it). Acquisitions at 11, 13, 15, 17
    # and 19 delete the generations three or more below them once there are PRUNE_AT (6)
    # of those: only the one at 15 did (7..12); releases delete none.
    assert PRUNE_AT == 6
    assert lease_keys(any_store, shard) == [
        f"{LEASES_DIR}/{shard}/{g:020d}.json" for g in range(13, 21)]


def meet_at_first_put(n: int) -> set[int]:
    """Hold each thread's first lease PUT until ``n`` threads are about to write."""
    ready = threading.Barrier(n, timeout=30)
    seen: set[int] = set()

    def meet(kind, **_):
        if kind == "acquire" and threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            ready.wait()

    hooks.register("lease.before_put", meet)
    return seen


def test_two_threads_race_for_one_shard_exactly_one_wins(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    seen = meet_at_first_put(2)
    results: dict[str, Lease | None] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(
        n, leases.try_acquire(shard, job(n)))) for n in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == 2  # both really wrote generation 1 at the same time
    winners = [n for n, lease in results.items() if lease is not None]
    assert len(winners) == 1 and len(results) == 2
    assert leases.current(shard) == results[winners[0]]
    assert leases.current(shard).generation == 1


def test_pick_free_concurrent_takers_get_distinct_shards(any_store, clock):
    leases = leases_on(any_store, clock)
    pool = [new_shard() for _ in range(6)]
    n = 4
    meet_at_first_put(n)  # all four write the pool's first shard at once
    got: dict[int, tuple[str, Lease]] = {}
    threads = [threading.Thread(target=lambda p=p: got.__setitem__(
        p, leases.pick_free(pool, job("J", p)))) for p in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == n
    shards = [shard for shard, _ in got.values()]
    # Each taker skipped only shards a sibling held, so together they took the first n.
    assert sorted(shards) == sorted(pool[:n])
    for p, (shard, lease) in got.items():
        assert leases.current(shard) == lease and lease.holder.partition == p


# -- waiting, pools and damaged state (in memory) ------------------------------------------


def test_acquire_waits_with_capped_backoff_then_names_the_holder(mem, clock):
    leases = leases_on(mem, clock, ttl=1000, max_backoff_s=1.0)
    shard = new_shard()
    leases.try_acquire(shard, Holder("A", 0, label="stream q1 batch 7"))
    with pytest.raises(LeaseHeld) as err:
        leases.acquire(shard, job("B"), wait_s=5)
    assert clock.sleeps[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]
    assert max(clock.sleeps) == 1.0 and sum(clock.sleeps) == pytest.approx(5)
    assert err.value.waited_s == pytest.approx(5)
    msg = str(err.value)
    assert "'stream q1 batch 7'" in msg and shard in msg and "waited 5.0 s" in msg


def test_may_wait_refuses_at_once_and_waiting_is_a_hook_point(mem, clock):
    """``may_wait`` is asked before each wait (the Spark writer's wait-die rule); each
    wait passes ``lease.waiting``; job ages order holders, old records read as age 0."""
    leases = leases_on(mem, clock, ttl=1000)
    shard = new_shard()
    old = Holder("A", 0, label="job A", job_started_ms=100)
    young = Holder("B", 0, label="job B", job_started_ms=200)
    assert old.precedes(young) and not young.precedes(old)
    assert Holder("A", 0).precedes(Holder("B", 0))  # equal ages: the job id decides
    a = leases.try_acquire(shard, old)
    asked = []
    with pytest.raises(LeaseHeld, match="waited 0.0 s for it. run after job A") as err:
        leases.acquire(shard, young, wait_s=60,
                       may_wait=lambda blocker: asked.append(blocker) or "run after job A")
    assert asked == [a] and clock.sleeps == [] and err.value.holder == old
    waits = []
    hooks.register("lease.waiting", lambda **ctx: waits.append(ctx))
    clock.on_sleep = lambda n: n == 2 and leases.release(a)
    leases.acquire(shard, young, wait_s=60, may_wait=lambda blocker: "")
    seen = [(w["shard"], w["job_id"], w["blocker_job_id"]) for w in waits]
    assert seen == [(shard, "B", "A")] * 2
    body = json.loads(a.encode())
    del body["holder"]["job_started_ms"]  # a record written before the field existed
    assert Lease.decode(json.dumps(body).encode(), shard, a.generation).holder.job_started_ms == 0


def test_acquire_gets_the_shard_when_the_holder_releases_while_waiting(mem, clock):
    leases = leases_on(mem, clock, ttl=1000)
    shard = new_shard()
    a = leases.try_acquire(shard, job("A"))
    clock.on_sleep = lambda n: n == 3 and leases.release(a)
    b = leases.acquire(shard, job("B"), wait_s=60)
    assert len(clock.sleeps) == 3 and leases.current(shard) == b


def test_acquire_takes_a_lease_that_expires_while_waiting(mem, clock):
    leases = leases_on(mem, clock, ttl=3)
    shard = new_shard()
    a = leases.try_acquire(shard, job("A"))
    b = leases.acquire(shard, job("B"), wait_s=60)
    assert clock.t * 1000 > a.expires_ms and sum(clock.sleeps) < 4
    assert leases.current(shard) == b


def test_pick_free_skips_held_shards_and_takes_over_its_own_attempt(mem, clock):
    leases = leases_on(mem, clock)
    pool = [new_shard() for _ in range(3)]
    leases.try_acquire(pool[0], job("other"))
    leases.try_acquire(pool[1], job("J", 0))
    old = leases.try_acquire(pool[2], job("J", 1, attempt=0))
    shard, lease = leases.pick_free(pool, job("J", 1, attempt=1))
    assert shard == pool[2] and lease.generation == old.generation + 1
    with pytest.raises(NoFreeShard) as err:
        leases.pick_free(pool, job("J", 2), wait_s=3)
    msg = str(err.value)
    assert "no free shard among 3" in msg and "'job other'" in msg and "'job J'" in msg
    assert sum(clock.sleeps) == pytest.approx(3)


def test_damaged_lease_file_keeps_nobody_off(mem, clock, caplog):
    leases = leases_on(mem, clock)
    shard = new_shard()
    mem.put_if_absent(f"{LEASES_DIR}/{shard}/{1:020d}.json", b"{not json")
    lease = leases.try_acquire(shard, job("A"))
    assert lease is not None and lease.generation == 2
    assert "damaged lease file" in caplog.text


class StaleListing(DelegatingStore):
    """Serves one listing (and the reads it leads to) from an old snapshot of the store."""

    def __init__(self, inner, snapshot: dict[str, bytes]):
        super().__init__(inner)
        self.snapshot = snapshot
        self.stale_lists = 1

    def list(self, prefix):
        if self.stale_lists:
            self.stale_lists -= 1
            return iter([k for k in self.snapshot if k.startswith(prefix)])
        return self.inner.list(prefix)

    def get(self, key):
        if key in self.snapshot:
            return self.snapshot.pop(key)
        return self.inner.get(key)


def test_stale_listing_cannot_win_a_freed_generation(mem, clock):
    leases = leases_on(mem, clock)
    shard = new_shard()
    a = leases.try_acquire(shard, job("A"))
    snapshot = {k: mem.get(k) for k in mem.list(f"{LEASES_DIR}/{shard}/")}
    clock.advance(TTL * 5)  # the snapshot's lease looks expired ...
    for _ in range(9):  # ... but A renewed it, and generations 1..7 were deleted
        a = leases.renew(a)
    assert not mem.exists(f"{LEASES_DIR}/{shard}/{2:020d}.json")
    stale = leases_on(StaleListing(mem, snapshot), clock)
    assert stale.try_acquire(shard, job("B")) is None  # wrote generation 2, saw 10, gave up
    assert leases.current(shard) == a
    assert lease_keys(mem, shard) == [f"{LEASES_DIR}/{shard}/{g:020d}.json" for g in (8, 9, 10)]


def test_renew_after_an_unknown_outcome_continues_its_own_lease(mem, clock):
    flaky = FlakyStore(mem, match=LEASES_DIR)
    leases = leases_on(flaky, clock)
    shard = new_shard()
    lease = leases.try_acquire(shard, job("A"))
    flaky.fail_puts, flaky.land = 1, True  # the renewal lands, its response is lost ...

    def fail_read_back(kind, **_):  # ... and reading it back fails too
        flaky.fail_gets = 1

    hooks.register("lease.before_put", fail_read_back)
    with pytest.raises(OutcomeUnknown):
        leases.renew(lease)
    hooks.clear()
    assert leases.current(shard).generation == 2  # it did land
    renewed = leases.renew(lease)  # recognised by lease_id, not taken for a rival's
    assert renewed.generation == 3 and renewed.lease_id == lease.lease_id


def test_release_that_fails_never_raises_and_the_lease_expires(mem, clock, caplog):
    flaky = FlakyStore(mem, fail_puts=100, match=LEASES_DIR)
    leases = leases_on(flaky, clock)
    shard = new_shard()
    flaky.fail_puts = 0
    lease = leases.try_acquire(shard, job("A"))
    flaky.fail_puts = 100
    assert leases.release(lease) is False
    assert "could not release" in caplog.text
    flaky.fail_puts = 0
    assert leases.try_acquire(shard, job("B")) is None
    clock.advance(TTL + 1)
    assert leases.try_acquire(shard, job("B")) is not None


# -- the renewal thread ----------------------------------------------------------------------


def wait_for_renewal_past(target_ms: int) -> threading.Event:
    done = threading.Event()

    def seen(expires_ms, **_):
        if expires_ms >= target_ms:
            done.set()

    hooks.register("lease.renewed", seen)
    return done


def test_renewal_thread_keeps_the_lease_past_its_ttl(mem, clock):
    leases = leases_on(mem, clock)
    shard = new_shard()
    with leases.held(shard, job("A"), renew_every_s=0.001) as held:
        assert isinstance(held, HeldLease) and held.shard == shard
        first = held.lease
        for _ in range(3):
            clock.advance(TTL * 0.9)
            target = int(clock.t * 1000) + int(TTL * 1000)
            assert wait_for_renewal_past(target).wait(30), "no renewal after the clock moved"
        assert clock.t * 1000 > first.expires_ms + TTL * 1000  # well past the first TTL
        assert held.renewals >= 3 and held.lease.lease_id == first.lease_id
        assert leases.try_acquire(shard, job("B")) is None
        held.check()
    assert leases.current(shard).released  # released on exit ...
    assert leases.try_acquire(shard, job("B")) is not None  # ... so others get it at once


def test_a_released_or_abandoned_lease_leaves_no_renewal_behind(mem, clock):
    """A released (or abandoned) lease's pending renewal goes at once: in a reused Spark
    worker one lease per task would otherwise stay for a TTL/3 with all it holds, for
    the daemon's collection after every request to walk."""
    import weakref

    from memwal_datasource.shard.lease_holding import _RENEWER

    leases = leases_on(mem, clock)
    gone = []
    for i in range(20):
        held = leases.hold(leases.try_acquire(new_shard(), job(f"T{i}")), renew_every_s=600)
        gone.append(weakref.ref(held))
        held.release() if i % 2 else held.abandon()
        del held
    assert not any(entry[2] is ref() for entry in _RENEWER._due for ref in gone)
    assert all(ref() is None for ref in gone)  # nothing keeps them alive


def test_paused_holder_loses_the_lease_and_check_raises(mem, clock):
    leases = leases_on(mem, clock)
    shard = new_shard()
    paused, resume = threading.Event(), threading.Event()

    def pause_first_renewal(kind, **_):
        if kind == "renew" and not paused.is_set():
            paused.set()
            assert resume.wait(30)

    hooks.register("lease.before_put", pause_first_renewal)
    with leases.held(shard, job("A"), renew_every_s=0.001) as held:
        assert paused.wait(30)
        clock.advance(TTL + 1)  # the holder stalls past its expiry ...
        b = leases.try_acquire(shard, job("B"))  # ... and another job takes the shard
        assert b is not None
        resume.set()
        assert held.wait_stopped(30)
        with pytest.raises(LeaseLost, match="taken by 'job B'"):
            held.check()
    assert leases.current(shard) == b  # A's exit did not release B's lease


# -- lost acknowledgements on a real S3 server ------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("fault", [dict(fault="drop_response"),
                                   dict(fault="error_after", status=500)],
                         ids=["lost response", "500 after landing"])
def test_lost_ack_of_a_lease_put_resolves_to_ours(proxied_s3_table, fault_proxy, clock, fault):
    uri, opts = proxied_s3_table
    leases = leases_on(open_store(uri, opts), clock)
    shard = new_shard()
    rule = fault_proxy.add_rule(FaultRule(method="PUT", key_pattern=LEASE_KEY,
                                          only_conditional=True, times=1, **fault))
    lease = leases.try_acquire(shard, job("A"))
    assert rule.hits == 1, "the fault never fired"
    assert lease is not None and leases.current(shard) == lease  # ours, not a rival's
    puts = [r for r in fault_proxy.records(method="PUT") if re.search(LEASE_KEY, r.path)]
    assert len(puts) == 2 and puts[0].path == puts[1].path  # sent once, retried once, read back
    assert leases.try_acquire(shard, job("B")) is None  # and it is a live lease


# -- a holder killed with SIGKILL --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_killed_holder_leaves_a_lease_taken_on_expiry_or_by_its_retry(location, clock):
    uri, opts = location
    shards = [new_shard(), new_shard()]
    env = dict(os.environ, MEMWAL_STORAGE_OPTIONS=json.dumps(opts),
               MEMWAL_KILL_AT="lease.acquired:2")
    proc = subprocess.run([sys.executable, "-m", "tests.lease_worker", uri, "J", "4", str(TTL),
                           *shards], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.splitlines() == [f"acquired {shards[0]} 1"]  # died before printing more
    clock.t = __import__("time").time()
    leases = leases_on(open_store(uri, opts), clock)
    for shard in shards:
        dead = leases.current(shard)
        assert dead is not None and dead.live(int(clock.t * 1000)) and dead.holder.job_id == "J"
        assert dead.holder.pid != os.getpid()
    # Another job waits for the dead holder's lease to expire, then takes it.
    assert leases.try_acquire(shards[0], job("other")) is None
    clock.advance(TTL + 1)
    assert leases.try_acquire(shards[0], job("other")) is not None
    # A retry of the same job and partition takes it at once.
    clock.advance(-(TTL + 1))
    retry = leases.try_acquire(shards[1], Holder("J", 4, attempt=1))
    assert retry is not None and retry.generation == 2


class PrunedBeforeReadBack(DelegatingStore):
    """The first lease PUT collides with a rival's record, which a writer three or more
    above prunes before our read-back can see it (as a busy shard's acquisitions do)."""

    def __init__(self, inner, rival: bytes):
        super().__init__(inner)
        self.rival, self.collided, self.pruned = rival, None, False

    def put_if_absent_unsynced(self, key, data):
        if self.collided is None and "/_memwal_leases/" in f"/{key}":
            self.collided = key
            self.inner.put_if_absent(key, self.rival)
            raise FileExistsError(key)
        self.inner.put_if_absent_unsynced(key, data)

    def get(self, key):
        if key == self.collided and not self.pruned:
            self.pruned = True
            self.inner.delete(key)
        return self.inner.get(key)


def test_a_collision_pruned_before_its_read_back_is_a_lost_race_not_an_unknown(
        any_store, clock):
    """A lease generation is deleted only by a writer three or more above it, so one that
    vanished between our collision and its read-back was superseded, whoever wrote it:
    the acquisition counts it lost and goes on (it used to fail the task with
    OutcomeUnknown)."""
    shard = new_shard()
    rival = Lease(shard, 1, job("R"), "r" * 32, 0, 0, released=True).encode()
    store = PrunedBeforeReadBack(any_store, rival)
    lease = leases_on(store, clock).try_acquire(shard, job("A"))
    assert store.collided and store.pruned
    assert lease is not None and lease.holder.job_id == "A"
    assert leases_on(any_store, clock).current(shard) == lease


def test_four_writers_taking_turns_on_one_shard_never_overlap_nor_fail(any_store):
    """Two actors and more, for real: four jobs take turns on one shard (non-waiting tries,
    real clock), so acquisitions race renewals, releases and the pruning of old
    generations; no two ever hold it at once and no try fails (a pruned collision is a
    lost race)."""
    shard, turns, holding, most, errors = new_shard(), 12, [], [0], []
    guard = threading.Lock()

    def writer(name: str) -> None:
        leases = Leases(any_store, ttl_s=60, retry_base_delay_ms=1)
        try:
            for _ in range(turns):
                while (lease := leases.try_acquire(shard, job(name))) is None:
                    pass
                with guard:
                    holding.append(name)
                    most[0] = max(most[0], len(holding))
                assert leases.current(shard) == lease  # held for a round trip at least
                with guard:
                    holding.remove(name)
                assert leases.release(lease)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"W{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert most[0] == 1
    gens = [int(k.rsplit("/", 1)[-1][:-5]) for k in lease_keys(any_store, shard)]
    assert gens[-1] >= 2 * 4 * turns and len(gens) <= 3 + PRUNE_AT + 1, gens


def test_a_released_lease_is_not_relabelled_after(any_store, clock):
    """A task whose close's fence check failed releases its lease while the idle relabel
    may still be on its way (they go at once): the relabel must not write after it."""
    leases = leases_on(any_store, clock)
    shard = new_shard()
    held = leases.hold(leases.try_acquire(shard, job("A")))
    assert held.release()
    with pytest.raises(LeaseLost, match="it was released"):
        held.relabel(job("idle"))
    assert leases.current(shard).released
