"""``WalOnlyShardWriter.write_through``: a task's last rows, cut by the calling thread.

When nothing is queued or in flight, the caller cuts and encodes the entry and
hands it straight to the PUT thread (no flusher, no sync thread); otherwise it
is ``put`` then ``flush``. Either way: the same entries, in order, durable on
return, and the same errors and stalls. Every backend (``backend``).
"""

from __future__ import annotations

import threading

import pytest

from memwal_datasource.errors import WriterPoisoned, WriterStalled
from memwal_datasource.shard_writer import open_shard_writer
from memwal_datasource.store import open_store
from tests.helpers import SCHEMA, FlakyStore, make_batch, new_shard, wal_entries, wal_rows
from tests.test_writer import WAIT, GatedStore, wal_only


@pytest.mark.parametrize("durable", [False, True])
def test_an_idle_writer_cuts_the_entry_in_the_calling_thread(location, durable):
    uri, opts = location
    shard = new_shard()
    # An interval no test waits for: only the flush inside write_through lands rows.
    cfg = wal_only(durable_write=durable, max_wal_flush_interval_ms=3_600_000)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts)
    w.write_through([make_batch(0, 3), make_batch(3, 2)])
    store = open_store(uri, opts)
    assert wal_rows(store, shard) == [0, 1, 2, 3, 4]  # durable on return, one entry
    assert len(wal_entries(store, shard)) == 1
    s = w.stats()
    assert (s.rows, s.rows_durable, s.rows_not_durable, s.wal_entries) == (5, 5, 0, 1)
    # Cut when put: the flusher's queue never held it.
    assert s.flushes[-1].queue_wait_s == 0.0
    w.write_through(make_batch(5, 1))  # again, on the same writer
    w.close()
    assert wal_rows(store, shard) == list(range(6))
    assert len(wal_entries(store, shard)) == 2


def test_rows_already_queued_go_first(location):
    uri, opts = location
    shard = new_shard()
    w = open_shard_writer(uri, shard, SCHEMA, wal_only(
        durable_write=False, max_wal_flush_interval_ms=3_600_000), opts)
    w.put(make_batch(0, 2))  # queued, not cut (the interval is an hour)
    w.write_through(make_batch(2, 2))  # so this one goes through put + flush
    assert wal_rows(open_store(uri, opts), shard) == [0, 1, 2, 3]
    assert w.stats().flushes[-1].queue_wait_s > 0.0
    w.close()


def test_a_thread_putting_meanwhile_keeps_both_orders(location):
    """Two actors on one writer: a thread puts 60 batches while this one writes 20
    through; every row lands once, each actor's rows in the order it wrote them."""
    uri, opts = location
    shard = new_shard()
    w = open_shard_writer(uri, shard, SCHEMA, wal_only(max_wal_flush_interval_ms=1), opts)
    go = threading.Barrier(2)
    errors: list[BaseException] = []

    def putter() -> None:
        try:
            go.wait(WAIT)
            for i in range(60):
                w.put(make_batch(10_000 + i * 2, 2))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=putter)
    t.start()
    go.wait(WAIT)
    for i in range(20):
        w.write_through(make_batch(i * 3, 3))
    t.join(WAIT)
    assert not t.is_alive() and not errors, errors
    w.close()
    rows = wal_rows(open_store(uri, opts), shard)
    mine = [r for r in rows if r < 10_000]
    theirs = [r for r in rows if r >= 10_000]
    assert mine == list(range(60))
    assert theirs == list(range(10_000, 10_120))


def test_a_hanging_put_stalls_write_through(location):
    uri, opts = location
    gated = GatedStore(open_store(uri, opts))
    shard = new_shard()
    w = open_shard_writer(uri, shard, SCHEMA, wal_only(backpressure_timeout_ms=150), opts,
                          store=gated)
    gated.close_gate()
    try:
        with pytest.raises(WriterStalled, match="backpressure_timeout_ms") as info:
            w.write_through(make_batch(0, 2))
        assert gated.entered.wait(WAIT)  # stalled inside the PUT, as arranged
    finally:
        gated.gate.set()
    with pytest.raises(WriterStalled) as again:  # terminal, as through put
        w.write_through(make_batch(2, 2))
    assert again.value is info.value


def test_a_failed_put_poisons_the_writer_and_loses_no_acknowledged_row(location):
    uri, opts = location
    inner = open_store(uri, opts)
    flaky = FlakyStore(inner)
    shard = new_shard()
    w = open_shard_writer(uri, shard, SCHEMA, wal_only(max_wal_persist_retries=2), opts,
                          store=flaky)
    w.write_through(make_batch(0, 2))
    flaky.fail_puts = 100
    with pytest.raises(WriterPoisoned, match="reopen") as info:
        w.write_through(make_batch(2, 2))
    flaky.fail_puts = 0
    for call in (lambda: w.write_through(make_batch(4, 2)), w.flush, w.close):
        with pytest.raises(WriterPoisoned) as again:
            call()
        assert again.value is info.value
    assert wal_rows(inner, shard) == [0, 1]
