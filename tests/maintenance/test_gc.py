"""Garbage collection behind a fence: it deletes only what compaction made unnecessary,
readers and writers that start afterwards find tips and rows, and a writer stalled
across a collection is fenced instead of landing in a freed slot."""

from __future__ import annotations

import pytest

from memwal_datasource import hooks
from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import Fenced
from memwal_datasource.log.commit import CommitLog, CommitRefused, CommittedRange
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.maintenance.gc import collect, plan
from memwal_datasource.shard.wal import WalAppender, WalTailer
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, read_table
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA, later, new_shard
from tests.maintenance.test_compact import batch, write

pytestmark = pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])


def rows(uri, opts) -> dict[int, str]:
    return {r["id"]: r["v"] for r in read_table(uri, opts).to_pylist()}


def test_gc_deletes_only_compacted_entries_and_readers_still_agree(pk_table):
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    for i in range(4):
        write(uri, opts, shard, [batch([i, 100 + i], f"w{i}")])
    write(uri, opts, shard, [batch([999], "lost")], commit=False)  # an uncommitted entry
    table = TableView(uri, opts)
    assert plan(table, retain_seconds=0).items() == []  # nothing compacted: nothing to free
    compact(table)
    write(uri, opts, shard, [batch([7], "tail")])  # committed, not compacted: must stay
    before = rows(uri, opts)
    dry = collect(table, retain_seconds=0, dry_run=True, clock=later(table))
    assert dry.shards and dry.bytes > 0
    assert all(store.exists(k) for k, _ in dry.items())  # a dry run changes nothing
    done = collect(table, retain_seconds=0, clock=later(table))
    assert [k for k, _ in done.items()] == [k for k, _ in dry.items()]
    assert not any(store.exists(k) for k, _ in done.items())
    tailer = WalTailer(store, shard)
    floor = done.shards[0].floor
    assert tailer.first_position() >= floor > 1
    assert rows(uri, opts) == before  # whole-table read unchanged
    assert TableView(uri, opts).committed_tail()  # the tail entry is still there
    # A writer that opens after the collection finds the tip, not a freed slot.
    with open_shard_writer(uri, shard, SCHEMA,
                           ShardWriterConfig(enable_memtable=False), opts) as w:
        w.put(batch([8], "after"))
    assert w.stats().first_wal_position > floor and tailer.next_position() > floor
    # pylance's own writer opens after a collection and replays nothing (our writers'
    # closes moved the replay position past their entries): it sees the base table.
    import lance

    from memwal_datasource.options import lance_storage_options

    ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
    with ds.mem_wal_writer(shard, max_wal_flush_interval_ms=10) as native:
        seen = native.lsm_scanner().to_table().column("id").to_pylist()
    assert sorted(seen) == [0, 1, 2, 3, 100, 101, 102, 103]
    # Checkpoints forget released ranges: they stay O(uncompacted), not O(history).
    ck = CommitLog(store).checkpoint()
    assert ck.visible and all(r.last >= ck.floors[r.shard_id] for r in ck.visible)
    assert len(ck.visible) < ck.records
    again = collect(TableView(uri, opts), retain_seconds=0, clock=later(table))
    assert again.shards == []  # no WAL entry left to release
    assert again.records  # the checkpoint now stands for the released records: they go
    assert not store.exists(again.records[0][0])
    assert rows(uri, opts) == before  # and every reader still agrees


def test_retention_keeps_recent_entries(pk_table):
    uri, opts = pk_table
    shard = new_shard()
    write(uri, opts, shard, [batch([1], "a")])
    table = TableView(uri, opts)
    compact(table)
    assert plan(table, retain_seconds=3600).shards == []
    assert plan(table, retain_seconds=0, clock=later(table)).shards


def test_writer_stalled_across_gc_is_fenced_not_landing_in_a_freed_slot(pk_table):
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    zombie = open_shard_writer(uri, shard, SCHEMA, ShardWriterConfig(enable_memtable=False),
                               opts)  # epoch 1: writes at 1, then stalls
    zombie.put(batch([50], "z"))
    zombie.flush()
    for i in range(2):  # a newer writer takes over, commits, and is compacted
        write(uri, opts, shard, [batch([i], f"n{i}")])
    table = TableView(uri, opts)
    compact(table)
    done = collect(table, retain_seconds=0, clock=later(table))
    assert done.shards and done.shards[0].floor > 2
    assert not store.exists(done.shards[0].entries[0][0])  # the zombie's next slot is free
    # The zombie wakes after a long stall: it re-checks the fence before writing.
    zombie._appender._last_ok -= 3600  # noqa: SLF001 - stands for an hour-long stall
    with pytest.raises(Fenced):
        zombie.put(batch([51], "z"))
        zombie.close()
    # A zombie that wakes sooner may land in a freed slot, but its commit is refused.
    stale = CommittedRange(shard, 1, 1, 2, 2)
    with pytest.raises(CommitRefused, match="garbage collection released"):
        CommitLog(store).append("append", [stale])
    assert 50 not in rows(uri, opts) and 51 not in rows(uri, opts)


def test_commit_landing_during_gc_keeps_its_entries(pk_table):
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    write(uri, opts, shard, [batch([1], "a")])
    table = TableView(uri, opts)
    compact(table)
    # A task wrote its entry before the GC; its driver commits while the GC fences.
    app = WalAppender.open(store, shard)
    app.append(SCHEMA, [batch([2], "late")])
    late = CommittedRange(shard, app.epoch, app.first_position, app.last_position, 1)

    landed = []

    def commit_now(shard, epoch):  # once, between gc's plan and its record: gc re-plans
        if not landed:
            landed.append(CommitLog(store).append("append", [late]).record.sequence)

    hooks.register("gc.fenced", commit_now)
    try:
        collect(table, retain_seconds=0, clock=later(table))
    finally:
        hooks.clear()
    assert rows(uri, opts) == {1: "a-1", 2: "late-2"}


def _released_three_records(uri, opts):
    """Three committed records, compacted, then collected (their WAL entries, then,
    below a checkpoint, the records): (store, shard, table, released boundary)."""
    store = open_store(uri, opts)
    shard = new_shard()
    for i in range(3):
        write(uri, opts, shard, [batch([i], f"w{i}")])
    table = TableView(uri, opts)
    compact(table)
    collect(table, retain_seconds=0, clock=later(table))  # the WAL entries
    CommitLog(store).checkpoint()  # (every 100th commit writes one)
    done = collect(TableView(uri, opts), retain_seconds=0, clock=later(table))
    assert done.records  # records below that checkpoint were released and deleted
    released = CommitLog(store).boundary(refresh=True)
    assert released >= 1
    return store, shard, table, released


def test_a_stray_record_in_a_released_number_is_deleted_and_never_planned(pk_table):
    """A committer stalled past a collection put a copy of a live record's ranges into a
    number gc had released: gc must neither fold it (its floors would free the live
    record's WAL entries) nor keep it."""
    from memwal_datasource.format.commit_format import released_key
    from memwal_datasource.log.commit import record_key

    uri, opts = pk_table
    store, shard, table, released = _released_three_records(uri, opts)
    assert store.exists(released_key(released))
    write(uri, opts, shard, [batch([7, 8], "live")])  # committed, not compacted
    live = CommitLog(store).read(CommitLog(store).next_sequence() - 1)
    stray = live.to_json().replace(f'"sequence": {live.sequence}'.encode(),
                                   f'"sequence": {released}'.encode())
    assert stray != live.to_json()
    store.put(record_key(released), stray)
    before = rows(uri, opts)
    assert before[7] == "live-7" and before[8] == "live-8"
    again = collect(TableView(uri, opts), retain_seconds=0, clock=later(table))
    assert not store.exists(record_key(released))  # the stray went
    assert all(sp.floor <= live.ranges[0].first for sp in again.shards)
    assert rows(uri, opts) == before
    assert TableView(uri, opts).committed_tail()


def test_a_stream_from_earliest_never_serves_a_stray(pk_table):
    """A stray naming an uncommitted entry sits in a released number: a new stream from
    ``earliest`` serves every committed row once, never the stray's, and goes on past
    it to records committed later."""
    from dataclasses import replace

    from memwal_datasource.log.commit import record_key
    from tests.helpers import stream_rows

    uri, opts = pk_table
    store, shard, table, released = _released_three_records(uri, opts)
    write(uri, opts, shard, [batch([999], "lost")], commit=False)  # never committed
    lost_at = WalTailer(store, shard).next_position() - 1
    lost_epoch = WalTailer(store, shard).read(lost_at).writer_epoch
    write(uri, opts, shard, [batch([7], "live")])
    live = CommitLog(store).read(CommitLog(store).next_sequence() - 1)
    stray = replace(live, sequence=released, job_id="stalled",
                    ranges=[replace(live.ranges[0], epoch=lost_epoch, first=lost_at,
                                    last=lost_at)])
    store.put(record_key(released), stray.to_json())
    write(uri, opts, shard, [batch([8], "later")])
    assert sorted(stream_rows(uri, opts)) == [7, 8]
