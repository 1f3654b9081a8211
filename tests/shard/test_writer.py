"""The ShardWriter: config and the WAL-only pipeline (MemTable mode: test_native.py).

WAL-only tests run on memory, local disk and S3.
Synchronisation uses events and conditions raised by store wrappers, never sleeps.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from memwal_datasource.config import GiB, ShardWriterConfig
from memwal_datasource.errors import (
    ConfigError,
    Fenced,
    MemWalError,
    NotInThisMode,
    WriterPoisoned,
    WriterStalled,
)
from memwal_datasource.format.memwal import wal_key
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import WalAppender, WalTailer
from memwal_datasource.shard.writer import WalOnlyShardWriter
from memwal_datasource.store import ObjectStore, open_store
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import (
    SCHEMA,
    DelegatingStore,
    FlakyStore,
    make_batch,
    new_shard,
    wal_entries,
    wal_rows,
)

REPO = Path(__file__).resolve().parents[2]
ROWS = 10  # rows per batch in most tests
# make_batch(1000 + k*10, 10) batches all have the same buffer size (4-digit ids).
BATCH_BYTES = make_batch(1000, ROWS).get_total_buffer_size()
WAIT = 20.0  # upper bound for event waits; a test that needs it has already failed


def wal_only(**kw) -> ShardWriterConfig:
    """A WAL-only config; fast interval unless the test says otherwise."""
    kw.setdefault("max_wal_flush_interval_ms", 5)
    kw.setdefault("wal_persist_retry_base_delay_ms", 1)
    kw.setdefault("backpressure_timeout_ms", 10_000)  # a broken pipeline fails fast
    return ShardWriterConfig(enable_memtable=False, **kw)


class GatedStore(DelegatingStore):
    """Wraps a real store. While ``gate`` is clear, WAL PUTs block (before landing)
    and ``entered`` is set; ``landed`` counts WAL PUTs that completed."""

    def __init__(self, inner: ObjectStore):
        super().__init__(inner)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self._cond = threading.Condition()
        self.landed = 0

    def close_gate(self) -> None:
        self.entered.clear()
        self.gate.clear()

    def wait_landed(self, n: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.landed >= n, WAIT)

    def put_if_absent(self, key, data):
        wal = "/wal/" in key
        if wal and not self.gate.is_set():
            self.entered.set()
            if not self.gate.wait(WAIT):
                raise RuntimeError("test gate never opened")
        self.inner.put_if_absent(key, data)
        if wal:
            with self._cond:
                self.landed += 1
                self._cond.notify_all()


class WatchedWriter(WalOnlyShardWriter):
    """Sets ``backpressured`` when a put finds the queue over budget and must wait.

    ``_wait`` runs under the writer's lock, so "not ready" here means the put is
    about to block on the condition: a deterministic signal, no timing involved.
    """

    def __init__(self, *args, **kwargs):
        self.backpressured = threading.Event()
        super().__init__(*args, **kwargs)

    def _wait(self, ready, what):
        if what.startswith("backpressure") and not ready():
            self.backpressured.set()
        super()._wait(ready, what)


# --- configuration -----------------------------------------------------------

# (field, bad value, text the message must contain)
BAD_FIELDS = [
    ("durable_write", "yes", "true or false"),
    ("enable_memtable", 1, "true or false"),
    ("max_wal_buffer_size", 0, "[1, 4294967296]"),
    ("max_wal_buffer_size", 4 * GiB + 1, "[1, 4294967296]"),
    ("max_wal_flush_interval_ms", -1, "[0, 3600000]"),
    ("max_wal_flush_interval_ms", 3_600_001, "[0, 3600000]"),
    ("max_wal_persist_retries", -1, "[0, 100]"),
    ("max_wal_persist_retries", 101, "[0, 100]"),
    ("wal_persist_retry_base_delay_ms", -1, "[0, 60000]"),
    ("max_memtable_size", 0, "[1, "),
    ("max_memtable_rows", 0, "[1, "),
    ("max_memtable_batches", 0, "[1, "),
    ("max_unflushed_memtable_bytes", 0, "[1, "),
    ("backpressure_timeout_ms", 0, "[1, 86400000]"),
    ("max_wal_buffer_size", True, "integer"),  # a bool is not an int here
    ("max_wal_buffer_size", "1024", "integer"),
    ("wal_compression", "gzip", "auto, none, lz4, zstd"),
]


@pytest.mark.parametrize("name,value,text", BAD_FIELDS,
                         ids=[f"{n}={v!r}" for n, v, _ in BAD_FIELDS])
def test_each_bad_field_is_named_with_its_range(name, value, text):
    with pytest.raises(ConfigError) as info:
        ShardWriterConfig(**{name: value}).validate()
    assert f"'{name}'" in str(info.value) and text in str(info.value)


def test_unflushed_budget_below_buffer_size_is_refused():
    with pytest.raises(ConfigError, match="max_unflushed_memtable_bytes.*max_wal_buffer_size"):
        ShardWriterConfig(max_wal_buffer_size=1000, max_unflushed_memtable_bytes=999).validate()
    ShardWriterConfig(max_wal_buffer_size=1000, max_unflushed_memtable_bytes=1000).validate()


def test_defaults_follow_lance():
    c = ShardWriterConfig().validate()
    assert (c.durable_write, c.max_wal_buffer_size, c.max_wal_flush_interval_ms) == (
        True, 10 * 1024 * 1024, 100)
    assert (c.max_memtable_size, c.max_memtable_rows, c.max_memtable_batches) == (
        256 * 1024 * 1024, 100_000, 8_000)
    assert (c.max_wal_persist_retries, c.wal_persist_retry_base_delay_ms) == (3, 50)
    assert c.max_unflushed_memtable_bytes == GiB and c.enable_memtable is True


def test_from_options_parses_strings():
    c = ShardWriterConfig.from_options({
        "durable_write": "FALSE", "enable_memtable": " false ", "max_wal_buffer_size": "2048",
        "max_wal_flush_interval_ms": "0", "max_unflushed_memtable_bytes": "4096",
        "backpressure_timeout_ms": "1500", "wal_compression": " LZ4", "not_ours": "ignored",
    })
    assert c == ShardWriterConfig(durable_write=False, enable_memtable=False,
                                  max_wal_buffer_size=2048, max_wal_flush_interval_ms=0,
                                  max_unflushed_memtable_bytes=4096, backpressure_timeout_ms=1500,
                                  wal_compression="lz4")


@pytest.mark.parametrize("setting,remote,codec", [
    ("auto", True, "zstd"), ("auto", False, None), ("none", True, None),
    ("lz4", False, "lz4"), ("zstd", False, "zstd")])
def test_wal_compression_auto_compresses_on_object_stores_only(setting, remote, codec):
    assert ShardWriterConfig(wal_compression=setting).wal_codec(remote) == codec


@pytest.mark.parametrize("options,text", [
    ({"max_wal_buffer_size": "10MB"}, "option 'max_wal_buffer_size' must be an integer in [1, "),
    ({"max_wal_flush_interval_ms": "1.5"}, "option 'max_wal_flush_interval_ms'"),
    ({"durable_write": "maybe"}, "option 'durable_write' must be true or false, got 'maybe'"),
    ({"enable_memtable": "1"}, "option 'enable_memtable' must be true or false"),
    ({"max_memtable_rows": "0"}, "'max_memtable_rows' must be an integer in [1, "),
    ({"max_wal_persist_retries": "1000"},
     "'max_wal_persist_retries' must be an integer in [0, 100]"),
    ({"wal_compression": "snappy"},
     "option 'wal_compression' must be one of auto, none, lz4, zstd, got 'snappy'"),
])
def test_from_options_names_the_bad_option(options, text):
    with pytest.raises(ConfigError) as info:
        ShardWriterConfig.from_options(options)
    assert text in str(info.value)


def test_bad_config_fails_before_any_claim(location):
    uri, opts = location
    store = open_store(uri, opts)
    fresh = new_shard()
    for name, value, _ in BAD_FIELDS:
        with pytest.raises(ConfigError, match=name):
            cfg = ShardWriterConfig(**({"enable_memtable": False} | {name: value}))
            open_shard_writer(uri, fresh, SCHEMA, cfg, opts, store=store)
    assert ManifestStore(store, fresh).latest() is None
    assert list(store.list("_mem_wal/")) == []

    # A live writer keeps its epoch and keeps working.
    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, wal_only(), opts, store=store) as live:
        with pytest.raises(ConfigError, match="max_wal_buffer_size"):
            open_shard_writer(uri, shard, SCHEMA, wal_only(max_wal_buffer_size=0), opts,
                              store=store)
        assert ManifestStore(store, shard).latest().writer_epoch == live.epoch == 1
        live.put(make_batch(0, 3))
    assert wal_rows(store, shard) == [0, 1, 2]


# --- WAL-only mode: flushing ------------------------------------------------------

def test_durable_put_returns_only_once_rows_are_in_the_wal(location):
    uri, opts = location
    store = open_store(uri, opts)
    shard = new_shard()
    w = open_shard_writer(uri, shard, SCHEMA, wal_only(), opts, store=store)
    expected: list[int] = []
    for i in range(4):
        w.put(make_batch(i * ROWS, ROWS))
        expected += list(range(i * ROWS, (i + 1) * ROWS))
        assert wal_rows(store, shard) == expected  # read right after put returned
        s = w.stats()
        assert (s.rows_durable, s.rows_not_durable) == ((i + 1) * ROWS, 0)
    w.close()
    assert [(p, e) for p, e, _, _ in wal_entries(store, shard)] == [(1, 1), (2, 1), (3, 1), (4, 1)]


def test_size_flush_splits_one_put_into_several_entries(location):
    uri, opts = location
    store = open_store(uri, opts)
    shard = new_shard()
    # The interval never fires: only max_wal_buffer_size can trigger a flush.
    cfg = wal_only(max_wal_buffer_size=BATCH_BYTES, max_wal_flush_interval_ms=3_600_000)
    with open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=store) as w:
        table = pa.Table.from_batches([make_batch(1000 + k * ROWS, ROWS) for k in range(6)])
        w.put(table)  # durable: returns once every batch is in the WAL
        assert wal_rows(store, shard) == list(range(1000, 1060))
        assert [r for _, _, r, _ in wal_entries(store, shard)] == [ROWS] * 6
        assert w.stats().wal_entries == 6


def test_size_flush_without_durable_write_groups_batches(location):
    uri, opts = location
    gated = GatedStore(open_store(uri, opts))
    shard = new_shard()
    cfg = wal_only(durable_write=False, max_wal_buffer_size=2 * BATCH_BYTES,
                   max_wal_flush_interval_ms=3_600_000)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=gated)
    for k in range(10):
        w.put(make_batch(1000 + k * ROWS, ROWS))
    # Five full buffers land before close(): the size trigger alone did it.
    assert gated.wait_landed(5)
    entries = list(WalTailer(gated, shard).entries(1))
    assert [len(e.batches) for _, e in entries] == [2] * 5
    w.close()
    assert gated.landed == 5  # nothing was left for close() to flush
    assert wal_rows(gated, shard) == list(range(1000, 1100))


def test_small_batches_fill_entries_to_at_least_the_buffer(location):
    """As Lance cuts them: an entry takes batches until it holds at least
    max_wal_buffer_size bytes (so 1.5 batches' worth means two per entry, not one)."""
    uri, opts = location
    gated = GatedStore(open_store(uri, opts))
    shard = new_shard()
    cfg = wal_only(durable_write=False, max_wal_buffer_size=BATCH_BYTES * 3 // 2,
                   max_wal_flush_interval_ms=3_600_000)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=gated)
    for k in range(10):
        w.put(make_batch(1000 + k * ROWS, ROWS))
    assert gated.wait_landed(5)  # the size trigger alone cut them
    w.close()
    assert [len(e.batches) for _, e in WalTailer(gated, shard).entries(1)] == [2] * 5
    assert wal_rows(gated, shard) == list(range(1000, 1100))


def test_a_put_blocked_on_a_partial_entry_cuts_it_without_the_interval():
    """A put that does not fit the queue, with no entry in flight to free room,
    makes the flusher cut what is queued at once: it never waits out the interval."""
    store, shard = open_store("memory://at-least-blocked"), new_shard()
    cfg = wal_only(durable_write=False, max_wal_buffer_size=BATCH_BYTES * 5 // 2,
                   max_unflushed_memtable_bytes=BATCH_BYTES * 5 // 2,
                   max_wal_flush_interval_ms=3_600_000)
    w = open_shard_writer(store.uri, shard, SCHEMA, cfg, store=store)
    for k in range(3):  # the third does not fit beside two: the first two are cut
        w.put(make_batch(1000 + k * ROWS, ROWS))
    w.close()
    assert [len(e.batches) for _, e in WalTailer(store, shard).entries(1)] == [2, 1]


def test_durable_put_group_commits_without_waiting_the_interval(location):
    uri, opts = location
    inner = open_store(uri, opts)
    gated = GatedStore(inner)
    shard = new_shard()
    # An interval no test would wait out: only group commit can make puts durable.
    cfg = wal_only(max_wal_flush_interval_ms=3_600_000)
    with open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=gated) as w:
        w.put(make_batch(0, 1))  # idle log: written at once
        assert wal_rows(inner, shard) == [0]
        gated.close_gate()
        first = threading.Thread(target=w.put, args=(make_batch(1, 1),))
        first.start()
        assert gated.entered.wait(WAIT)  # its PUT is in flight and held
        later = [threading.Thread(target=w.put, args=(make_batch(i, 1),)) for i in (2, 3)]
        for t in later:
            t.start()
        with w._cond:  # both later puts are queued behind the in-flight PUT
            assert w._cond.wait_for(lambda: w._seq == 4, WAIT)
        gated.gate.set()
        for t in [first, *later]:
            t.join(WAIT)
        rows_per_entry = [f.rows for f in w.stats().flushes]
    assert rows_per_entry == [1, 1, 2]  # the two late puts shared one entry
    assert sorted(wal_rows(inner, shard)) == [0, 1, 2, 3]


def test_interval_flush_without_durable_write_needs_no_close(location):
    uri, opts = location
    gated = GatedStore(open_store(uri, opts))
    shard = new_shard()
    cfg = wal_only(durable_write=False, max_wal_flush_interval_ms=20)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=gated)
    w.put(make_batch(0, 3))
    assert gated.wait_landed(1)  # no flush(), no close(): the interval did it
    assert wal_rows(gated, shard) == [0, 1, 2]
    w.close()


def test_non_durable_put_returns_at_once_and_close_drains(location):
    uri, opts = location
    gated = GatedStore(open_store(uri, opts))
    shard = new_shard()
    cfg = wal_only(durable_write=False, max_wal_buffer_size=BATCH_BYTES)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=gated)
    gated.close_gate()
    for k in range(5):  # returns although no WAL PUT can complete
        w.put(make_batch(1000 + k * ROWS, ROWS))
    assert gated.entered.wait(WAIT)
    s = w.stats()
    assert (s.puts, s.rows, s.rows_durable, s.rows_not_durable) == (5, 50, 0, 50)
    assert wal_rows(gated, shard) == []
    gated.gate.set()
    w.close()
    assert wal_rows(gated, shard) == list(range(1000, 1050))
    s = w.stats()
    assert (s.rows_durable, s.rows_not_durable, s.wal_entries) == (50, 0, 5)


def test_flush_makes_queued_rows_durable(location):
    uri, opts = location
    store = open_store(uri, opts)
    shard = new_shard()
    cfg = wal_only(durable_write=False, max_wal_flush_interval_ms=3_600_000)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=store)
    w.put(make_batch(0, 4))
    w.put(make_batch(4, 4))
    w.flush()
    assert wal_rows(store, shard) == list(range(8))
    assert w.stats().wal_entries == 1  # both puts went into one entry
    w.close()


# --- WAL-only mode: backpressure and stalls -------------------------------------------

def test_backpressure_blocks_put_and_releases(location):
    uri, opts = location
    gated = GatedStore(open_store(uri, opts))
    shard = new_shard()
    cfg = wal_only(durable_write=False, max_wal_buffer_size=BATCH_BYTES,
                   max_unflushed_memtable_bytes=2 * BATCH_BYTES)
    w = WatchedWriter(WalAppender.open(gated, shard), SCHEMA, cfg.validate())
    gated.close_gate()
    returned: list[int] = []
    errors: list[BaseException] = []

    def producer():
        try:
            for k in range(6):
                w.put(make_batch(1000 + k * ROWS, ROWS))
                returned.append(k)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    t = threading.Thread(target=producer)
    t.start()
    try:
        assert gated.entered.wait(WAIT), "the flusher never started a WAL PUT"
        assert w.backpressured.wait(WAIT), "a put never hit the unflushed-bytes budget"
        # The PUT is stuck, so the blocked put cannot have been admitted.
        s = w.stats()
        assert returned == [0, 1] and t.is_alive()
        assert (s.rows, s.rows_not_durable, s.wal_entries) == (2 * ROWS, 2 * ROWS, 0)
    finally:
        gated.gate.set()
    t.join(WAIT)
    assert not t.is_alive() and not errors
    assert returned == list(range(6))
    w.close()
    assert wal_rows(gated, shard) == list(range(1000, 1060))
    s = w.stats()
    assert (s.puts, s.rows_durable, s.rows_not_durable) == (6, 60, 0)


def test_stalled_pipeline_raises_writer_stalled(location):
    uri, opts = location
    gated = GatedStore(open_store(uri, opts))
    shard = new_shard()
    cfg = wal_only(backpressure_timeout_ms=150)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=gated)
    gated.close_gate()
    t0 = time.monotonic()
    try:
        with pytest.raises(WriterStalled, match="backpressure_timeout_ms") as info:
            w.put(make_batch(0, 2))
        assert time.monotonic() - t0 >= 0.14
        assert shard in str(info.value)
        assert gated.entered.wait(WAIT)  # stalled inside the PUT, as arranged
    finally:
        gated.gate.set()
    # A stall is terminal, like Fenced: retrying could duplicate queued rows.
    with pytest.raises(WriterStalled) as again:
        w.put(make_batch(2, 2))
    assert again.value is info.value
    with pytest.raises(WriterStalled):
        w.close()


def test_backpressure_wait_also_stalls(location):
    uri, opts = location
    gated = GatedStore(open_store(uri, opts))
    shard = new_shard()
    cfg = wal_only(durable_write=False, max_wal_buffer_size=BATCH_BYTES,
                   max_unflushed_memtable_bytes=BATCH_BYTES, backpressure_timeout_ms=150)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=gated)
    gated.close_gate()
    try:
        w.put(make_batch(1000, ROWS))  # admitted; its PUT then hangs
        with pytest.raises(WriterStalled, match="backpressure"):
            w.put(make_batch(1010, ROWS))
        assert w.stats().rows == ROWS  # the refused batch was never queued
    finally:
        gated.gate.set()
    with pytest.raises(WriterStalled):
        w.close()
    # The admitted batch's PUT finished once released; the refused one never ran.
    assert wal_rows(gated, shard) == list(range(1000, 1010))


# --- WAL-only mode: failures ----------------------------------------------------

@pytest.mark.parametrize("land", [False, True], ids=["failed", "lost-response"])
def test_transient_failures_within_retries_lose_nothing(location, land):
    uri, opts = location
    inner = open_store(uri, opts)
    flaky = FlakyStore(inner, land=land)
    shard = new_shard()
    cfg = wal_only(max_wal_persist_retries=3)
    with open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=flaky) as w:
        for i in range(3):
            flaky.fail_puts = 3  # every entry fails 3 times, then lands
            w.put(make_batch(i * ROWS, ROWS))
    assert wal_rows(inner, shard) == list(range(3 * ROWS))  # no loss, no duplicates
    assert [p for p, *_ in wal_entries(inner, shard)] == [1, 2, 3]
    s = w.stats()
    assert (s.wal_entries, s.rows_durable, s.first_wal_position, s.last_wal_position) == (
        3, 3 * ROWS, 1, 3)


def test_exhausted_retries_poison_every_later_call(location):
    uri, opts = location
    inner = open_store(uri, opts)
    flaky = FlakyStore(inner)
    shard = new_shard()
    w = open_shard_writer(uri, shard, SCHEMA, wal_only(max_wal_persist_retries=2), opts,
                          store=flaky)
    w.put(make_batch(0, 2))
    flaky.fail_puts = 100
    with pytest.raises(WriterPoisoned, match="reopen") as info:
        w.put(make_batch(2, 2))
    flaky.fail_puts = 0
    for call in (lambda: w.put(make_batch(4, 2)), lambda: w.put(make_batch(4, 0)),
                 w.flush, w.close, w.close):
        with pytest.raises(WriterPoisoned) as again:
            call()
        assert again.value is info.value
    assert w.stats().rows_not_durable == 2
    assert wal_rows(inner, shard) == [0, 1]
    # Reopening recovers.
    with open_shard_writer(uri, shard, SCHEMA, wal_only(), opts, store=inner) as w2:
        w2.put(make_batch(10, 1))
    assert wal_rows(inner, shard) == [0, 1, 10]


@pytest.mark.parametrize("fencer", ["appender", "writer"])
def test_fenced_writer_raises_and_reports_unflushed_rows(location, fencer):
    uri, opts = location
    store = open_store(uri, opts)
    shard = new_shard()
    old = open_shard_writer(uri, shard, SCHEMA, wal_only(), opts, store=store)
    old.put(make_batch(0, 3))
    if fencer == "appender":
        new_epoch = WalAppender.open(store, shard).epoch
    else:
        new = open_shard_writer(uri, shard, SCHEMA, wal_only(), opts, store=store)
        new_epoch = new.epoch
        new.close()
    assert new_epoch == 2
    with pytest.raises(Fenced) as info:
        old.put(make_batch(100, 4))
    err = info.value
    assert (err.shard_id, err.local_epoch, err.stored_epoch) == (shard, 1, 2)
    s = old.stats()
    assert (s.rows, s.rows_durable, s.rows_not_durable) == (7, 3, 4)
    for call in (lambda: old.put(make_batch(200, 1)), lambda: old.put(make_batch(200, 0)),
                 old.flush, old.close, old.close):
        with pytest.raises(Fenced) as again:
            call()
        assert again.value is err
    # Nothing of the old epoch landed after the new writer's sentinel.
    entries = wal_entries(store, shard)
    assert entries[:2] == [(1, 1, 3, False), (2, 2, 0, True)]
    assert all(epoch == 2 for _, epoch, _, _ in entries[1:])
    assert 100 not in wal_rows(store, shard)


def test_fenced_writer_with_queued_rows(location):
    uri, opts = location
    store = open_store(uri, opts)
    shard = new_shard()
    cfg = wal_only(durable_write=False, max_wal_flush_interval_ms=3_600_000)
    old = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=store)
    for k in range(3):
        old.put(make_batch(k * ROWS, ROWS))  # queued only
    WalAppender.open(store, shard)
    with pytest.raises(Fenced):
        old.close()
    s = old.stats()
    assert (s.rows_durable, s.rows_not_durable, s.wal_entries) == (0, 3 * ROWS, 0)
    assert wal_entries(store, shard) == [(1, 2, 0, True)]


def test_schema_mismatch_names_the_column_and_does_not_poison(location):
    uri, opts = location
    store = open_store(uri, opts)
    shard = new_shard()
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    with open_shard_writer(uri, shard, schema, wal_only(), opts, store=store) as w:
        with pytest.raises(ConfigError, match="column 'v' has type int32"):
            w.put(pa.record_batch({"id": pa.array([1], pa.int64()),
                                   "v": pa.array([1], pa.int32())}))
        with pytest.raises(ConfigError, match=r"\['id', 'value'\]"):
            w.put(pa.record_batch({"id": pa.array([1], pa.int64()), "value": ["x"]}))
        with pytest.raises(ConfigError,
                           match="^Column 'id' must not be null: drop or fill those rows.*1 null"):
            w.put(pa.record_batch({"id": pa.array([None], pa.int64()), "v": ["x"]}))
        # Nullable input without nulls fits a non-nullable column.
        w.put(pa.record_batch({"id": pa.array([7], pa.int64()), "v": ["ok"]}))
        assert w.stats().puts == 1
    entry = WalTailer(store, shard).read(1)
    assert entry.schema.field("id").nullable is False and entry.num_rows == 1


def test_put_after_close_is_refused(location):
    uri, opts = location
    w = open_shard_writer(uri, new_shard(), SCHEMA, wal_only(), opts,
                          store=open_store(uri, opts))
    w.close()
    w.close()  # idempotent
    with pytest.raises(MemWalError, match="after close"):
        w.put(make_batch(0, 1))


# --- WAL-only mode: stats ---------------------------------------------------

def test_stats_wal_only(location):
    uri, opts = location
    store = open_store(uri, opts)
    shard = new_shard()
    w = open_shard_writer(uri, shard, SCHEMA, wal_only(), opts, store=store)
    s = w.stats()
    assert (s.shard_id, s.epoch, s.mode, s.next_wal_entry_position) == (shard, 1, "wal_only", 1)
    assert (s.first_wal_position, s.last_wal_position, s.sentinel_position) == (None, None, None)
    assert (s.puts, s.rows, s.wal_entries, s.wal_bytes) == (0, 0, 0, 0)
    with pytest.raises(NotInThisMode, match="enable_memtable"):
        s.memtable_stats()
    w.put(make_batch(0, 5))
    w.put([make_batch(5, 5), make_batch(10, 5)])
    w.put(make_batch(15, 0))  # empty: not a put
    w.close()
    s = w.stats()
    assert (s.puts, s.rows, s.wal_entries) == (2, 15, 2)
    assert (s.first_wal_position, s.last_wal_position, s.next_wal_entry_position) == (1, 2, 3)
    sizes = [store.head(wal_key(shard, p)) for p in (1, 2)]
    assert s.wal_bytes == sum(sizes)
    assert [(f.position, f.rows, f.nbytes) for f in s.flushes] == [
        (1, 5, sizes[0]), (2, 10, sizes[1])]
    for f in s.flushes:
        assert 0 <= f.put_s <= f.total_s and 0 <= f.queue_wait_s <= f.total_s
    assert s.bytes == sum(make_batch(i, 5).get_total_buffer_size() for i in (0, 5, 10))

    # A reopen claims epoch 2 and drops its sentinel at the old tip.
    w2 = open_shard_writer(uri, shard, SCHEMA, wal_only(), opts, store=store)
    s2 = w2.stats()
    assert (s2.epoch, s2.sentinel_position, s2.next_wal_entry_position) == (2, 3, 4)
    w2.put(make_batch(100, 1))
    w2.close()
    assert (w2.stats().first_wal_position, w2.stats().last_wal_position) == (4, 4)
    with pytest.raises(NotInThisMode):
        w2.stats().memtable_stats()


@pytest.mark.parametrize("backend", ["local"])
@pytest.mark.parametrize("durable", [True, False])
def test_fsyncs_cost_what_durability_needs(location, monkeypatch, durable):
    """durable_write: two fsyncs per entry, on the PUT path. Without it: none on the
    PUT path; each entry file is fsynced once (by the sync thread, behind the PUTs)
    and its directory after it, before flush() or close() returns."""
    import os

    uri, opts = location
    synced: list[tuple[str, str]] = []  # (path, thread name)
    real_fsync = os.fsync

    def counting(fd):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), threading.current_thread().name))
        return real_fsync(fd)

    shard = new_shard()
    cfg = wal_only(durable_write=durable, max_wal_buffer_size=BATCH_BYTES)
    w = open_shard_writer(uri, shard, SCHEMA, cfg, opts)
    monkeypatch.setattr(os, "fsync", counting)
    for k in range(4):
        w.put(make_batch(1000 + k * ROWS, ROWS))
    w.flush()
    after_flush = [p for p, _ in synced]
    for k in range(4, 8):
        w.put(make_batch(1000 + k * ROWS, ROWS))
    w.close()
    s = w.stats()
    entries = [os.path.join(uri, wal_key(shard, p))
               for p in range(s.first_wal_position, s.last_wal_position + 1)]
    wal_dir = os.path.dirname(entries[0])
    paths = [p for p, _ in synced]
    # WAL files only: closing also writes a manifest (the replay position) with its fsyncs.
    files = [p for p in paths if "/wal/" in p]
    if durable:  # each entry: its temp file, then the directory after the link
        assert len(files) == len(entries) and paths.count(wal_dir) == len(entries)
    else:
        assert sorted(files) == sorted(entries)  # each entry once, by its final name
        assert not [t for _, t in synced if t.startswith("memwal-put")]  # not on the PUT path
        last_dir = len(paths) - 1 - paths[::-1].index(wal_dir)
        assert all(paths.index(e) < last_dir for e in entries)  # names durable after data
        flushed = entries[:4]
        assert set(flushed) <= set(after_flush)  # flush() made the first puts durable
        assert wal_dir in after_flush[after_flush.index(flushed[-1]):]


@pytest.mark.parametrize("backend", ["local"])
@pytest.mark.parametrize("point", ["append.after:1", "writer.closed:1", "commit.before:1",
                                   "commit.after:1"])
def test_without_durable_write_no_committed_row_is_lost_to_kill_9(location, tmp_path,
                                                                    monkeypatch, point):
    """durable_write=false: a put promises nothing, the commit record everything. Killed
    anywhere, the table holds every row of the job once if its record exists, none
    otherwise; the re-run commits exactly once."""
    import signal

    from tests.kill_worker import ROWS as JOB_ROWS
    from tests.test_crash_points import PUTS, run_job
    from tests.test_s3_faults import committed_ids

    uri, opts = location
    monkeypatch.setenv("MEMWAL_DURABLE_WRITE", "false")
    shard = new_shard()
    everything = list(range(PUTS * JOB_ROWS))
    proc, _, err = run_job(uri, opts, shard, point, tmp_path)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {err[-2000:]}"
    recorded = point == "commit.after:1"
    assert committed_ids(uri, opts) == (everything if recorded else [])
    proc2, _, err2 = run_job(uri, opts, shard, None, tmp_path)
    assert proc2.returncode == 0, err2[-2000:]
    assert ("duplicate" if recorded else "committed") in proc2.stdout
    assert committed_ids(uri, opts) == everything


# --- writes after a schema change (Lance's add_columns) ---------------------------------

@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("mode", ["wal_only", "memtable"])
def test_a_write_leaving_out_an_added_nullable_column_stores_nulls(pk_table, mode):
    import lance

    from memwal_datasource.format.memwal import field_id
    from memwal_datasource.format.table_schema import without_row_key
    from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
    from memwal_datasource.maintenance.compact import compact
    from memwal_datasource.memwal_table import MemWalTable
    from memwal_datasource.options import lance_storage_options
    from memwal_datasource.table.view import field_ids, read_table

    uri, opts = pk_table
    table = MemWalTable(uri, opts)
    table.dataset().add_columns(pa.field("extra", pa.int32()))
    ds = table.dataset()
    schema = without_row_key(ds.schema)
    assert schema.names == ["id", "v", "extra"]
    config = (ShardWriterConfig(enable_memtable=True, max_wal_flush_interval_ms=10)
              if mode == "memtable" else wal_only())
    shard = new_shard()
    with open_shard_writer(uri, shard, schema, config, opts) as w:
        w.put(make_batch(1, 3))  # no 'extra'
        # A column the table lacks is refused, the fix first; nothing of it is written.
        with pytest.raises(ConfigError, match=r"^Add column\(s\) \['w'\] to the table first"):
            w.put(make_batch(9, 1).append_column("w", pa.array([1], pa.int32())))
    s = w.stats()
    assert s.rows == 3
    store = open_store(uri, opts)
    CommitLog(store).append(APPEND, [CommittedRange(shard, s.epoch, s.first_wal_position,
                                                    s.last_wal_position, s.rows)])
    # The WAL entry carries the table's whole schema, field ids included.
    entry = WalTailer(store, shard).read(s.first_wal_position)
    ids = field_ids(ds)
    assert [field_id(entry.schema.field(n)) for n in ("id", "v", "extra")] == [
        ids["id"].id, ids["v"].id, ids["extra"].id]
    assert sum(b.column("extra").null_count for b in entry.batches) == 3
    want = {i: (f"row-{i}", None) for i in (1, 2, 3)}
    got = read_table(uri, opts)
    assert got.column_names == ["id", "v", "extra"]
    assert {r["id"]: (r["v"], r["extra"]) for r in got.to_pylist()} == want
    summary = compact(MemWalTable(uri, opts))
    assert summary.rounds and all(r.committed for r in summary.rounds)
    base = lance.dataset(uri, storage_options=lance_storage_options(opts)).to_table()
    assert {r["id"]: (r["v"], r["extra"]) for r in base.to_pylist()} == want


# --- WAL compression ----------------------------------------------------------------

@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
@pytest.mark.parametrize("setting", ["auto", "none", "lz4"])
def test_wal_entries_are_compressed_as_set_and_read_back(location, backend, setting):
    """'auto' compresses on object stores and not on local disk; every entry reads back
    with its rows, whichever way it was written."""
    from memwal_datasource.format.memwal import decode_wal_entry, encode_wal_buffer

    uri, opts = location
    store = open_store(uri, opts)
    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, wal_only(wal_compression=setting), opts,
                           store=store) as w:
        w.put(make_batch(0, 3000))
        w.flush()
        w.put(make_batch(3000, 3000))
    assert wal_rows(store, shard) == list(range(6000))
    compressed = {"auto": backend != "local", "none": False, "lz4": True}[setting]
    for pos, entry in WalTailer(store, shard).entries(1):
        stored = store.get(wal_key(shard, pos))
        again = decode_wal_entry(stored, f"position {pos}")
        plain = encode_wal_buffer(again.schema, again.batches, again.writer_epoch)
        # Uncompressed, an entry is exactly the plain stream; make_batch's "row-N" strings
        # and sequential ids shrink under either codec.
        if compressed:
            assert len(stored) < 0.8 * plain.size, (pos, len(stored), plain.size)
        else:
            assert len(stored) == plain.size
        assert entry.num_rows == 3000


def test_a_long_lived_writer_remembers_only_its_latest_flush_timings():
    """A writer kept between tasks may flush thousands of times: its stats keep at most
    twice MAX_FLUSH_TIMINGS timings, the newest."""
    from memwal_datasource.shard.writer_base import MAX_FLUSH_TIMINGS, FlushTiming, WriterStats

    stats = WriterStats("s", 1, "wal_only")
    for i in range(5 * MAX_FLUSH_TIMINGS):
        stats.add_flush(FlushTiming(0.0, 0.0, 0.0, rows=1, nbytes=1, position=i + 1))
    assert MAX_FLUSH_TIMINGS <= len(stats.flushes) <= 2 * MAX_FLUSH_TIMINGS
    assert stats.flushes[-1].position == 5 * MAX_FLUSH_TIMINGS
    positions = [f.position for f in stats.flushes]
    assert positions == list(range(positions[0], positions[-1] + 1))


def test_an_open_writer_keeps_no_rows_it_made_durable(tmp_path):
    """A writer kept open between tasks holds none of the rows it already wrote (nor the
    encoded entry): its threads wait without them."""
    import gc
    import weakref

    uri = str(tmp_path / "t.lance")
    store = open_store(uri)
    w = open_shard_writer(uri, new_shard(), SCHEMA, wal_only(), store=store)
    try:
        batch = make_batch(0, 5000)
        gone = weakref.ref(batch)
        w.put(batch)
        w.flush()
        del batch
        gc.collect()
        assert gone() is None
        assert w.stats().rows_durable == 5000
    finally:
        w.close()
