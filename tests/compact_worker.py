"""Run one compaction in a child process (killed by ``MEMWAL_KILL_AT`` in the tests).

Usage: ``python -m tests.compact_worker URI`` with storage options as JSON in
``MEMWAL_STORAGE_OPTIONS``; prints ``rounds N rows M`` when it finishes.
"""

from __future__ import annotations

import json
import os
import sys

from memwal_datasource.maintenance.compact import compact
from memwal_datasource.table.view import TableView


def main() -> None:
    opts = json.loads(os.environ.get("MEMWAL_STORAGE_OPTIONS", "{}"))
    summary = compact(TableView(sys.argv[1], opts), max_records_per_round=2)
    print(f"rounds {len(summary.rounds)} rows {summary.rows}", flush=True)


if __name__ == "__main__":
    main()
