"""Reader holds: gc keeps what a live stream still has to read, and only while it lives.

Time passing is a gc ``clock`` running ahead of the store's: a little past the
minimum retention (the hold is live), or hours (the hold has expired).
"""

from __future__ import annotations

import pytest

from memwal_datasource.format.memwal import wal_key
from memwal_datasource.log.holds import (
    DEFAULT_HOLD_TTL_S,
    FORGET_AFTER_S,
    ReaderHold,
    ReaderHolds,
    hold_key,
)
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.maintenance.gc import MIN_RETAIN_SECONDS, collect, plan
from memwal_datasource.memwal_table import MemWalTable
from memwal_datasource.store import open_store
from tests.helpers import new_shard
from tests.maintenance.test_compact import batch, write
from tests.maintenance.test_maintenance_races import every_reader

pytestmark = pytest.mark.parametrize("backend", ["local", "s3"])


def ahead(store, seconds: float):
    """A gc clock ``seconds`` ahead of the store's."""
    return lambda: store.now_ms() + int(seconds * 1000)


def three_records(uri, opts) -> str:
    """Records 1..3 on one shard (entries 1, 3, 5: each writer drops a sentinel), compacted."""
    shard = new_shard()
    for ids, tag in (([1, 2], "a"), ([3], "b"), ([4], "c")):
        write(uri, opts, shard, [batch(ids, tag)])
    compact(MemWalTable(uri, opts))
    return shard


def test_gc_keeps_what_a_live_hold_needs_until_it_expires(pk_table):
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = three_records(uri, opts)
    entries = {seq: wal_key(shard, p) for seq, p in ((1, 1), (2, 3), (3, 5))}
    assert all(store.exists(k) for k in entries.values())
    ReaderHolds(store).put(ReaderHold("h-1", "q-test", after_seq=1))
    table = MemWalTable(uri, opts)
    # Past the minimum retention, inside the hold's TTL: record 1 goes, 2 and 3 stay.
    done = collect(table, retain_seconds=0, clock=ahead(store, MIN_RETAIN_SECONDS + 5))
    assert done.releasable_seq == 1 and done.gc_sequence == 4
    assert "commit records 2..3 are held by stream q-test (hold h-1" in done.kept_reason()
    assert "less than the retention" not in done.kept_reason()
    assert not store.exists(entries[1])
    assert store.exists(entries[2]) and store.exists(entries[3])
    want = {1: "a-1", 2: "a-2", 3: "b-3", 4: "c-4"}
    assert every_reader(uri, opts) == want
    # The hold moves on (the stream read record 2): record 2 goes too.
    ReaderHolds(store).put(ReaderHold("h-1", "q-test", after_seq=2))
    done = collect(MemWalTable(uri, opts), retain_seconds=0,
                   clock=ahead(store, MIN_RETAIN_SECONDS + 5))
    assert not store.exists(entries[2]) and store.exists(entries[3])
    # A dead stream does not pin the table: past its TTL its hold is ignored.
    done = collect(MemWalTable(uri, opts), retain_seconds=0,
                   clock=ahead(store, DEFAULT_HOLD_TTL_S + 5))
    assert done.held_by is None and not store.exists(entries[3])
    assert every_reader(uri, opts) == want
    # Long expired, the hold object itself goes.
    assert store.exists(hold_key("h-1"))
    done = collect(MemWalTable(uri, opts), retain_seconds=0,
                   clock=ahead(store, FORGET_AFTER_S + DEFAULT_HOLD_TTL_S + 5))
    assert (hold_key("h-1"), len(ReaderHold("h-1", "q-test", 2).encode())) in done.holds
    assert not store.exists(hold_key("h-1"))


def test_the_lowest_live_hold_wins_and_retention_is_reported_apart(pk_table):
    uri, opts = pk_table
    store = open_store(uri, opts)
    three_records(uri, opts)
    holds = ReaderHolds(store)
    holds.put(ReaderHold("h-high", "fast", after_seq=3))
    holds.put(ReaderHold("h-low", "slow", after_seq=0))
    table = MemWalTable(uri, opts)
    p = plan(table, retain_seconds=0, clock=ahead(store, MIN_RETAIN_SECONDS + 5))
    assert p.releasable_seq == 0 and p.shards == [] and p.records == []
    assert p.kept_reason().startswith("commit records 1..3 are held by stream slow")
    # Inside the retention the hold is not what keeps them.
    p = plan(table, retain_seconds=0, clock=ahead(store, 1))
    assert p.held_by is None
    assert "commit records 1..3 were compacted less than the retention" in p.kept_reason()


def test_a_keeper_refreshes_its_hold_and_says_when_it_may_have_lapsed(pk_table, monkeypatch):
    from memwal_datasource.log import holds as holds_mod
    uri, opts = pk_table
    store = open_store(uri, opts)
    keeper = holds_mod.HoldKeeper(store, "q-keep", ttl_s=60)
    assert keeper.hold(0) is False  # the first hold: nothing was held before
    assert keeper.hold(3) is True
    (h,) = ReaderHolds(store).live(store.now_ms())
    assert (h.hold_id, h.after_seq, h.ttl_s) == (keeper.hold_id, 3, 60)
    puts = []
    unhook = holds_mod.hooks.register("hold.put", lambda **kw: puts.append(kw["after_seq"]))
    try:
        assert keeper.hold(3) is True and puts == []  # unchanged and fresh: no PUT
        keeper.refresh()  # what the daemon thread does every quarter TTL
        assert puts == [3]
        # Not written for most of a TTL (refreshes failing): it may have lapsed.
        now = holds_mod.time.monotonic()
        monkeypatch.setattr(holds_mod.time, "monotonic", lambda: now + 55)
        assert keeper.hold(3) is False and puts == [3, 3]
        keeper.stop()
        keeper.refresh()
        assert puts == [3, 3]  # stopped: the hold lapses after its TTL
    finally:
        unhook()
