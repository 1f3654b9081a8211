"""A Spark round trip on each cloud emulator (fake-gcs-server behind its XML gateway,
Azurite): batch appends, a streaming sink and source, compaction and garbage collection,
with pylance writing the base table through the same storage options."""

from __future__ import annotations

from collections import Counter

import pytest

from memwal_datasource import MemWalTable, compact, read_table
from memwal_datasource.maintenance.gc import collect
from memwal_datasource.store import open_store
from tests.helpers import later
from tests.spark.test_compact import append, base, rows
from tests.spark.test_stream import add_files, run_sink, run_source

pytestmark = [pytest.mark.spark, pytest.mark.cloud]


@pytest.mark.parametrize("backend", ["gcs", "azure"])
def test_write_stream_compact_gc_round_trip(spark, spark_location, tmp_path):
    uri, opts = spark_location
    storage = {k[len("storage."):]: v for k, v in opts.items()}
    # Batch: two appends, read back committed.
    append(spark, uri, opts, 0, 30)
    append(spark, uri, opts, 30, 50)
    got = spark.read.format("memwal").options(**opts).load(uri)
    assert sorted(r.id for r in got.collect()) == list(range(50))
    # Stream: files -> memwal sink (a commit per micro-batch) -> memwal source -> parquet.
    src = str(tmp_path / "src")
    add_files(spark, src, 1, 2)  # ids 100..299
    run_sink(spark, src, uri, str(tmp_path / "ck_sink"), opts)
    streamed, _ = run_source(spark, uri, str(tmp_path / "ck_src"), str(tmp_path / "out"), opts)
    assert streamed == list(range(50)) + list(range(100, 300))
    # Compaction folds every committed row into the base table, exactly once.
    summary = compact(uri, storage)
    assert summary.rows == 250 and summary.pending_records == 0
    want = rows(0, 50) + Counter((i, str(i)) for i in range(100, 300))
    assert base(uri, storage) == want
    # GC (behind a fence) deletes the compacted WAL entries; readers still agree.
    store = open_store(uri, storage)
    done = collect(t := MemWalTable(uri, storage), retain_seconds=0, clock=later(t))
    assert done.shards and done.items()
    assert not any(store.exists(k) for k, _ in done.items())
    assert sorted(read_table(uri, storage).column("id").to_pylist()) == sorted(
        i for i, _ in want.elements())
    # The table stays writable after the collection.
    append(spark, uri, opts, 500, 510, tag="after-")
    tail = spark.read.format("memwal").options(**opts).load(uri)
    assert sorted(r.id for r in tail.collect()) == list(range(500, 510))
