"""What a fresh Spark Python worker imports to plan, write and commit a small append.

Each step runs in a fresh interpreter, as Spark runs it in a fresh worker:
the planner (``MemWalDataSource(options).writer()``) pickles its writer, a
task unpickles it and writes one batch read off an Arrow stream (as Spark's
socket hands it), the commit unpickles the writer and the task's message.
Planning an append to an existing table imports neither pylance nor pandas:
the table's description is read through our store (``_memwal_tables/``).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.spark.source import MemWalDataSource
from memwal_datasource.store import open_store
from memwal_datasource.table.sharding import create_table
from memwal_datasource.table.table_info import TableSharding
from memwal_datasource.table.view import read_table

REPO = str(Path(__file__).resolve().parents[2])
SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])
# Modules none of the three steps of a WAL-only append needs.
HEAVY = ("lance", "pandas", "memwal_datasource.spark.compaction")

PRELUDE = f"""
import json, pickle, sys
import pyspark.worker  # what a Spark Python worker has loaded before our code runs
HEAVY = {HEAVY!r}
import memwal_datasource
# The package's own __init__ may load the core's compaction module; when it does not,
# no step may load it either.
if "memwal_datasource.maintenance.compact" not in sys.modules:
    HEAVY = HEAVY + ("memwal_datasource.maintenance.compact",)
def loaded():
    return sorted(m for m in HEAVY if m in sys.modules)
"""

PLAN = PRELUDE + """
from pyspark.sql.types import LongType, StringType, StructField, StructType
from memwal_datasource.spark.source import MemWalDataSource
schema = StructType([StructField("id", LongType()), StructField("v", StringType())])
writer = MemWalDataSource(json.loads(sys.argv[1])).writer(schema, overwrite=False)
pickle.dump(writer, open(sys.argv[2], "wb"))
print(json.dumps(loaded()))
"""

TASK = PRELUDE + """
import pyarrow as pa
writer = pickle.load(open(sys.argv[2], "rb"))
batch = pa.ipc.open_stream(open(sys.argv[3], "rb").read()).read_next_batch()
message = writer.write(iter([batch]))
pickle.dump(message, open(sys.argv[4], "wb"))
print(json.dumps(loaded()))
"""

COMMIT = PRELUDE + """
writer = pickle.load(open(sys.argv[2], "rb"))
writer.commit([pickle.load(open(sys.argv[4], "rb"))])
print(json.dumps(loaded()))
"""


def fresh(code: str, *args: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; the heavy modules it ended with."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def stream_file(path: Path, ids) -> str:
    batch = pa.RecordBatch.from_arrays(
        [pa.array(ids, pa.int64()), pa.array([f"v{i}" for i in ids])], names=["id", "v"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    path.write_bytes(sink.getvalue().to_pybytes())
    return str(path)


def steps(tmp_path, options, ids) -> dict[str, list[str]]:
    """Plan, write and commit one append, each step in a fresh interpreter."""
    files = [json.dumps(options), str(tmp_path / "writer.pkl"),
             stream_file(tmp_path / "batch.arrows", ids), str(tmp_path / "message.pkl")]
    return {"plan": fresh(PLAN, *files), "task": fresh(TASK, *files),
            "commit": fresh(COMMIT, *files)}


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_an_append_to_an_existing_table_imports_no_lance_in_any_step(location, tmp_path):
    uri, storage = location
    options = {"path": uri, **{f"storage.{k}": v for k, v in storage.items()}}
    # The first write creates the table (pylance) and keeps its description.
    MemWalDataSource(options).writer(SCHEMA, overwrite=False)
    assert open_store(uri, storage).exists("_memwal_tables/00000000000000000002.json")

    seen = steps(tmp_path, options, [1, 2, 3])
    assert seen["plan"] == [], seen
    # pandas is not asserted for the task: pyarrow may load it converting Python values.
    assert [m for m in seen["task"] if m != "pandas"] == [], seen
    assert seen["commit"] == [], seen
    assert sorted(read_table(uri, storage).column("id").to_pylist()) == [1, 2, 3]
    assert CommitLog(open_store(uri, storage)).read(1).job_id == pickle.load(
        open(tmp_path / "writer.pkl", "rb")).job_id


def test_a_table_another_tool_made_is_described_once_then_read_without_lance(tmp_path):
    uri = str(tmp_path / "t.lance")
    create_table(uri, pa.schema([("id", pa.int64()), ("v", pa.string())]), ("id",), None, None)
    options = {"path": uri, "enable_memtable": "false"}
    files = [json.dumps(options), str(tmp_path / "writer.pkl")]
    # Nobody described this version yet: the first planner reads it with pylance ...
    assert "lance" in fresh(PLAN, *files)
    # ... and keeps it, so the next one (a primary-key, sharded table) needs no pylance.
    assert fresh(PLAN, *files) == []
    writer = pickle.load(open(tmp_path / "writer.pkl", "rb"))
    # Its sharding spec reaches the tasks without pylance's schema (a task routing rows
    # opens the table for it).
    assert isinstance(writer.opts.sharding, TableSharding)
    assert writer.opts.sharding.lance_schema is None
    assert writer.opts.field_ids is not None and writer.opts.field_ids["id"].id == 0


def test_a_bucket_is_checked_once_per_process_for_the_same_options(s3_table, monkeypatch):
    """A reused planner HEADs the bucket on its first write, not on every append; other
    options (another secret) or another bucket are checked again, and fail clearly."""
    from memwal_datasource.errors import StoreAuthError, StoreNotFoundError
    from memwal_datasource.spark import prepare
    from memwal_datasource.store.s3 import S3Store

    uri, opts = s3_table
    monkeypatch.setattr(prepare, "_checked_buckets", set())
    calls = []
    real = S3Store.check_bucket
    monkeypatch.setattr(S3Store, "check_bucket", lambda self: (calls.append(self.bucket),
                                                               real(self))[1])
    for _ in range(3):
        prepare.check_store(uri, opts)
    assert len(calls) == 1
    with pytest.raises(StoreAuthError):
        prepare.check_store(uri, dict(opts, aws_secret_access_key="wrong"))
    with pytest.raises(StoreNotFoundError, match="bucket 'nobucket' does not exist"):
        prepare.check_store("s3://nobucket/t.lance", opts)
    assert len(calls) == 3
