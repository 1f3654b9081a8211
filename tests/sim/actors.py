"""The simulation's actors (committers, gc, maintainers, a stream planner, readers) and
one world.

Each actor is a few store calls of the real code; what each one was told is kept
for :mod:`tests.sim.checks`. :func:`build` makes a world from a seed: which
actors, how many commits, which fault profile.
"""

from __future__ import annotations

import dataclasses
import random
import types
from dataclasses import dataclass, field

from memwal_datasource.errors import (
    CommitRefused,
    CorruptEntryError,
    MemWalError,
    OutcomeUnknown,
    StoreError,
)
from memwal_datasource.format.commit_format import (
    APPEND,
    CHECKPOINTS_DIR,
    OVERWRITE,
    CommitRecord,
    CommittedRange,
    Txn,
    record_key,
)
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.log.holds import ReaderHold, ReaderHolds
from memwal_datasource.maintenance import gc
from memwal_datasource.maintenance.auto import MAINTAINER_LEASE
from memwal_datasource.shard.leases import Holder, Leases
from memwal_datasource.store import MemoryStore

from .scheduler import LONER, PROFILES, SHAPED, Crash, Scheduler
from .simstore import SimStore, released_now


@dataclass
class Job:
    """One commit and the answer its committer got."""

    actor: str
    job_id: str
    kind: str
    ranges: list[CommittedRange]
    txn: Txn | None
    start_step: int
    start: float
    outcome: str = "crashed"  # created, duplicate, refused, unknown, corrupt, failed
    record: CommitRecord | None = None
    error: BaseException | None = None
    end_step: int = 1 << 60
    end: float = float("inf")
    faults: int = 0  # injected errors and lost acknowledgements it met


@dataclass
class World:
    """A schedule's store, scheduler, actors and everything they were told."""

    seed: int
    profile: str
    sched: Scheduler
    inner: MemoryStore
    store: SimStore
    jobs: list[Job] = field(default_factory=list)
    streams: dict[str, list[tuple[int, str, tuple]]] = field(default_factory=dict)
    offsets: dict[str, list[int]] = field(default_factory=dict)
    reads: list[tuple[int, list[CommittedRange]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # violations actors saw themselves
    strays_folded: list[str] = field(default_factory=list)  # see checks.watch_folds
    # name, after, the released boundary then, why
    stream_errors: list[tuple[str, int, int, str]] = field(default_factory=list)

    def actor(self):
        return self.sched.current()


def _commit(world: World, name: str, log: CommitLog, job: Job, group: bool,
            ahead: bool = False) -> None:
    actor = world.actor()
    before = actor.faults
    try:
        look = None
        if ahead:  # a driver's look made while the job's tasks run (spark/looks.py)
            try:
                look = log.look()
            except Exception:  # noqa: BLE001 - as the driver: the commit looks again
                look = None
            # The tasks: short, or past the commit deadline (the look is then stale).
            world.sched.sleep(0.5 if int(job.job_id.rsplit(".", 1)[1]) % 4 == 1 else 12.0)
        res = log.append(job.kind, job.ranges, job_id=job.job_id, txn=job.txn, group=group,
                         look=look)
        job.outcome, job.record = ("created" if res.created else "duplicate"), res.record
    except CommitRefused as exc:
        job.outcome, job.error = "refused", exc
    except OutcomeUnknown as exc:
        job.outcome, job.error = "unknown", exc
    except CorruptEntryError as exc:
        job.outcome, job.error = "corrupt", exc
    except Exception as exc:  # noqa: BLE001 - "nothing committed", as a failed job says
        job.outcome, job.error = "failed", exc
    finally:
        job.faults = actor.faults - before
        job.end_step, job.end = world.sched.step, world.sched.now


def committer(world: World, name: str, jobs: list[tuple[float, Job]], interval: int | None,
              group: bool, fresh: bool) -> None:
    """Commit ``jobs`` one after the other (a driver running job after job)."""
    log = CommitLog(world.store, checkpoint_interval=interval)
    for think, job in jobs:
        world.sched.sleep(think, aligned=True)
        job.start_step, job.start = world.sched.step, world.sched.now
        world.jobs.append(job)
        if fresh:
            log = CommitLog(world.store, checkpoint_interval=interval)
        ahead = group and job.kind == APPEND and int(job.job_id.rsplit(".", 1)[1]) % 2 == 1
        _commit(world, name, log, job, group, ahead)


def reader(world: World, reads: int, think: float) -> None:
    """A committed reader: a fresh log's visible ranges, now and then."""
    for _ in range(reads):
        world.sched.sleep(think, aligned=True)
        step = world.sched.step
        try:
            world.reads.append((step, CommitLog(world.store).visible()))
        except (OSError, StoreError, CorruptEntryError):
            pass


def stream(world: World, name: str, plans: int, think: float) -> None:
    """A stream from ``earliest``: hold, resolve the start, then plan micro-batches
    (as ``MemWalStreamReader`` does, without Spark)."""
    holds = ReaderHolds(world.store)
    seen = world.streams.setdefault(name, [])
    offsets = world.offsets.setdefault(name, [])

    def hold(after: int) -> None:
        holds.put(ReaderHold(name, name, after, ttl_s=600.0))

    log = CommitLog(world.store)
    seq = None
    while seq is None:
        try:
            hold(0)
            seq = log.first_stored() - 1
            hold(seq)
        except (OSError, StoreError):
            world.sched.sleep(1.0)
        except CorruptEntryError:
            return  # a damaged checkpoint: the stream fails naming it
    offsets.append(seq)
    for _ in range(plans):
        world.sched.sleep(think, aligned=True)
        try:
            hold(seq)
            try:
                recs = list(log.records(after=seq))
            except (OSError, StoreError, CorruptEntryError):
                raise
            except MemWalError:  # records after seq were collected (see _records_after)
                first = log.first_stored()
                if first <= seq + 1:
                    raise
                recs = list(log.records(after=first - 1))
        except (OSError, StoreError):
            continue
        except CorruptEntryError:
            return
        except MemWalError as exc:
            world.stream_errors.append((name, seq, released_now(world.inner), str(exc)))
            return
        for rec in recs:
            seen.append((rec.sequence, rec.digest(),
                         tuple((r.shard_id, r.first, r.last) for r in rec.ranges)))
        if recs:
            seq = recs[-1].sequence
        offsets.append(seq)
    holds.drop(name)  # a query stopped for good (a crashed one's hold lapses in 600 s)


def collector(world: World, runs: int, think: float,
              rounds: list[tuple[int, int]] | None = None, name: str | None = None) -> None:
    """gc for a commit log without a Lance table: the real ``maintenance/gc.py``
    steps after the plan; the plan's compaction is a round per run, released
    :data:`gc.MIN_RETAIN_SECONDS` after it. With ``name``, an automatic maintainer
    (``maintenance/auto.py``): a run only under the table's maintainer lease (taken
    and released with the real :class:`Leases` on the simulated clock; one that
    stalls past its life is taken over, so two maintainers can still overlap)."""
    rounds = [] if rounds is None else rounds  # (done at ms, records folded up to)
    leases = Leases(world.store, ttl_s=60.0, clock=lambda: world.store.now_ms() / 1000)
    for _ in range(runs):
        world.sched.sleep(think, aligned=True)
        table = types.SimpleNamespace(store=world.store, uri=world.store.uri,
                                      commits=CommitLog(world.store, checkpoint_interval=None))
        try:
            lease = None
            if name is not None:
                holder = Holder(job_id=f"maintainer-{name}", partition=-1, label=name,
                                job_started_ms=world.store.now_ms())
                lease, _blocker = leases.try_take(MAINTAINER_LEASE, holder)
                if lease is None:
                    continue  # another maintainer works on it
            collect_once(world, table, rounds)
            if lease is not None:
                leases.release(lease)
        except (OSError, MemWalError):
            pass  # the next run starts over, as a failed gc run does
        except Crash:
            world.sched.revive()  # gc died mid-run; the next run is a new process


def collect_once(world: World, table, rounds: list[tuple[int, int]]) -> None:
    """One collection (gc.collect's steps for the commit log, with no shards)."""
    retain = gc.MIN_RETAIN_SECONDS
    todo = gc.GcPlan(retain_seconds=retain)
    todo.through_seq = table.commits.next_sequence() - 1
    now = table.store.now_ms()
    released = [upto for done, upto in rounds if done <= now - int(retain * 1000)]
    rounds.append((now, todo.through_seq))
    todo.releasable_seq = min(max(released, default=0), todo.through_seq)
    holds = ReaderHolds(table.store)
    todo.hold(holds.live(now))
    todo.holds = holds.forgotten(now)
    first = table.commits.first_stored()
    ck = table.commits.latest_checkpoint(refresh=True)
    for seq in range(first, min(ck.sequence - 1 if ck else 0, todo.releasable_seq) + 1):
        size = table.store.head(record_key(seq))
        if size is not None:
            todo.records.append((record_key(seq), size))
    todo.now_ms = now
    gc._sweep_intents(table, todo)
    if not todo.items():
        return
    gc._keep_for_late_holds(table, todo)
    if todo.records:
        table.commits.checkpoint()
    gc._release(table, todo)
    gc._delete(table, todo, None)
    since = len(world.store.puts)
    gc._collect_checkpoints(table)
    # Bounded: the newest few, and any written while it listed and deleted.
    later = sum(1 for _, k in world.store.puts[since:] if k.startswith(CHECKPOINTS_DIR))
    stored = [k for k in world.inner.list(CHECKPOINTS_DIR + "/") if "released-" not in k]
    if len(stored) > gc.KEEP_CHECKPOINTS + later:
        world.problems.append(f"{len(stored)} checkpoints stored after a collection "
                              f"(keeps {gc.KEEP_CHECKPOINTS})")


def _lists_after(seed: int) -> bool:
    """Half the worlds' stores list after a key, as S3 does (a separate draw, so every
    other choice of a seed's world stays as it was)."""
    return random.Random(seed * 2654435761 + 11).random() < 0.5


def build(seed: int, known: tuple[str, ...] = ()) -> World:
    """A world chosen by ``seed``: a few committers, maybe a txnAppId re-run, an
    overwrite, gc, a stream and a reader; one fault profile. One world in three is
    a race: more committers over a longer time, gc often, more stalls (the stalls
    that put strays into freed numbers need all three); some races are pileups,
    committers busy all along (a stray and then a lost race needs one). A few worlds
    (:data:`LONE_SHARE`, by a separate draw) are lone worlds (:func:`_lone`)."""
    # A separate draw, so the other worlds are the ones these seeds always made (its
    # constant keeps every seed of test_sim.py's REGRESSIONS and FOUND_BUGS out).
    shape = random.Random(seed * 15485863 + 39)
    if shape.random() < LONE_SHARE:
        return _lone(seed, shape, known)
    cfg = random.Random(seed * 7919 + 17)
    race = cfg.random() < 0.35
    pileup = race and cfg.random() < 0.4  # ... with committers busy all along
    profile = "race" if race else cfg.choice(sorted(PROFILES))
    rates = {**PROFILES, **SHAPED}[profile]
    sched = Scheduler(seed, dataclasses.replace(rates, oserror="oserror" in known,
                                                verdict_stall="verdict-stall" in known))
    name = f"sim-{seed}"
    MemoryStore.reset(name)
    inner = MemoryStore(name)
    world = World(seed, profile, sched, inner, SimStore(inner, sched, _lists_after(seed)))
    thinks = (1.0, 2.0, 3.0) if pileup else (0.0, 2.0, 5.0, 10.0, 20.0) if race \
        else (0.0, 0.0, 1.0, 5.0, 15.0, 30.0)

    def job(actor: str, k: int, shard: str, epoch: int, first: int, kind: str = APPEND,
            txn: Txn | None = None) -> tuple[float, Job]:
        rng = [CommittedRange(shard, epoch, first, first + 4, rows=5)]
        return cfg.choice(thinks), Job(actor, f"{actor}.{k}", kind, rng, txn, 0, 0.0)

    committers = 6 if pileup else cfg.randint(4, 5) if race else cfg.randint(2, 4)
    for i in range(committers):
        actor, group = f"c{i}", (i > 0 or cfg.random() < 0.3) if race else cfg.random() < 0.7
        jobs = [job(actor, k, f"s{i % 2}", i + 1, 1000 * i + 10 * k + 1)
                for k in range(cfg.randint(4, 6) if pileup else cfg.randint(2, 6) if race
                               else cfg.randint(1, 3))]
        interval = cfg.choice((2, 3) if race else (2, 2, 3, 4, None))
        fresh = cfg.random() < 0.7
        sched.spawn(actor, lambda a=actor, j=jobs, n=interval, g=group, f=fresh:
                    committer(world, a, j, n, g, f))
    if cfg.random() < 0.4:  # a txnAppId job run twice (a re-run after a failure)
        for i in range(2):
            actor = f"t{i}"
            jobs = [job(actor, 0, "t", 1, 100 * i + 1, txn=Txn("nightly", 1))]
            sched.spawn(actor, lambda a=actor, j=jobs, g=cfg.random() < 0.7:
                        committer(world, a, j, 2, g, True))
    if cfg.random() < 0.2:
        jobs = [job("ow", 0, "o", 1, 1, kind=OVERWRITE)]
        sched.spawn("ow", lambda j=jobs: committer(world, "ow", j, 3, False, True))
    rounds: list[tuple[int, int]] = []  # compaction is the table's: every collector's
    if race or cfg.random() < 0.85:
        runs = cfg.randint(10, 20) if race else cfg.randint(2, 5)
        think = 8.0 if race else cfg.choice((5.0, 12.0, 20.0))
        sched.spawn("gc", lambda: collector(world, runs, think, rounds))
    # Two streams' automatic maintainers beside it, in one world in four (a separate
    # draw, so the worlds without them are the ones these seeds always made).
    extra = random.Random(seed * 104729 + 3)
    if extra.random() < 0.25:
        for m in ("m0", "m1"):
            runs, think = extra.randint(3, 8), extra.choice((2.0, 6.0, 12.0))
            sched.spawn(m, lambda m=m, n=runs, t=think: collector(world, n, t, rounds, m))
    if cfg.random() < 0.5:
        plans, think = cfg.randint(2, 4), cfg.choice((1.0, 10.0, 25.0))
        sched.spawn("stream", lambda: stream(world, "stream", plans, think))
    if cfg.random() < 0.4:
        reads, think = cfg.randint(1, 3), cfg.choice((0.0, 10.0, 30.0))
        sched.spawn("reader", lambda: reader(world, reads, think))
    return world


LONE_SHARE = 0.15  # of the worlds: lone worlds (:func:`_lone`)
LONE_RECENT = (3, 4, 6)  # records a lone world's checkpoints remember (else RECENT, 256)


def _lone(seed: int, cfg: random.Random, known: tuple[str, ...]) -> World:
    """Two or three lone committers (each sees no contention: one PUT, no intent) that
    stall inside their record PUTs (:data:`~tests.sim.scheduler.LONER`) past
    collections, while another commits alone (never an intent) every few seconds
    and gc runs often; checkpoints remember only a few records (as 256 do in a log
    hundreds of records long). A lone committer's PUT fills a freed number (a stray);
    a checkpoint still knows that number, so it deletes the stray and puts again at
    the tip, where it may lose the race (to the committer or another lone one waking
    on the same tick). Its intent's window must then begin at the number it lost:
    one beginning at the stray crosses collected records the newest checkpoint no
    longer remembers (defect "after-first-number", a spurious OutcomeUnknown)."""
    rates = SHAPED["lone"]
    sched = Scheduler(seed, dataclasses.replace(rates, oserror="oserror" in known,
                                                verdict_stall="verdict-stall" in known))
    sched.recent = cfg.choice(LONE_RECENT)
    name = f"sim-{seed}"
    MemoryStore.reset(name)
    inner = MemoryStore(name)
    world = World(seed, "lone", sched, inner, SimStore(inner, sched, _lists_after(seed)))

    def jobs(actor: str, i: int, count: int, thinks: tuple[float, ...]):
        return [(cfg.choice(thinks),
                 Job(actor, f"{actor}.{k}", APPEND,
                     [CommittedRange(f"s{i}", 1, 1000 * i + 10 * k + 1, 1000 * i + 10 * k + 5,
                                     rows=5)], None, 0, 0.0))
                for k in range(count)]

    # Fresh logs: a log kept across jobs trusts its last listing, and after a stall
    # between jobs its PUT may fill a number no checkpoint remembers (OutcomeUnknown,
    # stalled past what they remember: excused only for a stall inside the job).
    lone = cfg.randint(2, 3)
    loner = dataclasses.replace(LONER, oserror="oserror" in known)
    for i in range(lone):
        actor = f"c{i}"
        sched.spawn(actor, lambda a=actor, j=jobs(actor, i, cfg.randint(3, 5), (1.0, 5.0, 10.0)),
                    n=cfg.choice((2, 3, 4)): committer(world, a, j, n, True, True), rates=loner)
    actor, think = f"c{lone}", cfg.choice((3.0, 4.0, 6.0))
    busy = jobs(actor, lone, cfg.randint(8, 16), (think,))
    sched.spawn(actor, lambda a=actor, j=busy, n=cfg.choice((2, 3, 4)), g=cfg.random() < 0.2:
                committer(world, a, j, n, g, True))
    rounds: list[tuple[int, int]] = []
    gc_think = cfg.choice((4.0, 8.0))
    sched.spawn("gc", lambda n=int(think * len(busy) / gc_think) + 5:
                collector(world, n, gc_think, rounds))
    return world
