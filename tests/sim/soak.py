"""A long run of the simulator: ``python -m tests.sim.soak [--schedules N] [--seed S]``.

N schedules from seed S (default: one, from a random seed), every check on; prints the
count, the seeds, the rate and the failing seeds, and the first failure's schedule. One
seed alone replays that schedule and prints it. Exits 1 when a schedule fails.
``--defect NAME`` runs them with a defect of the verdicts put back (tests/sim/defects.py).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time

from .checks import KNOWN, SWEEP_CHECKS
from .run import run_schedule


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.soak", description=__doc__)
    p.add_argument("--schedules", type=int, default=1, help="how many (default 1)")
    p.add_argument("--seed", type=int, help="the first seed (default: a random one)")
    p.add_argument("--known", default=",".join(SWEEP_CHECKS),
                   help=f"bug checks to run, comma-separated, of {', '.join(KNOWN)}")
    p.add_argument("--defect", help="put this defect of the verdicts back (a name of "
                   "tests/sim/defects.py's DEFECTS)")
    args = p.parse_args(argv)
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 40)
    known = tuple(k for k in args.known.split(",") if k)
    put_back = contextlib.nullcontext()
    if args.defect:
        from .defects import DEFECTS, defect  # imports pyspark (abort()'s lookup)

        if args.defect not in DEFECTS:
            p.error(f"--defect: one of {', '.join(DEFECTS)}")
        put_back = defect(args.defect)
    started = time.perf_counter()
    with put_back:
        outcomes = [run_schedule(s, known) for s in range(first, first + args.schedules)]
    took = time.perf_counter() - started
    bad = [o for o in outcomes if o.violations]
    print(f"memwal sim: {args.schedules} schedule(s), seeds {first}..{first + args.schedules - 1}, "
          f"{took:.1f} s ({args.schedules / took:.0f}/s), failing: {[o.world.seed for o in bad]}")
    if bad or args.schedules == 1:
        print((bad or outcomes)[0].report())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
