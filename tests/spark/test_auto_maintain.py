"""Automatic maintenance beside live Spark streams (on local disk and S3): two streams on
one table keep it compacted, every row exactly once everywhere; a failing maintenance
never stops a stream; ``merge_schema`` beside an old-schema writer and a Lance reader."""

from __future__ import annotations

import os
import time
from collections import Counter

import lance
import pyarrow as pa
import pytest
from pyspark.sql.utils import AnalysisException

from memwal_datasource import MemWalTable, compact, lancedb_table
from memwal_datasource.log.rounds import round_key
from memwal_datasource.options import lance_storage_options
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, write_task
from tests.spark.test_source import first_sentence
from tests.spark.test_stream import add_files
from tests.spark.test_writer import read, storage_of, write

pytestmark = pytest.mark.parametrize("backend", ["local", "s3"])
WAIT_S = 180.0
MAINTAIN = {"maintain_pending_records": "2", "maintain_gc_retain_s": "30"}


def eventually(check, what: str, timeout: float = WAIT_S):
    """Poll ``check()`` until it returns a true value: the background maintainer lives in
    Spark's Python commit worker, another process, so no event of ours reaches it."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def start_sink(spark, src, uri, ck, opts):
    stream = spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1)
    w = stream.parquet(src).writeStream.format("memwal").option("checkpointLocation", ck)
    for k, v in {"enable_memtable": "false", **MAINTAIN, **opts}.items():
        w = w.option(k, v)
    return w.trigger(availableNow=True).start(uri)


def new_table(spark, uri, opts):
    write(spark.range(0, 0).selectExpr("id", "cast(id as string) as v"), uri, opts,
          primary_key="id", enable_memtable="false")


def test_two_streams_with_automatic_maintenance(spark, spark_location, tmp_path):
    uri, opts = spark_location
    storage = storage_of(opts)
    new_table(spark, uri, opts)
    src = [str(tmp_path / "src0"), str(tmp_path / "src1")]
    add_files(spark, src[0], 0, 4, rows_per_file=50)     # ids 0..199
    add_files(spark, src[1], 100, 4, rows_per_file=50)   # ids 5000..5199
    keys = list(range(0, 200)) + list(range(5000, 5200))
    sinks = [start_sink(spark, s, uri, str(tmp_path / f"ck{i}"), opts)
             for i, s in enumerate(src)]
    # A stream from earliest, started while they run (its hold keeps what it has yet to read).
    r = spark.readStream.format("memwal")
    for k, v in opts.items():
        r = r.option(k, v)
    reader = (r.option("starting_commit", "earliest").load(uri).writeStream.format("memory")
              .queryName("auto_maintained").option("checkpointLocation", str(tmp_path / "rck"))
              .start())
    try:
        for q in sinks:
            assert q.awaitTermination(WAIT_S) and q.exception() is None, q.exception()
        table = MemWalTable(uri, storage)
        done = eventually(lambda: table.stats(full=False).maintenance.get("compaction"),
                          "the streams' maintainer to compact")
        assert done["by"] != f"{os.uname().nodename} pid {os.getpid()}"  # Spark's worker
        assert done["result"]["rounds"] >= 1 and not done["failing"]
        reader.processAllAvailable()
        served = [row.id for row in spark.sql("SELECT id FROM auto_maintained").collect()]
    finally:
        reader.stop()
    assert Counter(served) == Counter(keys), "the stream from earliest lost or repeated a row"
    whole = [row.id for row in read(spark, uri, opts, view="table").collect()]
    assert Counter(whole) == Counter(keys)
    compact(uri, storage)  # whatever the maintainer left below its thresholds
    base = lance.dataset(uri, storage_options=lance_storage_options(storage)).to_table()
    assert Counter(base.column("id").to_pylist()) == Counter(keys)
    assert Counter(lancedb_table(uri, storage).to_arrow().column("id").to_pylist()) == \
        Counter(keys)


def test_failing_maintenance_never_stops_the_stream(spark, spark_location, tmp_path):
    uri, opts = spark_location
    storage = storage_of(opts)
    new_table(spark, uri, opts)
    table = MemWalTable(uri, storage)
    # A damaged round intent: every compaction fails reading it until it is removed.
    table.store.put_if_absent(round_key(1), b"{not json")
    add_files(spark, str(tmp_path / "src"), 0, 4, rows_per_file=25)
    q = start_sink(spark, str(tmp_path / "src"), uri, str(tmp_path / "ck"), opts)
    assert q.awaitTermination(WAIT_S) and q.exception() is None, q.exception()
    failed = eventually(lambda: (table.stats(full=False).maintenance.get("compaction")
                                 or {}).get("failing"), "the maintainer's failure recorded")
    assert failed
    status = table.stats().maintenance["compaction"]
    assert "CorruptEntryError" in status["last_error"] and "rounds" in status["last_error"]
    # The stream's rows are all there, exactly once, and its query never failed.
    assert Counter(row.id for row in read(spark, uri, opts, view="table").collect()) == \
        Counter(range(100))
    assert sum(p["numInputRows"] for p in q.recentProgress) == 100


def test_merge_schema_beside_an_old_schema_writer_and_a_lance_reader(spark, spark_location):
    uri, opts = spark_location
    storage = storage_of(opts)
    old_df = spark.range(0, 10, numPartitions=1).selectExpr("id", "concat('v', id) as v")
    write(old_df, uri, opts, primary_key="id", enable_memtable="false")
    # An old-schema job planned now; its task writes now and its driver commits later.
    old = MemWalBatchWriter(WriteOptions.parse({"path": uri, **opts, "enable_memtable": "false"}),
                            pa.schema([("id", pa.int64()), ("v", pa.string())]), False)
    batch = pa.record_batch([pa.array(range(100, 105), pa.int64()),
                             pa.array([f"old{i}" for i in range(100, 105)])], schema=old.schema)
    message = write_task(old.opts, old.schema, iter([batch]), old.job)

    wide = spark.range(10, 20, numPartitions=2).selectExpr(
        "id", "concat('v', id) as v", "cast(id as int) as w")
    with pytest.raises(AnalysisException) as refused:
        write(wide, uri, opts, enable_memtable="false")
    text = str(refused.value)
    assert first_sentence(text[text.index("Write with"):]) == (
        "Write with option merge_schema=true to add column(s) ['w'] to the table (nullable; "
        "rows written before read null)")
    write(wide, uri, opts, enable_memtable="false", merge_schema="true")
    ds = lance.dataset(uri, storage_options=lance_storage_options(storage))
    assert ds.schema.field("w").nullable and ds.schema.field("w").type == pa.int32()
    old.commit([message])  # the old-schema writer goes on: its rows read null in 'w'
    write(spark.range(20, 25, numPartitions=1).selectExpr("id", "concat('v', id) as v"),
          uri, opts, enable_memtable="false")  # an old-schema DataFrame still writes
    with pytest.raises(AnalysisException, match="Cast column 'w' to int32"):
        write(spark.range(30, 31).selectExpr("id", "'x' as v", "'no' as w"), uri, opts,
              merge_schema="true", enable_memtable="false")

    want = {i: None for i in [*range(10), *range(100, 105), *range(20, 25)]}
    want.update({i: i for i in range(10, 20)})
    got = read(spark, uri, opts, view="table").collect()
    assert Counter(r.id for r in got) == Counter(list(want)) and {r.id: r.w for r in got} == want
    compact(uri, storage)
    base = lance.dataset(uri, storage_options=lance_storage_options(storage)).to_table()
    assert dict(zip(base.column("id").to_pylist(), base.column("w").to_pylist(),
                    strict=True)) == want and base.num_rows == len(want)
