"""What must hold after every schedule: each answer matches the log, rows exactly once.

The log's truth is what a fresh reader folds (records ``1..N``: the stored
body whose digest its fold keeps for each number); every answer an actor got
is checked against it, so a reader that folded a stray, or a committer told
"committed" by one, shows as a job whose answer and the log disagree.
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter
from collections.abc import Iterator

from memwal_datasource.errors import CorruptEntryError
from memwal_datasource.format.commit_format import (
    COMMITS_DIR,
    COMMITTED,
    OVERWRITE,
    Checkpoint,
    CommitRecord,
    record_key,
)
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.log.commit_reader import forget_folds

from .actors import Job, World


def rid(r) -> tuple:
    """A range's identity (every job writes positions no other job writes)."""
    return (r.shard_id, r.first, r.last)


def record_number(key: str) -> int | None:
    """The number of a record's key, else ``None`` (checkpoints, intents)."""
    head, _, name = key.rpartition("/")
    if head == COMMITS_DIR and name.endswith(".json") and name[:-5].isdigit():
        return int(name[:-5])
    return None


def _fresh(world: World) -> CommitLog:
    forget_folds()
    return CommitLog(world.inner, checkpoint_interval=None)


def _read_damaged(world: World, out: list[str]) -> None:
    """A damaged record must be refused naming it, never read as the log's end: what
    a reader sees before the original bytes are put back (as an operator would) is
    what it sees after, or an error naming a damaged object."""
    damaged = {k: v for k, v in world.store.damaged.items() if world.inner.exists(k)}
    try:
        before = _fresh(world).visible()
    except CorruptEntryError as exc:
        before = None
        if not any(k.rsplit("/", 1)[-1] in str(exc) for k in damaged):
            out.append(f"a fresh reader's refusal names no damaged object: {exc}")
    for key, data in damaged.items():
        world.inner.put(key, data)
    if damaged and before is not None:
        try:
            after = _fresh(world).visible()
        except Exception:  # noqa: BLE001 - reported by the other checks
            return
        if before != after:
            out.append(f"a damaged object ({', '.join(sorted(damaged))}) changed what a "
                       "reader sees without an error")


def _truth(world: World, log: CommitLog, out: list[str]) -> dict[int, CommitRecord]:
    """The records of the log, by number, as a fresh fold has them (a number its
    checkpoint no longer has the digest of, in a world whose checkpoints remember few
    records: the first body stored there, which is the record by invariant 1)."""
    state = log.state()
    truth = {}
    for seq in range(1, state.sequence + 1):
        digest = state.recent.get(seq)
        if digest is None:
            bodies = world.store.landed.get(record_key(seq))
            if bodies:
                truth[seq] = CommitRecord.from_json(bodies[0], record_key(seq))
            continue
        for body in world.store.landed.get(record_key(seq), []):
            rec = CommitRecord.from_json(body, record_key(seq))
            if rec.digest() == digest:
                truth[seq] = rec
                break
        else:
            out.append(f"the fold's record {seq} is no body any committer stored")
    return truth


def _unknown_allowed(world: World, job: Job, known: tuple[str, ...]) -> bool:
    """An OutcomeUnknown needs a reason: store errors, or a stall; for "garbage
    collection removed records after" a stall from the intent PUT to that finding.
    Unless asked for, the known bug "stale-after" is excused: an intent written
    from a stale view (its window begins at a number released or stored long
    before), but not after a stray of its own at ``after`` (a spurious OutcomeUnknown).
    In a world whose checkpoints remember only a few records (a lone world), any
    stall of the job before that finding excuses it (an owner that stalled past what
    they remember: docs/protocol.md, invariant 5), but never a window that begins at
    its own stray."""
    actor = next(a for a in world.sched.actors if a.name == job.actor)
    stalls = [(s, e) for s, e, _ in actor.stalls if job.start <= s <= job.end]
    text = f"{job.error} {job.error.__cause__}"
    if "removed commit records after" not in text:
        return bool(job.faults or stalls)
    since = actor.marks.get(f"intent:{job.job_id}")
    found = actor.marks.get(f"unknown:{job.job_id}", job.end)
    if since is None:
        return False
    if any(since <= s and e <= found for s, e in stalls):
        return True
    after = actor.marks[f"after:{job.job_id}"]
    stray = actor.marks.get(f"stray:{after}")
    if stray is not None and job.start <= stray <= since:
        return False  # its window begins at its own stray, not at the number it lost
    if world.sched.recent is not None and any(s <= found for s, _ in stalls):
        return True  # stalled past more records than the checkpoints remember (a few here)
    return "stale-after" not in known and actor.marks[f"stale:{job.job_id}"]


@contextlib.contextmanager
def watch_folds(world: World) -> Iterator[None]:
    """Note every stray an actor's fold takes (a body at a number other than the
    first one stored there, which is the record): the known bug "fold-stray"."""
    orig = Checkpoint.fold
    firsts: dict[int, str] = {}

    def fold(state, rec):
        bodies = world.store.landed.get(record_key(rec.sequence), ())
        actor = world.sched.current()
        if len(bodies) > 1 and actor is not None:
            first = firsts.get(rec.sequence)
            if first is None:
                first = firsts[rec.sequence] = CommitRecord.from_json(bodies[0], "").digest()
            if rec.digest() != first:
                world.strays_folded.append(f"{actor.name} folded a stray at {rec.sequence} "
                                           f"(of job {rec.job_id}) at step {world.sched.step}")
        return orig(state, rec)

    Checkpoint.fold = fold
    try:
        yield
    finally:
        Checkpoint.fold = orig


# Bugs the simulator found (see test_sim.py, FOUND_BUGS), each with its own check or
# fault; the sweep turns them all on but "fold-stray" (a fold reading a stray and then
# folding again without it is right: what it decides is what is checked).
KNOWN = ("verdict-stall", "fold-stray", "stale-after", "late-refusal", "stream-released",
         "abort-lookup", "oserror")
# Every bug check and fault but the report of a fold's reads: a fold that read a stray
# folds again without it, and what it decided is checked.
SWEEP_CHECKS = tuple(k for k in KNOWN if k != "fold-stray")


def check(world: World, known: tuple[str, ...] = ()) -> list[str]:
    """Every violation of the protocol's promises in this schedule (empty: none);
    ``known``: also the known bugs named (see :data:`KNOWN`)."""
    # A fold may read a stray and then, listing the checkpoints, fold again without it:
    # what it decided is judged below; "fold-stray" also reports the read itself.
    out = list(world.problems) + (world.strays_folded if "fold-stray" in known else [])
    if world.sched.overrun:
        out.append(f"over {world.sched.max_steps} steps: a livelock?")
    for actor in world.sched.actors:
        if actor.error is not None:
            out.append(f"actor {actor.name} raised {actor.error!r}")
    _read_damaged(world, out)
    log = _fresh(world)
    try:
        visible = log.visible()
        truth = _truth(world, log, out)
        boundary = log.boundary(refresh=True)
    except Exception as exc:  # noqa: BLE001 - an unreadable log is the finding
        return [*out, f"the log cannot be read after the schedule: {exc!r}"]
    tip = max(truth, default=0)
    for seq in range(boundary + 1, tip + 1):
        if seq in truth and world.inner.head(record_key(seq)) is None:
            out.append(f"record {seq} (above the released boundary {boundary}) was deleted")
    counts = Counter(rid(r) for r in visible)
    out += [f"range {r} visible {n} times" for r, n in counts.items() if n > 1]
    overwrite = max((s for s, rec in truth.items() if rec.kind == OVERWRITE), default=0)
    committed: dict[str, list[int]] = {}
    intents: dict[str, list[int]] = {}
    for seq, rec in sorted(truth.items()):
        for part in rec.parts():
            if part.intent_id:
                intents.setdefault(part.intent_id, []).append(seq)
            if part.verdict == COMMITTED:
                committed.setdefault(part.job_id, []).append(seq)
    out += [f"intent {i} in records {s}" for i, s in intents.items() if len(s) > 1]
    out += [f"job {j} committed by records {s}" for j, s in committed.items() if len(s) > 1]
    for job in world.jobs:
        out += _check_job(world, job, truth, committed, counts, overwrite, known)
    out += _check_streams(world, log, truth)
    for step, ranges in world.reads:
        seen = Counter(rid(r) for r in ranges)
        out += [f"a read at step {step} saw {r} {n} times" for r, n in seen.items() if n > 1]
        for job in world.jobs:
            if job.outcome == "created" and job.end_step < step and overwrite == 0 \
                    and any(rid(r) not in seen for r in job.ranges):
                out.append(f"a read at step {step} missed job {job.job_id}, committed before")
    for name, after, released, why in world.stream_errors:
        if released > after or "stream-released" in known:
            out.append(f"stream {name} failed after {after} (released boundary then "
                       f"{released}): {why}")
    if "abort-lookup" in known:
        out += _check_abort_lookup(world, truth)
    return out


def _check_job(world: World, job: Job, truth, committed, counts, overwrite,
               known: tuple[str, ...]) -> list[str]:
    out = []
    seqs = committed.get(job.job_id, [])
    shown = [counts.get(rid(r), 0) for r in job.ranges]
    tag = f"job {job.job_id} ({job.outcome}"
    tag += f": {str(job.error)[:160]})" if job.error else ")"
    if job.outcome == "created":
        seq = job.record.sequence
        if seq not in seqs:
            out.append(f"{tag} answered committed at {seq}, but records {seqs} commit it")
        hidden = seq < overwrite
        if not hidden and shown != [1] * len(shown):
            out.append(f"{tag} committed at {seq} but visible {shown} times")
        if job.txn is not None and seq in truth and not any(
                p.txn_app_id == job.txn.app_id and p.verdict == COMMITTED
                for p in truth[seq].parts()):
            out.append(f"{tag}: record {seq} does not hold its key")
    elif job.outcome == "duplicate":
        if seqs or any(shown):
            out.append(f"{tag} answered duplicate, but records {seqs} commit it")
        prior = job.record.sequence
        if prior in truth and not any(p.txn_app_id == job.txn.app_id and p.verdict == COMMITTED
                                      for p in truth[prior].parts()):
            out.append(f"{tag}: record {prior} it names does not hold its key")
    elif job.outcome in ("refused", "failed"):
        # Known bug "late-refusal": an owner, stalled, refuses its job against a fold
        # past its number while another leader's record has committed its intent.
        late = job.outcome == "refused" and "late-refusal" not in known and len(seqs) == 1 \
            and truth[seqs[0]].parts()[0].job_id != job.job_id
        if (seqs or any(shown)) and not late:
            out.append(f"{tag} answered nothing committed, but records {seqs} commit it")
    elif job.outcome == "unknown" and not _unknown_allowed(world, job, known):
        why = "with neither store errors nor a stall"
        if "removed commit records after" in f"{job.error} {job.error.__cause__}":
            actor = next(a for a in world.sched.actors if a.name == job.actor)
            after = actor.marks[f"after:{job.job_id}"]
            own = f"stray:{after}" in actor.marks
            why = (f"(its intent's window begins after {after}"
                   + (", its own stray," if own else "") + " and crosses collected records) "
                   "with no stall since its intent")
        out.append(f"{tag} answered OutcomeUnknown {why}")
    return out


def _check_streams(world: World, log: CommitLog, truth) -> list[str]:
    out = []
    for name, seen in world.streams.items():
        offsets = world.offsets[name]
        if any(b < a for a, b in zip(offsets, offsets[1:], strict=False)):
            out.append(f"stream {name}: offsets went back: {offsets}")
        seqs = [s for s, _, _ in seen]
        if any(b <= a for a, b in zip(seqs, seqs[1:], strict=False)):
            out.append(f"stream {name}: served records out of order: {seqs}")
        for seq, digest, _ in seen:
            if seq not in truth or truth[seq].digest() != digest:
                out.append(f"stream {name} served record {seq}, which is not the log's")
        ranges = Counter(r for _, _, rs in seen for r in rs)
        out += [f"stream {name} served {r} {n} times" for r, n in ranges.items() if n > 1]
    try:  # a new stream from earliest, after the schedule
        first = log.first_stored()
        recs = list(log.records(after=first - 1))
    except Exception as exc:  # noqa: BLE001 - the finding
        return [*out, f"a stream from earliest fails: {exc!r}"]
    tip = max(truth, default=0)
    if [r.sequence for r in recs] != list(range(first, tip + 1)):
        out.append(f"a stream from earliest ({first}) serves {[r.sequence for r in recs]}, "
                   f"the log ends at {tip}")
    out += [f"a stream from earliest serves record {r.sequence}, which is not the log's"
            for r in recs if r.sequence not in truth or truth[r.sequence].digest() != r.digest()]
    return out


def _check_abort_lookup(world: World, truth) -> list[str]:
    """``abort()``'s lookup (spark.writer._record_of) names a record only for a job
    that record committed."""
    from memwal_datasource.spark import writer

    out = []
    saved = writer.time
    writer.time = types.SimpleNamespace(time=lambda: world.sched.now)
    try:
        for job in world.jobs:
            if job.outcome not in ("refused", "failed", "duplicate"):
                continue
            forget_folds()
            rec, _ = writer._record_of(types.SimpleNamespace(path=world.inner.uri, storage={}),
                                    job.job_id)
            if rec is not None:
                out.append(f"abort() of job {job.job_id} ({job.outcome}) would say record "
                           f"{rec.sequence} committed its rows")
    finally:
        writer.time = saved
    return out
