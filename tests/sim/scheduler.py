"""A deterministic scheduler for the commit protocol: real code, one actor at a time.

Actors are threads, but only one runs at a time: every store call (through
:class:`~tests.sim.simstore.SimStore`) and every ``time.sleep`` parks the actor,
which picks the next one with a ``random.Random(seed)`` and hands it the baton.
Time is virtual: ``time.time``/``monotonic``/``sleep`` of the modules under test
read :attr:`Scheduler.now`, which moves a little with each store call and jumps
when every live actor is waiting. Faults are drawn from the same generator when
a call is granted, so a seed replays the same schedule.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import re
import threading
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from memwal_datasource.format.commit_format import (
    CHECKPOINTS_DIR,
    COMMITS_DIR,
    INTENTS_DIR,
)

T0 = 1_800_000_000.0  # the virtual clock's start (s since the epoch)
# Modules whose ``time`` (and ``uuid``/``random``) the simulation replaces.
TIME_MODULES = ("memwal_datasource.log.commit", "memwal_datasource.log.commit_reader",
                "memwal_datasource.log.commit_intents", "memwal_datasource.log.commit_folds",
                "memwal_datasource.log.holds", "memwal_datasource.maintenance.gc",
                "memwal_datasource.store.base", "memwal_datasource.store.memory")
UUID_MODULES = ("memwal_datasource.log.commit", "memwal_datasource.log.commit_intents",
                "memwal_datasource.maintenance.gc")
# Past the commit deadline; past the retention; far past it.
STALLS_S = (12.0, 40.0, 75.0, 120.0, 240.0)
STALE_S = 10.0  # an intent's window begins this long ago: its view was stale


class Crash(BaseException):
    """Raised in an actor at a store call: its process died there (no cleanup reaches
    the store: every later call raises it too)."""


class Hang(AssertionError):
    """An actor neither parked nor finished in time (a real wait the simulation missed)."""


@dataclass
class Rates:
    """Per store call fault probabilities of one schedule."""

    error: float = 0.0  # an error after the client's retries (nothing happened)
    lost: float = 0.0  # a write lands, its acknowledgement is lost
    stall: float = 0.0  # descheduled while the clock moves on, then the call runs
    stall_record: float = 0.0  # ... for a record PUT (where a stray comes from)
    crash: float = 0.0  # the process dies at this call
    damage: float = 0.0  # a record, intent or checkpoint stored empty or truncated
    delete: float = 0.0  # a DELETE fails
    # Some errors are a bare OSError (local disk: EIO, ESTALE) instead of the store's
    # TransientStoreError: a known gap (see test_sim.py), so off unless asked for.
    oserror: bool = False
    # Stalls after a record PUT landed until the committer writes anything else (its
    # verdict's reads): a known bug (see test_sim.py), so off unless asked for.
    verdict_stall: bool = False

    def any(self) -> bool:
        return any(v for k, v in vars(self).items() if not isinstance(v, bool))


PROFILES = {
    "calm": Rates(),
    "stalls": Rates(stall=0.03),
    "errors": Rates(error=0.03, lost=0.03, delete=0.1),
    "mixed": Rates(error=0.01, lost=0.02, stall=0.02, crash=0.002, damage=0.002, delete=0.05),
    "storm": Rates(error=0.04, lost=0.04, stall=0.04, crash=0.004, damage=0.004, delete=0.2),
}
# Chosen by the world's shape (actors.build), not at random.
SHAPED = {"race": Rates(error=0.01, lost=0.01, stall=0.04, stall_record=0.25, crash=0.001,
                        damage=0.002, delete=0.2),
          # A lone world's busy committers and gc (its lone committer stalls more: LONER).
          "lone": Rates(error=0.01, lost=0.01, stall=0.01, stall_record=0.02, damage=0.002,
                        delete=0.1)}
# A lone world's committer that stalls inside its record PUTs (past a collection).
LONER = Rates(error=0.01, lost=0.01, stall=0.02, stall_record=0.5, delete=0.1)


@dataclass
class Actor:
    """One simulated process (a driver committing, gc, a stream, a reader)."""

    name: str
    fn: Callable[[], Any]
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    wake: float = 0.0  # runnable once the clock reaches this
    done: bool = False
    dead: bool = False  # crashed
    error: BaseException | None = None  # what escaped ``fn`` (not a Crash)
    stalls: list[tuple[float, float, str]] = field(default_factory=list)  # from, to, op
    faults: int = 0  # injected errors and lost acknowledgements it met
    marks: dict[str, float] = field(default_factory=dict)  # hook name: first time seen
    landed: bool = False  # a record PUT of its landed; its verdict may still be pending
    rates: Rates | None = None  # its own fault profile (else the schedule's)
    thread: threading.Thread | None = None


class Scheduler:
    """Runs actors one at a time under a seeded choice, with a virtual clock."""

    def __init__(self, seed: int, rates: Rates, max_steps: int = 20_000):
        self.seed = seed
        self.rng = random.Random(seed)
        self.rates = rates
        self.now = T0
        self.max_steps = max_steps
        self.step = 0
        self.actors: list[Actor] = []
        self.trace: list[tuple[int, str, str, str, str]] = []  # step, actor, op, key, fault
        self._finished = threading.Event()
        self.overrun = False  # more than max_steps: the checks report it
        # Records a checkpoint remembers (commit_format.RECENT) while the schedule runs;
        # ``None``: the real number. Fewer make an owner's window outlive the memory.
        self.recent: int | None = None
        self._local = threading.local()

    # --- actors ------------------------------------------------------------------------

    def spawn(self, name: str, fn: Callable[[], Any], rates: Rates | None = None) -> Actor:
        actor = Actor(name, fn, rates=rates)
        self.actors.append(actor)
        return actor

    def current(self) -> Actor | None:
        """The actor running in this thread (``None``: the test's own thread)."""
        return getattr(self._local, "actor", None)

    def _body(self, actor: Actor) -> None:
        self._local.actor = actor
        actor.go.acquire()
        try:
            actor.fn()
        except Crash:
            actor.dead = True
        except BaseException as exc:  # noqa: BLE001 - reported by the checks
            actor.error = exc
        finally:
            actor.done = True
            nxt = self._pick()
            if nxt is None:
                self._finished.set()
            else:
                nxt.go.release()

    def run(self) -> None:
        """Run every actor to its end, picking who goes next with the seeded generator.

        The baton passes from actor to actor: whoever parks picks the next one (itself:
        no thread switch), so one thread runs at a time and the choices are the seed's.
        """
        from memwal_datasource.format import commit_format

        saved = commit_format.RECENT
        commit_format.RECENT = saved if self.recent is None else self.recent
        try:
            for actor in self.actors:
                actor.thread = threading.Thread(target=self._body, args=(actor,), daemon=True,
                                                name=f"sim-{actor.name}")
                actor.thread.start()
            first = self._pick()
            if first is not None:
                first.go.release()
                if not self._finished.wait(600):
                    raise Hang(f"seed {self.seed}: an actor waited outside the scheduler")
            for actor in self.actors:
                actor.thread.join(10)
        finally:
            commit_format.RECENT = saved  # the checks' fresh reader remembers as shipped

    def _pick(self) -> Actor | None:
        """The next actor to run (moving the clock while every live one waits)."""
        while True:
            live = [a for a in self.actors if not a.done]
            if not live:
                return None
            ready = [a for a in live if a.wake <= self.now]
            if ready:
                break
            self.now = min(a.wake for a in live)  # everyone waits: time passes
        self.step += 1
        if self.step > self.max_steps and not self.overrun:
            self.overrun = True  # a livelock? every actor dies at its next call
            for a in self.actors:
                a.dead = True
        return ready[self.rng.randrange(len(ready))]

    def _park(self, actor: Actor) -> None:
        nxt = self._pick()
        if nxt is not actor:
            nxt.go.release()
            actor.go.acquire()

    # --- what actors call --------------------------------------------------------------

    def sleep(self, seconds: float, aligned: bool = False) -> None:
        """``time.sleep`` in an actor: wait on the virtual clock, letting others run.
        ``aligned``: until the next whole second after it (jobs and stalls end on the
        same tick, so they meet: contention)."""
        actor = self.current()
        if actor is None:
            self.now += max(seconds, 0.0)
            return
        if actor.dead:
            raise Crash
        actor.wake = self.now + max(seconds, 0.0)
        if aligned:
            actor.wake = float(math.ceil(actor.wake))
            actor.landed = False
        self._park(actor)

    def enter(self, op: str, key: str) -> str:
        """Park before a store call; once granted, the fault it meets ("" for none)."""
        actor = self.current()
        if actor is None:
            return ""
        if actor.dead:
            raise Crash
        actor.wake = self.now
        self._park(actor)
        fault = self._fault(op, key, actor.rates or self.rates)
        if op in ("put", "put_if_absent") and not key.startswith(COMMITS_DIR + "/0"):
            actor.landed = False  # past the verdict (a checkpoint, a hint, an intent)
        if fault == "stall" and actor.landed and not self.rates.verdict_stall:
            fault = ""
        if fault == "stall":
            stall = STALLS_S[self.rng.randrange(len(STALLS_S))]
            self.trace.append((self.step, actor.name, op, short(key), f"stall {stall:g} s"))
            start = self.now
            self.sleep(stall, aligned=True)
            actor.stalls.append((start, self.now, "write" if op.startswith("put") else "read"))
            fault = ""
        self.trace.append((self.step, actor.name, op, short(key), fault))
        if fault == "crash":
            actor.dead = True
            raise Crash
        if fault in ("error", "lost"):
            actor.faults += 1
        self.now += self.rng.uniform(0.0002, 0.004)  # the call's latency
        return fault

    def _fault(self, op: str, key: str, r: Rates) -> str:
        if not r.any():
            return ""
        roll = self.rng.random()
        stall = r.stall_record if op == "put_if_absent" and key.startswith(COMMITS_DIR + "/0") \
            else r.stall
        for name, p in (("crash", r.crash), ("stall", max(stall, r.stall)),
                        ("error", r.delete if op == "delete" else r.error),
                        ("lost", r.lost if op in ("put_if_absent", "put") else 0.0),
                        ("damage", r.damage if op in ("put_if_absent", "put")
                         and damageable(key) else 0.0)):
            if roll < p:
                return name
            roll -= p
        return ""

    def mark(self, name: str, job_id: object = None) -> None:
        """Note when the running actor first passed hook ``name`` (for ``job_id``)."""
        actor = self.current()
        if actor is not None:
            actor.marks.setdefault(f"{name}:{job_id}", self.now)

    def revive(self) -> None:
        """The running actor, crashed, starts again as a new process."""
        actor = self.current()
        actor.dead = False
        self.trace.append((self.step, actor.name, "restart", "", ""))

    def note(self, op: str, key: str, what: str) -> None:
        """Put an event of the running actor (not a store call) in the trace."""
        actor = self.current()
        if actor is not None:
            self.trace.append((self.step, actor.name, op, key, what))

    def format_trace(self) -> str:
        return "\n".join(f"  {s:5d} {a:<10} {op:<13} {k:<28} {f}" for s, a, op, k, f
                         in self.trace)


def short(key: str) -> str:
    """``_memwal_commits/00000000000000000012.json`` as ``12.json``, for traces."""
    return re.sub(r"\b0+(?=\d)", "", key.replace(COMMITS_DIR + "/", ""))


def damageable(key: str) -> bool:
    """Records, intents and checkpoints (not hints, markers, holds)."""
    return key.startswith((COMMITS_DIR + "/0", INTENTS_DIR + "/", CHECKPOINTS_DIR + "/0"))


@contextlib.contextmanager
def simulated(sched: Scheduler) -> Iterator[None]:
    """Give the modules under test the scheduler's clock, ids and jitter; quiet logs."""
    import importlib

    from memwal_datasource import hooks

    ids = random.Random(sched.seed ^ 0x5EED)
    clock = types.SimpleNamespace(
        time=lambda: sched.now, monotonic=lambda: sched.now - T0 + 1000.0,
        time_ns=lambda: int(sched.now * 1e9), sleep=sched.sleep)
    fake_uuid = types.SimpleNamespace(uuid4=lambda: uuid.UUID(int=ids.getrandbits(128),
                                                              version=4))
    saved = []
    for name in TIME_MODULES:
        mod = importlib.import_module(name)
        saved.append((mod, "time", mod.time))
        mod.time = clock
    for name in UUID_MODULES:
        mod = importlib.import_module(name)
        saved.append((mod, "uuid", mod.uuid))
        mod.uuid = fake_uuid
    base = importlib.import_module("memwal_datasource.store.base")
    saved.append((base, "random", base.random))
    base.random = types.SimpleNamespace(random=ids.random)
    def stray(sequence, **_):
        sched.note("stray", f"{sequence}.json", "deleted, commits again")
        sched.mark("stray", sequence)
        if sched.current() is not None:
            sched.current().landed = False  # the verdict is in: stalls are fine again

    removers = [hooks.register("commit.stray", stray)]
    from memwal_datasource.log.commit import CommitLog

    unknown = CommitLog.__dict__["_unknown"]

    def noted_unknown(log, intent):  # when a commit first found its window collected
        sched.mark("unknown", intent.record.job_id)
        return unknown(log, intent)

    saved.append((CommitLog, "_unknown", unknown))
    CommitLog._unknown = noted_unknown
    quiet = logging.getLogger("memwal_datasource")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        yield
    finally:
        quiet.level = level
        for remove in removers:
            remove()
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)
