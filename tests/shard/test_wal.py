"""Fenced WAL appender and tailer, on memory, local disk and S3."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.errors import CorruptEntryError, Fenced, WriterPoisoned
from memwal_datasource.format.memwal import encode_wal_entry, wal_key
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import WalAppender, WalTailer, find_tip
from tests import race_worker
from tests.helpers import SCHEMA, FlakyStore, make_batch, new_shard


def rows(tailer: WalTailer, start: int = 1) -> list[int]:
    out = []
    for _pos, entry in tailer.entries(start):
        for b in entry.batches:
            out.extend(b.column("id").to_pylist())
    return out


def test_first_open_claims_epoch_one_without_sentinel(any_store):
    shard = new_shard()
    app = WalAppender.open(any_store, shard, schema=SCHEMA)
    assert (app.epoch, app.next_position, app.sentinel_position) == (1, 1, None)
    assert [app.append(SCHEMA, [make_batch(i * 10, 10)]).position for i in range(3)] == [1, 2, 3]
    assert (app.first_position, app.last_position) == (1, 3)
    tailer = WalTailer(any_store, shard)
    assert rows(tailer) == list(range(30))
    assert tailer.next_position() == 4 and tailer.first_position() == 1
    assert [e.writer_epoch for _, e in tailer.entries(1)] == [1, 1, 1]


def test_reopen_fences_old_writer_with_sentinel_at_tip(any_store):
    shard = new_shard()
    old = WalAppender.open(any_store, shard, schema=SCHEMA)
    old.append(SCHEMA, [make_batch(0, 2)])
    new = WalAppender.open(any_store, shard, schema=SCHEMA)
    assert new.epoch == 2 and new.sentinel_position == 2 and new.next_position == 3
    with pytest.raises(Fenced) as info:
        old.append(SCHEMA, [make_batch(100, 2)])
    assert info.value.shard_id == shard and info.value.stored_epoch == 2
    with pytest.raises(Fenced):  # every later call raises the same typed error
        old.append(SCHEMA, [make_batch(200, 2)])
    assert new.append(SCHEMA, [make_batch(2, 2)]).position == 3
    tailer = WalTailer(any_store, shard)
    raw = list(tailer.entries(1, include_sentinels=True))
    assert [(p, e.writer_epoch, e.is_sentinel) for p, e in raw] == [
        (1, 1, False), (2, 2, True), (3, 2, False)]
    assert rows(tailer) == [0, 1, 2, 3]  # sentinels never appear as rows


def _traceback_depth(exc: BaseException) -> int:
    depth, tb = 0, exc.__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    return depth


def test_a_fenced_writer_keeps_no_frames_of_the_calls_it_refused(any_store):
    """Its stored error is raised by every later call: raised as one object, each raise
    chained its frames (and their locals) onto it, so a kept writer fenced in a Spark
    worker kept every later task's stack alive."""
    shard = new_shard()
    old = WalAppender.open(any_store, shard, schema=SCHEMA)
    WalAppender.open(any_store, shard, schema=SCHEMA)
    depths = []
    for _ in range(20):
        with pytest.raises(Fenced) as info:
            old.check_fence()
        depths.append(_traceback_depth(info.value))
    assert max(depths) == depths[0] <= 3, depths
    assert _traceback_depth(old._error) <= 3

def test_open_seeds_next_position_from_manifest_hint(any_store):
    shard = new_shard()
    app = WalAppender.open(any_store, shard)
    for i in range(5):
        app.append(SCHEMA, [make_batch(i, 1)])

    def seen(m):
        m.wal_entry_position_last_seen = 3

    ManifestStore(any_store, shard).commit_update(app.epoch, seen)
    again = WalAppender.open(any_store, shard)
    # Known before any append: the sentinel went to 6, the next entry is 7.
    assert again.sentinel_position == 6 and again.next_position == 7


def test_transient_failures_are_retried_at_the_same_position(any_store):
    shard = new_shard()
    flaky = FlakyStore(any_store)
    app = WalAppender.open(flaky, shard, max_retries=3, retry_base_delay_ms=1)
    flaky.fail_puts = 3
    assert app.append(SCHEMA, [make_batch(0, 4)]).position == 1
    assert rows(WalTailer(any_store, shard)) == [0, 1, 2, 3]


def test_lost_response_is_resolved_not_duplicated(any_store):
    shard = new_shard()
    flaky = FlakyStore(any_store, land=True)
    app = WalAppender.open(flaky, shard, max_retries=3, retry_base_delay_ms=1)
    flaky.fail_puts = 1  # the PUT lands but the caller sees an error
    assert app.append(SCHEMA, [make_batch(0, 2)]).position == 1
    assert app.append(SCHEMA, [make_batch(2, 2)]).position == 2
    assert rows(WalTailer(any_store, shard)) == [0, 1, 2, 3]


def test_exhausted_retries_poison_the_writer(any_store):
    shard = new_shard()
    flaky = FlakyStore(any_store)
    app = WalAppender.open(flaky, shard, max_retries=2, retry_base_delay_ms=1)
    flaky.fail_puts = 100
    with pytest.raises(WriterPoisoned, match=f"shard {shard}.*position 1"):
        app.append(SCHEMA, [make_batch(0, 1)])
    flaky.fail_puts = 0
    with pytest.raises(WriterPoisoned):
        app.append(SCHEMA, [make_batch(0, 1)])
    reopened = WalAppender.open(any_store, shard)  # reopen recovers
    assert reopened.append(SCHEMA, [make_batch(5, 1)]).position == 2


def test_older_writer_inflight_entry_is_skipped(any_store):
    shard = new_shard()
    app = WalAppender.open(any_store, shard)
    # An entry of a lower epoch lands at our next slot (a zombie's in-flight PUT).
    any_store.put_if_absent(wal_key(shard, 1), encode_wal_entry(SCHEMA, [make_batch(9, 1)], 0))
    assert app.append(SCHEMA, [make_batch(0, 1)]).position == 2


def test_find_tip_gallops_over_long_tail(any_store):
    shard = new_shard()
    data = encode_wal_entry(SCHEMA, [make_batch(0, 1)], 1)
    for p in range(1, 38):
        any_store.put_if_absent(wal_key(shard, p), data)
    assert find_tip(any_store, shard, 1) == 38
    assert find_tip(any_store, shard, 20) == 38
    assert find_tip(any_store, shard, 40) == 40


def test_tailer_range_and_missing(any_store):
    shard = new_shard()
    app = WalAppender.open(any_store, shard)
    for i in range(6):
        app.append(SCHEMA, [make_batch(i, 1)])
    tailer = WalTailer(any_store, shard)
    assert [p for p, _ in tailer.entries(2, 4)] == [2, 3, 4]
    assert rows(tailer, 5) == [4, 5]
    assert tailer.read(99) is None


def test_corrupt_and_truncated_entries_name_shard_and_position(any_store):
    shard = new_shard()
    app = WalAppender.open(any_store, shard)
    app.append(SCHEMA, [make_batch(0, 1000)])
    good = encode_wal_entry(SCHEMA, [make_batch(0, 1000)], 1)
    any_store.put_if_absent(wal_key(shard, 2), good[: len(good) - 100])
    any_store.put_if_absent(wal_key(shard, 3), b"not arrow at all")
    tailer = WalTailer(any_store, shard)
    for pos in (2, 3):
        with pytest.raises(CorruptEntryError) as info:
            tailer.read(pos)
        assert shard in str(info.value) and f"position {pos}" in str(info.value)
    assert tailer.read(1).num_rows == 1000  # nothing already written was harmed


def test_thread_race_fenced_writers_never_land_above_sentinel(any_store):
    shard = new_shard()
    n = 4
    barrier = threading.Barrier(n)
    results = [None] * n

    def worker(i):
        barrier.wait()
        try:
            app = WalAppender.open(any_store, shard, schema=SCHEMA)
        except Fenced:
            results[i] = None
            return
        got = []
        for j in range(5):
            try:
                got.append(app.append(SCHEMA, [make_batch(j, 1)]).position)
            except Fenced:
                break
        results[i] = (app.epoch, app.sentinel_position, got)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_no_entry_above_newer_sentinel(any_store, shard)


def test_opener_stalled_after_its_claim_leaves_no_sentinel_above_a_newer_one(any_store):
    """Opener A claims epoch 2 and stalls before finding the tip; B claims epoch 3, writes
    its sentinel at the tip and appends; A wakes: fenced, with nothing written above B's
    sentinel (it used to leave its own sentinel there)."""
    shard = new_shard()
    WalAppender.open(any_store, shard, schema=SCHEMA)  # epoch 1
    paused, go = threading.Event(), threading.Event()

    def stall(**_):
        if threading.current_thread().name == "opener-A" and not paused.is_set():
            paused.set()
            go.wait(60)

    hooks.register("claim.written", stall)
    out: dict = {}

    def opener_a():
        try:
            out["a"] = WalAppender.open(any_store, shard, schema=SCHEMA)
        except Fenced as exc:
            out["a"] = exc

    a = threading.Thread(target=opener_a, name="opener-A")
    a.start()
    try:
        assert paused.wait(60)
        b = WalAppender.open(any_store, shard, schema=SCHEMA)
        b.append(SCHEMA, [make_batch(0, 1)])
    finally:
        go.set()
        a.join(60)
        hooks.clear()
    assert isinstance(out["a"], Fenced) and b.epoch == 3
    check_no_entry_above_newer_sentinel(any_store, shard)
    assert all(e.writer_epoch == 3 for _p, e in WalTailer(any_store, shard).entries(
        b.sentinel_position, include_sentinels=True))


def check_no_entry_above_newer_sentinel(store, shard):
    """For every sentinel of epoch E, no entry after it has an epoch below E."""
    entries = list(WalTailer(store, shard).entries(1, include_sentinels=True))
    assert entries, "the race wrote nothing"
    max_sentinel_epoch = 0
    for pos, entry in entries:
        assert entry.writer_epoch >= max_sentinel_epoch, (
            f"entry at {pos} of epoch {entry.writer_epoch} landed above a sentinel of "
            f"epoch {max_sentinel_epoch}")
        if entry.is_sentinel:
            max_sentinel_epoch = max(max_sentinel_epoch, entry.writer_epoch)
    positions = [p for p, _ in entries]
    assert positions == list(range(1, len(positions) + 1))  # gap-free


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_process_race_claims_and_appends(location):
    uri, opts = location
    shard = new_shard()
    ctx = mp.get_context("spawn")
    n = 4
    with ctx.Manager() as manager:
        barrier = manager.Barrier(n)
        with ctx.Pool(n) as pool:
            claims = pool.starmap(race_worker.claim, [(uri, opts, shard, barrier)] * n)
            won = [e for r, e in claims if r == "won"]
            assert len(won) == len(set(won)) >= 1
            barrier2 = manager.Barrier(n)
            outs = pool.starmap(race_worker.open_and_append,
                                [(uri, opts, shard, barrier2, 5)] * n)
    from memwal_datasource.store import open_store

    store = open_store(uri, opts)
    check_no_entry_above_newer_sentinel(store, shard)
    newest = max(o["epoch"] for o in outs if o["epoch"] is not None)
    winner = [o for o in outs if o["epoch"] == newest][0]
    assert len(winner["positions"]) == 5 and not winner["fenced"]
    # Every position a writer reported as written holds that writer's epoch.
    tailer = WalTailer(store, shard)
    for o in outs:
        for p in o["positions"]:
            assert tailer.read(p).writer_epoch == o["epoch"]


def test_append_keeps_user_schema_metadata(any_store):
    shard = new_shard()
    schema = SCHEMA.with_metadata({"owner": "me"})
    app = WalAppender.open(any_store, shard)
    app.append(schema, [make_batch(0, 1, schema)])
    entry = WalTailer(any_store, shard).read(1)
    assert entry.schema.metadata[b"owner"] == b"me" and entry.schema.metadata[b"writer_epoch"]
    assert pa.Table.from_batches(entry.batches).num_rows == 1


def test_an_opener_finds_the_tip_beside_its_claims_hint_put(proxied_location):
    """A claim's version-hint PUT goes beside the opener's search for the WAL tip (one
    round trip less), and lands before anything after the tip (the fence check reads the
    hint; a hint landing late could regress a newer one)."""
    from memwal_datasource.store import open_store

    proxy, (uri, opts) = proxied_location
    store = open_store(uri, opts)
    shard = new_shard()
    WalAppender.open(store, shard)  # epoch 1
    # The hint PUT slower than the rest: a step not waiting for it would start ~0.4 s
    # before it finished (the proxy stamps a reply's end just after relaying it).
    proxy.add_rule(fault="delay", delay_s=0.5, method="PUT", key_pattern="version_hint")
    proxy.add_rule(fault="delay", delay_s=0.1)
    proxy.clear_records()
    app = WalAppender.open(store, shard)
    assert app.epoch == 2 and app.sentinel_position is not None
    records = sorted(proxy.records(), key=lambda r: r.started)
    hint = [r for r in records if r.method == "PUT" and r.path.endswith("version_hint.json")]
    tip = [r for r in records if r.method == "HEAD" and "/wal/" in r.path]
    assert len(hint) == 1 and tip
    assert tip[0].started < hint[0].finished and hint[0].started < tip[0].finished  # beside
    after = [r for r in records if r.started > tip[-1].finished]
    assert after and all(r.started >= hint[0].finished - 0.05 for r in after)
