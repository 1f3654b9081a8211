"""Issue 18: a bounded, seeded, randomized soak of maintenance beside live writers.

Writer processes (tests/soak_worker.py) commit jobs on a shared pool of shards,
with and without idempotency keys (some keys run twice), while this process runs a
compaction loop (with checkpoints), a gc loop whose clock runs further ahead of the
store's as the run goes on (the effective retention shrinks from 30 s of store
time to a few seconds), a stream (``MemWalStreamReader``, no Spark) following the
commits from 'earliest', and whole-table reads. The oracle is the writers' own
logs: every acknowledged row is read exactly once by ``read_table``, by base table
+ committed WAL tail, and by the stream, which all agree; no row of a job whose key
was already committed, or whose commit was refused, is ever read.

``MEMWAL_SOAK_SEED`` fixes the seed (printed on every run and in every failure);
``MEMWAL_SOAK_SECONDS`` the writing time per backend (default 18).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from memwal_datasource.log.commit import CommitLog
from memwal_datasource.maintenance.compact import compact
from memwal_datasource.maintenance.gc import collect
from memwal_datasource.store import open_store
from memwal_datasource.table.view import TableView, create_table, read_table
from tests.helpers import SCHEMA, committed_view, later, new_shard, stream_batch, stream_reader

REPO = Path(__file__).resolve().parents[2]
WRITERS = 2
SHARDS = 3
SECONDS = float(os.environ.get("MEMWAL_SOAK_SECONDS", "18"))
MAX_AHEAD_S = 25.0  # the gc clock's final lead: retention 30 s -> 5 s effective


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines(keepends=True):
        if line.endswith("\n"):  # a line still being written is skipped
            out.append(json.loads(line))
    return out


def rows_of(table) -> Counter:
    return Counter(zip(table.column("id").to_pylist(), table.column("v").to_pylist(),
                       strict=True))


class Loop:
    """Runs ``step()`` in a thread until stopped; keeps the unexpected errors."""

    def __init__(self, name: str, step, expected: tuple[str, ...] = ()):
        self.name, self.step, self.expected = name, step, expected
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.runs = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            try:
                self.step()
                self.runs += 1
            except Exception as exc:  # noqa: BLE001 - asserted after the run
                text = f"{type(exc).__name__}: {exc}"
                if not any(e in text for e in self.expected):
                    self.errors.append(text)
                    if len(self.errors) > 20:
                        return

    def join(self):
        self.stop.set()
        self.thread.join(300)
        assert not self.thread.is_alive(), f"{self.name} did not stop"


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_maintenance_soak(location, tmp_path):
    uri, opts = location
    seed = int(os.environ.get("MEMWAL_SOAK_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"\nmaintenance soak on {'s3' if uri.startswith('s3') else 'local disk'}: seed={seed} "
          f"writers={WRITERS} shards={SHARDS} seconds={SECONDS}", flush=True)
    rng = random.Random(seed)
    create_table(uri, SCHEMA, storage_options=opts)  # no primary key: duplicates would show
    store = open_store(uri, opts)
    shards = [new_shard() for _ in range(SHARDS)]
    logs = [tmp_path / f"writer{i}.jsonl" for i in range(WRITERS)]

    def acked() -> dict[int, str]:
        return {i: e["tag"] for p in logs for e in read_log(p) if e["ev"] == "ack"
                for i in e["ids"]}

    # The stream starts before any commit: it must serve every committed row once.
    follower = stream_reader(uri, opts, "earliest")
    offset = follower.initialOffset()
    streamed: list[tuple[int, str]] = []

    def follow():
        nonlocal offset
        rows, offset = stream_batch(follower, offset)
        streamed.extend(rows)

    compact_rng = random.Random(rng.random())

    def compact_step():
        table = TableView(uri, opts)
        compact(table, max_records_per_round=compact_rng.randint(1, 8))
        table.commits.checkpoint()

    start = time.monotonic()

    def ahead_ms() -> int:  # grows from 0 to MAX_AHEAD_S over the first half of the run
        return int(MAX_AHEAD_S * 1000 * min(1.0, (time.monotonic() - start) / (SECONDS / 2)))

    gc_stats = Counter()

    def gc_step():
        table = TableView(uri, opts)
        done = collect(table, retain_seconds=0, clock=lambda: store.now_ms() + ahead_ms())
        gc_stats.update(runs=1, wal=sum(len(s.entries) for s in done.shards),
                        records=len(done.records), busy=len(done.skipped_busy))

    read_stats = Counter()

    def read_step():
        before = acked()
        got = read_table(uri, opts)
        ids = got.column("id").to_pylist()
        assert len(ids) == len(set(ids)), f"seed {seed}: a row read twice: " + str(
            sorted(i for i, n in Counter(ids).items() if n > 1)[:10])
        missing = set(before) - set(ids)
        assert not missing, f"seed {seed}: acknowledged rows not read: {sorted(missing)[:10]}"
        read_stats.update(reads=1, rows=len(ids))

    loops = [Loop("compact", compact_step), Loop("gc", gc_step, expected=("run gc again",)),
             Loop("stream", follow), Loop("reads", read_step)]
    env = dict(os.environ, MEMWAL_STORAGE_OPTIONS=json.dumps(opts))
    deadline = time.time() + SECONDS
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.soak_worker", uri, str(i), str(rng.randrange(1 << 30)),
         str(deadline), str(logs[i]), *shards], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(WRITERS)]
    for loop in loops:
        loop.thread.start()
    try:
        for p in procs:
            out, err = p.communicate(timeout=SECONDS + 300)
            assert p.returncode == 0, f"seed {seed}: writer failed: {err[-3000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for loop in loops:
            loop.join()
    elapsed = time.monotonic() - start
    for loop in loops:
        assert not loop.errors, f"seed {seed}: {loop.name} failed: {loop.errors[:3]}"

    events = [e for p in logs for e in read_log(p)]
    kinds = Counter(e["ev"] for e in events)
    fails = Counter(e["error"].split(":")[0] for e in events if e["ev"] == "fail")
    want = Counter((i, e["tag"]) for e in events if e["ev"] == "ack" for i in e["ids"])
    never = {i for e in events if e["ev"] in ("dup",) for i in e["ids"]}
    never |= {i for e in events if e["ev"] == "fail" and "CommitRefused" in e["error"]
              for i in e["ids"]}
    tried = {i for e in events if e["ev"] == "try" for i in e["ids"]}
    print(f"seed={seed}: {elapsed:.1f} s; events {dict(kinds)}; failures {dict(fails)}; "
          f"compactions {loops[0].runs}; gc {dict(gc_stats)}; reads {dict(read_stats)}; "
          f"streamed {len(streamed)} rows", flush=True)
    assert kinds["ack"] > 0 and kinds["dup"] + kinds["ack"] > 5, f"seed {seed}: tested nothing"

    def check(stage: str) -> None:
        whole = rows_of(read_table(uri, opts))
        assert all(n == 1 for n in whole.values()), f"seed {seed} {stage}: a row read twice"
        ids = {i for i, _ in whole}
        assert not ids & never, f"seed {seed} {stage}: rows of a duplicate or refused " \
                                f"commit were read: {sorted(ids & never)[:10]}"
        assert ids <= tried, f"seed {seed} {stage}: rows never tried: {sorted(ids - tried)[:10]}"
        lost = want - whole
        assert not lost, f"seed {seed} {stage}: acknowledged rows lost: {sorted(lost)[:10]}"
        assert committed_view(TableView(uri, opts)) == whole, (
            f"seed {seed} {stage}: base table + committed tail disagrees with read_table")
        # The stream, caught up, served every committed row exactly once.
        follow()
        assert Counter(streamed) == whole, f"seed {seed} {stage}: the stream disagrees: " \
            f"{sorted((Counter(streamed) - whole).items())[:5]} / " \
            f"{sorted((whole - Counter(streamed)).items())[:5]}"

    check("after the run")
    table = TableView(uri, opts)
    compact(table)
    CommitLog(store).checkpoint()
    collect(table, retain_seconds=0, clock=later(table))
    collect(TableView(uri, opts), retain_seconds=0, clock=later(table))
    assert TableView(uri, opts).committed_tail() == []
    check("after a final compaction and gc")
