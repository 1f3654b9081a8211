"""Entry points run in separate processes by the race tests (spawn-safe)."""

from __future__ import annotations

from memwal_datasource.errors import Fenced
from memwal_datasource.manifest import ManifestStore
from memwal_datasource.store import open_store
from memwal_datasource.wal import WalAppender
from tests.helpers import SCHEMA, make_batch


def claim(uri, opts, shard, barrier):
    """Claim the shard once; returns ('won', epoch) or ('lost', epoch)."""
    ms = ManifestStore(open_store(uri, opts), shard)
    barrier.wait()
    try:
        return "won", ms.claim_epoch().writer_epoch
    except Fenced as exc:
        return "lost", exc.local_epoch


def open_and_append(uri, opts, shard, barrier, entries):
    """Open an appender and append ``entries`` entries until fenced."""
    store = open_store(uri, opts)
    barrier.wait()
    try:
        app = WalAppender.open(store, shard, schema=SCHEMA)
    except Fenced:
        return {"epoch": None, "positions": [], "sentinel": None, "fenced": True}
    positions = []
    fenced = False
    for i in range(entries):
        try:
            positions.append(app.append(SCHEMA, [make_batch(i, 1)]).position)
        except Fenced:
            fenced = True
            break
    return {"epoch": app.epoch, "positions": positions, "sentinel": app.sentinel_position,
            "fenced": fenced}
