"""``Leases.take_after``: a task takes the shard right after its process's kept writer's
idle record, with one put and one listing, and wins only if nothing came between.

On memory, local disk, S3 and both emulators; races between two takers (threads) and
against a renewal of the record.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from memwal_datasource import hooks
from memwal_datasource.shard.leases import LEASES_DIR, PRUNE_AT, Holder
from tests.helpers import new_shard
from tests.log.test_commit import CountingStore
from tests.shard.test_leases import FakeClock, job, lease_keys, leases_on


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def meet_at_puts(n: int, kinds=("acquire", "renew")) -> set[int]:
    """Hold each thread's first lease PUT of ``kinds`` until ``n`` threads are about to
    write: the two actors really write the same generation at once."""
    ready = threading.Barrier(n, timeout=30)
    seen: set[int] = set()

    def meet(kind, **_):
        if kind in kinds and threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            ready.wait()

    hooks.register("lease.before_put", meet)
    return seen


def kept(holder: Holder) -> Holder:
    return Holder(f"kept-{holder.job_id}", -1, label="idle writer", kept=True)


def idle_record(leases, shard: str, holder: Holder):
    """A lease acquired by ``holder`` and relabelled idle (as a kept writer's)."""
    return leases.relabel(leases.try_acquire(shard, holder), kept(holder))


class Counting(CountingStore):
    """The commit tests' counting store, also counting puts-if-absent and bulk deletes."""

    def __init__(self, inner):
        super().__init__(inner)
        self.calls.update(put=0, delete_many=0)

    def put_if_absent(self, key, data):
        self.calls["put"] += 1
        super().put_if_absent(key, data)

    def delete_many(self, keys):
        self.calls["delete_many"] += 1
        self.inner.delete_many(keys)


def at_once(*actors: Callable[[], None]) -> None:
    """Run each actor in its own thread and wait for all of them."""
    threads = [threading.Thread(target=actor) for actor in actors]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_take_after_our_idle_record_is_one_put_and_one_listing(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    counting = Counting(any_store)
    taker = leases_on(counting, clock)
    got = taker.take_after(record, job("B"))
    assert got is not None and got.generation == record.generation + 1
    assert got.holder.job_id == "B" and taker.replaced[shard] == record
    assert leases.current(shard) == got
    # nothing read, nothing old to delete yet
    assert counting.calls == {"get": 0, "head": 0, "list": 1, "put": 1, "delete_many": 0}
    deletes = []
    for i in range(6):
        clock.advance(1)
        record = taker.relabel(got, kept(job("B")))
        counting.calls = dict.fromkeys(counting.calls, 0)
        got = taker.take_after(record, job(f"C{i}"))
        assert got is not None
        deletes.append(counting.calls["delete_many"])
        assert {**counting.calls, "delete_many": 0} == {
            "get": 0, "head": 0, "list": 1, "put": 1, "delete_many": 0}
    # Takes at generations 5, 7, ..., 15: the one at 9 finds PRUNE_AT generations three or
    # more below it (1..6) and deletes them in one request, the one at 15 the next six.
    assert PRUNE_AT == 6 and deletes == [0, 0, 1, 0, 0, 1]
    assert lease_keys(any_store, shard) == [
        f"{LEASES_DIR}/{shard}/{g:020d}.json"
        for g in range(got.generation - 2, got.generation + 1)]


def test_take_after_fails_when_another_holder_came_between(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    other = leases.try_acquire(shard, job("X"))  # an idle record is free to anyone
    assert other is not None
    assert leases.take_after(record, job("B")) is None  # the next generation is X's
    assert leases.current(shard) == other
    leases.release(other)
    assert leases.take_after(record, job("B")) is None  # released, but not ours any more


def test_take_after_into_a_freed_generation_is_taken_back(any_store, clock):
    """Others went on far enough that the generation after ours was deleted: the put lands
    there, the listing shows higher ones, and the stray record is deleted."""
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    freed = f"{LEASES_DIR}/{shard}/{record.generation + 1:020d}.json"
    others = 0
    while others == 0 or any_store.exists(freed):  # until an acquisition prunes it
        leases.release(leases.try_acquire(shard, job(f"X{others}")))
        others += 1
        assert others <= PRUNE_AT
    before = lease_keys(any_store, shard)
    assert leases.take_after(record, job("B")) is None
    assert lease_keys(any_store, shard) == before  # our stray generation is gone again
    assert leases.current(shard).holder.job_id == f"X{others - 1}"


def test_take_after_in_a_table_made_anew_is_refused(any_store, clock):
    """Lease history deleted (the table was deleted and made anew): our record's generation
    is missing, so the put, though the highest, does not count."""
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    any_store.delete_many(lease_keys(any_store, shard))
    assert leases.take_after(record, job("B")) is None
    assert lease_keys(any_store, shard) == []
    assert leases.try_acquire(shard, job("C")).generation == 1


def test_take_after_refuses_a_live_record(any_store, clock):
    """Only an idle (kept), released or expired record may be taken after."""
    leases = leases_on(any_store, clock)
    shard = new_shard()
    live = leases.try_acquire(shard, job("A"))
    assert leases.take_after(live, job("B")) is None
    assert leases.current(shard) == live


def test_two_takers_after_one_record_exactly_one_wins(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    seen = meet_at_puts(2)
    won: dict[str, object] = {}

    def take(name: str) -> Callable[[], None]:
        return lambda: won.__setitem__(name, leases_on(any_store, clock).take_after(
            record, job(name)))

    at_once(take("B"), take("C"))
    winners = [n for n, lease in won.items() if lease is not None]
    assert len(seen) == 2 and len(won) == 2 and len(winners) == 1
    assert leases.current(shard).holder.job_id == winners[0]


def test_take_after_racing_a_full_acquisition_exactly_one_holds(any_store, clock):
    """Another job lists and acquires while we take after our record: one of us holds."""
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    seen = meet_at_puts(2)
    got: dict[str, object] = {}

    def taker():
        got["after"] = leases_on(any_store, clock).take_after(record, job("B"))

    def acquirer():
        got["acquire"] = leases_on(any_store, clock).try_acquire(shard, job("C"))

    at_once(taker, acquirer)
    holders = [lease for lease in got.values() if lease is not None]
    assert len(seen) == 2 and len(got) == 2 and len(holders) == 1
    assert leases.current(shard) == holders[0]


def test_take_after_racing_the_records_renewal(any_store, clock):
    """The kept writer's lease renews (same acquisition, next generation) while a task takes
    after the record it had: whichever lands first, the shard has one current holder, and a
    taker that lost takes the renewed (still idle) record by the usual path."""
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    seen = meet_at_puts(2)
    out: dict[str, object] = {}

    def renew():
        try:
            out["renewed"] = leases_on(any_store, clock).renew(record)
        except Exception as exc:  # noqa: BLE001 - LeaseLost when the taker won
            out["renewed"] = exc

    def take():
        out["taken"] = leases_on(any_store, clock).take_after(record, job("B"))

    at_once(renew, take)
    assert len(seen) == 2
    hooks.clear()
    current = leases.current(shard)
    if out["taken"] is not None:
        assert current == out["taken"] and isinstance(out["renewed"], Exception)
    else:
        assert current == out["renewed"] and current.holder.kept
        again = leases.try_acquire(shard, job("B"))
        assert again is not None and leases.replaced[shard] == current


def test_take_after_proved_later_puts_now_and_lists_when_asked(any_store, clock):
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    counting = Counting(any_store)
    taker = leases_on(counting, clock)
    got = taker.take_after(record, job("B"), prove_later=True)
    assert got is not None and got.generation == record.generation + 1
    assert counting.calls == {"get": 0, "head": 0, "list": 0, "put": 1, "delete_many": 0}
    assert taker.prove_taken(got, record)
    assert counting.calls["list"] == 1 and leases.current(shard) == got


def test_a_takeover_between_the_put_and_its_later_proof_is_found(any_store, clock):
    """Two actors: a retried attempt of the same task takes the lease over right after
    the continuing attempt's put, before that attempt's listing proves it."""
    leases = leases_on(any_store, clock)
    shard = new_shard()
    record = idle_record(leases, shard, job("A"))
    got = leases.take_after(record, job("B"), prove_later=True)
    retry = leases.try_acquire(shard, job("B", attempt=1))  # same job and partition
    assert retry is not None and retry.generation == got.generation + 1
    assert not leases.prove_taken(got, record)
    assert leases.current(shard) == retry
    assert f"{LEASES_DIR}/{shard}/{got.generation:020d}.json" not in lease_keys(any_store,
                                                                                 shard)
