"""A writer process of the maintenance soak (tests/maintenance/test_maintenance_soak.py).

Usage: ``python -m tests.soak_worker URI WORKER SEED DEADLINE LOG SHARD [SHARD...]``
with storage options as JSON in ``MEMWAL_STORAGE_OPTIONS``. Until ``time.time()``
passes DEADLINE it runs seeded jobs: a task writes 1-3 batches to a shard of the
pool (usually holding the shard's lease, as a Spark task does; sometimes not, so
gc may fence it), then the "driver" commits, with an idempotency key or without;
some keyed jobs are run a second time with the same key (new rows, same key: they
must not be committed). Some commits are deferred until after the next task wrote
(a late driver: a shard's commit order then differs from its WAL order), and half
the commits ask for epochs in order (a sharded table's Spark commit). Every id is
unique. One JSON line per event goes to LOG: ``try`` (the ids about to be
committed), then ``ack`` (committed, with the record sequence), ``dup`` (the key
was already committed: nothing new committed) or ``fail`` (the exception; nothing
is assumed either way).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time

import pyarrow as pa

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, Txn
from memwal_datasource.shard.leases import Holder, Leases
from memwal_datasource.store import open_store
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA


def main() -> None:
    uri, wid, seed, deadline, path, *shards = sys.argv[1:]
    wid, deadline = int(wid), float(deadline)
    opts = json.loads(os.environ.get("MEMWAL_STORAGE_OPTIONS", "{}"))
    rng = random.Random(int(seed))
    store = open_store(uri, opts)
    config = ShardWriterConfig(enable_memtable=False, durable_write=False)
    job = 0
    with open(path, "a", buffering=1) as log:

        def event(**body) -> None:
            log.write(json.dumps(body) + "\n")
            log.flush()
            os.fsync(log.fileno())

        def commit(pending: dict) -> None:
            event(ev="try", job=pending["job"], run=pending["run"], key=pending["keyed"],
                  tag=pending["tag"], ids=pending["ids"])
            try:
                res = CommitLog(store).append(APPEND, [pending["range"]], txn=pending["txn"],
                                              job_id=pending["tag"],
                                              ordered_epochs=pending["ordered"])
                event(ev="ack" if res.created else "dup", job=pending["job"],
                      run=pending["run"], tag=pending["tag"], seq=res.record.sequence,
                      ids=pending["ids"])
            except Exception as exc:  # noqa: BLE001 - logged for the oracle
                event(ev="fail", job=pending["job"], run=pending["run"], tag=pending["tag"],
                      ids=pending["ids"], error=f"{type(exc).__name__}: {exc}"[:300])

        deferred: dict | None = None  # a driver that commits only after the next task
        while time.time() < deadline:
            job += 1
            keyed = rng.random() < 0.6
            txn = Txn(f"soak-w{wid}", job) if keyed else None
            runs = 2 if keyed and rng.random() < 0.3 else 1
            for run in range(runs):
                shard = rng.choice(shards)
                sizes = [rng.randint(1, 5) for _ in range(rng.randint(1, 3))]
                first = wid * 100_000_000 + job * 1000 + run * 100
                ids = list(range(first, first + sum(sizes)))
                tag = f"w{wid}-j{job}-r{run}"
                try:
                    lease = (Leases(store).held(shard, Holder(
                        job_id=f"soak-w{wid}-j{job}-r{run}", partition=0, label=tag,
                        job_started_ms=int(time.time() * 1000)), wait_s=30)
                        if rng.random() < 0.8 else contextlib.nullcontext())
                    with lease, open_shard_writer(uri, shard, SCHEMA, config, opts) as w:
                        at = 0
                        for n in sizes:
                            part = ids[at:at + n]
                            at += n
                            w.put(pa.record_batch([pa.array(part, pa.int64()),
                                                   pa.array([tag] * n)], schema=SCHEMA))
                    s = w.stats()
                except Exception as exc:  # noqa: BLE001 - logged for the oracle
                    event(ev="fail", job=job, run=run, tag=tag, ids=ids,
                          error=f"{type(exc).__name__}: {exc}"[:300])
                    continue
                # Half the jobs commit like an unsharded table's Spark job (epochs of a
                # shard in any order), half like a sharded one's (in epoch order).
                pending = dict(job=job, run=run, keyed=keyed, tag=tag, ids=ids, txn=txn,
                               ordered=rng.random() < 0.5, range=CommittedRange(
                                   shard, s.epoch, s.first_wal_position, s.last_wal_position,
                                   s.rows))
                if deferred is None and rng.random() < 0.3:
                    deferred = pending
                    continue
                commit(pending)
                if deferred is not None:
                    commit(deferred)
                    deferred = None
        if deferred is not None:
            commit(deferred)
    print(f"worker {wid}: {job} jobs", flush=True)


if __name__ == "__main__":
    main()
