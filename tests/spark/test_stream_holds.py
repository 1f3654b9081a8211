"""Streams beside garbage collection (issue 26, item 4): a stream's hold keeps what it
planned; a new stream from 'earliest' starts at what stays stored; a planned batch gc
collected anyway (the hold lapsed) is re-planned on restart, skipping what is gone.

The source's driver side (MemWalStreamReader) is driven directly, as Spark calls it,
with gc racing it at hook points; the Spark tests run real queries. Time passing is a
gc ``clock`` running ahead of the store's: past the minimum retention but inside a
hold's TTL, or past the TTL too (a stream stopped that long).
"""

from __future__ import annotations

import logging

import pytest

from memwal_datasource.errors import CollectedError
from memwal_datasource.log.holds import DEFAULT_HOLD_TTL_S
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.maintenance.gc import MIN_RETAIN_SECONDS, collect
from memwal_datasource.memwal_table import MemWalTable
from memwal_datasource.spark.stream import readable_from
from memwal_datasource.store import open_store
from memwal_datasource.table.view import read_table
from tests.helpers import new_shard, stream_batch, stream_reader
from tests.maintenance.test_compact import batch, write
from tests.maintenance.test_maintenance_races import Pause, in_thread

SOON = MIN_RETAIN_SECONDS + 5  # the minimum retention has passed; a hold lives on
LONG = DEFAULT_HOLD_TTL_S + 60  # a stopped stream's hold has lapsed too


@pytest.fixture(autouse=True)
def _no_hooks_left():
    from memwal_datasource import hooks

    yield
    hooks.clear()


def gc_at(uri, opts, seconds: float):
    """One collection at minimum retention, ``seconds`` ahead on the store's clock."""
    store = open_store(uri, opts)
    return collect(MemWalTable(uri, opts), retain_seconds=0,
                   clock=lambda: store.now_ms() + int(seconds * 1000))


def records(uri, opts, shard, *tags: str, first_id: int = 0) -> dict[int, str]:
    """One commit record per tag (two rows each); the rows written."""
    rows = {}
    for n, tag in enumerate(tags):
        ids = [first_id + 2 * n, first_id + 2 * n + 1]
        write(uri, opts, shard, [batch(ids, tag)])
        rows.update({i: f"{tag}-{i}" for i in ids})
    return rows


def served(reader, start, end) -> list[int]:
    return [i for p in reader.partitions(start, end) for b in reader.read(p)
            for i in b.column("id").to_pylist()]


# --- (iii) gc keeps what a live stream planned --------------------------------------

@pytest.mark.parametrize("backend", ["local", "s3"])
def test_gc_keeps_a_live_streams_planned_batch(pk_table):
    uri, opts = pk_table
    rows = records(uri, opts, new_shard(), "a", "b", "c")
    compact(MemWalTable(uri, opts))
    reader = stream_reader(uri, opts)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)  # planned: records 1..3
    assert end["commit"] == 3
    done = gc_at(uri, opts, SOON)
    assert done.shards == [] and done.releasable_seq == 0
    assert "commit records 1..3 are held by stream" in done.kept_reason()
    assert sorted(served(reader, start, end)) == sorted(rows)  # old code: CollectedError
    reader.commit(end)
    # Read and committed: the next collection releases them.
    done = gc_at(uri, opts, SOON)
    assert done.releasable_seq == 3 and done.held_by is None
    assert {r["id"] for r in read_table(uri, opts).to_pylist()} == set(rows)


# --- (i) a new stream from 'earliest' beside gc at minimum retention ------------------

@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("at", ["gc.fenced", "commit.before", "gc.recorded"])
def test_new_stream_from_earliest_beside_gc(pk_table, at):
    """gc pauses at ``at`` while a new stream resolves 'earliest' and plans its first
    micro-batch: before gc's record (``gc.fenced``: gc re-plans, seeing the hold), at its
    PUT (``commit.before``: the stream planned without floors, gc keeps its entries), or
    after it (``gc.recorded``: the stream starts past what gc released). Every row is
    served exactly once or, released before the stream started, in the base table."""
    uri, opts = pk_table
    rows = records(uri, opts, new_shard(), "a", "b", "c")
    compact(MemWalTable(uri, opts))
    from memwal_datasource import hooks

    seen: list[str] = []
    for point in ("gc.replan", "gc.held"):
        hooks.register(point, lambda point=point, **_: seen.append(point))
    pause = Pause(at, "gc")
    t, out = in_thread("gc", gc_at, uri, opts, SOON)
    assert pause.reached.wait(60)
    reader = stream_reader(uri, opts)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    pause.release()
    t.join(60)
    assert "error" not in out, out.get("error")
    got = served(reader, start, end)  # old code: CollectedError for the first two
    assert len(got) == len(set(got)), f"a row served twice: {sorted(got)}"
    if at == "gc.recorded":  # gc released records 1..3 first: the stream starts past them
        assert start["commit"] == 3 and got == []
        assert readable_from(reader.log) == 4
        assert seen == []
    else:
        assert start["commit"] == 0 and sorted(got) == sorted(rows)
        assert out["result"].held_by is not None
        # Before the record gc plans again; at it, gc records but keeps the entries.
        assert seen == (["gc.replan"] if at == "gc.fenced" else ["gc.held"])
    # Every row is in the table exactly once, and the stream goes on.
    table = read_table(uri, opts).to_pylist()
    assert {r["id"]: r["v"] for r in table} == rows and len(table) == len(rows)
    reader.commit(end)
    more = records(uri, opts, new_shard(), "d", first_id=100)
    nxt, _ = stream_batch(reader, end)
    assert sorted(i for i, _ in nxt) == sorted(more)


# --- (ii) a planned batch collected while the stream was stopped -----------------------

@pytest.mark.parametrize("backend", ["local", "s3"])
def test_planned_batch_collected_while_stopped_recovers_on_restart(pk_table, caplog):
    uri, opts = pk_table
    shard = new_shard()
    first = records(uri, opts, shard, "a")  # record 1
    reader = stream_reader(uri, opts)
    start = reader.initialOffset()
    rows0, end0 = stream_batch(reader, start)
    reader.commit(end0)
    assert sorted(i for i, _ in rows0) == sorted(first)
    gone = records(uri, opts, shard, "b", "c", first_id=10)  # records 2, 3
    compact(MemWalTable(uri, opts))
    kept = records(uri, opts, shard, "d", first_id=20)  # record 4, not compacted
    end1 = reader.latestOffset(end0, None)  # batch 1 planned (2..4); the query stops
    assert end1["commit"] == 4
    # Stopped longer than the hold's TTL: gc releases records 2 and 3.
    done = gc_at(uri, opts, LONG)
    assert done.held_by is None and done.releasable_seq == 3
    # The stopped run's plan, read as it was, fails naming the fix that works for a stream.
    with pytest.raises(CollectedError, match="^Restart the query from its checkpoint"):
        served(reader, end0, end1)
    # Restart with the same checkpoint: Spark re-runs batch 1 from end0 to end1.
    again = stream_reader(uri, opts)
    with caplog.at_level(logging.WARNING, logger="memwal_datasource"):
        got = served(again, end0, end1)
    assert sorted(got) == sorted(kept)  # old code: CollectedError, on every restart
    warning = " ".join(r.getMessage() for r in caplog.records if "skipping" in r.getMessage())
    assert "skipping commit record(s) 2..3 (4 rows) of the micro-batch ending at record 4" \
        in warning
    assert "view', 'table'" in warning
    # Their rows are in the base table; the stream goes on.
    assert {r["id"] for r in read_table(uri, opts).to_pylist()} == set(first | gone | kept)
    again.commit(end1)
    more = records(uri, opts, shard, "e", first_id=30)
    nxt, _ = stream_batch(again, end1)
    assert sorted(i for i, _ in nxt) == sorted(more)


# --- Spark: real queries beside gc --------------------------------------------------------

def run_query(spark, uri, opts, ck, on_batch, **extra):
    """memwal source -> foreachBatch(on_batch) until caught up (availableNow); the error.

    ``on_batch(df, batch_id)`` runs in this process, before the micro-batch's rows are
    read (its DataFrame is lazy): a gc there races the read as a gc loop would.
    """
    r = spark.readStream.format("memwal")
    for k, v in {**{f"storage.{k}": v for k, v in opts.items()}, **extra}.items():
        r = r.option(k, v)
    q = (r.load(uri).writeStream.foreachBatch(on_batch).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    try:
        q.awaitTermination(300)
    except Exception as exc:  # noqa: BLE001 - handed to the test
        return exc
    finally:
        q.stop()
    return q.exception()


class Sink:
    """Collects each micro-batch's ids; runs gc first (``gc_s`` ahead) on the batches
    in ``gc_on``; fails batch ``fail_on`` once, before reading it."""

    def __init__(self, uri, opts, gc_s: float | None = None, fail_on: int | None = None):
        self.uri, self.opts, self.gc_s, self.fail_on = uri, opts, gc_s, fail_on
        self.batches: dict[int, list[int]] = {}
        self.gcs = []

    def __call__(self, df, batch_id):
        if self.fail_on == batch_id:
            self.fail_on = None
            raise RuntimeError(f"the query stops with batch {batch_id} planned")
        if self.gc_s is not None:
            self.gcs.append(gc_at(self.uri, self.opts, self.gc_s))
        self.batches[batch_id] = [r.id for r in df.select("id").collect()]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_spark_stream_from_earliest_beside_gc_reaches_the_end_and_resumes(
        spark, pk_table, tmp_path):
    uri, opts = pk_table
    shard = new_shard()
    rows = records(uri, opts, shard, "a", "b", "c")
    compact(MemWalTable(uri, opts))
    ck = str(tmp_path / "ck")
    # Each micro-batch: gc at the minimum retention, past it, then the read.
    sink = Sink(uri, opts, gc_s=SOON)
    assert run_query(spark, uri, opts, ck, sink) is None  # old code: CollectedError
    assert sorted(i for b in sink.batches.values() for i in b) == sorted(rows)
    assert all(g.held_by is not None for g in sink.gcs)
    # A restart resumes from its checkpoint beside gc, with only the new rows.
    more = records(uri, opts, shard, "d", "e", first_id=100)
    compact(MemWalTable(uri, opts))
    again = Sink(uri, opts, gc_s=SOON)
    assert run_query(spark, uri, opts, ck, again) is None
    assert sorted(i for b in again.batches.values() for i in b) == sorted(more)
    table = read_table(uri, opts).to_pylist()
    assert {r["id"]: r["v"] for r in table} == rows | more and len(table) == len(rows | more)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_spark_batch_collected_while_stopped_recovers_with_the_same_checkpoint(
        spark, pk_table, tmp_path):
    uri, opts = pk_table
    shard = new_shard()
    first = records(uri, opts, shard, "a")  # record 1
    ck = str(tmp_path / "ck")
    sink = Sink(uri, opts)
    assert run_query(spark, uri, opts, ck, sink) is None
    assert sorted(sink.batches[0]) == sorted(first)
    gone = records(uri, opts, shard, "b", "c", first_id=10)  # records 2, 3: compacted
    compact(MemWalTable(uri, opts))
    kept = records(uri, opts, shard, "d", first_id=20)  # record 4: not compacted
    stopped = Sink(uri, opts, fail_on=1)
    assert "batch 1 planned" in str(run_query(spark, uri, opts, ck, stopped))
    # Stopped longer than the hold's TTL: gc releases records 2 and 3.
    done = gc_at(uri, opts, LONG)
    assert done.releasable_seq == 3 and "held by" not in done.kept_reason()
    # The same checkpoint re-runs batch 1: the released records are skipped (logged),
    # the rest served. Old code: CollectedError, on this and every later restart.
    again = Sink(uri, opts)
    assert run_query(spark, uri, opts, ck, again) is None
    assert sorted(again.batches[1]) == sorted(kept)
    assert all(not ids for b, ids in again.batches.items() if b != 1)  # gc's own record
    assert {r["id"] for r in read_table(uri, opts).to_pylist()} == set(first | gone | kept)
