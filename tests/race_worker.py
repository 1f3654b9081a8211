"""Entry points run in separate processes by the race tests (spawn-safe)."""

from __future__ import annotations

from memwal_datasource.errors import Fenced
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.store import open_store
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


def _count_requests(store) -> dict:
    """Count ``store``'s requests (its own methods, wrapped on the instance)."""
    counts = {"n": 0}
    for name in ("get", "head", "list", "list_after", "put_if_absent", "put", "delete"):
        method = getattr(store, name)

        def counted(*args, _method=method, **kwargs):
            counts["n"] += 1
            return _method(*args, **kwargs)

        setattr(store, name, counted)
    return counts


def commit_turns(uri, opts, worker, conn, share_folds=True):
    """A Spark commit worker: on each ``i`` from ``conn``, commit job ``i`` through a
    fresh CommitLog (as Spark's commit workers do) and answer with its request count."""
    from memwal_datasource.log import commit_folds
    from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange

    if not share_folds:  # a host without shared folds: each process folds alone
        commit_folds._host_checked, commit_folds._host_dir = True, None
    while (i := conn.recv()) is not None:
        store = open_store(uri, opts)
        counts = _count_requests(store)
        rec = CommitLog(store).append(APPEND, [CommittedRange(f"w{worker}", 1, i, i, rows=1,
                                                              task=0)], job_id=f"job{i}")
        conn.send((rec.record.sequence, counts["n"]))


def commit_racing(uri, opts, worker, stop, barrier):
    """Commit jobs until ``stop`` is set, each through a fresh CommitLog (seeded by this process's
    and the host's folds), with the protocol's clocks scaled down 10x as the racing
    collector's are. Returns (jobs committed, jobs whose outcome is unknown)."""
    import time

    from memwal_datasource.errors import OutcomeUnknown
    from memwal_datasource.log import commit as commit_mod
    from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange

    commit_mod.COMMIT_DEADLINE_S, commit_mod.INTENT_MAX_AGE_S = 1.0, 1.0
    commit_mod.LEADER_WAIT_S = 0.2
    store = open_store(uri, opts)
    barrier.wait()
    done, unknown = [], []
    i = 0
    while not stop.is_set():
        i, t0 = i + 1, time.monotonic()
        try:
            CommitLog(store, retry_base_delay_ms=1).append(
                APPEND, [CommittedRange(f"w{worker}", 1, i, i, rows=1, task=0)],
                job_id=f"w{worker}-{i}")
            done.append(i)
        except OutcomeUnknown:
            if time.monotonic() - t0 < 3.0:
                raise  # within the collector's grace: a collector must never cause it
            unknown.append(i)
            break
    return done, unknown
