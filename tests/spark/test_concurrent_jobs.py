"""Concurrent writers on one table with default options: shard leases keep them apart.

Spark tests pause tasks inside Spark's Python workers at hook points
(:mod:`memwal_datasource.hooks`). A worker is another process, started by a
``pyspark.daemon`` whose environment is ``sc.environment`` as it was when the
data source was registered (see tests/spark/driver_job.py). So
:func:`worker_gates` writes a ``sitecustomize.py`` onto the workers'
``PYTHONPATH`` that registers a hook at each gated point, and registers the
data source again: the hook connects to a socket in this process, reports the
point and its context, and waits for the reply. The test decides when to
reply; no sleeps.

The wait-die rule between jobs of a sharded table is tested without Spark,
calling ``write_task`` directly as Spark would.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from collections import defaultdict
from contextlib import contextmanager

import pyarrow as pa
import pytest

from memwal_datasource import hooks
from memwal_datasource.errors import ConfigError
from memwal_datasource.format.table_schema import without_row_key
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.shard.leases import (
    LEASES_DIR,
    Holder,
    LeaseHeld,
    LeaseLost,
    Leases,
    NoFreeShard,
)
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import MemWalBatchWriter, TaskJob, write_task
from memwal_datasource.store import open_store
from memwal_datasource.table.sharding import ShardingRequest, table_sharding
from memwal_datasource.table.sharding import create_table as create_sharded
from memwal_datasource.table.view import create_table, open_table, read_table
from tests.spark.test_writer import frame, read, write

GATES_VAR = "MEMWAL_TEST_GATES"
EVENT_TIMEOUT_S = 120  # a deadline for a gate event that never comes, not a wait

# Loaded by Spark's Python workers (never by this process): registers a hook at each
# gated point once memwal_datasource.hooks is imported. Importing it here instead
# would load the package (and lance) into the daemon before it forks its workers.
SITECUSTOMIZE = '''
import importlib.machinery
import json
import os
import socket
import sys

_GATES = json.loads(os.environ.get("MEMWAL_TEST_GATES") or "[]")


def _gate(point, port):
    def hook(**context):
        event = json.dumps({"point": point, "pid": os.getpid(), **context}, default=str)
        with socket.create_connection(("127.0.0.1", port), timeout=300) as conn:
            conn.sendall(event.encode() + b"\\n")
            if conn.recv(1) == b"x":  # the test's fail (else its go, or closing)
                raise RuntimeError(f"injected failure at {point}")
    return hook


class _RegisterGates:
    def find_spec(self, name, path, target=None):
        if name != "memwal_datasource.hooks":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for gate in _GATES:
                module.register(gate["point"], _gate(gate["point"], gate["port"]))

        spec.loader.exec_module = exec_module
        return spec


if _GATES:
    sys.meta_path.insert(0, _RegisterGates())
'''


class WorkerGates:
    """The test's end of the gates: events per point; the first hit of a held point waits.

    Every other hit is answered at once. :meth:`next` returns the next event of
    a point (failing after :data:`EVENT_TIMEOUT_S`), :meth:`release` answers a
    held one, :meth:`fail` makes its hook raise.
    """

    def __init__(self, points: list[str], hold: set[str]):
        self.points = points
        self._hold = set(hold)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._events: dict[str, queue.Queue] = defaultdict(queue.Queue)
        self._held: dict[str, list[socket.socket]] = defaultdict(list)
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            event = json.loads(conn.makefile("r").readline())
            with self._lock:
                held = event["point"] in self._hold
                self._hold.discard(event["point"])
                if held:
                    self._held[event["point"]].append(conn)
            if not held:
                conn.sendall(b"g")
                conn.close()
            self._events[event["point"]].put(event)

    def next(self, point: str) -> dict:
        try:
            return self._events[point].get(timeout=EVENT_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"no Spark task reached {point}") from None

    def release(self, point: str, reply: bytes = b"g") -> None:
        with self._lock:
            conns = self._held.pop(point, [])
        for conn in conns:
            conn.sendall(reply)
            conn.close()

    def fail(self, point: str) -> None:
        """Answer a held point by making its hook raise (the task fails there)."""
        self.release(point, b"x")

    def close(self) -> None:
        with self._lock:
            self._hold.clear()
            points = list(self._held)
        for point in points:
            self.release(point)
        self._server.close()


def register(spark, env: dict[str, str | None]) -> None:
    """Set (or, for None, remove) worker environment variables and register the source again."""
    from memwal_datasource import MemWalDataSource

    environment = spark.sparkContext.environment
    for name, value in env.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    spark.dataSource.register(MemWalDataSource)  # captures sc.environment now


@contextmanager
def worker_gates(spark, tmp_path, points: list[str], hold: set[str]):
    """Jobs planned inside the block run their tasks with gates at ``points``.

    Jobs planned after it (the block may end while a job's task is paused) run
    without them; the gates stay open until the context is closed by the
    returned :class:`WorkerGates` ``close()`` (the fixture-like caller does).
    """
    site = tmp_path / "worker_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    gates = WorkerGates(points, hold)
    saved = {name: spark.sparkContext.environment.get(name) for name in ("PYTHONPATH", GATES_VAR)}
    register(spark, {"PYTHONPATH": str(site),
                     GATES_VAR: json.dumps([{"point": p, "port": gates.port} for p in points])})
    try:
        yield gates
    finally:
        register(spark, saved)


def storage(opts: dict) -> dict:
    return {k[len("storage."):]: v for k, v in opts.items() if k.startswith("storage.")}


def records(uri: str, opts: dict) -> list:
    return list(CommitLog(open_store(uri, storage(opts))).records())


def in_thread(spark, fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    """Run a Spark job ``fn`` in a driver thread; the dict gets ``result`` or ``error``.

    Spark finds a Python data source through the JVM thread's active session,
    and a new thread has none ("Failed to find the data source: memwal"), so
    the thread sets it first.
    """
    out: dict = {}

    def run():
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        try:
            out["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def finish(thread: threading.Thread, out: dict):
    thread.join(EVENT_TIMEOUT_S)
    assert not thread.is_alive(), "the job did not finish"
    if "error" in out:
        raise out["error"]
    return out.get("result")


# --- Spark: concurrent jobs with default options ------------------------------------------

@pytest.mark.parametrize("backend", ["local", "s3"])
def test_two_append_jobs_at_once_with_default_options(spark, spark_location, tmp_path):
    """Job A's first task pauses holding its lease (slot 0); job B runs meanwhile on the
    other core, leases around it, and commits; then A finishes. No task fenced another
    (every range is a first attempt) and every row is committed once."""
    uri, opts = spark_location
    write(frame(spark, 0, 10, 1), uri, opts)  # create the table (no primary key)
    t0 = time.perf_counter()
    with worker_gates(spark, tmp_path, ["lease.acquired"], hold={"lease.acquired"}) as gates:
        job_a, out_a = in_thread(spark, write, frame(spark, 1000, 400, 2), uri, opts)
        paused = gates.next("lease.acquired")
    try:
        write(frame(spark, 5000, 400, 2), uri, opts)  # job B, planned without gates
        assert "result" not in out_a and "error" not in out_a  # A is still paused
    finally:
        gates.close()
    finish(job_a, out_a)
    elapsed = time.perf_counter() - t0

    ids = sorted(r.id for r in read(spark, uri, opts).collect())
    assert ids == list(range(10)) + list(range(1000, 1400)) + list(range(5000, 5400))
    recs = records(uri, opts)
    assert len(recs) == 3
    assert all(r.attempt == 0 for rec in recs for r in rec.ranges)
    opts_a = WriteOptions.parse({"path": uri, **opts})
    slots = {opts_a.shard_for(s): s for s in range(4)}
    b_rec = next(rec for rec in recs if sum(r.rows for r in rec.ranges) == 400
                 and paused["job_id"] not in rec.job_id)
    assert paused["shard"] == opts_a.shard_for(int(paused["partition"]))
    # B's tasks stayed off A's paused shard and the table gained no extra shards.
    assert {r.shard_id for r in b_rec.ranges} <= set(slots) - {paused["shard"]}
    print(f"two concurrent jobs on {spark_location[0].split(':')[0]}: {elapsed:.1f} s")


@pytest.mark.parametrize("backend", ["local"])
def test_num_shards_one_with_two_concurrent_tasks_take_turns(spark, spark_location, tmp_path):
    """Partition X leases the only shard and pauses; partition Y waits for it (the gate
    sees it waiting); X finishes, Y writes: no fencing, no retry, rows once."""
    uri, opts = spark_location
    with worker_gates(spark, tmp_path, ["lease.acquired", "lease.waiting"],
                      hold={"lease.acquired"}) as gates:
        job, out = in_thread(spark, write, frame(spark, 0, 600, 2), uri, opts, num_shards="1")
        first = gates.next("lease.acquired")
        waiting = gates.next("lease.waiting")
        assert waiting["partition"] != first["partition"]
        assert waiting["blocker_job_id"] == first["job_id"]
        gates.release("lease.acquired")
        finish(job, out)
        gates.close()
    assert sorted(r.id for r in read(spark, uri, opts).collect()) == list(range(600))
    (rec,) = records(uri, opts)
    shard = WriteOptions.parse({"path": uri}).shard_for(0)
    assert [(r.shard_id, r.attempt) for r in rec.ranges] == [(shard, 0), (shard, 0)]
    assert len({r.epoch for r in rec.ranges}) == 2  # one after the other, never fenced


@pytest.mark.parametrize("backend", ["local"])
def test_sharded_table_job_waits_for_another_jobs_shard_or_fails_naming_it(
        spark, spark_location, tmp_path):
    """A live lease of another job on the one shard of a bucket(id, 1) table: with
    lease_wait_s=0 the job fails naming that job and commits nothing; with a wait, the
    lease released once the task is waiting, the job commits."""
    uri, opts = spark_location
    sharded = {"primary_key": "id", "shard_by_bucket": "id", "num_buckets": "1"}
    write(frame(spark, 0, 20, 1), uri, opts, **sharded)
    shard = table_sharding(open_table(uri, storage(opts))).shard_id(0)
    leases = Leases(open_store(uri, storage(opts)))
    other = leases.acquire(shard, Holder("nightly", 0, label="job nightly (test)"))
    with pytest.raises(Exception, match=r"leased by 'job nightly \(test\)'.*run this job "
                                        r"after 'job nightly \(test\)' finishes"):
        write(frame(spark, 100, 20, 1), uri, opts, lease_wait_s="0")
    assert len(records(uri, opts)) == 1

    with worker_gates(spark, tmp_path, ["lease.waiting"], hold={"lease.waiting"}) as gates:
        job, out = in_thread(spark, write, frame(spark, 100, 20, 1), uri, opts, lease_wait_s="300")
        event = gates.next("lease.waiting")
        assert (event["shard"], event["blocker_job_id"]) == (shard, "nightly")
        assert leases.release(other)
        gates.release("lease.waiting")
        finish(job, out)
        gates.close()
    assert sorted(r.id for r in read(spark, uri, opts).collect()) == list(range(20)) + list(
        range(100, 120))
    assert len(records(uri, opts)) == 2


@pytest.mark.parametrize("backend", ["local"])
def test_stream_tasks_lease_as_their_micro_batch(spark, spark_location, tmp_path):
    """A micro-batch is a job for the lease rules: job id '{query id}:{batch id}' (its
    commit record's), label 'stream {query id} batch {batch id}'."""
    from memwal_datasource.spark.source import checkpoint_query_id

    uri, opts = spark_location
    src, ck = str(tmp_path / "src"), str(tmp_path / "ck")
    for lo in (0, 100):
        spark.range(lo, lo + 100, numPartitions=1).selectExpr(
            "id", "cast(id as string) as v").write.mode("append").parquet(src)
    q = (spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1)
         .parquet(src).writeStream.format("memwal").option("checkpointLocation", ck)
         # the release at task end is the rule this checks; kept writers (the default)
         # keep their lease instead: tests/spark/test_kept_writers.py
         .option("keep_writers", "false")
         .trigger(availableNow=True).start(uri))
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    query = checkpoint_query_id(ck)
    recs = records(uri, opts)
    assert [r.job_id for r in recs] == [f"{query}:0", f"{query}:1"]
    leases = Leases(open_store(uri, storage(opts)))
    (last,) = {r.shard_id for r in recs[-1].ranges}
    lease = leases.current(last)
    assert lease.released and lease.holder.job_id == f"{query}:1"
    assert lease.holder.label == f"stream {query} batch 1"
    # Its age is the micro-batch's: Spark 4.3 builds the sink's writer for each batch.
    assert lease.holder.job_started_ms >= recs[0].created_ms


# --- the lease rules in write_task, without Spark -------------------------------------------

SCHEMA = pa.schema([("id", pa.int64()), ("tenant", pa.string()), ("v", pa.string())])


def rows(ids, tenant):
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([tenant] * len(ids)),
                            pa.array(["x"] * len(ids))], schema=SCHEMA)


@pytest.fixture
def by_tenant(tmp_path):
    """(options, table schema, shard of tenant) of a table sharded by identity(tenant)."""
    uri = str(tmp_path / "t.lance")
    table = create_sharded(uri, SCHEMA, ["id"], {},
                           ShardingRequest(identity_column="tenant")).schema
    writer = MemWalBatchWriter(WriteOptions.parse({"path": uri, "lease_wait_s": "60",
                                                   "enable_memtable": "false"}), table,
                               overwrite=False)
    return writer, table, writer.opts.sharding.shard_id


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


def no_waiting(**context):
    raise AssertionError(f"the task waited: {context}")


def job(name: str, started_ms: int) -> TaskJob:
    return TaskJob(name, f"job {name}", started_ms)


def test_a_task_never_waits_while_it_holds_a_shard(by_tenant):
    """A younger job's task holds 'a' and meets 'b' leased by an older job: it writes and
    releases 'a' first, then waits for 'b' holding nothing (so no two jobs can wait for
    each other), and fails after lease_wait_s naming the older job."""
    from dataclasses import replace

    writer, table, shard_of = by_tenant
    leases = Leases(open_store(writer.opts.path, {}))
    older = leases.acquire(shard_of("b"), Holder("old", 3, label="job old", job_started_ms=1))
    seen = []

    def waiting(**context):
        seen.append((context["shard"], leases.current(shard_of("a")).released))

    hooks.register("lease.waiting", waiting)
    with pytest.raises(LeaseHeld) as info:
        write_task(replace(writer.opts, lease_wait_s=0.2), table,
                   iter([rows([1], "a"), rows([2], "b")]), job("young", 2))
    text = str(info.value)
    assert f"shard {shard_of('b')} is leased by 'job old' (partition 3" in text
    assert f"{older.holder.host} pid {older.holder.pid}" in text
    assert "run this job after 'job old' finishes, or raise lease_wait_s (now 0.2 s)" in text
    assert seen and all(s == (shard_of("b"), True) for s in seen)  # 'a' released first
    assert read_table(writer.opts.path).num_rows == 0


def test_an_older_task_waits_for_a_younger_job_and_a_task_holding_nothing_waits(by_tenant):
    writer, table, shard_of = by_tenant
    leases = Leases(open_store(writer.opts.path, {}))
    young = leases.acquire(shard_of("b"), Holder("young", 0, job_started_ms=10**15))
    older_still = leases.acquire(shard_of("c"), Holder("old", 0, job_started_ms=1))
    waits = []

    def release_blocker(**context):
        waits.append(context["blocker_job_id"])
        leases.release({"young": young, "old": older_still}[context["blocker_job_id"]])

    hooks.register("lease.waiting", release_blocker)
    # Holds 'a', wants 'b' held by a younger job: waits. Holds nothing, wants 'c': waits.
    msg = write_task(writer.opts, table, iter([rows([1], "a"), rows([2], "b")]), job("mid", 5))
    msg2 = write_task(writer.opts, table, iter([rows([3], "c"), rows([4], "a")]), job("new", 6))
    assert waits == ["young", "old"]
    writer.commit([msg])
    writer.commit([msg2])
    assert sorted(read_table(writer.opts.path).column("id").to_pylist()) == [1, 2, 3, 4]


def test_a_holder_that_stays_fails_the_wait_naming_it_and_the_option(by_tenant):
    writer, table, shard_of = by_tenant
    leases = Leases(open_store(writer.opts.path, {}))
    leases.acquire(shard_of("a"), Holder("old", 0, label="job old", job_started_ms=1))
    from dataclasses import replace

    with pytest.raises(LeaseHeld, match=r"value 'a'.*run this job after 'job old' finishes, or "
                                        r"raise lease_wait_s \(now 0 s\)"):
        write_task(replace(writer.opts, lease_wait_s=0.0), table, iter([rows([1], "a")]),
                   job("new", 2))


def test_two_partitions_of_one_job_take_turns_on_a_shard(by_tenant):
    """A sibling task (same job, partition 1) holds 'a': partition 0 writes 'b' directly,
    spills 'a', releases 'b' and waits for its sibling without a bound (lease_wait_s=0
    bounds only other jobs); the sibling ends its turn, partition 0 takes 'a' with a new
    epoch. Both tasks' ranges commit, in WAL order, and the later turn's value wins."""
    from dataclasses import replace

    writer, table, shard_of = by_tenant
    opts = replace(writer.opts, lease_wait_s=0.0)
    leases = Leases(open_store(opts.path, {}))
    sibling = write_task(opts, table, iter([rows([1, 2], "a")]), job("j", 1))
    assert [s.shard_id for s in sibling.shards] == [shard_of("a")]
    held = leases.acquire(shard_of("a"), Holder("j", 1, label="job j"))  # its next turn
    waits = []

    def sibling_ends_its_turn(**context):
        waits.append((context["blocker_job_id"], leases.current(shard_of("b")).released))
        if len(waits) == 3:
            leases.release(held)

    hooks.register("lease.waiting", sibling_ends_its_turn)
    batch = rows([1, 3], "a")
    later = write_task(opts, table, iter([rows([5], "b"), batch.set_column(
        2, "v", pa.array(["later", "later"]))]), job("j", 1))
    assert waits == [("j", True)] * 3
    assert [s.shard_id for s in later.shards] == [shard_of("b"), shard_of("a")]
    (first,) = sibling.shards
    turn = later.shards[1]
    assert turn.epoch > first.epoch and turn.first_position > first.last_position
    writer.commit([replace(sibling, partition_id=1), later])
    got = {r["id"]: r["v"] for r in read_table(opts.path).to_pylist()}
    assert got == {1: "later", 2: "x", 3: "later", 5: "x"}


def test_pool_tasks_lease_around_other_jobs_and_wait_with_num_shards(tmp_path):
    uri = str(tmp_path / "t.lance")
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    table = without_row_key(create_table(uri, schema).schema)
    # Leases released at task end are the rule here; kept writers (the default) keep
    # theirs: tests/spark/test_kept_writers.py and tests/write/test_writer_pool.py.
    opts = MemWalBatchWriter(WriteOptions.parse({"path": uri, "keep_writers": "false"}),
                             table, False).opts
    assert opts.config.enable_memtable is False  # no primary key: WAL-only by default
    batch = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], schema=schema)
    leases = Leases(open_store(uri, {}))
    assert write_task(opts, table, iter([batch.slice(0, 0)])).shard_id is None
    assert not list(open_store(uri, {}).list(f"{LEASES_DIR}/"))  # an empty task leases nothing
    held = leases.acquire(opts.shard_for(0), Holder("other", 0, label="job other"))
    hooks.register("lease.waiting", no_waiting)
    msg = write_task(opts, table, iter([batch]))
    assert msg.shard_id == opts.shard_for(1)  # the next free slot, at once
    assert leases.current(opts.shard_for(1)).released
    one = WriteOptions.parse({"path": uri, "num_shards": "1", "lease_wait_s": "0",
                              "keep_writers": "false"}).with_table_key(False)
    with pytest.raises(NoFreeShard, match=r"job other.*Option 'num_shards' is 1: at most 1 "
                                          r"task\(s\) write writer group 'default'"):
        write_task(one, table, iter([batch]))
    leases.release(held)
    assert write_task(one, table, iter([batch])).shard_id == opts.shard_for(0)
    # This job's own running task holds the one shard: lease_wait_s does not bound
    # that wait (the sibling finishes and releases it); the test's hook releases it.
    sibling = leases.acquire(opts.shard_for(0), Holder("mine", 1, label="job mine"))
    hooks.clear()
    waits = []

    def sibling_finishes(**context):
        waits.append(context["blocker_job_id"])
        if len(waits) == 3:  # a few rounds past lease_wait_s=0
            leases.release(sibling)

    hooks.register("lease.waiting", sibling_finishes)
    msg = write_task(one, table, iter([batch]), job("mine", 1))
    assert (msg.shard_id, waits) == (opts.shard_for(0), ["mine"] * 3)


def test_a_lost_lease_fails_the_task_before_close(tmp_path, monkeypatch):
    """A newer attempt takes the lease over mid-task; the renewal finds it lost, and the
    old attempt fails at its next batch with LeaseLost (its rows are not committed)."""
    uri = str(tmp_path / "t.lance")
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    table = without_row_key(create_table(uri, schema).schema)
    opts = WriteOptions.parse({"path": uri, "enable_memtable": "false", "lease_ttl_s": "0.3"})
    lost = threading.Event()
    renew = Leases.renew

    def renew_and_tell(self, lease):
        try:
            return renew(self, lease)
        except LeaseLost:
            lost.set()
            raise

    monkeypatch.setattr(Leases, "renew", renew_and_tell)
    task = TaskJob("j", "job j", 1)

    def batches():
        yield pa.record_batch([pa.array([1], pa.int64()), pa.array(["a"])], schema=schema)
        Leases(open_store(uri, {})).acquire(opts.shard_for(0), Holder("j", 0, attempt=1))
        assert lost.wait(EVENT_TIMEOUT_S)
        yield pa.record_batch([pa.array([2], pa.int64()), pa.array(["b"])], schema=schema)

    with pytest.raises(LeaseLost, match="taken by 'job j' \\(partition 0, attempt 1\\)"):
        write_task(opts, table, batches(), task)


def test_lease_options_are_checked_and_enable_memtable_follows_the_key():
    assert WriteOptions.parse({"path": "/t"}).lease_wait_s == 60.0
    assert WriteOptions.parse({"path": "/t", "lease_wait_s": "0"}).lease_wait_s == 0.0
    for bad, match in [({"lease_wait_s": "-1"}, "option 'lease_wait_s' must be a number of "
                                                 "seconds >= 0, got '-1'"),
                       ({"lease_wait_s": "soon"}, "option 'lease_wait_s'"),
                       ({"lease_ttl_s": "0"}, "option 'lease_ttl_s' must be a positive"),
                       ({"lease_ttl_s": "inf"}, "option 'lease_ttl_s'")]:
        with pytest.raises(ConfigError, match=match):
            WriteOptions.parse({"path": "/t", **bad})
    auto = WriteOptions.parse({"path": "/t"})
    assert auto.with_table_key(True).config.enable_memtable is True
    wal = auto.with_table_key(False).config
    assert wal.enable_memtable is False and wal.max_unflushed_memtable_bytes == 20 << 20
    explicit = WriteOptions.parse({"path": "/t", "enable_memtable": "true"})
    assert explicit.with_table_key(False).config.enable_memtable is True  # refused later
    knob = WriteOptions.parse({"path": "/t", "max_wal_persist_retries": "5"})
    assert knob.with_table_key(False).config.max_wal_persist_retries == 5
    with pytest.raises(ConfigError, match="max_wal_persist_retries.*'enable_memtable' is unset"):
        knob.with_table_key(True)
