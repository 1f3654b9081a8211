"""The write protocol under lost acknowledgements, failing reads and damaged metadata.

Every test runs on memory, local disk and the S3 server (``backend``). Faults
are injected by a store wrapper here; ``test_s3_faults.py`` injects the same
faults at the HTTP level through a proxy.
"""

from __future__ import annotations

import copy
import logging

import pytest

from memwal_datasource import hooks
from memwal_datasource.errors import (
    CorruptEntryError,
    Fenced,
    OutcomeUnknown,
    TransientStoreError,
    WriterPoisoned,
)
from memwal_datasource.format.manifest_format import ShardManifest, encode_manifest
from memwal_datasource.format.memwal import (
    IPC_EOS,
    encode_wal_entry,
    manifest_key,
    version_hint_key,
    wal_key,
)
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, Txn
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import (
    MAX_POSITION_CONFLICTS,
    TIP_REFRESH_EVERY,
    WalAppender,
    WalTailer,
)
from memwal_datasource.store import MAX_BACKOFF_S, backoff_delay, put_resolved
from tests.helpers import (
    SCHEMA,
    FlakyStore,
    HeldOpen,
    make_batch,
    new_shard,
    wal_entries,
    wal_rows,
)


@pytest.fixture(autouse=True)
def _no_hooks():
    yield
    hooks.clear()


# --- put_resolved: the one place ambiguity is resolved ----------------------------

def test_put_resolved_knows_a_landed_put_whose_response_was_lost(any_store):
    flaky = FlakyStore(any_store, fail_puts=1, land=True, match="k/")
    assert put_resolved(flaky, "k/a", b"mine", retries=3, base_delay_ms=1, what="t") is True
    assert any_store.get("k/a") == b"mine"


def test_put_resolved_tells_a_rival_object_from_ours(any_store):
    any_store.put_if_absent("k/b", b"theirs")
    assert put_resolved(any_store, "k/b", b"mine", retries=3, base_delay_ms=1, what="t") is False
    assert any_store.get("k/b") == b"theirs"


def test_put_resolved_unknowable_when_read_back_fails(any_store):
    any_store.put_if_absent("k/c", b"x")
    flaky = FlakyStore(any_store, match="k/", fail_gets=1)
    with pytest.raises(OutcomeUnknown, match="could not be read back"):
        put_resolved(flaky, "k/c", b"mine", retries=3, base_delay_ms=1, what="t")


def test_put_resolved_gives_up_after_retries_naming_the_write(any_store):
    flaky = FlakyStore(any_store, fail_puts=10, match="k/")
    with pytest.raises(OutcomeUnknown, match="entry 7.*failed 3 time"):
        put_resolved(flaky, "k/d", b"mine", retries=2, base_delay_ms=1, what="entry 7")
    assert flaky.put_calls == 3


def test_backoff_is_capped_like_lances():
    assert all(backoff_delay(n, 50) <= MAX_BACKOFF_S for n in range(1, 200))
    assert backoff_delay(30, 50) >= MAX_BACKOFF_S / 2


# --- claims ---------------------------------------------------------------------------

def test_lost_response_to_a_claim_is_our_claim(any_store):
    shard = new_shard()
    ManifestStore(any_store, shard).claim_epoch()
    flaky = FlakyStore(any_store, fail_puts=1, land=True, match="/manifest/0")
    m = ManifestStore(flaky, shard, retry_base_delay_ms=1).claim_epoch()
    assert m.writer_epoch == 2 and flaky.fail_puts == 0
    assert ManifestStore(any_store, shard).latest().writer_epoch == 2


def test_identical_rival_claim_is_not_mistaken_for_ours(any_store):
    """A rival claiming from the same base writes the same manifest but for the nonce."""
    shard = new_shard()
    base = ManifestStore(any_store, shard).claim_epoch()

    class RivalLands(FlakyStore):
        """Our PUT of version 2 fails without landing; the rival's lands meanwhile."""

        def put_if_absent(self, key, data):
            if key == manifest_key(shard, 2) and self.fail_puts:
                self.fail_puts = 0
                rival = copy.deepcopy(base)
                rival.version, rival.writer_epoch, rival.claim_nonce = 2, 2, b"rival"
                self.inner.put_if_absent(key, encode_manifest(rival))
                raise TransientStoreError("injected: response lost, not landed")
            self.inner.put_if_absent(key, data)

    mine = ManifestStore(RivalLands(any_store, fail_puts=1), shard, retry_base_delay_ms=1)
    with pytest.raises(Fenced, match="epoch 2 is fenced by epoch 2"):
        mine.claim_epoch()
    assert ManifestStore(any_store, shard).latest().claim_nonce == b"rival"


def test_claim_nonce_is_dropped_on_rewrite(any_store):
    shard = new_shard()
    ms = ManifestStore(any_store, shard)
    m = ms.claim_epoch()
    assert m.claim_nonce and ms.latest().claim_nonce == m.claim_nonce
    updated = ms.commit_update(m.writer_epoch, lambda x: None)
    raw = any_store.get(manifest_key(shard, updated.version))
    assert m.claim_nonce not in raw and ms.latest().claim_nonce == b""


# --- damaged metadata -----------------------------------------------------------------

def _damaged_manifests(shard: str, good: bytes) -> dict[str, bytes]:
    body = ShardManifest(shard_id=new_shard(), version=3, writer_epoch=1)
    return {
        "empty": b"",
        "cut after first field": good[:18],
        "wrong version in body": encode_manifest(
            ShardManifest(shard_id=shard, version=9, writer_epoch=1)),
        "other shard in body": encode_manifest(body),
        "garbage": b"\xff\xfe\xfd not a protobuf",
    }


@pytest.mark.parametrize("damage", ["empty", "cut after first field", "wrong version in body",
                                    "other shard in body", "garbage"])
def test_damaged_latest_manifest_refuses_claims_naming_the_file(any_store, damage):
    shard = new_shard()
    ms = ManifestStore(any_store, shard)
    for _ in range(2):
        ms.claim_epoch()
    app = WalAppender.open(any_store, shard)  # epoch 3 writes at 2 (sentinel at 1)
    app.append(SCHEMA, [make_batch(0, 5)])
    good = any_store.get(manifest_key(shard, 3))
    any_store.put_if_absent(manifest_key(shard, 4), _damaged_manifests(shard, good)[damage])
    with pytest.raises(CorruptEntryError) as info:
        ms.claim_epoch()
    assert manifest_key(shard, 4) in str(info.value) and shard in str(info.value)
    # The epoch-3 writer is not silently un-fenced: nothing claimed epoch 1 again.
    assert [v for v in range(1, 6) if any_store.exists(manifest_key(shard, v))] == [1, 2, 3, 4]
    assert wal_rows(any_store, shard) == list(range(5))  # nothing written is lost


@pytest.mark.parametrize("hint", [b'{"version": Infinity}', b'{"version": 1e400}',
                                  b'{"version": 99999999999999999999999999}',
                                  b'{"version": "7"}', b"not json", b'{"version": -3}'])
def test_bad_version_hint_is_ignored_with_a_warning(any_store, hint, caplog):
    shard = new_shard()
    ms = ManifestStore(any_store, shard)
    ms.claim_epoch()
    ms.claim_epoch()
    any_store.put(version_hint_key(shard), hint)
    with caplog.at_level(logging.WARNING):
        assert ms.latest().writer_epoch == 2
        assert WalAppender.open(any_store, shard).epoch == 3
    assert "version_hint.json" in caplog.text and "only a hint" in caplog.text


@pytest.mark.parametrize("cut", ["message boundary", "missing EOS", "trailing bytes"])
def test_entry_without_end_of_stream_is_damaged_not_shorter(any_store, cut):
    shard = new_shard()
    app = WalAppender.open(any_store, shard)
    app.append(SCHEMA, [make_batch(0, 3)])
    whole = encode_wal_entry(SCHEMA, [make_batch(10, 3), make_batch(13, 3)], app.epoch)
    assert whole.endswith(IPC_EOS)
    body = {"message boundary": whole[:-8],  # a valid stream of fewer messages
            "missing EOS": whole[:-4],
            "trailing bytes": whole + b"\x00" * 8}[cut]
    any_store.put_if_absent(wal_key(shard, 2), body)
    with pytest.raises(CorruptEntryError) as info:
        WalTailer(any_store, shard).read(2)
    message = str(info.value)
    assert shard in message and "position 2" in message and wal_key(shard, 2) in message
    assert WalTailer(any_store, shard).read(1).num_rows == 3


# --- the appender ---------------------------------------------------------------------

def test_failing_read_back_poisons_the_writer(any_store):
    shard = new_shard()
    app = WalAppender.open(any_store, shard)
    any_store.put_if_absent(wal_key(shard, 1), encode_wal_entry(SCHEMA, [make_batch(9, 1)], 0))
    app.store = FlakyStore(any_store, fail_gets=1)
    with pytest.raises(WriterPoisoned, match="reopen"):
        app.append(SCHEMA, [make_batch(0, 1)])
    with pytest.raises(WriterPoisoned):  # terminal
        app.append(SCHEMA, [make_batch(0, 1)])


def _stale_run(store, shard: str, n: int) -> None:
    stale = encode_wal_entry(SCHEMA, [make_batch(0, 1)], 0)  # an older epoch's entries
    for p in range(1, n + 1):
        store.put_if_absent(wal_key(shard, p), stale)


def test_periodic_tip_refresh_skips_a_run_of_foreign_entries(any_store, monkeypatch):
    import memwal_datasource.shard.wal as wal

    shard = new_shard()
    app = WalAppender.open(any_store, shard)
    _stale_run(any_store, shard, 3 * TIP_REFRESH_EVERY)
    refreshes = []
    real = wal.find_tip

    def counting(store, shard_id, start):
        refreshes.append(start)
        return real(store, shard_id, start)

    monkeypatch.setattr(wal, "find_tip", counting)
    # One tip refresh, after 16 conflicts, jumps over the rest of the run.
    assert app.append(SCHEMA, [make_batch(0, 1)]).position == 3 * TIP_REFRESH_EVERY + 1
    assert refreshes == [TIP_REFRESH_EVERY + 1]


@pytest.mark.parametrize("backend", ["memory"])  # 1,000+ PUTs: the limit, not the store
def test_conflict_cap_poisons_the_writer(any_store, monkeypatch):
    import memwal_datasource.shard.wal as wal

    shard = new_shard()
    epoch = WalAppender.open(any_store, shard).epoch
    _stale_run(any_store, shard, MAX_POSITION_CONFLICTS + 8)
    monkeypatch.setattr(wal, "find_tip", lambda store, shard_id, start: start)
    app = WalAppender(any_store, shard, epoch, 1)
    with pytest.raises(WriterPoisoned, match="1024 consecutive WAL position conflicts"):
        app.append(SCHEMA, [make_batch(0, 1)])


def test_zombie_held_between_claim_and_tip_is_fenced_at_open(any_store):
    """Writer A claims, stalls before its tip; B claims, writes and closes; A must fail."""
    shard = new_shard()
    WalAppender.open(any_store, shard).append(SCHEMA, [make_batch(0, 1)])  # epoch 1
    with HeldOpen(any_store, shard, epoch=2) as a:
        b = WalAppender.open(any_store, shard)  # epoch 3: sentinel at 2
        for i in range(3):
            b.append(SCHEMA, [make_batch(10 + i, 1)])
    assert isinstance(a.outcome, Fenced) and a.outcome.stored_epoch == 3
    entries = wal_entries(any_store, shard)
    # A dropped its sentinel above B's entries, but no data entry of epoch 2 exists.
    assert [e for e in entries if e[1] == 2 and not e[3]] == []
    assert wal_rows(any_store, shard) == [0, 10, 11, 12]


# --- commit records -------------------------------------------------------------------

def _range(shard: str) -> list[CommittedRange]:
    return [CommittedRange(shard, 1, 1, 1, rows=5)]


def test_commit_record_whose_response_was_lost_is_written_once(any_store):
    shard = new_shard()
    flaky = FlakyStore(any_store, fail_puts=1, land=True, match="_memwal_commits/")
    res = CommitLog(flaky, retry_base_delay_ms=1).append(APPEND, _range(shard), job_id="j1")
    assert res.created and res.record.sequence == 1
    assert [r.job_id for r in CommitLog(any_store).records()] == ["j1"]


def test_idempotency_key_commits_once_and_later_versions_commit(any_store):
    log = CommitLog(any_store)
    assert log.append(APPEND, _range(new_shard()), txn=Txn("app", 1)).created
    again = CommitLog(any_store).append(APPEND, _range(new_shard()), txn=Txn("app", 1))
    assert not again.created and again.record.sequence == 1
    assert CommitLog(any_store).append(APPEND, [], txn=Txn("app", 2)).created
    older = CommitLog(any_store).append(APPEND, [], txn=Txn("app", 1))
    assert not older.created and older.record.txn_version == 2
    assert CommitLog(any_store).append(APPEND, [], txn=Txn("other", 1)).created
    assert [r.sequence for r in CommitLog(any_store).records()] == [1, 2, 3]


def test_stalled_committer_finds_the_rival_record_with_its_key(any_store):
    """A stalled driver wakes after a re-run committed the same key at its sequence."""
    import threading

    held, release = threading.Event(), threading.Event()

    def hold(sequence):
        if threading.current_thread().name == "zombie":
            held.set()
            assert release.wait(30)

    hooks.register("commit.before", hold)
    out: dict = {}
    zombie = threading.Thread(
        name="zombie",
        target=lambda: out.update(z=CommitLog(any_store).append(
            APPEND, _range(new_shard()), job_id="first", txn=Txn("app", 7))))
    zombie.start()
    assert held.wait(30)
    rerun = CommitLog(any_store).append(APPEND, _range(new_shard()), job_id="rerun",
                                        txn=Txn("app", 7))
    release.set()
    zombie.join(30)
    assert rerun.created and not out["z"].created and out["z"].record.job_id == "rerun"
    assert [r.job_id for r in CommitLog(any_store).records()] == ["rerun"]
