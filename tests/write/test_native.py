"""MemTable mode (pylance's native writer behind our interface) and crash replay.

pylance needs a real Lance table, so these run on local disk and S3 only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import ConfigError, Fenced, MemWalError
from memwal_datasource.options import lance_storage_options
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table
from memwal_datasource.write.native import NativeShardWriter
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA, DelegatingStore, make_batch, new_shard, wal_entries, wal_rows
from tests.shard.test_writer import ROWS, wal_only

REPO = Path(__file__).resolve().parents[2]


# --- MemTable mode (pylance's native writer) ----------------------------------------

native_backends = pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])


@pytest.fixture
def table(pk_table):
    """A fresh Lance table with primary key ``id`` and a MemWAL: (uri, options)."""
    return pk_table


def memtable(**kw) -> ShardWriterConfig:
    kw.setdefault("max_wal_flush_interval_ms", 10)
    return ShardWriterConfig(enable_memtable=True, **kw)


def lsm_ids(uri: str, opts: dict, shard: str) -> list[int]:
    """Open a native writer (it replays the WAL) and return every id it sees."""
    import lance

    ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
    with ds.mem_wal_writer(shard, max_wal_flush_interval_ms=10) as w:
        return sorted(w.lsm_scanner().to_table().column("id").to_pylist())


@native_backends
def test_memtable_mode_put_close_reopen(table):
    uri, opts = table
    store = open_store(uri, opts)
    shard = new_shard()
    w = open_shard_writer(uri, shard, SCHEMA, memtable(), opts)
    assert isinstance(w, NativeShardWriter) and w.epoch == 1
    assert w.stats().next_wal_entry_position == 1  # known right from open
    for i in range(3):
        w.put(make_batch(i * ROWS, ROWS))
    live = w.stats()
    assert live.next_wal_entry_position == 4  # durable puts: entries 1..3 are down
    assert (live.mode, live.puts, live.rows, live.rows_durable) == ("memtable", 3, 30, 30)
    mt = live.memtable_stats()
    assert (mt["row_count"], mt["generation"]) == (30, 1)
    w.close()
    s = w.stats()
    assert (s.epoch, s.first_wal_position, s.last_wal_position, s.wal_entries) == (1, 1, 3, 3)
    assert (s.next_wal_entry_position, s.sentinel_position) == (4, None)
    m = ManifestStore(store, shard).latest()
    assert [t.path for t in m.sstables] == s.sstables and len(s.sstables) == 1
    assert s.sstables[0].endswith("_gen_1") and m.sstables[0].physical_rows == 30
    assert (m.writer_epoch, m.replay_after_wal_entry_position, m.current_generation) == (1, 3, 2)

    assert lsm_ids(uri, opts, shard) == list(range(30))  # epoch 2, sentinel at 4

    w3 = open_shard_writer(uri, shard, SCHEMA, memtable(), opts)
    # Our fence claims epoch 3 (sentinel at 5, replay position 5); pylance claims 4.
    assert w3.epoch == 4
    assert w3.stats().next_wal_entry_position == 7  # past pylance's sentinel at 6
    w3.put(make_batch(100, 2))
    w3.close()
    s3 = w3.stats()
    # Epoch 2 left its sentinel at 4, our fence its own at 5; pylance's is at 6, its entry at 7.
    assert (s3.sentinel_position, s3.first_wal_position, s3.last_wal_position) == (6, 7, 7)
    assert [(p, e, sent) for p, e, _r, sent in wal_entries(store, shard)[3:]] == [
        (4, 2, True), (5, 3, True), (6, 4, True), (7, 4, False)]
    assert len(s3.sstables) == 1 and s3.sstables[0] not in s.sstables
    assert lsm_ids(uri, opts, shard) == list(range(30)) + [100, 101]


@native_backends
def test_memtable_mode_fenced_is_translated(table):
    uri, opts = table
    store = open_store(uri, opts)
    shard = new_shard()
    old = open_shard_writer(uri, shard, SCHEMA, memtable(), opts)
    old.put(make_batch(0, 2))
    new = open_shard_writer(uri, shard, SCHEMA, memtable(), opts)
    assert new.epoch == 3  # our fence claimed 2
    with pytest.raises(Fenced) as info:
        old.put(make_batch(50, 2))
    assert (info.value.shard_id, info.value.local_epoch, info.value.stored_epoch) == (shard, 1, 3)
    with pytest.raises(Fenced) as again:
        old.put(make_batch(60, 2))
    assert again.value is info.value
    with pytest.raises(Fenced):
        old.close()
    new.put(make_batch(10, 1))
    new.close()
    # The fenced put never landed; the new writer replayed nothing of the old
    # (uncommitted) attempt, so its rows stay out of the SSTables.
    assert [(e, r, sent) for _, e, r, sent in wal_entries(store, shard)] == [
        (1, 2, False), (2, 0, True), (3, 0, True), (3, 1, False)]
    assert lsm_ids(uri, opts, shard) == [10]


@native_backends
def test_memtable_mode_fenced_by_our_wal_only_claim(table):
    uri, opts = table
    shard = new_shard()
    old = open_shard_writer(uri, shard, SCHEMA, memtable(), opts)
    old.put(make_batch(0, 2))
    ours = open_shard_writer(uri, shard, SCHEMA, wal_only(), opts)
    with pytest.raises(Fenced) as info:
        old.put(make_batch(50, 2))
    assert info.value.stored_epoch == 2
    ours.put(make_batch(7, 1))
    ours.close()
    old.abort()
    # A native opener replays nothing: the fenced attempt's rows were never committed,
    # and ours are read from their WAL range (our close moved the replay position).
    assert lsm_ids(uri, opts, shard) == []


@pytest.mark.parametrize("name,value", [
    ("max_wal_persist_retries", 5),
    ("wal_persist_retry_base_delay_ms", 10),
    ("backpressure_timeout_ms", 1000),
    ("max_wal_flush_interval_ms", 0),  # with durable_write
    ("wal_compression", "zstd"),  # pylance writes uncompressed entries
])
def test_memtable_mode_refuses_unsupported_settings_before_claim(tmp_path, name, value):
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA, primary_key=["id"])
    store = open_store(uri)
    fresh = new_shard()
    with pytest.raises(ConfigError, match=name):
        open_shard_writer(uri, fresh, SCHEMA, ShardWriterConfig(**{name: value}))
    assert ManifestStore(store, fresh).latest() is None

    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, memtable()) as live:
        with pytest.raises(ConfigError, match=name):
            open_shard_writer(uri, shard, SCHEMA, ShardWriterConfig(**{name: value}))
        assert ManifestStore(store, shard).latest().writer_epoch == live.epoch == 1
        live.put(make_batch(0, 1))  # still the owner


def test_memtable_mode_without_table_is_a_clear_error(tmp_path):
    uri = str(tmp_path / "missing.lance")
    with pytest.raises(MemWalError, match="needs an existing Lance table"):
        open_shard_writer(uri, new_shard(), SCHEMA, memtable())


# --- crash replay -----------------------------------------------------------------

def run_until_acks(mode: str, uri: str, opts: dict, shard: str, acks: int,
                   tmp_path: Path) -> list[tuple[int, int]]:
    """Start tests/crash_worker.py, SIGKILL it after ``acks`` acknowledged puts.

    Returns every acknowledged (start, end) id range the worker printed.
    """
    env = dict(os.environ, MEMWAL_CRASH_STORAGE_OPTIONS=json.dumps(opts),
               PYTHONPATH=str(REPO))
    err_path = tmp_path / f"crash-{mode}.stderr"
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.crash_worker", mode, uri, shard, str(ROWS)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    got: list[tuple[int, int]] = []
    try:
        while len(got) < acks:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"worker exited ({proc.wait()}) after {len(got)} acks: "
                            f"{err_path.read_text()[-2000:]}")
            if line.startswith("ack "):
                _, a, b = line.split()
                got.append((int(a), int(b)))
        assert proc.poll() is None, "the worker finished before it was killed"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    for line in rest.splitlines():  # acks printed before the kill landed
        if line.startswith("ack "):
            _, a, b = line.split()
            got.append((int(a), int(b)))
    return got


def check_acked_present(acked: list[tuple[int, int]], present: list[int]) -> None:
    want = {i for a, b in acked for i in range(a, b)}
    assert want <= set(present), f"acknowledged rows lost: {sorted(want - set(present))[:10]}"
    # Whole puts of a prefix of the stream, each exactly once.
    assert sorted(present) == list(range(len(present))) and len(present) % ROWS == 0


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_crash_wal_only_keeps_every_acknowledged_row(location, tmp_path):
    uri, opts = location
    shard = new_shard()
    acked = run_until_acks("wal", uri, opts, shard, 15, tmp_path)
    store = open_store(uri, opts)
    present = wal_rows(store, shard)
    check_acked_present(acked, present)
    # The next writer claims epoch 2 and continues after the crashed tail.
    with open_shard_writer(uri, shard, SCHEMA, wal_only(), opts, store=store) as w:
        assert w.epoch == 2
        w.put(make_batch(10_000, 1))
    assert wal_rows(store, shard) == present + [10_000]


@native_backends
def test_crash_memtable_mode_replays_every_acknowledged_row(table, tmp_path):
    uri, opts = table
    shard = new_shard()
    acked = run_until_acks("memtable", uri, opts, shard, 15, tmp_path)
    check_acked_present(acked, lsm_ids(uri, opts, shard))
    # The replaying open above claimed epoch 2; our fence claims 3, pylance 4.
    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w:
        assert w.epoch == 4


@native_backends
def test_zombie_held_before_its_tip_is_fenced_after_a_native_writer(table):
    """Our writer stalls between claim and tip; pylance's writer claims, writes, closes."""
    import lance
    import pyarrow as pa

    from tests.helpers import HeldOpen

    uri, opts = table
    shard = new_shard()
    store = open_store(uri, opts)
    with HeldOpen(store, shard, epoch=1) as zombie:
        ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
        with ds.mem_wal_writer(shard, max_wal_flush_interval_ms=10) as native:
            native.put(pa.Table.from_batches([make_batch(0, 3)]))
    assert isinstance(zombie.outcome, Fenced) and zombie.outcome.stored_epoch == 2
    assert [e for e in wal_entries(store, shard) if e[1] == 1 and not e[3]] == []


@native_backends
def test_native_epoch_is_the_one_it_claimed_not_the_latest(table):
    """A claim that lands during the native open makes the epoch unknowable: refuse it."""
    from memwal_datasource import hooks
    from memwal_datasource.errors import WriterPoisoned
    from memwal_datasource.write.native import claimed_epoch

    uri, opts = table
    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w:
        assert w.epoch == 1
    ms = ManifestStore(open_store(uri, opts), shard)
    before = ms.latest()

    class Native:
        closed = False

        def close(self):
            Native.closed = True

    ms.claim_epoch()  # the native open's claim (epoch 2) ...
    assert claimed_epoch(ms, before.version, before.writer_epoch, Native()) == 2
    ms.claim_epoch()  # ... and a rival's claim (epoch 3) during the same open
    with pytest.raises(WriterPoisoned, match=r"\[2, 3\] were claimed"):
        claimed_epoch(ms, before.version, before.writer_epoch, Native())
    assert Native.closed
    hooks.clear()


class _ManifestReads(DelegatingStore):
    """Counts GETs of each shard manifest version (``.binpb``) made through our store."""

    def __init__(self, inner):
        super().__init__(inner)
        self.gets: dict[str, int] = {}

    def get(self, key):
        if key.endswith(".binpb"):
            self.gets[key] = self.gets.get(key, 0) + 1
        return super().get(key)


@native_backends
@pytest.mark.parametrize("mode", ["memtable", "wal_only"])
def test_one_open_reads_each_manifest_version_once(table, mode):
    """An open (the sharding check, our fence, pylance's claim, the tip) shares one chain
    object, so each version it reads is fetched once, not once per step; the writer it
    returns still holds the shard and is fenced by a newer claim."""
    uri, opts = table
    shard = new_shard()
    config = memtable() if mode == "memtable" else ShardWriterConfig(enable_memtable=False)
    first = open_shard_writer(uri, shard, SCHEMA, config, opts)  # a shard with history
    first.put(make_batch(0, ROWS))
    first.close()
    counting = _ManifestReads(open_store(uri, opts))
    manifests = ManifestStore(counting, shard)
    w = open_shard_writer(uri, shard, SCHEMA, config, opts, manifests=manifests)
    w.put(make_batch(ROWS, ROWS))
    w.close()
    assert counting.gets and max(counting.gets.values()) == 1, counting.gets
    stored = ManifestStore(open_store(uri, opts), shard).latest()
    assert w.stats().epoch == stored.writer_epoch > first.stats().epoch
    # A writer opened this way is fenced by a claim made after its open like any other.
    shared = open_shard_writer(uri, shard, SCHEMA, config, opts,
                               manifests=ManifestStore(open_store(uri, opts), shard))
    shared.put(make_batch(2 * ROWS, ROWS))
    newer = open_shard_writer(uri, shard, SCHEMA, config, opts)
    with pytest.raises(Fenced):
        shared.put(make_batch(3 * ROWS, ROWS))
        shared.close()
    newer.close()
