"""One forced maintenance pass in a child process (killed by ``MEMWAL_KILL_AT`` in tests).

Usage: ``python -m tests.maintain_worker URI`` with storage options as JSON in
``MEMWAL_STORAGE_OPTIONS``; gc's clock runs two hours ahead (the retention passed).
Prints the pass's line when it finishes. ``MEMWAL_KILL_ON_DELETE=n`` kills it at its
n-th object delete (gc deletes only after its record and after letting its leases go:
this is a gc killed mid-deletion).
"""

from __future__ import annotations

import json
import os
import signal
import sys

from memwal_datasource.maintenance.auto import maintain_once
from memwal_datasource.maintenance.thresholds import Thresholds
from memwal_datasource.table.view import TableView
from tests.helpers import later


def main() -> None:
    table = TableView(sys.argv[1], json.loads(os.environ.get("MEMWAL_STORAGE_OPTIONS", "{}")))
    kill_on = int(os.environ.get("MEMWAL_KILL_ON_DELETE", "0"))
    if kill_on:
        deleted, delete = [], table.store.delete

        def killing_delete(key: str) -> None:
            deleted.append(key)
            if len(deleted) == kill_on:
                os.kill(os.getpid(), signal.SIGKILL)
            delete(key)

        table.store.delete = killing_delete
    result = maintain_once(table, Thresholds(max_rounds=100, max_records_per_round=2),
                           force=True, gc_clock=later(table), label="maintain_worker")
    print(result.line(), flush=True)
    sys.exit(1 if result.error else 0)


if __name__ == "__main__":
    main()
