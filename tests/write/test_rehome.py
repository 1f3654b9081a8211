"""A commit a newer epoch overtook is re-homed, not refused (memwal_datasource.write.rehome).

Job A writes shards of a primary-key table and closes (its tasks' leases are
released); job B writes the same shards later (newer epochs) and commits
first. A's commit then moves A's rows of those shards to the tip under a
newer epoch and commits: every reader (the whole-table read, the committed
view, compaction, and in MemTable mode Lance's LSM view) agrees that A's
values are the newest (A committed last), each key once. Interleavings are
forced with hooks, threads and events, never sleeps.
"""

from __future__ import annotations

import threading
from collections import Counter

import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.errors import CommitRefused
from memwal_datasource.format.memwal import FIELD_ID_KEY
from memwal_datasource.format.table_schema import without_row_key
from memwal_datasource.log.commit import APPEND, GC, CommitLog, CommittedRange, Txn
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.shard.leases import Holder, Leases
from memwal_datasource.shard.wal import WalTailer
from memwal_datasource.table.sharding import ShardingRequest, initialize_shard, table_sharding
from memwal_datasource.table.sharding import create_table as create_sharded
from memwal_datasource.table.view import TOMBSTONE, TableView, open_table, read_table
from memwal_datasource.write.native import committed_lsm_scanner
from memwal_datasource.write.rehome import DRIVER_PARTITION, Rehomer
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import committed_view

EVENT_TIMEOUT_S = 60  # a deadline for an event that never comes, not a wait
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


@pytest.fixture
def table(location, request):
    """A primary-key table sharded by bucket(id, 2), seeded with keys 0..199 = 'seed'
    (in MemTable mode for tests that take ``native``)."""
    uri, opts = location
    create_sharded(uri, SCHEMA, ["id"], opts, ShardingRequest(bucket_column="id", num_buckets=2))
    t = TableView(uri, opts)
    native = request.getfixturevalue("native") if "native" in request.fixturenames else False
    commit(t, "seed", write(t, range(200), "seed", native=native))
    return t


def config(native: bool) -> ShardWriterConfig:
    return ShardWriterConfig(enable_memtable=native, max_wal_flush_interval_ms=20)


def write(t: TableView, ids, value: str, *, native: bool = False, delete: bool = False,
          only: str | None = None) -> list[CommittedRange]:
    """One job's writes (as its tasks would): each shard of ``ids`` opened, written, closed."""
    ds = open_table(t.uri, t.storage_options)
    sharding = table_sharding(ds)
    schema = without_row_key(ds.schema)
    ids = pa.array(list(ids), pa.int64())
    if delete:
        schema = schema.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))
        cols = [ids, pa.nulls(len(ids), pa.string()), pa.repeat(True, len(ids))]
    else:
        cols = [ids, pa.array([value] * len(ids))]
    out = []
    for shard, (key, rows) in sharding.route(pa.record_batch(cols, schema=schema)).items():
        if only is not None and shard != only:
            continue
        initialize_shard(t.store, sharding, shard, key)
        writer = open_shard_writer(t.uri, shard, schema, config(native and not delete),
                                   t.storage_options, store=t.store)
        writer.put(rows)
        writer.close()
        s = writer.stats()
        out.append(CommittedRange(shard, s.epoch, s.first_wal_position, s.last_wal_position,
                                  s.rows, s.bytes, 0, 0, tuple(s.sstables)))
    return out


def commit(t: TableView, job: str, ranges, **kwargs):
    """Commit as a job without re-homing (refused if overtaken)."""
    return CommitLog(t.store).append(APPEND, ranges, job_id=job, ordered_epochs=True,
                                     extra={"label": f"job {job} (test)"}, **kwargs)


def rehomer(t: TableView, job: str, native: bool = False, **kwargs) -> Rehomer:
    return Rehomer(TableView(t.uri, t.storage_options),
                   Holder(job, DRIVER_PARTITION, label=f"job {job}"), config(native),
                   lease_wait_s=EVENT_TIMEOUT_S, **kwargs)


def rehomed_commit(t: TableView, job: str, ranges, native: bool = False, **kwargs):
    return rehomer(t, job, native).append(APPEND, ranges, job_id=job, ordered_epochs=True,
                                          extra={"label": f"job {job}"}, **kwargs)


def rows(t: TableView) -> dict[int, str]:
    got = read_table(t.uri, t.storage_options).to_pylist()
    out = {r["id"]: r["v"] for r in got}
    assert len(out) == len(got), "read_table returned a key twice"
    return out


def lsm(t: TableView) -> dict[int, str]:
    got = committed_lsm_scanner(TableView(t.uri, t.storage_options)).to_table().to_pylist()
    out = {r["id"]: r["v"] for r in got}
    assert len(out) == len(got), "the LSM view returned a key twice"
    return out


def agree(t: TableView, want: dict[int, str], native: bool) -> None:
    """Every reader, before and after compaction, sees ``want``, each key once."""
    assert rows(t) == want
    assert committed_view(TableView(t.uri, t.storage_options)) == Counter(want.items())
    if native:
        assert lsm(t) == want
    compact(TableView(t.uri, t.storage_options))
    base = TableView(t.uri, t.storage_options).dataset().to_table(
        columns=["id", "v"]).to_pylist()
    assert {r["id"]: r["v"] for r in base} == want and len(base) == len(want)
    assert rows(t) == want
    if native:
        assert lsm(t) == want


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("native", [False, True], ids=["wal", "memtable"])
def test_an_overtaken_commit_is_rehomed_and_its_values_are_newest(table, native):
    a = write(table, range(100), "a", native=native)
    b = write(table, range(50, 150), "b", native=native)
    assert {r.shard_id for r in a} == {r.shard_id for r in b}  # both shards, both jobs
    commit(table, "B", b)
    with pytest.raises(CommitRefused) as refused:  # what every job got before re-homing
        commit(table, "A", a)
    assert refused.value.reason == CommitRefused.NEWER_EPOCH
    assert refused.value.shard_id in {r.shard_id for r in a}

    mover = rehomer(table, "A", native)
    result = mover.append(APPEND, a, job_id="A", ordered_epochs=True)
    assert result.created
    newer = {r.shard_id: r.epoch for r in b}
    assert {r.shard_id for r in result.record.ranges} == set(newer)
    for r in result.record.ranges:  # A's ranges now sit above B's, under a newer epoch
        assert r.epoch > newer[r.shard_id] and r.first > max(x.last for x in b
                                                              if x.shard_id == r.shard_id)
        assert bool(r.sstables) == native
    assert sorted(m.shard_id for m in mover.rehomed) == sorted(newer)
    assert all("job B" in m.overtaken_by for m in mover.rehomed)
    assert sum(r.rows for r in result.record.ranges) == 100
    log = CommitLog(table.store)
    assert all(log.superseded(r.shard_id, r.epoch) for r in a)  # the old attempt is dead
    leases = Leases(table.store)
    assert all(leases.current(s).released for s in newer)

    want = {k: "seed" for k in range(200)} | {k: "b" for k in range(50, 150)} | {
        k: "a" for k in range(100)}
    agree(table, want, native)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_rehomed_deletes_keep_their_markers_and_field_ids(table):
    a = write(table, range(10), "", delete=True)
    b = write(table, range(20), "b")
    commit(table, "B", b)
    mover = rehomer(table, "A")
    rec = mover.append(APPEND, a, job_id="A", ordered_epochs=True).record
    for old, new in zip(sorted(a, key=lambda r: r.shard_id),
                        sorted(rec.ranges, key=lambda r: r.shard_id), strict=True):
        tailer = WalTailer(table.store, old.shard_id)
        before = [e for _p, e in tailer.entries(old.first, old.last) if e.writer_epoch == old.epoch]
        after = [e for _p, e in tailer.entries(new.first, new.last) if e.writer_epoch == new.epoch]
        assert [e.num_rows for e in after] == [e.num_rows for e in before] and after
        for x, y in zip(before, after, strict=True):
            assert x.schema.field("id").metadata[FIELD_ID_KEY] is not None
            assert [f.metadata.get(FIELD_ID_KEY) if f.metadata else None for f in y.schema] == \
                   [f.metadata.get(FIELD_ID_KEY) if f.metadata else None for f in x.schema]
            assert y.schema.names[-1] == TOMBSTONE
            assert pa.Table.from_batches(y.batches).equals(pa.Table.from_batches(x.batches))
    want = {k: "seed" for k in range(20, 200)} | {k: "b" for k in range(10, 20)}
    agree(table, want, native=False)


@pytest.mark.parametrize("backend", ["local"])
def test_a_second_shard_overtaken_while_rehoming_is_rehomed_next_round(table):
    """A wrote both shards; B overtakes one and commits; W claimed the other after A and
    commits (in its own thread) while A re-homes the first: A re-homes the second in a
    second round and commits both, with the first shard's re-homed range unchanged."""
    a = write(table, range(100), "a")
    first, second = sorted(r.shard_id for r in a)
    b = write(table, range(100), "b", only=first)
    w = write(table, range(100), "w", only=second)
    commit(table, "B", b)
    rounds, w_done = [], threading.Event()

    def refused(**context):
        rounds.append((context["round"], context["shards"]))

    def written(**context):
        if context["shard"] == first and not w_done.is_set():
            def w_commits():
                commit(table, "W", w)
                w_done.set()
            threading.Thread(target=w_commits, daemon=True).start()
            assert w_done.wait(EVENT_TIMEOUT_S), "W did not commit"

    hooks.register("rehome.refused", refused)
    hooks.register("rehome.written", written)
    rec = rehomed_commit(table, "A", a).record
    assert rounds == [(1, [first]), (2, [second])]
    by_shard = {r.shard_id: r for r in rec.ranges}
    assert by_shard[first].epoch > b[0].epoch and by_shard[second].epoch > w[0].epoch
    assert [r.job_id for r in CommitLog(table.store).records()] == ["seed", "B", "W", "A"]
    want = {k: "seed" for k in range(200)} | {k: "a" for k in range(100)}
    assert rows(table) == want


@pytest.mark.parametrize("backend", ["local"])
def test_the_retry_rechecks_the_idempotency_key(table):
    """A's commit is overtaken; while it re-homes, another run of the same job (same
    txnAppId and version) commits: A's retry commits nothing, rows once."""
    txn = Txn("nightly", 7)
    a = write(table, range(10), "a")
    b = write(table, range(10), "b")
    commit(table, "B", b)
    rerun_done = threading.Event()

    def rerun(**context):
        if not rerun_done.is_set():
            rerun_done.set()
            commit(table, "A-rerun", write(table, range(10), "a2"), txn=txn)

    hooks.register("rehome.written", rerun)
    result = rehomed_commit(table, "A", a, txn=txn)
    assert not result.created and result.record.job_id == "A-rerun"
    recs = [r for r in CommitLog(table.store).records() if r.txn_app_id == "nightly"]
    assert [r.job_id for r in recs] == ["A-rerun"]
    assert rows(table) == {k: "seed" for k in range(200)} | {k: "a2" for k in range(10)}


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_the_bounded_retry_gives_up_naming_the_overtaker(table):
    """A writer without a lease (its lease lost) claims and commits the shard each time A
    has re-homed it: after 3 re-homes A fails naming that writer; nothing of A is committed
    and its leases are released."""
    a = write(table, range(100), "a")
    shard = sorted(r.shard_id for r in a)[0]
    a = [r for r in a if r.shard_id == shard]
    commit(table, "X0", write(table, range(100), "x", only=shard))
    n = [0]

    def overtake(**context):
        n[0] += 1
        commit(table, f"X{n[0]}", write(table, range(100), "x", only=shard),
               writer_group="nightly")

    hooks.register("rehome.written", overtake)
    with pytest.raises(CommitRefused) as info:
        rehomed_commit(table, "A", a)
    assert n[0] == 3
    text = str(info.value)
    assert text.startswith("run the job again when 'job X3 (test)'")
    assert "job X3" in text and "writer group 'nightly'" in text
    assert f"shard {shard}" in text and "overtaken 4 times" in text
    assert info.value.reason == CommitRefused.NEWER_EPOCH
    assert "A" not in [r.job_id for r in CommitLog(table.store).records()]
    assert Leases(table.store).current(shard).released


@pytest.mark.parametrize("backend", ["local"])
def test_a_gc_floor_stays_a_refusal_naming_gc(table):
    a = write(table, range(100), "a")
    commit(table, "B", write(table, range(100), "b"))
    CommitLog(table.store).append(GC, [], extra={"floors": {r.shard_id: r.last + 1 for r in a}})
    with pytest.raises(CommitRefused, match="^run the job again: garbage collection") as info:
        rehomed_commit(table, "A", a)
    assert info.value.reason == CommitRefused.GC_FLOOR
    assert "A" not in [r.job_id for r in CommitLog(table.store).records()]
