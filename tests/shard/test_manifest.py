"""Manifest store: latest, claim_epoch, check_fenced, commit_update."""

from __future__ import annotations

import json
import threading

import pytest

from memwal_datasource.errors import CorruptEntryError, Fenced, ShardSealedError
from memwal_datasource.format.manifest_format import SHARD_ACTIVE, SHARD_SEALED
from memwal_datasource.format.memwal import manifest_key, version_hint_key
from memwal_datasource.shard.manifest import ManifestStore, list_shards
from tests.helpers import DelegatingStore, new_shard


class ClaimBefore(DelegatingStore):
    """An object store (reads may go at once) where a rival claims ``shard`` once, just
    before the GET of ``get_key`` or the existence probe of ``exists_key``."""

    remote = True

    def __init__(self, inner, shard: str, get_key: str | None, exists_key: str | None):
        super().__init__(inner)
        self.rival = ManifestStore(inner, shard)
        self.get_key, self.exists_key = get_key, exists_key
        self.landed = threading.Event()

    def _claim_once(self) -> None:
        if not self.landed.is_set():
            self.landed.set()
            self.rival.claim_epoch()

    def get(self, key):
        if key == self.get_key:
            self._claim_once()
        return self.inner.get(key)

    def exists(self, key):
        if key == self.exists_key:
            self._claim_once()
        return self.inner.exists(key)


def test_claim_creates_then_increments(any_store):
    ms = ManifestStore(any_store, new_shard())
    assert ms.latest() is None
    first = ms.claim_epoch()
    assert (first.version, first.writer_epoch, first.status) == (1, 1, SHARD_ACTIVE)
    second = ms.claim_epoch()
    assert (second.version, second.writer_epoch) == (2, 2)
    assert ms.latest().writer_epoch == 2
    assert json.loads(any_store.get(version_hint_key(ms.shard_id))) == {"version": 2}
    assert list_shards(any_store) == [ms.shard_id]


def test_latest_probes_past_stale_hint_and_survives_bad_hint(any_store):
    ms = ManifestStore(any_store, new_shard())
    for _ in range(5):
        ms.claim_epoch()
    any_store.put(version_hint_key(ms.shard_id), b'{"version": 2}')
    assert ms.latest().version == 5
    any_store.put(version_hint_key(ms.shard_id), b"not json")
    assert ms.latest().version == 5
    any_store.delete(version_hint_key(ms.shard_id))
    assert ms.latest().version == 5


def test_sealed_shard_refuses_claims(any_store):
    ms = ManifestStore(any_store, new_shard())
    m = ms.claim_epoch()

    def seal(new):
        new.status = SHARD_SEALED

    ms.commit_update(m.writer_epoch, seal)
    with pytest.raises(ShardSealedError, match=ms.shard_id):
        ms.claim_epoch()
    assert ms.latest().version == 2  # nothing written by the refused claim


def test_check_fenced_and_commit_update_refuse_old_epoch(any_store):
    ms = ManifestStore(any_store, new_shard())
    old = ms.claim_epoch()
    ms.claim_epoch()
    with pytest.raises(Fenced) as info:
        ms.check_fenced(old.writer_epoch)
    assert info.value.stored_epoch == 2 and info.value.local_epoch == 1

    def bump(new):
        new.wal_entry_position_last_seen = 99

    with pytest.raises(Fenced):
        ms.commit_update(old.writer_epoch, bump)
    assert ms.latest().version == 2
    assert ms.latest().wal_entry_position_last_seen == 0


@pytest.mark.parametrize("during", ["hint", "probe"])
def test_fence_check_sees_a_claim_landing_between_its_two_reads(any_store, during):
    """On an object store the fence check reads the hint and probes the next version at
    once, in no fixed order. A claim that lands after one read began but before the
    other does is seen through the other: the hint names the new version, or the probe
    finds it (the hint may still be old, or already read)."""
    shard = new_shard()
    ms = ManifestStore(any_store, shard)
    mine = ms.claim_epoch()
    # Lands before the hint is read (the probe may be done), or just before the probe.
    store = ClaimBefore(any_store, shard, version_hint_key(shard) if during == "hint" else None,
                        manifest_key(shard, mine.version + 1) if during == "probe" else None)
    watched = ManifestStore(store, shard)
    watched._known = mine
    with pytest.raises(Fenced):
        watched.check_fenced(mine.writer_epoch)
    assert store.landed.is_set()


def test_commit_update_gap_free_and_keeps_epoch(any_store):
    ms = ManifestStore(any_store, new_shard())
    m = ms.claim_epoch()

    def bump(new):
        new.wal_entry_position_last_seen += 1

    for _ in range(3):
        ms.commit_update(m.writer_epoch, bump)
    latest = ms.latest()
    assert (latest.version, latest.writer_epoch, latest.wal_entry_position_last_seen) == (4, 1, 3)
    assert all(any_store.exists(manifest_key(ms.shard_id, v)) for v in range(1, 5))


def test_corrupt_manifest_names_shard_and_version(any_store):
    ms = ManifestStore(any_store, new_shard())
    ms.claim_epoch()
    any_store.put_if_absent(manifest_key(ms.shard_id, 2), b"\xff\xfe garbage")
    with pytest.raises(CorruptEntryError) as info:
        ms.latest()
    assert ms.shard_id in str(info.value) and "version 2" in str(info.value)
    assert ms.load(1).writer_epoch == 1  # the older version is untouched


def test_thread_race_one_winner_per_epoch(any_store):
    shard = new_shard()
    ManifestStore(any_store, shard).claim_epoch()
    n = 8
    barrier = threading.Barrier(n)
    won: list[int] = []
    lost: list[int] = []

    def claim():
        ms = ManifestStore(any_store, shard)
        barrier.wait()
        try:
            won.append(ms.claim_epoch().writer_epoch)
        except Fenced as exc:
            lost.append(exc.local_epoch)

    threads = [threading.Thread(target=claim) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) + len(lost) == n
    assert len(won) == len(set(won)) >= 1  # no epoch was won twice
    latest = ManifestStore(any_store, shard).latest()
    assert latest.writer_epoch == max(won)
    assert latest.version == 1 + len(won)  # each win is exactly one version


def test_initialize_records_identity_and_claims_copy_it(any_store):
    ms = ManifestStore(any_store, new_shard())
    first = ms.initialize(1, [("bucket", b"\x03\x00\x00\x00")])
    assert (first.version, first.writer_epoch) == (1, 0)  # as Lance's initialize_shard
    claimed = ms.claim_epoch()
    assert (claimed.version, claimed.writer_epoch) == (2, 1)
    assert (claimed.shard_spec_id, claimed.shard_field_entries) == (
        1, [("bucket", b"\x03\x00\x00\x00")])
    # An existing shard is never rewritten: the latest version comes back to be checked.
    again = ms.initialize(1, [("bucket", b"\x05\x00\x00\x00")])
    assert (again.version, again.shard_field_entries) == (2, [("bucket", b"\x03\x00\x00\x00")])


def test_a_cold_latest_reads_the_hinted_version_beside_the_probe(proxied_location):
    """On an object store a reader knowing no version reads the hint, then the hinted
    version at once with the probe past it: two round trips, not four."""
    from memwal_datasource.store import open_store

    proxy, (uri, opts) = proxied_location
    store = open_store(uri, opts)
    shard = new_shard()
    for _ in range(3):
        ManifestStore(store, shard).claim_epoch()
    proxy.add_rule(fault="delay", delay_s=0.1)  # two reads sent together overlap
    proxy.clear_records()
    latest = ManifestStore(store, shard).latest()
    assert (latest.version, latest.writer_epoch) == (3, 3)
    assert sorted(r.method for r in proxy.records()) == ["GET", "GET", "HEAD"]
    # At most (a loaded machine can make the proxy see two round trips as one).
    assert proxy.round_trips() <= 2


@pytest.mark.parametrize("during", ["load", "probe"])
def test_a_cold_latest_sees_a_claim_landing_during_its_reads(any_store, during):
    """Two actors: a claim lands while a reader that knows no version reads the hinted
    version beside the probe past it. Landing before the probe, it is found (the probe
    decides); landing only before the read of the hinted version, either version may
    be answered, each the latest at a moment of the call, and never a damaged one."""
    shard = new_shard()
    for _ in range(2):
        ManifestStore(any_store, shard).claim_epoch()
    store = ClaimBefore(any_store, shard, manifest_key(shard, 2) if during == "load" else None,
                        manifest_key(shard, 3) if during == "probe" else None)
    got = ManifestStore(store, shard).latest()
    assert store.landed.is_set()
    if during == "probe":
        assert (got.version, got.writer_epoch) == (3, 3)
    else:
        assert (got.version, got.writer_epoch) in ((2, 2), (3, 3))


def test_a_cold_latest_past_a_damaged_or_collected_hinted_version(any_store):
    """The hinted version is read beside the probe: damage there is no error when a newer
    version exists, and a collected one sends the reader to the listing."""
    ms = ManifestStore(any_store, new_shard())
    for _ in range(3):
        ms.claim_epoch()
    any_store.put(version_hint_key(ms.shard_id), b'{"version": 2}')
    any_store.put(manifest_key(ms.shard_id, 2), b"\xff\xfe garbage")
    assert ManifestStore(any_store, ms.shard_id).latest().version == 3
    any_store.put(version_hint_key(ms.shard_id), b'{"version": 1}')
    any_store.delete(manifest_key(ms.shard_id, 1))
    assert ManifestStore(any_store, ms.shard_id).latest().version == 3
    any_store.put(version_hint_key(ms.shard_id), b'{"version": 3}')
    any_store.put(manifest_key(ms.shard_id, 3), b"\xff\xfe garbage")
    with pytest.raises(CorruptEntryError, match="version 3"):
        ManifestStore(any_store, ms.shard_id).latest()  # the latest itself is damaged
