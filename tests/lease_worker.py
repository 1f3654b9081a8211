"""A lease holder in its own process, for kill -9 tests.

Usage: ``python -m tests.lease_worker URI JOB PARTITION TTL_S SHARD...`` with storage
options as JSON in ``MEMWAL_STORAGE_OPTIONS``. Acquires each SHARD in turn for job JOB
and partition PARTITION (printing ``acquired SHARD GENERATION``), then releases them
all (printing ``released SHARD``). ``MEMWAL_KILL_AT=lease.acquired[:n]`` kills the
process with SIGKILL once its n-th lease has landed, before it can release anything.
"""

from __future__ import annotations

import json
import os
import sys

from memwal_datasource.shard.leases import Holder, Leases
from memwal_datasource.store import open_store


def main() -> None:
    uri, job, partition, ttl_s, *shards = sys.argv[1:]
    opts = json.loads(os.environ.get("MEMWAL_STORAGE_OPTIONS", "{}"))
    leases = Leases(open_store(uri, opts), ttl_s=float(ttl_s))
    holder = Holder(job, int(partition), label=f"job {job} (lease_worker)")
    held = []
    for shard in shards:
        lease = leases.acquire(shard, holder)
        held.append(lease)
        print(f"acquired {shard} {lease.generation}", flush=True)
    for lease in held:
        leases.release(lease)
        print(f"released {lease.shard}", flush=True)


if __name__ == "__main__":
    main()
