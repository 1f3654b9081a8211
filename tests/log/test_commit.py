"""Commit log checkpoints: equal answers with and without them, cheap reads, GC safety.

Every test runs on memory, local disk and the S3 server (``backend``) unless it
says otherwise; intervals are small so S3 runs stay fast.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace

import pytest

from memwal_datasource.errors import CorruptEntryError, MemWalError, TransientStoreError
from memwal_datasource.format.commit_format import released_key
from memwal_datasource.log.commit import (
    APPEND,
    CHECKPOINTS_DIR,
    LAST_CHECKPOINT_KEY,
    OVERWRITE,
    Checkpoint,
    CommitLog,
    CommittedRange,
    Txn,
    checkpoint_key,
    record_key,
)
from memwal_datasource.log.commit_reader import forget_folds
from memwal_datasource.store import open_store
from tests.helpers import DelegatingStore, FlakyStore, stall_record_puts

SHARDS = ["shard-a", "shard-b", "shard-c"]


class CountingStore(DelegatingStore):
    """Counts the reads a commit log makes (``exists`` goes through ``head``)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.calls = {"get": 0, "head": 0, "list": 0}

    def get(self, key):
        self.calls["get"] += 1
        return super().get(key)

    def head(self, key):
        self.calls["head"] += 1
        return super().head(key)

    def list(self, prefix):
        self.calls["list"] += 1
        return super().list(prefix)

    @property
    def reads(self) -> int:
        return sum(self.calls.values())


def _ranges(seq: int) -> list[CommittedRange]:
    """Ranges of several shards, distinct per record."""
    return [CommittedRange(s, 1, seq * 10 + i, seq * 10 + i + 1, rows=seq + i, task=i)
            for i, s in enumerate(SHARDS[: 1 + seq % 3])]


def _fill(store, n: int, interval: int | None, overwrite_at: tuple[int, ...] = (),
          start: int = 1) -> list[CommittedRange]:
    """Append records ``start..n`` (overwrites where asked); return what must be visible."""
    log = CommitLog(store, checkpoint_interval=interval, retry_base_delay_ms=1)
    for seq in range(start, n + 1):
        kind = OVERWRITE if seq in overwrite_at else APPEND
        assert log.append(kind, _ranges(seq), job_id=f"j{seq}").record.sequence == seq
    return _expected(n, overwrite_at)


def _expected(n: int, overwrite_at: tuple[int, ...] = ()) -> list[CommittedRange]:
    last = max([s for s in overwrite_at if s <= n], default=1)
    return [replace(r, sequence=s) for s in range(last, n + 1) for r in _ranges(s)]


def _gc(store, below: int) -> None:
    """What the garbage collector does: store the released boundary (records below the
    checkpoint ``below``), then delete them, ascending."""
    store.put(released_key(below - 1), b"{}")
    for seq in range(1, below):
        store.delete(record_key(seq))


def _collect_pass(store, grace_s: float) -> list[int]:
    """One pass of a collector keeping its contract (checkpoint, then delete ascending
    below it the records older than ``grace_s``): the sequences it deleted."""
    log = CommitLog(store, checkpoint_interval=None)
    ck = log.checkpoint()
    doomed: list[int] = []
    for seq in range(log.first_stored(), ck.sequence if ck else 0):
        try:
            rec = log.read(seq)
        except FileNotFoundError:
            continue
        if rec.created_ms >= (time.time() - grace_s) * 1000:
            break
        doomed.append(seq)
    if doomed:
        store.put(released_key(doomed[-1]), b"{}")
    deleted: list[int] = []
    for seq in doomed:
        store.delete(record_key(seq))
        deleted.append(seq)
    return deleted


def _checkpoints(store) -> list[str]:
    return sorted(k.rsplit("/", 1)[-1] for k in store.list(CHECKPOINTS_DIR + "/"))


# --- the same answers with and without checkpoints ---------------------------------------

def test_visible_is_the_same_with_checkpoints_across_overwrites(any_store):
    overwrites = (3, 12)  # one before the checkpoint at 5, one after the one at 10
    for n in range(1, 14):
        _fill(any_store, n, 5, overwrites, start=n)
        assert CommitLog(any_store, checkpoint_interval=5).visible() == _expected(n, overwrites)
    assert _checkpoints(any_store) == [f"{5:020d}.json", f"{10:020d}.json"]
    ck = CommitLog(any_store).latest_checkpoint()
    assert (ck.sequence, ck.records, ck.last_overwrite) == (10, 10, 3)
    assert ck.visible == _expected(10, overwrites)
    assert json.loads(any_store.get(LAST_CHECKPOINT_KEY)) == {"sequence": 10}


def test_a_long_lived_log_sees_records_others_append(any_store):
    reader = CommitLog(any_store, checkpoint_interval=4)
    _fill(any_store, 5, 4)
    assert reader.visible() == _expected(5)
    _fill(any_store, 9, 4, (7,), start=6)
    assert reader.visible() == _expected(9, (7,))
    assert [r.sequence for r in reader.records(after=3)] == [4, 5, 6, 7, 8, 9]


def test_idempotency_and_stream_keys_survive_checkpoints(any_store):
    log = CommitLog(any_store, checkpoint_interval=3)
    first = log.append(APPEND, _ranges(1), job_id="nightly", txn=Txn("app", 1))
    for batch in range(5):
        log.append(APPEND, _ranges(2), txn=Txn("stream:q", batch))
    assert CommitLog(any_store).latest_checkpoint().sequence == 6
    fresh = CommitLog(any_store, checkpoint_interval=3)
    again = fresh.append(APPEND, [], txn=Txn("app", 1))
    assert not again.created and again.record.job_id == "nightly" and again.record.sequence == 1
    assert CommitLog(any_store).find_stream_batch("q", 4).sequence == 6
    assert CommitLog(any_store).find_stream_batch("q", 5) is None
    assert CommitLog(any_store).committed_txn(Txn("app", 2)) is None
    # After the records below the checkpoint are collected, the checkpoint still knows.
    _gc(any_store, 6)
    gone = CommitLog(any_store).append(APPEND, [], txn=Txn("app", 1))
    assert not gone.created and gone.record.sequence == 1 and gone.record.job_id == "nightly"
    assert gone.record.extra == {"garbage_collected": True} and first.record.extra == {}
    assert CommitLog(any_store).find_stream_batch("q", 2).sequence == 6
    assert CommitLog(any_store).append(APPEND, [], txn=Txn("app", 2)).record.sequence == 7


# --- reading cost ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["memory", "local"])
def test_reads_cost_only_the_records_since_the_checkpoint(any_store):
    _fill(any_store, 250, 100)
    forget_folds()  # cold readers: what a new process pays
    counting = CountingStore(any_store)
    assert CommitLog(counting).visible() == _expected(250)
    visible_cost = counting.reads
    counting.calls = dict.fromkeys(counting.calls, 0)
    assert CommitLog(counting).next_sequence() == 251
    next_cost = counting.reads
    counting.calls = dict.fromkeys(counting.calls, 0)
    assert CommitLog(counting).committed_txn(Txn("none", 1)) is None
    txn_cost = counting.reads
    # 50 records + the hint, the checkpoint and a probe for the next one, + the end.
    assert visible_cost <= 55, visible_cost
    # The hint, the checkpoint, SCAN_AHEAD records by GET (a fold reads them next), a gallop.
    assert next_cost <= 25, next_cost
    assert txn_cost <= 75, txn_cost
    for key in [LAST_CHECKPOINT_KEY, *(f"{CHECKPOINTS_DIR}/{n}" for n in _checkpoints(any_store))]:
        any_store.delete(key)
    forget_folds()
    counting.calls = dict.fromkeys(counting.calls, 0)
    assert CommitLog(counting).visible() == _expected(250)
    assert counting.reads > 250  # without checkpoints every record is read
    print(f"store reads: visible {visible_cost}, next_sequence {next_cost}, "
          f"committed_txn {txn_cost}; without checkpoints visible {counting.reads}")


# --- writing checkpoints -----------------------------------------------------------------

def test_two_checkpointers_racing_agree(any_store):
    _fill(any_store, 4, None)
    barrier = threading.Barrier(2, timeout=30)

    class Together(DelegatingStore):
        def put_if_absent(self, key, data):
            if "_checkpoints/" in key:
                barrier.wait()  # both folded before either writes
            super().put_if_absent(key, data)

    out: list[Checkpoint] = []
    threads = [threading.Thread(target=lambda: out.append(
        CommitLog(Together(any_store)).checkpoint())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == 2 and out[0].state() == out[1].state() and out[0].sequence == 4
    assert _checkpoints(any_store) == [f"{4:020d}.json"]


def test_a_rival_checkpoint_with_other_bytes_but_the_same_state_is_fine(any_store):
    _fill(any_store, 3, None)
    rival = CommitLog(any_store)._fold().copy()
    rival.created_ms = 1
    any_store.put_if_absent(checkpoint_key(3), rival.to_json())
    assert CommitLog(any_store).checkpoint().created_ms == 1
    rival.visible = rival.visible[1:]
    _fill(any_store, 4, None, start=4)
    rival.sequence, rival.records = 4, 4
    any_store.put_if_absent(checkpoint_key(4), rival.to_json())
    with pytest.raises(CorruptEntryError, match=f"{4:020d}.json does not match records 1..4"):
        CommitLog(any_store).checkpoint()


def test_lost_acknowledgement_of_a_checkpoint_is_ours(any_store, caplog):
    flaky = FlakyStore(any_store, fail_puts=1, land=True, match="_checkpoints/")
    log = CommitLog(flaky, checkpoint_interval=3, retry_base_delay_ms=1)
    with caplog.at_level(logging.WARNING, logger="memwal_datasource.log.commit"):
        _fill(flaky, 3, 3)
        assert log.next_sequence() == 4
    assert flaky.fail_puts == 0 and caplog.records == []
    assert CommitLog(any_store).latest_checkpoint().sequence == 3
    assert json.loads(any_store.get(LAST_CHECKPOINT_KEY)) == {"sequence": 3}


def test_a_failed_automatic_checkpoint_never_fails_the_commit(any_store, caplog):
    flaky = FlakyStore(any_store, fail_puts=100, match="_checkpoints/")
    log = CommitLog(flaky, checkpoint_interval=2, retries=1, retry_base_delay_ms=1)
    with caplog.at_level(logging.WARNING, logger="memwal_datasource.log.commit"):
        log.append(APPEND, _ranges(1))
        assert log.append(APPEND, _ranges(2)).created
    assert "record 2 is durable, but its checkpoint was not written" in caplog.text
    assert _checkpoints(any_store) == [] and CommitLog(any_store).visible() == _expected(2)


def test_checkpoint_of_an_empty_log_is_none(any_store):
    assert CommitLog(any_store).checkpoint() is None
    assert CommitLog(any_store).visible() == [] and CommitLog(any_store).next_sequence() == 1
    assert list(CommitLog(any_store).records()) == []


# --- finding the latest checkpoint -------------------------------------------------------

@pytest.mark.parametrize("hint", [None, b"{not json", b'{"sequence": 5}', b'{"sequence": 99}'])
def test_missing_garbage_or_stale_hint_still_finds_the_latest(any_store, hint, caplog):
    _fill(any_store, 11, 5)
    forget_folds()  # a cold reader: this process remembers no fold
    any_store.delete(LAST_CHECKPOINT_KEY)
    if hint is not None:
        any_store.put(LAST_CHECKPOINT_KEY, hint)
    counting = CountingStore(any_store)
    log = CommitLog(counting, checkpoint_interval=5)
    with caplog.at_level(logging.WARNING, logger="memwal_datasource.log.commit"):
        assert log.latest_checkpoint().sequence == 10
        assert log.visible() == _expected(11)
    # A stale hint is corrected by probing the next interval, the others by a LIST; a
    # fold that read records ends with one (a stray among them would be released).
    assert counting.calls["list"] == (1 if hint == b'{"sequence": 5}' else 2)
    assert ("only a hint" in caplog.text) == (hint == b"{not json")


def test_a_damaged_checkpoint_is_reported_not_skipped(any_store):
    _fill(any_store, 10, 5)
    forget_folds()  # cold readers (a warm one holds the checkpoint it wrote, undamaged)
    any_store.delete(checkpoint_key(10))
    any_store.put(checkpoint_key(10), b'{"format": 1, "sequence": 10')
    with pytest.raises(CorruptEntryError, match=f"{10:020d}.json is corrupt"):
        CommitLog(any_store).visible()
    any_store.delete(LAST_CHECKPOINT_KEY)  # found by LIST: the same error
    with pytest.raises(CorruptEntryError, match=f"{10:020d}.json is corrupt"):
        CommitLog(any_store).next_sequence()
    body = Checkpoint()
    for seq in range(1, 6):
        body.fold(CommitLog(any_store).read(seq))
    any_store.delete(checkpoint_key(10))
    any_store.put(checkpoint_key(10), body.to_json())  # a checkpoint of 1..5 named 10
    with pytest.raises(CorruptEntryError, match="folds records 1..5, but its name says 1..10"):
        CommitLog(any_store).visible()


# --- garbage collection below a checkpoint -----------------------------------------------

def test_collected_records_below_a_checkpoint(any_store):
    _fill(any_store, 12, 5, (3,))
    behind = CommitLog(any_store)
    assert [r.sequence for r in behind.records(after=6)] == list(range(7, 13))
    _gc(any_store, 10)
    fresh = CommitLog(any_store, checkpoint_interval=5)
    assert fresh.visible() == _expected(12, (3,))
    assert fresh.next_sequence() == 13
    assert [r.sequence for r in CommitLog(any_store).records(after=10)] == [11, 12]
    with pytest.raises(MemWalError, match="restart the reader .* released commit records"):
        list(CommitLog(any_store).records())
    # A log holding later records but not the collected ones notices too; what it
    # holds is still served.
    with pytest.raises(MemWalError, match="released commit records"):
        list(behind.records(after=2))
    # Records at or below the released boundary (9) are never served again, even from a
    # cache: a stray could stand in their place.
    with pytest.raises(MemWalError, match="released commit records"):
        list(behind.records(after=8))
    assert [r.sequence for r in behind.records(after=9)] == [10, 11, 12]
    assert CommitLog(any_store).append(APPEND, _ranges(13)).record.sequence == 13
    assert CommitLog(any_store).visible() == _expected(13, (3,))


def test_a_stale_writer_never_reuses_a_collected_sequence(any_store):
    stale = CommitLog(any_store, checkpoint_interval=None)
    for seq in range(1, 8):  # cached through 7, no checkpoint known
        stale.append(APPEND, _ranges(seq))
    assert stale.visible() == _expected(7)
    _fill(any_store, 12, 5, start=8)  # others commit 8..12 and checkpoint 5 and 10
    _gc(any_store, 10)
    assert stale.append(APPEND, _ranges(13)).record.sequence == 13
    assert stale.visible() == _expected(13)


def test_stale_hint_after_collection_moves_to_the_newer_checkpoint(any_store):
    _fill(any_store, 12, 5)
    assert CommitLog(any_store).checkpoint().sequence == 12  # not on the probed interval
    _gc(any_store, 12)
    any_store.put(LAST_CHECKPOINT_KEY, b'{"sequence": 10}')
    assert CommitLog(any_store, checkpoint_interval=5).visible() == _expected(12)
    assert CommitLog(any_store, checkpoint_interval=5).next_sequence() == 13
    _fill(any_store, 13, 5, start=13)
    assert CommitLog(any_store).visible() == _expected(13)


def test_append_refuses_a_sequence_below_its_checkpoint(any_store):
    _fill(any_store, 6, 5)
    log = CommitLog(any_store)
    assert log.latest_checkpoint().sequence == 5
    log.next_sequence = lambda: 3  # what a bug or a stale view would do
    with pytest.raises(MemWalError, match="refusing to write commit record 3: checkpoint 5"):
        log.append(APPEND, _ranges(3))
    assert [r.sequence for r in CommitLog(any_store).records()] == list(range(1, 7))


def test_a_failed_hint_update_is_only_logged(any_store, caplog):
    class NoPut(DelegatingStore):
        def put(self, key, data):
            raise TransientStoreError(f"injected failure writing {key}")

    _fill(any_store, 3, None)
    with caplog.at_level(logging.WARNING, logger="memwal_datasource.log.commit"):
        assert CommitLog(NoPut(any_store)).checkpoint().sequence == 3
    assert "could not update" in caplog.text and not any_store.exists(LAST_CHECKPOINT_KEY)
    counting = CountingStore(any_store)
    assert CommitLog(counting).latest_checkpoint().sequence == 3 and counting.calls["list"] == 1


# --- the rules maintenance and Lance's readers rely on --------------------------------

def test_a_committer_stalled_past_a_collection_commits_again_not_lost(any_store,
                                                                      monkeypatch):
    """X picks sequence 7 and stalls; 7..12 land, checkpoint 10, gc deletes 1..9; X's
    put at 7 succeeds into a freed number nobody reads: it is removed and X commits again
    at 13 (an exact verdict, no job re-run needed)."""
    from memwal_datasource import hooks

    _fill(any_store, 6, 5)
    stalled = CommitLog(any_store, checkpoint_interval=5)
    stall_record_puts(monkeypatch, any_store)  # as long as a collection needs

    def others_commit_and_collect(sequence):
        hooks.clear()
        _fill(any_store, 12, 5, start=7)
        _gc(any_store, 10)

    hooks.register("commit.before", others_commit_and_collect)
    try:
        res = stalled.append(APPEND, [CommittedRange("x", 1, 1, 1, rows=1)], job_id="x")
    finally:
        hooks.clear()
    assert res.created and res.record.sequence == 13
    assert CommitLog(any_store).read(7).job_id != "x" if any_store.exists(record_key(7)) else True
    visible = CommitLog(any_store).visible()
    assert [r for r in visible if r.shard_id == "x"] == [
        CommittedRange("x", 1, 1, 1, rows=1, sequence=13)]
    assert [r for r in visible if r.shard_id != "x"] == _expected(12)


def test_a_vanished_key_is_never_created_again(any_store):
    """A collision whose object is deleted before the read-back is unknowable, not redone."""
    from memwal_datasource.errors import OutcomeUnknown
    from memwal_datasource.store import put_resolved

    class Vanishing(DelegatingStore):
        def get(self, key):
            self.inner.delete(key)
            raise FileNotFoundError(key)

    any_store.put_if_absent("k", b"theirs")
    with pytest.raises(OutcomeUnknown, match="was deleted before it could be read back"):
        put_resolved(Vanishing(any_store), "k", b"ours", retries=2, base_delay_ms=1, what="k")
    assert not any_store.exists("k")


def test_a_shards_epochs_commit_in_order_and_older_attempts_are_dead(any_store):
    from memwal_datasource.errors import CommitRefused

    log = CommitLog(any_store)
    log.append(APPEND, [CommittedRange("s", 6, 3, 4, rows=2)])  # Q: epoch 6 commits first
    assert log.superseded("s", 5) and not log.superseded("s", 6)
    with pytest.raises(CommitRefused, match="^run the job again: shard s already has a commit "
                                            "of a newer writer \\(epoch 6\\)"):
        log.append(APPEND, [CommittedRange("s", 5, 1, 2, rows=2)])  # P: epoch 5, later
    log.append(APPEND, [CommittedRange("s", 6, 5, 5, rows=1)])  # the same writer again: fine
    # An unordered pool (no primary key) accepts it and proves nothing dead.
    log.append(APPEND, [CommittedRange("p", 9, 4, 4)], ordered_epochs=False)
    log.append(APPEND, [CommittedRange("p", 8, 1, 2)], ordered_epochs=False)
    assert not CommitLog(any_store).superseded("p", 1)
    assert CommitLog(any_store).superseded("s", 5)  # a fresh reader agrees


def test_append_at_an_exact_sequence_is_refused_when_taken(any_store):
    from memwal_datasource.log.commit import SequenceTaken

    _fill(any_store, 3, None)
    log = CommitLog(any_store)
    with pytest.raises(SequenceTaken):
        log.append(APPEND, [], at_sequence=3)
    assert log.append(APPEND, [], at_sequence=4).record.sequence == 4


def test_a_look_made_ahead_is_refused_for_a_commit_it_cannot_serve(tmp_path):
    log = CommitLog(open_store(str(tmp_path / "t.lance")))
    look = log.look()
    with pytest.raises(ValueError, match="pass look= only to a grouped append"):
        log.append(APPEND, [], job_id="j", group=False, look=look)
    assert log.append(APPEND, [], job_id="j", look=look).record.sequence == look.sequence
