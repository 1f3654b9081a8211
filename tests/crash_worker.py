"""A writer process for the crash-replay tests; the test kills it with SIGKILL.

Usage: ``python -m tests.crash_worker MODE URI SHARD ROWS`` with MODE ``wal``
(WAL-only) or ``memtable`` (pylance's native writer) and storage options as
JSON in ``MEMWAL_CRASH_STORAGE_OPTIONS``. It makes durable puts of ``ROWS``
rows with consecutive ids and prints ``ack START END`` (flushed) after each put
returns, so every printed range is a promise the data is durable. It never
closes the writer: it keeps writing until killed.
"""

from __future__ import annotations

import json
import os
import sys

from memwal_datasource.config import ShardWriterConfig
from memwal_datasource.write.shard_writer import open_shard_writer
from tests.helpers import SCHEMA, make_batch

MAX_PUTS = 100_000


def main() -> None:
    mode, uri, shard, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    opts = json.loads(os.environ.get("MEMWAL_CRASH_STORAGE_OPTIONS", "{}"))
    config = ShardWriterConfig(
        enable_memtable=mode == "memtable",
        durable_write=True,
        max_wal_flush_interval_ms=5,
        # MemTable mode: flush SSTables mid-stream too, so the kill can hit one.
        max_memtable_rows=rows * 4,
    )
    writer = open_shard_writer(uri, shard, SCHEMA, config, opts)
    print(f"open {writer.epoch}", flush=True)
    for i in range(MAX_PUTS):
        writer.put(make_batch(i * rows, rows))
        print(f"ack {i * rows} {(i + 1) * rows}", flush=True)
    print("done", flush=True)
    sys.stdin.read()  # never close: wait to be killed


if __name__ == "__main__":
    main()
