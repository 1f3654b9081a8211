"""Build examples/tour.ipynb from the cells below, execute it and save it with its outputs.

``python examples/build_tour.py`` (about a minute on 2 cores). The notebook is
generated so its sources live in one reviewable Python file, and saved
executed so a reader sees real counts, CLI output and plots without running
it. ``tests/test_examples.py`` executes a fresh copy of the saved notebook.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
OUT = HERE / "tour.ipynb"

# (kind, source): "md" cells explain, "code" cells run. Keep each step short and
# self-contained: the notebook is read by data engineers new to the package.
CELLS: list[tuple[str, str]] = [
    ("md", """\
# memwal_datasource tour

Spark writes into a Lance table's **MemWAL**: every Spark task appends to its own
*shard*'s write-ahead log, and the driver makes the job visible with one commit
record. No table commit per write, exactly-once for readers.

This notebook walks through:

1. setting up Spark with the `memwal` format,
2. batch writes (WAL-only and MemTable mode),
3. committed vs uncommitted reads,
4. a streaming copy that stays exactly-once across reruns,
5. the `memwal` CLI,
6. plots of where the rows went,
7. compaction into the base Lance table.

Everything runs on local disk in a temporary directory."""),
    ("code", """\
import os
import sys
import tempfile

# Spark's Python workers must run this interpreter (it has memwal_datasource installed).
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession

from memwal_datasource import MemWalDataSource

spark = (SparkSession.builder.master("local[2]").appName("memwal-tour")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")  # no progress bars in cell output
         .config("spark.sql.shuffle.partitions", "2")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
spark.dataSource.register(MemWalDataSource)  # the format name is "memwal"

work = tempfile.mkdtemp(prefix="memwal-tour-")
events = os.path.join(work, "events.lance")    # no primary key: WAL-only writes
users = os.path.join(work, "users.lance")      # primary key: MemTable mode
copy = os.path.join(work, "events_copy.lance")  # written by a stream
print("Spark", spark.version, "- tables under", work)"""),
    ("md", """\
## 1. Batch writes

`df.write.format("memwal").mode("append").save(path)` creates the table if it
does not exist (from the DataFrame's schema). Each of the 4 Spark partitions
leases a shard and writes it; the second append reuses the same 4 shards (a
task takes its partition number's slot of the `writer_group` when no other job
holds it), each task claiming a new *writer epoch* on its shard.

A table without a primary key is written **WAL-only** (`enable_memtable=false`):
rows go straight into WAL entries. Always pass `.mode("append")` (or
`"overwrite"`); Spark's default mode is refused by Python data sources."""),
    ("code", """\
for start in (0, 10_000):
    df = spark.range(start, start + 10_000, numPartitions=4).selectExpr(
        "id", "concat('event-', id) AS payload", "id % 7 AS kind")
    (df.write.format("memwal").mode("append")
       .option("enable_memtable", "false")   # WAL-only: the table has no primary key
       .save(events))
print("events, committed rows:", spark.read.format("memwal").load(events).count())"""),
    ("md", """\
A table with a **primary key** (`primary_key`, used when the table is created)
is written in **MemTable mode** by default: pylance's native shard writer also
flushes rows into SSTables. With a key, a later row *replaces* an earlier one:
the WAL-tail read returns every committed row, the whole-table view
(`view=table`) the newest row per key.

Lance keeps all rows of one key in one shard, chosen by the table's sharding
spec: a new primary-key table gets `bucket(id, 16)`. Spark cannot be told to
send each bucket to one task, but any DataFrame works: tasks sharing a bucket
take turns on its shard. `partition_for_table` is the fast path, one task per
bucket (and, with `create_options`, it creates the table as the write would)."""),
    ("code", """\
from memwal_datasource.spark import partition_for_table

people = spark.range(0, 5_000, numPartitions=2).selectExpr("id", "concat('user-', id) AS name")
(partition_for_table(people, users, create_options={"primary_key": "id"})
   .write.format("memwal").mode("append").option("primary_key", "id").save(users))
renamed = spark.range(0, 1_000, numPartitions=2).selectExpr("id", "concat('renamed-', id) AS name")
partition_for_table(renamed, users).write.format("memwal").mode("append").save(users)

tail = spark.read.format("memwal").load(users)
whole = spark.read.format("memwal").option("view", "table").load(users)
print("users, committed WAL-tail rows:", tail.count())
print("users, rows in the whole table:", whole.count())
print("users, renamed rows:", whole.filter("name LIKE 'renamed-%'").count())"""),
    ("md", """\
## 2. Committed vs uncommitted

A writer that appends WAL entries but never gets a commit record (a crashed
task, a fenced attempt, a job whose driver died) leaves rows in the log that no
committed reader may see. Here an *orphan* writer from the Spark-free core
(`open_shard_writer`) puts 500 rows into a new shard and closes: its entries are
durable, but no job commits them.

`isolation=read_committed` (the default) returns exactly what commit records
list; `read_uncommitted` shows the raw log."""),
    ("code", """\
import uuid

import pyarrow as pa

from memwal_datasource import MemWalTable, ShardWriterConfig, open_shard_writer
from memwal_datasource.table.view import data_schema

schema = data_schema(MemWalTable(events).dataset().schema)
orphan_shard = str(uuid.uuid4())
orphan_rows = pa.record_batch({
    "id": pa.array(range(90_000, 90_500), pa.int64()),
    "payload": pa.array([f"orphan-{i}" for i in range(500)]),
    "kind": pa.array([99] * 500, pa.int64()),
}, schema=schema)
with open_shard_writer(events, orphan_shard, schema,
                       ShardWriterConfig(enable_memtable=False)) as writer:
    writer.put(orphan_rows)  # durable in the WAL; no commit record names it

committed = spark.read.format("memwal").option("isolation", "read_committed").load(events).count()
uncommitted = (spark.read.format("memwal").option("isolation", "read_uncommitted")
               .load(events).count())
print("read_committed rows:  ", committed)
print("read_uncommitted rows:", uncommitted)"""),
    ("md", """\
## 3. Streaming: memwal source to memwal sink

`spark.readStream.format("memwal")` serves committed entries commit record by
commit record (never the orphan's); `writeStream.format("memwal")` commits each
non-empty micro-batch once, keyed by (checkpoint location, batch id).
`trigger(availableNow=True)` drains what is committed and stops.

Run the copy three times on the same checkpoint: the first run copies
everything, the second finds nothing new and writes nothing (no duplicate rows,
no new commit record), the third, after another append, copies just that."""),
    ("code", """\
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.store import open_store

checkpoint = os.path.join(work, "checkpoints", "events_copy")

def run_copy():
    query = (spark.readStream.format("memwal").load(events)
             .writeStream.format("memwal").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(copy))
    query.awaitTermination()
    rows = spark.read.format("memwal").load(copy).count()
    records = len(list(CommitLog(open_store(copy)).records()))
    print(f"copy: {rows} rows in {records} commit records")
    return rows, records

rows1, recs1 = run_copy()
rows2, recs2 = run_copy()  # same checkpoint, nothing new in the source
print("rerun added rows:", rows2 - rows1, "records:", recs2 - recs1)

more = spark.range(20_000, 25_000, numPartitions=4).selectExpr(
    "id", "concat('event-', id) AS payload", "id % 7 AS kind")
more.write.format("memwal").mode("append").option("enable_memtable", "false").save(events)
rows3, recs3 = run_copy()
print("after one more append, the copy added rows:", rows3 - rows2, "records:", recs3 - recs2)"""),
    ("md", """\
## 4. The `memwal` CLI

`memwal` (or `python -m memwal_datasource.cli`) reads a table's MemWAL without
Spark: `inspect` gives one screen (shards, commits, lag, SSTables), `commits`
lists commit records. The orphan shard shows up with uncommitted entries.
Colour is turned off and the width fixed so the output reads well here."""),
    ("code", """\
import subprocess

cli_env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
cli_env.update(NO_COLOR="1", COLUMNS="100")

def memwal(*args):
    proc = subprocess.run([sys.executable, "-m", "memwal_datasource.cli", *args],
                          capture_output=True, text=True, env=cli_env, check=False)
    print(f"$ memwal {' '.join(args[:1])} events.lance")
    print(proc.stdout)
    if proc.returncode:
        print("exit code", proc.returncode, proc.stderr)

memwal("inspect", events)
memwal("commits", events)"""),
    ("md", """\
## 5. Where the rows went

The same facts from Python, through `MemWalTable` (the object every reader, the
compactor and the CLI use). First the rows in each shard's WAL: the 4 Spark
shards hold committed rows only, the orphan's shard only uncommitted ones."""),
    ("code", """\
from collections import Counter

import matplotlib.pyplot as plt

table = MemWalTable(events)
committed_by_shard = Counter()
for rng in table.committed_tail():
    committed_by_shard[rng.shard_id] += rng.rows
stored_by_shard = Counter()
for shard in table.shards():
    for _pos, entry in table.tailer(shard).entries(table.tailer(shard).first_position()):
        stored_by_shard[shard] += entry.num_rows
shards = sorted(stored_by_shard, key=lambda s: (-committed_by_shard[s], s))
ok = [committed_by_shard[s] for s in shards]
orphaned = [stored_by_shard[s] - committed_by_shard[s] for s in shards]

fig, ax = plt.subplots(figsize=(7, 3))
ax.bar([s[:8] for s in shards], ok, label="committed")
ax.bar([s[:8] for s in shards], orphaned, bottom=ok, label="uncommitted", color="tab:red")
ax.set(xlabel="shard", ylabel="rows", title="events: rows per shard")
ax.legend()
plt.show()
for s, c, u in zip(shards, ok, orphaned, strict=True):
    print(f"shard {s[:8]}: {c:>6} committed, {u:>4} uncommitted")"""),
    ("md", """\
Then the commit timeline: one point per commit record, sized by its rows
(`memwal commits` lists the same records). The batch table grows by one record
per job; the stream's copy by one per non-empty micro-batch, and the rerun that
found nothing new left no point."""),
    ("code", """\
histories = {name: list(MemWalTable(uri).commits.records())
             for name, uri in (("events\\n(batch jobs)", events),
                               ("events_copy\\n(stream)", copy))}
t0 = min(r.created_ms for recs in histories.values() for r in recs)
fig, ax = plt.subplots(figsize=(7, 3.6))
colors = ("tab:blue", "tab:orange")
for lane, ((name, recs), color) in enumerate(zip(histories.items(), colors, strict=True)):
    secs = [(r.created_ms - t0) / 1000 for r in recs]
    added = [sum(rng.rows for rng in r.ranges) for r in recs]
    ax.scatter(secs, [lane] * len(recs), s=[n / 40 for n in added], color=color, alpha=0.7)
    for i, (r, x, n) in enumerate(zip(recs, secs, added, strict=True)):
        what = r.kind if r.batch_id is None else f"batch {r.batch_id}"
        # Labels outside the lanes (below the bottom one, above the top one), in two
        # alternating tiers so commits close in time stay readable.
        up = lane == len(histories) - 1
        offset = (14 + 24 * (i % 2)) * (1 if up else -1)
        ax.annotate(f"#{r.sequence} {what}\\n+{n:,} rows", (x, lane), ha="center",
                    va="bottom" if up else "top", fontsize=8, textcoords="offset points",
                    xytext=(0, offset))
        print(f"{name.split()[0]:12} commit #{r.sequence} at {x:5.1f}s: {what:8} +{n:>6} rows")
ax.set_yticks(range(len(histories)), list(histories))
ax.set_ylim(-1.6, len(histories) + 0.6)
ax.margins(x=0.1)
ax.set(xlabel="seconds since the first commit", title="commit timeline (size = rows)")
plt.show()"""),
    ("md", """\
## 6. Compaction and the whole table

`memwal_datasource.compact(path)` folds committed WAL entries into the base
Lance table, exactly once (the orphan's entries are never folded). Afterwards
plain `lance` sees the rows, the whole-table view is unchanged, and the WAL-tail
read (rows not yet compacted) is empty."""),
    ("code", """\
import lance

import memwal_datasource

print("before: base table rows", lance.dataset(events).count_rows(),
      "| tail rows", spark.read.format("memwal").load(events).count())
memwal_datasource.compact(events)
print("after:  base table rows", lance.dataset(events).count_rows(),
      "| tail rows", spark.read.format("memwal").load(events).count())
print("whole table (view=table):",
      spark.read.format("memwal").option("view", "table").load(events).count())"""),
    ("code", """\
spark.stop()"""),
]


def build() -> nbformat.NotebookNode:
    """The notebook from ``CELLS``, without outputs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, source) in enumerate(CELLS):
        cell = (nbformat.v4.new_markdown_cell(source) if kind == "md"
                else nbformat.v4.new_code_cell(source))
        cell["id"] = f"tour-{i:02d}"  # stable ids: rebuilding changes only what changed
        nb.cells.append(cell)
    return nb


def execute(nb: nbformat.NotebookNode, workdir: str | os.PathLike,
            timeout: int = 300) -> nbformat.NotebookNode:
    """Run ``nb`` in place with a ``python3`` kernel started in ``workdir``.

    The kernel is ipykernel's native spec, i.e. this interpreter. Raises
    ``nbclient.exceptions.CellExecutionError`` naming the failing cell.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # PNGs in outputs
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir)}})
    # nbclient passes kernel start kwargs through to jupyter_client's KernelManager.
    client.execute(env=env)
    return nb


def main() -> None:
    """Build, execute, save."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-execute", action="store_true", help="save the cells only")
    args = parser.parse_args()
    nb = build()
    if not args.no_execute:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as workdir:
            execute(nb, workdir)
        print(f"executed in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    nbformat.validate(nb)
    nbformat.write(nb, args.out)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
