"""One schedule end to end: build the world from a seed, run it, check it."""

from __future__ import annotations

from dataclasses import dataclass

from memwal_datasource.log.commit_reader import forget_folds
from memwal_datasource.store import MemoryStore

from .actors import World, build
from .checks import check, watch_folds
from .scheduler import simulated


@dataclass
class Outcome:
    """A schedule's world and what the checks found in it."""

    world: World
    violations: list[str]

    def report(self) -> str:
        """The seed, the violations and the schedule (actor, call, key, fault)."""
        w = self.world
        jobs = "\n".join(f"  {j.job_id:<6} {j.outcome:<9} steps {j.start_step}..{j.end_step}"
                         f" {'' if j.record is None else 'at ' + str(j.record.sequence)}"
                         for j in w.jobs)
        return (f"seed {w.seed} (profile {w.profile}, {w.sched.step} steps): "
                f"replay with MEMWAL_SIM_SEED={w.seed}\n"
                + "\n".join(f"  - {v}" for v in self.violations)
                + f"\njobs:\n{jobs}\nschedule (step actor op key fault):\n"
                + w.sched.format_trace())


def run_schedule(seed: int, known: tuple[str, ...] = ()) -> Outcome:
    """Run the schedule of ``seed`` and check it; ``known`` names the known bugs
    (checks.KNOWN) to look for too."""
    forget_folds()
    world = build(seed, known)
    try:
        with simulated(world.sched), watch_folds(world):
            world.sched.run()
            violations = check(world, known)
    finally:
        forget_folds()
        MemoryStore.reset(f"sim-{seed}")
    return Outcome(world, violations)
