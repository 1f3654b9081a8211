"""One job's worth of writing, killed by ``MEMWAL_KILL_AT`` at a chosen protocol point.

Usage: ``python -m tests.kill_worker URI SHARD START PUTS APP VERSION`` with storage
options as JSON in ``MEMWAL_STORAGE_OPTIONS``. Opens a WAL-only writer on SHARD,
makes PUTS durable puts of 10 rows from id START (printing ``ack A B`` after each
returns), closes, and commits one record keyed ``(APP, VERSION)``, printing
``committed SEQ`` or ``duplicate SEQ``. The hook kills the process with SIGKILL
when it reaches the point named in ``MEMWAL_KILL_AT``.
"""

from __future__ import annotations

import json
import os
import sys

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, Txn
from memwal_datasource.store import open_store
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA, make_batch

ROWS = 10


def main() -> None:
    uri, shard, start, puts, app, version = sys.argv[1:7]
    opts = json.loads(os.environ.get("MEMWAL_STORAGE_OPTIONS", "{}"))
    # MEMWAL_DURABLE_WRITE=false: puts are not promises then, only the commit is.
    config = ShardWriterConfig(
        enable_memtable=False, max_wal_flush_interval_ms=1,
        durable_write=os.environ.get("MEMWAL_DURABLE_WRITE", "true") == "true")
    first = int(start)
    with open_shard_writer(uri, shard, SCHEMA, config, opts) as writer:
        for i in range(int(puts)):
            a = first + i * ROWS
            writer.put(make_batch(a, ROWS))
            print(f"ack {a} {a + ROWS}", flush=True)
    s = writer.stats()
    rng = CommittedRange(shard, s.epoch, s.first_wal_position, s.last_wal_position, s.rows)
    res = CommitLog(open_store(uri, opts)).append(APPEND, [rng], txn=Txn(app, int(version)))
    print(f"{'committed' if res.created else 'duplicate'} {res.record.sequence}", flush=True)


if __name__ == "__main__":
    main()
