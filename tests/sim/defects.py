"""Defects of the commit verdicts, put back one at a time, to show the simulator has teeth.

Each is a patch of today's code back to the defect (``with defect(name):``). The
sixth is ``abort()``'s lookup (``spark/writer.py:_record_of``) naming a refused
job's record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from memwal_datasource.errors import CorruptEntryError
from memwal_datasource.format.commit_format import record_key
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.log.commit_reader import CommitLogReader
from memwal_datasource.maintenance import gc
from memwal_datasource.spark import writer as spark_writer


def _empty_is_missing(fetch):
    """8. ``_fetch`` reads an empty record as "no record" (the end of the log)."""
    def patched(self, sequence):
        try:
            return fetch(self, sequence)
        except CorruptEntryError as exc:
            if "empty (0 bytes" in str(exc):
                return None, True
            raise
    return patched


def _first_stored_bisect(_):
    """1, 2. ``first_stored`` bisects for the first stored object, boundary or not."""
    def first_stored(self):
        if self.store.exists(record_key(1)):
            return 1
        ck = self.latest_checkpoint(refresh=True)
        if ck is None:
            return 1
        lo, hi = 1, ck.sequence
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.store.exists(record_key(mid)):
                hi = mid
            else:
                lo = mid
        return hi
    return first_stored


def _holder_below_boundary(_):
    """3. A follower takes its verdict from a record at or below the boundary (a stray)."""
    def _holder(self, intent, upto):
        for seq in range(intent.after + 1, upto + 1):
            if seq not in self._cache and self._fetch(seq)[0] is None:
                return None
        at = self._holders.get(intent.intent_id)
        if at is None or not intent.after < at <= upto:
            return ()
        rec = self._cache[at]
        return rec, next(p for p in rec.parts() if p.intent_id == intent.intent_id)
    return _holder


def _stray_hides_holder(_):
    """9. A follower whose window holds a stray (a stalled PUT into a number gc released,
    where the record holding its intent was) answers that no record holds it."""
    def _holder(self, intent, upto):
        for seq in range(intent.after + 1, upto + 1):
            if seq not in self._cache and self._fetch(seq)[0] is None:
                return self._holder_remembered(intent, upto)
        at = self._holders.get(intent.intent_id)
        if at is None or not intent.after < at <= upto:
            return ()
        if at <= self.boundary(refresh=True):
            return self._holder_remembered(intent, upto)
        rec = self._cache[at]
        return rec, next(p for p in rec.parts() if p.intent_id == intent.intent_id)
    return _holder


def _errors_escape(_):
    """4. A store error after the intent (or record) is stored ends the commit."""
    def _store_failed(self, exc, since, job_id, stored=""):
        raise exc
    return _store_failed


def _after_first_number(append_alone):
    """5. After a PUT into a freed number and a lost race, the intent's ``after`` is the
    first number (released), not the one lost."""
    def patched(self, rec, txn, at_sequence, once=False, **kw):
        result = append_alone(self, rec, txn, at_sequence, once, **kw)
        if once and result is None:
            rec.sequence = at_sequence
        return result
    return patched


def _verdict_ignores_boundary(_):
    """The verdict trusts every landed PUT (a stray in a freed number is "committed")."""
    def _verify_landed(self, rec):
        return True
    return _verify_landed


def _clear_without_deadline(_):
    """10. A PUT after a listing that showed its number free is trusted however long it
    took (a stalled PUT into a number gc freed meanwhile is "committed")."""
    def _landed_clear(clear):
        return clear is not None
    return staticmethod(_landed_clear)


def _clear_without_listing(_):
    """11. A look trusts its fold's tip as free and unreleased without a listing."""
    from memwal_datasource.log import commit

    def clear_since(self, sequence):
        return commit.time.monotonic()  # the simulation's clock, as the module reads it
    return clear_since


def _no_checkpoint_collection(_):
    """7. gc never deletes a checkpoint (a commit's cost grows with the table's age)."""
    def _collect_checkpoints(table):
        return None
    return _collect_checkpoints


def _abort_lookup(_):
    """6. abort()'s lookup names the newest record naming the job, whatever the job's
    verdict there (a refused job "committed")."""
    from memwal_datasource.log.commit import CommitLog
    from memwal_datasource.store import open_store

    def _record_of(opts, job_id):
        log_ = CommitLog(open_store(opts.path, opts.storage))
        for seq in range(log_.next_sequence() - 1, log_.first_stored() - 1, -1):
            if any(p.job_id == job_id for p in log_.read(seq).parts()):
                return log_.read(seq), True
        return None, True
    return _record_of


DEFECTS = {  # name: (owner, attribute, patch of the current value)
    "empty-record-is-missing": (CommitLogReader, "_fetch", _empty_is_missing),
    "first-stored-bisects": (CommitLogReader, "first_stored", _first_stored_bisect),
    "holder-below-boundary": (CommitLog, "_holder", _holder_below_boundary),
    "stray-hides-holder": (CommitLog, "_holder", _stray_hides_holder),
    "follower-errors-escape": (CommitLog, "_store_failed", _errors_escape),
    "after-first-number": (CommitLog, "_append_alone", _after_first_number),
    "verdict-ignores-boundary": (CommitLog, "_verify_landed", _verdict_ignores_boundary),
    "checkpoints-never-collected": (gc, "_collect_checkpoints", _no_checkpoint_collection),
    "clear-without-deadline": (CommitLog, "_landed_clear", _clear_without_deadline),
    "clear-without-listing": (CommitLogReader, "clear_since", _clear_without_listing),
    "abort-lookup": (spark_writer, "_record_of", _abort_lookup),
}


@contextlib.contextmanager
def defect(name: str) -> Iterator[None]:
    """Today's code with defect ``name`` put back."""
    owner, attr, patch = DEFECTS[name]
    saved = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    setattr(owner, attr, patch(saved))
    try:
        yield
    finally:
        setattr(owner, attr, saved)
