"""MemTable mode is exactly once: no attempt's SSTables hold rows it did not write.

pylance's writer replays every WAL entry after the manifest's replay position
into its MemTable and flushes them into SSTables. Our open moves that position
to a fence sentinel at the tip first, so an attempt's SSTables hold only its
own rows (which its commit record names), and the committed views (the
whole-table read from WAL ranges, pylance's LsmScanner over committed
SSTables) never show a failed, fenced or uncommitted attempt's rows.
Real pylance throughout; these fail if the open lets pylance replay.
"""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import ConfigError, Fenced, WriterPoisoned
from memwal_datasource.format.memwal import shard_dir
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange
from memwal_datasource.options import lance_storage_options
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.writer_base import WriterStats
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, create_table, read_table
from memwal_datasource.write.native import committed_lsm_scanner
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA, make_batch, new_shard, wal_rows
from tests.write.test_native import run_until_acks


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


def memtable(**kw) -> ShardWriterConfig:
    kw.setdefault("max_wal_flush_interval_ms", 10)
    return ShardWriterConfig(enable_memtable=True, **kw)


def wal_only() -> ShardWriterConfig:
    return ShardWriterConfig(enable_memtable=False, max_wal_flush_interval_ms=10)


def commit(uri: str, opts: dict, s: WriterStats) -> None:
    """One commit record naming the attempt's WAL range and SSTables (as the driver does)."""
    CommitLog(open_store(uri, opts)).append(APPEND, [CommittedRange(
        s.shard_id, s.epoch, s.first_wal_position, s.last_wal_position, s.rows,
        sstables=tuple(s.sstables))])


def ids(t: pa.Table) -> list[int]:
    return sorted(t.column("id").to_pylist())


def sstable_ids(uri: str, opts: dict, shard: str, path: str) -> list[int]:
    """Every id stored in one SSTable (a Lance dataset under the shard's directory)."""
    ds = lance.dataset(f"{uri}/{shard_dir(shard)}/{path}",
                       storage_options=lance_storage_options(opts))
    return ids(ds.to_table(columns=["id"]))


def committed_views(uri: str, opts: dict) -> tuple[list[int], list[int]]:
    """(whole-table read, pylance's LsmScanner over committed SSTables): ids of each."""
    return (ids(read_table(uri, opts)),
            ids(committed_lsm_scanner(TableView(uri, opts)).to_table()))


def replayed_at_open(writer) -> int:
    """Rows pylance's writer holds right after opening: what it replayed."""
    return writer.stats().memtable_stats()["row_count"]


@pytest.mark.parametrize("backend", ["local"])
def test_killed_attempt_rows_stay_out_of_the_next_attempts_sstables(pk_table, tmp_path):
    """(1) An attempt is SIGKILLed mid-write (some of its rows already flushed to SSTables)."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    acked = run_until_acks("memtable", uri, opts, shard, 15, tmp_path)
    dead = {i for a, b in acked for i in range(a, b)}
    left = ManifestStore(store, shard).latest()
    assert left.sstables, "the killed attempt flushed no SSTable: the case is not exercised"
    assert left.replay_after_wal_entry_position < len(acked)  # unflushed entries remain

    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w:
        assert replayed_at_open(w) == 0
        w.put(make_batch(10_000, 7))
    s = w.stats()
    assert s.sstables and not {t.path for t in left.sstables} & set(s.sstables)
    assert sorted(i for p in s.sstables for i in sstable_ids(uri, opts, shard, p)) == \
        list(range(10_000, 10_007))
    commit(uri, opts, s)
    assert committed_views(uri, opts) == (list(range(10_000, 10_007)),) * 2
    assert dead <= set(wal_rows(store, shard))  # still in the raw log, never committed


@pytest.mark.parametrize("backend", ["local"])
def test_aborted_attempts_sstables_are_never_counted(pk_table):
    """(1) An attempt closes (flushing its MemTable to an SSTable) but its job never commits."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as failed:
        failed.put(make_batch(0, 5))
    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w:
        assert replayed_at_open(w) == 0
        w.put(make_batch(100, 3))
    s = w.stats()
    assert [sstable_ids(uri, opts, shard, p) for p in s.sstables] == [[100, 101, 102]]
    # Both SSTables are in the shard manifest; only the committed one counts.
    listed = {t.path for t in ManifestStore(store, shard).latest().sstables}
    assert listed == set(failed.stats().sstables) | set(s.sstables)
    commit(uri, opts, s)
    assert committed_views(uri, opts) == ([100, 101, 102],) * 2


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_wal_only_history_is_not_replayed_into_sstables(pk_table):
    """(2) M committed + N uncommitted WAL-only entries, then the shard opens in MemTable mode."""
    uri, opts = pk_table
    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, wal_only(), opts) as a:  # M = 2 entries
        a.put(make_batch(0, 3))
        a.flush()
        a.put(make_batch(3, 3))
    commit(uri, opts, a.stats())
    with open_shard_writer(uri, shard, SCHEMA, wal_only(), opts) as b:  # N = 2, never committed
        b.put(make_batch(50, 2))
        b.flush()
        b.put(make_batch(52, 2))
    assert (a.stats().wal_entries, b.stats().wal_entries) == (2, 2)

    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w:
        assert replayed_at_open(w) == 0
        w.put(make_batch(3, 1).set_column(1, "v", pa.array(["new"])))  # an upsert of key 3
        w.put(make_batch(200, 2))
    s = w.stats()
    assert [sstable_ids(uri, opts, shard, p) for p in s.sstables] == [[3, 200, 201]]
    commit(uri, opts, s)
    whole = read_table(uri, opts)
    assert ids(whole) == [0, 1, 2, 3, 4, 5, 200, 201]  # committed rows once, 50..53 never
    assert whole.filter(pa.compute.equal(whole.column("id"), 3)).column("v").to_pylist() == \
        ["new"]
    # Lance's LSM view holds what MemTable mode committed; WAL-only rows reach it by compaction.
    assert ids(committed_lsm_scanner(TableView(uri, opts)).to_table()) == [3, 200, 201]
    # A later pylance open (not through us) replays nothing of that history either.
    ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
    with ds.mem_wal_writer(shard, max_wal_flush_interval_ms=10) as direct:
        assert direct.memtable_stats()["row_count"] == 0


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_fenced_zombie_rows_never_reach_committed_views(pk_table):
    """(3) A live MemTable attempt is fenced by a retry; it writes even during the retry's open."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    zombie = open_shard_writer(uri, shard, SCHEMA, memtable(), opts)
    zombie.put(make_batch(0, 4))

    def zombie_writes_at_the_tip(shard, epoch, tip):
        # Between the retry's claim and its sentinel: the zombie has not seen the
        # claim, so its entry lands at the tip (pylance checks the fence on collision).
        zombie.put(make_batch(20, 2))

    remove = hooks.register("open.tip", zombie_writes_at_the_tip)
    retry = open_shard_writer(uri, shard, SCHEMA, memtable(), opts)
    remove()
    assert replayed_at_open(retry) == 0
    assert {20, 21} <= set(wal_rows(store, shard))  # the zombie's entry did land
    retry.put(make_batch(100, 3))
    with pytest.raises(Fenced):
        zombie.put(make_batch(40, 2))
    with pytest.raises(Fenced):
        zombie.close()  # its MemTable flush is refused too
    retry.close()
    s = retry.stats()
    assert [sstable_ids(uri, opts, shard, p) for p in s.sstables] == [[100, 101, 102]]
    assert [t.path for t in ManifestStore(store, shard).latest().sstables] == s.sstables
    commit(uri, opts, s)
    assert committed_views(uri, opts) == ([100, 101, 102],) * 2


@pytest.mark.parametrize("backend", ["local"])
def test_committed_rows_replayed_by_a_direct_pylance_open_are_read_once(pk_table):
    """pylance opened directly (not through us) replays nothing: our close moved the
    replay position past the committed WAL-only rows, which are read from their WAL
    ranges (and reach Lance's readers by compaction), so each row shows once."""
    uri, opts = pk_table
    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, wal_only(), opts) as a:
        a.put(make_batch(0, 3))
    commit(uri, opts, a.stats())
    ds = lance.dataset(uri, storage_options=lance_storage_options(opts))
    with ds.mem_wal_writer(shard, max_wal_flush_interval_ms=10) as direct:
        assert direct.memtable_stats()["row_count"] == 0  # nothing replayed
    assert ManifestStore(open_store(uri, opts), shard).latest().sstables == []
    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w:
        w.put(make_batch(10, 2))
    commit(uri, opts, w.stats())
    whole = read_table(uri, opts)
    assert whole.column("id").to_pylist().count(0) == 1 and ids(whole) == [0, 1, 2, 10, 11]
    raw = wal_rows(open_store(uri, opts), shard)  # the tailer's raw log: each entry once
    assert sorted(raw) == [0, 1, 2, 10, 11]
    assert ids(committed_lsm_scanner(TableView(uri, opts)).to_table()) == [10, 11]


@pytest.mark.parametrize("backend", ["local"])
def test_a_claim_between_our_fence_and_pylances_open_is_refused(pk_table):
    """Our fence, then pylance's claim: a rival claim in between makes the epoch unknowable."""
    uri, opts = pk_table
    store = open_store(uri, opts)
    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w:
        w.put(make_batch(0, 1))
    hooks.register("native.advanced",
                   lambda shard, epoch, position: ManifestStore(store, shard).claim_epoch())
    with pytest.raises(WriterPoisoned, match=r"epochs \[3, 4\] were claimed"):
        open_shard_writer(uri, shard, SCHEMA, memtable(), opts)


@pytest.mark.parametrize("backend", ["local"])
def test_memtable_mode_without_a_primary_key_is_refused_before_any_write(location):
    uri, opts = location
    create_table(uri, SCHEMA, storage_options=opts)  # no primary key
    shard = new_shard()
    with pytest.raises(ConfigError, match=r"primary key.*LsmScanner.*'primary_key'"):
        open_shard_writer(uri, shard, SCHEMA, memtable(), opts)
    assert ManifestStore(open_store(uri, opts), shard).latest() is None
    with open_shard_writer(uri, shard, SCHEMA, wal_only(), opts) as w:  # WAL-only is fine
        w.put(make_batch(0, 1))


@pytest.mark.parametrize("backend", ["local"])
def test_committed_lsm_view_after_compaction_and_overwrite(pk_table):
    """Compacted SSTables leave the view (their rows are in the base); an overwrite is refused."""
    from memwal_datasource.errors import MemWalError
    from memwal_datasource.log.commit import OVERWRITE
    from memwal_datasource.maintenance.compact import compact
    from memwal_datasource.write.native import committed_sstables

    uri, opts = pk_table
    shard = new_shard()
    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w:
        w.put(make_batch(0, 3))
    commit(uri, opts, w.stats())
    table = TableView(uri, opts)
    assert committed_sstables(table) == {shard: [(1, w.stats().sstables[0])]}
    compact(table)
    assert committed_sstables(table) == {}
    assert ids(committed_lsm_scanner(table).to_table()) == [0, 1, 2]  # from the base, once
    with open_shard_writer(uri, shard, SCHEMA, memtable(), opts) as w2:
        w2.put(make_batch(7, 1))
    s = w2.stats()
    CommitLog(open_store(uri, opts)).append(OVERWRITE, [CommittedRange(
        shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows,
        sstables=tuple(s.sstables))])
    assert ids(read_table(uri, opts)) == [7]
    with pytest.raises(MemWalError, match="overwrite .* hides the base table"):
        committed_lsm_scanner(table)
