"""Lease records and lease errors: who holds a shard, until when.

Pure data (the bodies of ``_memwal_leases/{shard}/{generation}.json``) and the
errors that name a holder. Taking, renewing and releasing leases is
:mod:`memwal_datasource.shard.leases`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from dataclasses import dataclass, field

from ..errors import MemWalError


class LeaseError(MemWalError):
    """Base class of the lease errors."""


class LeaseHeld(LeaseError):
    """Another live job holds the shard (or every shard of a pool) after waiting."""

    def __init__(self, shard: str, lease: Lease | None, waited_s: float, detail: str = "",
                 fix: str = ""):
        self.shard = shard
        self.lease = lease
        self.holder = lease.holder if lease else None
        self.waited_s = waited_s
        who = lease.describe() if lease else "another writer"
        super().__init__(
            f"shard {shard} is leased by {who}; waited {waited_s:.1f} s for it"
            + (f" ({detail})" if detail else "") + ". "
            + (fix or "Two live jobs must not write one shard at once: wait for that job to "
                      "finish, give this one a longer wait, or write to a different writer "
                      "group"))


class NoFreeShard(LeaseHeld):
    """Every shard of a pool is leased by other live writers after waiting."""

    def __init__(self, shards: list[str], leases: list[Lease], waited_s: float,
                 fix: str = ""):
        self.shards = shards
        self.leases = leases
        self.shard = shards[0] if shards else ""
        self.lease = leases[0] if leases else None
        self.holder = self.lease.holder if self.lease else None
        self.waited_s = waited_s
        holders = sorted({lease.holder.describe() for lease in leases})
        shown = "; ".join(holders[:5]) + (f"; and {len(holders) - 5} more" if len(holders) > 5
                                          else "")
        MemWalError.__init__(
            self,
            f"no free shard among {len(shards)} after waiting {waited_s:.1f} s: every one is "
            f"leased by a live writer ({shown}). "
            + (fix or "Use a larger pool (num_shards), fewer concurrent writers, or a longer "
                      "wait"))


class LeaseLost(LeaseError):
    """Our lease was taken over (or could not be renewed in time): stop writing."""

    def __init__(self, shard: str, lease: Lease, by: Lease | None, reason: str = ""):
        self.shard = shard
        self.lease = lease
        self.by = by
        if reason:
            pass
        elif by is None:
            reason = "its lease files are gone"
        elif by.lease_id == lease.lease_id:
            reason = "it was released"
        else:
            reason = f"taken by {by.describe()}"
        super().__init__(
            f"shard {shard}: lost the lease of {lease.holder.describe()} ({reason}); "
            "another writer may claim the shard and fence this one, so stop writing")


@dataclass(frozen=True)
class Holder:
    """Who holds a lease. ``job_id`` and ``partition`` decide the rules. The rest is for people."""

    job_id: str
    partition: int
    attempt: int = 0
    label: str = ""  # e.g. "stream <query> batch 7" or "job <id>"
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    # When the holder's job started (epoch ms): its age for wait-die. Records
    # written before the field existed read as 0, the oldest.
    job_started_ms: int = 0
    # An idle writer kept between tasks (memwal_datasource.write.writer_pool) holds the lease
    # for no job: anyone may take it over, and its claim fences the kept writer.
    kept: bool = False

    def precedes(self, other: Holder) -> bool:
        """Whether this holder's job is older than ``other``'s (ties broken by job id).

        A total order on jobs: under wait-die only an older job waits for a
        younger one, so no cycle of waiting tasks can form.
        """
        return (self.job_started_ms, self.job_id) < (other.job_started_ms, other.job_id)

    def describe(self) -> str:
        """A one-line description for errors and logs."""
        name = self.label or f"job {self.job_id}"
        return (f"'{name}' (partition {self.partition}, attempt {self.attempt}) "
                f"on {self.host} pid {self.pid}")


@dataclass(frozen=True)
class Lease:
    """One lease record: generation ``generation`` of ``shard``.

    ``lease_id`` stays the same across renewals and the release of one
    acquisition. ``nonce`` is fresh in every record, so a read-back can tell
    our write from a rival's.
    """

    shard: str
    generation: int
    holder: Holder
    lease_id: str
    acquired_ms: int
    expires_ms: int
    released: bool = False
    nonce: str = ""

    def live(self, now_ms: int) -> bool:
        """Whether the lease still keeps other jobs off: not released, not expired."""
        return not self.released and now_ms <= self.expires_ms

    def describe(self) -> str:
        """Holder and expiry, for errors."""
        until = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.expires_ms / 1000))
        state = "released" if self.released else f"until {until}"
        return f"{self.holder.describe()} {state}"

    def encode(self) -> bytes:
        """The JSON body of the lease file."""
        # Field by field (the names decode reads): asdict deep-copied every value.
        body = {k: getattr(self, k) for k in _LEASE_FIELDS}
        body["holder"] = {k: getattr(self.holder, k) for k in _HOLDER_FIELDS}
        return json.dumps(body, sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes, shard: str, generation: int) -> Lease:
        """Parse a lease body. Raises ``ValueError`` if it is damaged or names another file."""
        raw = json.loads(data)
        # Unknown fields are ignored so a newer writer's records stay readable.
        holder = Holder(**{k: raw["holder"][k] for k in _HOLDER_FIELDS if k in raw["holder"]})
        lease = Lease(**{k: raw[k] for k in _LEASE_FIELDS if k in raw and k != "holder"},
                      holder=holder)
        if lease.shard != shard or lease.generation != generation:
            raise ValueError(f"its body names shard {lease.shard} generation {lease.generation}")
        return lease


_HOLDER_FIELDS = tuple(f.name for f in dataclasses.fields(Holder))
_LEASE_FIELDS = tuple(f.name for f in dataclasses.fields(Lease))
