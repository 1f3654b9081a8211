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


def random_rounds(uri, opts, shard, seed, barrier, rounds=3):
    """Seeded rounds of open-and-append under random lost acknowledgements.

    Returns ``{"opens": [epoch...], "acked": [(epoch, position, first_id)...]}``: every
    epoch this worker opened with and every append it saw acknowledged.
    """
    from tests.helpers import RandomFaultStore

    store = RandomFaultStore(open_store(uri, opts), seed=seed, probability=0.15)
    barrier.wait()
    return run_rounds(store, shard, seed, rounds)


def run_rounds(store, shard, seed, rounds):
    """The body of :func:`random_rounds`, also run in threads."""
    import random

    from memwal_datasource.errors import WriterPoisoned

    rng = random.Random(seed)
    out = {"opens": [], "acked": []}
    for r in range(rounds):
        try:
            app = WalAppender.open(store, shard, schema=SCHEMA, retry_base_delay_ms=1)
        except (Fenced, WriterPoisoned):
            continue
        out["opens"].append(app.epoch)
        for j in range(rng.randint(1, 4)):
            first = seed * 100_000 + r * 100 + j * 10
            try:
                res = app.append(SCHEMA, [make_batch(first, 2)])
            except (Fenced, WriterPoisoned):
                break
            out["acked"].append((app.epoch, res.position, first))
    return out
