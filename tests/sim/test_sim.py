"""The commit protocol under a deterministic simulator (tests/sim).

``make test`` runs :data:`SWEEP` schedules (seeds ``0..SWEEP-1``) in a few chunks,
the regression seeds, the seeds of the bugs it found (fixed, each must pass),
and for each defect of the commit verdicts put back, that the simulator finds a failing
schedule within the budget. A failure prints the seed and the schedule; replay
one (and print its schedule) with ``python -m tests.sim.soak --seed S``; a longer soak:
``python -m tests.sim.soak --schedules N`` (from a random seed, printed).
"""

from __future__ import annotations

import pytest

from .checks import SWEEP_CHECKS
from .defects import defect
from .run import run_schedule

SWEEP, CHUNKS = 2000, 4
CHECKS = SWEEP_CHECKS


def _failures(seeds, known: tuple[str, ...] = CHECKS) -> list:
    return [o for o in (run_schedule(s, known) for s in seeds) if o.violations]


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_schedules_keep_every_promise(chunk):
    """Each answer matches the log, every committed row is visible exactly once (to
    a fold, a stream from earliest and readers), nothing refused shows, gc deletes
    nothing needed, checkpoints stay bounded."""
    size = SWEEP // CHUNKS
    bad = _failures(range(chunk * size, (chunk + 1) * size))
    assert not bad, f"{len(bad)} failing schedule(s); the first:\n{bad[0].report()}"


# Seeds that failed while the simulator was built, each the simulator's own mistake
# (now fixed): they must keep passing. (Later changes to the worlds moved what these
# seeds run; they stay as plain regression seeds.)
REGRESSIONS = [
    471,  # a damaged record a checkpoint covers is never read: no error is right
    727,  # OutcomeUnknown after a failed intent PUT (it may have landed) and a stall
    1487,  # ... an intent PUT whose acknowledgement was lost, then a stall
    1972,  # a stream meeting a damaged checkpoint fails naming it
    198,  # a stream failing after its hold lapsed is judged by the boundary then
    5000126,  # a stall inside the intent PUT itself excuses an OutcomeUnknown
    5004852,  # the verdict window includes the read-back after a lost acknowledgement
    852,  # a stream's hold must outlive its stalls (600 s), and is dropped at its end
    # A real bug: a txnAppId owner stalled while a leader committed its intent; its own
    # lead then found the key committed (by that record) and answered "duplicate".
    2785,
]


@pytest.mark.parametrize("seed", REGRESSIONS)
def test_regression_seeds(seed):
    outcome = run_schedule(seed, CHECKS)
    assert not outcome.violations, outcome.report()


# Real bugs the simulator found in the code, each fixed: the seeds that showed them
# replay with the bug's own check on (tests/sim/checks.py, KNOWN) and must pass.
FOUND_BUGS = {
    # A committer whose verdict (the LIST after its record PUT landed, or the read-back
    # after a lost acknowledgement) stalled past a collection took its own folded,
    # released record for a stray and committed again: the job's rows twice (31, 514),
    # "refused" for a job that committed (54), "duplicate" of its own record (123).
    "verdict-stall": [31, 514, 54, 123],
    # A committer's fold that read records never looked for a newer boundary: a stray
    # decided its checks and, shared, a checkpoint (7685: a job's rows twice).
    "fold-stray": [251, 7685],
    # ... and a fold that used records another look had fetched (a follower's holder
    # search) before the boundary moved past them never checked them: a leader put a
    # group record on a fold with a stray in it, and its checkpoint later hid the
    # committed record there (31276: a job's rows lost, a refused job's rows shown).
    "fold-stray-cached": [31276],
    # A PUT whose acknowledgement was lost landed, was folded and released while its
    # retry stalled; the retry met a stray in the freed number, took it for a rival's
    # record and committed again: the job's rows twice (20183).
    "lost-ack-stray": [20183],
    # An intent written from a stale view: its window crossed released numbers and the
    # owner answered OutcomeUnknown although nothing could have committed the intent.
    "stale-after": [382],
    # An owner stalled after its checks judged its ranges against a fold past its number
    # and answered CommitRefused while another leader had committed its intent.
    "late-refusal": [2234],
    # records() said "released" when a record and a checkpoint were written during its
    # read: a stream from earliest failed with nothing released.
    "stream-released": [2],
    # abort()'s lookup named a record whatever the job's verdict there.
    "abort-lookup": [58],
    # A bare OSError (local disk) from a read after an intent or record was stored
    # escaped append() although the record commits.
    "oserror": [89],
}


@pytest.mark.parametrize("bug,seed", [(b, s) for b, seeds in FOUND_BUGS.items()
                                      for s in seeds])
def test_found_bug_stays_fixed(bug, seed):
    outcome = run_schedule(seed, (bug,))
    assert not outcome.violations, outcome.report()


# The verdicts' defects, put back one at a time (tests/sim/defects.py): the simulator
# finds a failing schedule within this many (seeds 0, 1, ...; the comment says where
# it finds the first; replay it with ``python -m tests.sim.soak --seed S --defect NAME``).
TEETH = {
    "empty-record-is-missing": 800,  # 8: seed 728
    "first-stored-bisects": 20,  # 1, 2: seed 1
    "holder-below-boundary": 150,  # 3: seed 137
    "follower-errors-escape": 50,  # 4: seed 23
    # A lone world (actors._lone): its intent's window begins at its own stray.
    "after-first-number": 100,  # 5: seed 40
    "abort-lookup": 400,  # 6: seed 80
    "checkpoints-never-collected": 20,  # 7: seed 1
    "verdict-ignores-boundary": 40,  # the verdict trusting a stray: seed 8
    "stray-hides-holder": 1900,  # 9: seed 1857 (reached once followers skip held intents)
    # A world listing after a key (as S3): a PUT soon after a look takes no verdict listing.
    "clear-without-deadline": 100,  # 10: seed 57
    "clear-without-listing": 700,  # 11: seed 666
}


@pytest.mark.parametrize("name,within", TEETH.items())
def test_the_simulator_finds_each_defect(name, within):
    with defect(name):
        found = next((s for s in range(within) if run_schedule(s, CHECKS).violations), None)
    assert found is not None, f"no failing schedule in {within} with {name} put back"
    print(f"{name}: found at schedule {found + 1}")
