"""pylance 14's native MemWAL writer as the oracle, on local disk and S3.

What it writes we must read (WAL entries, fence sentinels, manifests), and what
we write it must read (WAL entries it replays, manifests it claims from, our
fence sentinels it collides with).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pyarrow as pa
import pytest

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import Fenced
from memwal_datasource.format.manifest_format import (
    SHARD_ACTIVE,
    SHARD_SEALED,
    decode_manifest,
    decode_version_hint,
    encode_manifest,
)
from memwal_datasource.format.memwal import manifest_key, shard_dir, version_hint_key, wal_key
from memwal_datasource.options import lance_storage_options
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import WalAppender, WalTailer
from memwal_datasource.store import open_store
from memwal_datasource.table.view import create_table
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA, make_batch, new_shard

both = pytest.mark.parametrize("backend", ["local", "s3"])


@pytest.fixture
def table(location):
    """A fresh Lance table with primary key ``id`` and a MemWAL, plus our store on it."""
    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    return uri, opts, open_store(uri, opts)


def native(uri, opts, shard, **kw):
    """A native pylance ShardWriter (claims an epoch, fences, replays on open)."""
    import lance

    kw.setdefault("max_wal_flush_interval_ms", 10)
    ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
    return ds.mem_wal_writer(shard, **kw)


def arrow(batch: pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([batch])


def lsm_ids(writer) -> list[int]:
    return sorted(writer.lsm_scanner().to_table().column("id").to_pylist())


def close_quietly(writer) -> None:
    with contextlib.suppress(OSError):  # a fenced native writer's close raises
        writer.close()


def entries(store, shard):
    """(position, epoch, is_sentinel, ids, tombstones) of every WAL entry."""
    out = []
    for pos, e in WalTailer(store, shard).entries(1, include_sentinels=True):
        t = pa.Table.from_batches(e.batches, schema=e.schema)
        tomb = t.column("_tombstone").to_pylist() if "_tombstone" in t.column_names else None
        ids = t.column("id").to_pylist() if t.num_columns else []
        out.append((pos, e.writer_epoch, e.is_sentinel, ids, tomb))
    return out


# --- (a) pylance writes, we read ---------------------------------------------------

@both
def test_we_read_every_native_row_and_epoch(table):
    uri, opts, store = table
    shard = new_shard()
    w1 = native(uri, opts, shard)
    w1.put(arrow(make_batch(0, 3)))
    w1.put(pa.Table.from_batches([make_batch(3, 2), make_batch(5, 2)]))  # one entry, 2 batches
    w1.delete(pa.table({"id": pa.array([1], pa.int64())}))
    tailer = WalTailer(store, shard)
    first = tailer.read(1)
    assert first.schema.names == ["id", "v", "_tombstone"]  # native entries carry tombstones
    assert (first.writer_epoch, first.generation, first.is_sentinel) == (1, 1, False)
    assert len(tailer.read(2).batches) == 2
    assert entries(store, shard) == [
        (1, 1, False, [0, 1, 2], [False] * 3),
        (2, 1, False, [3, 4, 5, 6], [False] * 4),
        (3, 1, False, [1], [True]),
    ]
    assert tailer.next_position() == 4 and tailer.first_position() == 1

    # A second native writer claims epoch 2 and drops its sentinel at the tip.
    w2 = native(uri, opts, shard)
    with pytest.raises(OSError, match="(?i)fenced"):
        w1.put(arrow(make_batch(100, 1)))
    w2.put(arrow(make_batch(7, 1)))
    got = entries(store, shard)
    assert got[3] == (4, 2, True, [], None)  # empty schema, no batches
    assert got[4] == (5, 2, False, [7], [False])
    assert len(got) == 5  # the fenced put never landed
    sentinel = tailer.read(4)
    assert sentinel.schema.names == [] and sentinel.num_rows == 0
    # Rows as a reader sees them: sentinels skipped, entries in order.
    assert [p for p, _ in tailer.entries(1)] == [1, 2, 3, 5]
    assert lsm_ids(w2) == [0, 2, 3, 4, 5, 6, 7]  # the oracle agrees (1 was deleted)
    close_quietly(w1)
    w2.close()


# --- (d) manifests: theirs decoded by us ----------------------------------------

@both
def test_we_decode_native_manifests(table):
    uri, opts, store = table
    shard = new_shard()
    w = native(uri, opts, shard)
    for i in range(3):
        w.put(arrow(make_batch(i * 10, 2)))
    w.close()
    raw1 = store.get(manifest_key(shard, 1))
    raw2 = store.get(manifest_key(shard, 2))
    m1 = decode_manifest(raw1, "v1")
    assert (m1.shard_id, m1.version, m1.writer_epoch, m1.current_generation) == (shard, 1, 1, 1)
    assert (m1.replay_after_wal_entry_position, m1.wal_entry_position_last_seen) == (0, 0)
    assert (m1.sstables, m1.status, m1.shard_spec_id, m1.shard_field_entries) == (
        [], SHARD_ACTIVE, 0, [])
    m2 = decode_manifest(raw2, "v2")
    assert (m2.shard_id, m2.version, m2.writer_epoch, m2.current_generation) == (shard, 2, 1, 2)
    # The close flushed entries 1..3 into the generation-1 SSTable.
    assert (m2.replay_after_wal_entry_position, m2.wal_entry_position_last_seen) == (3, 3)
    assert len(m2.sstables) == 1
    sst = m2.sstables[0]
    assert sst.generation == 1 and re.fullmatch(r"[0-9a-f]{8}_gen_1", sst.path)
    assert sst.physical_rows == 6 and sst.in_memory_bytes > 0 and sst.primary_key_bytes > 0
    assert list(store.list(f"{shard_dir(shard)}/{sst.path}/"))  # the SSTable is there
    # Our encoder reproduces their bytes exactly.
    assert encode_manifest(m1) == raw1 and encode_manifest(m2) == raw2
    assert decode_version_hint(store.get(version_hint_key(shard))) == 2
    assert ManifestStore(store, shard).latest().version == 2


# --- (b) we write, pylance replays ------------------------------------------------------

@both
def test_native_writer_replays_our_wal_only_entries(table):
    uri, opts, store = table
    shard = new_shard()
    cfg = ShardWriterConfig(enable_memtable=False, max_wal_flush_interval_ms=5)
    with open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=store) as ours:
        for i in range(3):
            ours.put(make_batch(i * 10, 3))
    assert ours.stats().last_wal_position == 3
    # Our close moves the replay position past our entries: a native opener replays
    # nothing (committed rows are read from their WAL ranges, never from SSTables).
    manifests = ManifestStore(store, shard)
    assert manifests.latest().replay_after_wal_entry_position == 3
    w = native(uri, opts, shard)
    assert w.memtable_stats()["row_count"] == 0
    w.close()
    # As an older version of this package left it (replay position 0, entries without
    # field ids or _tombstone aside): pylance replays our entries.
    m = manifests.latest()
    manifests.commit_update(m.writer_epoch, lambda m: setattr(
        m, "replay_after_wal_entry_position", 0))

    w = native(uri, opts, shard)
    assert ManifestStore(store, shard).latest().writer_epoch == 3
    assert lsm_ids(w) == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert w.memtable_stats()["row_count"] == 9
    w.put(arrow(make_batch(100, 1)))
    w.close()
    assert [(p, e, s) for p, e, s, _, _ in entries(store, shard)] == [
        (1, 1, False), (2, 1, False), (3, 1, False), (4, 2, True), (5, 3, True),
        (6, 3, False)]
    m = ManifestStore(store, shard).latest()
    assert m.replay_after_wal_entry_position == 6 and m.sstables[0].physical_rows == 10
    # And once more, now from the SSTable.
    w3 = native(uri, opts, shard)
    assert lsm_ids(w3) == [0, 1, 2, 10, 11, 12, 20, 21, 22, 100]
    w3.close()


@both
@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_native_writer_replays_our_compressed_entries(table, codec):
    """Entries we write with IPC buffer compression (the default on object stores)
    are replayed by pylance like plain ones, mixed with plain ones in one shard."""
    uri, opts, store = table
    shard = new_shard()
    for i, setting in enumerate([codec, "none", codec]):
        cfg = ShardWriterConfig(enable_memtable=False, max_wal_flush_interval_ms=5,
                                wal_compression=setting)
        with open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=store) as ours:
            ours.put(make_batch(i * 1000, 500))
    manifests = ManifestStore(store, shard)
    m = manifests.latest()
    manifests.commit_update(m.writer_epoch, lambda m: setattr(
        m, "replay_after_wal_entry_position", 0))
    w = native(uri, opts, shard)
    expected = [i * 1000 + k for i in range(3) for k in range(500)]
    assert w.memtable_stats()["row_count"] == 1500
    assert lsm_ids(w) == expected
    w.close()


@both
def test_native_replays_our_entries_after_its_own_sstable(table):
    uri, opts, store = table
    shard = new_shard()
    w1 = native(uri, opts, shard)
    w1.put(arrow(make_batch(0, 2)))
    w1.close()  # SSTable gen 1, replay_after 1
    app = WalAppender.open(store, shard, schema=SCHEMA)
    # Our claim kept their fields and bumped only version and epoch.
    m = ManifestStore(store, shard).latest()
    assert (m.version, m.writer_epoch, m.replay_after_wal_entry_position) == (3, 2, 1)
    assert [s.generation for s in m.sstables] == [1] and m.current_generation == 2
    assert app.sentinel_position == 2
    assert app.append(SCHEMA, [make_batch(50, 2)]).position == 3
    w3 = native(uri, opts, shard)
    assert ManifestStore(store, shard).latest().writer_epoch == 3
    assert lsm_ids(w3) == [0, 1, 50, 51]
    with pytest.raises(Fenced):
        app.append(SCHEMA, [make_batch(60, 1)])
    w3.close()


# --- (c) fencing both ways ---------------------------------------------------------

@both
def test_our_claim_fences_a_live_native_writer(table):
    uri, opts, store = table
    shard = new_shard()
    w = native(uri, opts, shard)
    w.put(arrow(make_batch(0, 2)))
    app = WalAppender.open(store, shard, schema=SCHEMA)
    assert (app.epoch, app.sentinel_position) == (2, 2)
    with pytest.raises(OSError, match="local epoch 1 < stored epoch 2"):
        w.put(arrow(make_batch(10, 2)))
    with pytest.raises(OSError, match="(?i)fenced"):  # and stays fenced
        w.put(arrow(make_batch(20, 2)))
    close_quietly(w)
    app.append(SCHEMA, [make_batch(30, 1)])
    assert [(p, e, s, ids) for p, e, s, ids, _ in entries(store, shard)] == [
        (1, 1, False, [0, 1]), (2, 2, True, []), (3, 2, False, [30])]


@both
def test_our_wal_only_writer_fences_native_through_our_wrapper(table):
    uri, opts, store = table
    shard = new_shard()
    theirs = open_shard_writer(uri, shard, SCHEMA,
                               ShardWriterConfig(max_wal_flush_interval_ms=10), opts)
    theirs.put(make_batch(0, 1))
    ours = open_shard_writer(uri, shard, SCHEMA,
                             ShardWriterConfig(enable_memtable=False), opts, store=store)
    with pytest.raises(Fenced) as info:
        theirs.put(make_batch(1, 1))
    assert (info.value.local_epoch, info.value.stored_epoch) == (1, 2)
    theirs.abort()
    ours.put(make_batch(2, 1))
    ours.close()
    w = native(uri, opts, shard)
    # Nothing replayed: the fenced native attempt's row 0 was never committed, and our
    # row 2 is read from its WAL range (our close moved the replay position past it).
    assert lsm_ids(w) == []
    w.close()


@both
def test_native_open_fences_our_appender(table):
    uri, opts, store = table
    shard = new_shard()
    app = WalAppender.open(store, shard, schema=SCHEMA)
    app.append(SCHEMA, [make_batch(0, 2)])
    w = native(uri, opts, shard)
    with pytest.raises(Fenced) as info:
        app.append(SCHEMA, [make_batch(10, 2)])
    assert (info.value.shard_id, info.value.local_epoch, info.value.stored_epoch) == (shard, 1, 2)
    with pytest.raises(Fenced):
        app.append(SCHEMA, [make_batch(20, 2)])
    w.put(arrow(make_batch(5, 1)))
    got = entries(store, shard)
    assert [(p, e, s) for p, e, s, _, _ in got] == [(1, 1, False), (2, 2, True), (3, 2, False)]
    assert lsm_ids(w) == [0, 1, 5]
    w.close()


@both
def test_native_open_fences_our_queued_rows(table):
    uri, opts, store = table
    shard = new_shard()
    cfg = ShardWriterConfig(enable_memtable=False, durable_write=False,
                            max_wal_flush_interval_ms=3_600_000)
    ours = open_shard_writer(uri, shard, SCHEMA, cfg, opts, store=store)
    ours.put(make_batch(0, 2))
    ours.flush()
    ours.put(make_batch(10, 2))  # queued, not yet durable
    w = native(uri, opts, shard)
    with pytest.raises(Fenced):
        ours.close()
    assert ours.stats().rows_not_durable == 2
    # Nothing of ours above the native sentinel.
    got = entries(store, shard)
    assert [(p, e, s) for p, e, s, _, _ in got] == [(1, 1, False), (2, 2, True)]
    assert lsm_ids(w) == [0, 1]
    w.close()


# --- (d) manifests: ours read by pylance -------------------------------------------

@both
def test_native_claims_the_epoch_after_ours(table):
    uri, opts, store = table
    shard = new_shard()
    manifests = ManifestStore(store, shard)
    for _ in range(3):
        manifests.claim_epoch()
    assert manifests.latest().writer_epoch == 3
    w = native(uri, opts, shard)
    # Its claim is the version after ours, with our epoch + 1 (it may add cursor updates).
    assert manifests.load(4).writer_epoch == 4 and manifests.latest().writer_epoch == 4
    w.put(arrow(make_batch(0, 1)))
    assert [(p, e, s) for p, e, s, _, _ in entries(store, shard)] == [
        (1, 4, True), (2, 4, False)]
    w.close()


@both
def test_native_honours_our_replay_after(table):
    uri, opts, store = table
    shard = new_shard()
    app = WalAppender.open(store, shard, schema=SCHEMA)
    for i in range(3):
        app.append(SCHEMA, [make_batch(i * 10, 2)])

    def replayed_up_to_2(m):
        m.replay_after_wal_entry_position = 2

    ManifestStore(store, shard).commit_update(app.epoch, replayed_up_to_2)
    w = native(uri, opts, shard)
    assert lsm_ids(w) == [20, 21]  # entries 1 and 2 were skipped as already flushed
    w.close()


@both
def test_native_refuses_our_sealed_shard(table):
    uri, opts, store = table
    shard = new_shard()
    app = WalAppender.open(store, shard, schema=SCHEMA)

    def seal(m):
        m.status = SHARD_SEALED

    ManifestStore(store, shard).commit_update(app.epoch, seal)
    with pytest.raises(OSError, match="(?i)sealed"):
        native(uri, opts, shard)
    m = ManifestStore(store, shard).latest()
    assert (m.version, m.writer_epoch, m.status) == (2, 1, SHARD_SEALED)


def test_our_crashed_temp_file_does_not_mislead_native_tip_discovery(tmp_path):
    """A local put-if-absent killed before its link leaves a temp file in ``wal/``.

    pylance finds the tip by LIST when the manifest has no hint and parses the
    name up to the first '.', so a temp named like an entry would push its
    sentinel past a live writer's next slot (a false ack). Ours are dot-prefixed.
    """
    uri, opts = str(tmp_path / "t.lance"), {}  # local disk only: S3 has no temp files
    create_table(uri, SCHEMA, primary_key=["id"])
    store = open_store(uri)
    shard = new_shard()
    app = WalAppender.open(store, shard, schema=SCHEMA)
    app.append(SCHEMA, [make_batch(0, 1)])
    leftover = store._write_temp(store._path(wal_key(shard, 3)), b"half an entry")
    assert list(store.list(f"{shard_dir(shard)}/wal/")) == [wal_key(shard, 1)]
    w = native(uri, opts, shard)
    sentinel = WalTailer(store, shard).read(2)  # the sentinel went to the real tip
    assert sentinel is not None and (sentinel.is_sentinel, sentinel.writer_epoch) == (True, 2)
    with pytest.raises(Fenced):
        app.append(SCHEMA, [make_batch(1, 1)])
    w.close()
    assert Path(leftover).exists()
