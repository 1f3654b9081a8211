"""Shard manifests: find the latest version, claim an epoch, fence, update.

Every version is a new immutable object written put-if-absent at
``version + 1``, so versions are gap-free and two racing writers cannot both
win a version. ``version_hint.json`` is written best-effort after each win and
only ever used as a place to start probing.
"""

from __future__ import annotations

import copy
import logging
import os
import uuid
from collections.abc import Callable
from typing import TypeVar

from .. import hooks
from ..errors import CorruptEntryError, Fenced, ShardSealedError, StoreError
from ..format.manifest_format import (
    ShardManifest,
    decode_manifest,
    decode_version_hint,
    encode_manifest,
    encode_version_hint,
)
from ..format.memwal import MEM_WAL_DIR, manifest_key, parse_bit_reversed_name, version_hint_key
from ..store import ObjectStore, beside, put_resolved, read_both

log = logging.getLogger(__name__)
T = TypeVar("T")

# A claim or update loses a race only when another process wrote the same
# version; this bounds a pathological livelock, not ordinary contention.
_MAX_RACE_RETRIES = 1000


class ManifestStore:
    """The manifest chain of one shard.

    Every conditional write here goes through :func:`put_resolved`: it is sent
    once per attempt, and a collision is read back, so a claim whose response
    was lost is recognised as ours instead of as a rival's.
    """

    def __init__(self, store: ObjectStore, shard_id: str, *, retries: int = 3,
                 retry_base_delay_ms: int = 50):
        self.store = store
        self.shard_id = str(uuid.UUID(shard_id))
        self.retries = retries
        self.retry_base_delay_ms = retry_base_delay_ms
        # The newest version this object wrote or read. A writer re-checks its fence
        # with the hint and one probe past it instead of reading it again (latest_version).
        self._known: ShardManifest | None = None

    def _where(self, version: int) -> str:
        where = self.store.describe(manifest_key(self.shard_id, version))
        return f"shard {self.shard_id} manifest version {version} ({where})"

    def _exists(self, version: int) -> bool:
        return self.store.exists(manifest_key(self.shard_id, version))

    def _listed_max(self) -> int:
        best = 0
        for key in self.store.list(f"{MEM_WAL_DIR}/{self.shard_id}/manifest/"):
            if key.endswith(".binpb"):
                try:
                    best = max(best, parse_bit_reversed_name(key))
                except ValueError:
                    continue
        return best

    def _hint(self) -> int | None:
        key = version_hint_key(self.shard_id)
        try:
            data = self.store.get(key)
        except FileNotFoundError:
            return None
        hint = decode_version_hint(data)
        if hint is None:
            log.warning("ignoring unusable version hint %s (%d bytes): it is only a hint",
                        self.store.describe(key), len(data))
        return hint

    def _hint_and_next(self) -> tuple[int | None, bool | None]:
        """The hint, and whether the version after the one we know exists (``None``: not
        probed). On an object store the two reads go at once (:func:`read_both`), so
        the verdict is as of the probe, which starts after what the check guards; the
        hint only adds evidence (a freed next version). Elsewhere the probe is skipped
        when the hint already shows a newer version."""
        known = self._known
        if known is None:
            return self._hint(), None
        if self.store.remote:
            return read_both(self.store, self._hint, lambda: self._exists(known.version + 1))
        hint = self._hint()
        if hint is not None and hint > known.version:
            return hint, None  # moved on already: no probe needed
        return hint, self._exists(known.version + 1)

    def latest_version(self) -> int:
        """The last existing version (0 if the shard has no manifest)."""
        known = self._known
        hint, next_exists = self._hint_and_next()
        # The version we know is still the latest: no hint above it and no next version.
        # (A version is freed only by a collector that claimed ten versions past it and
        # wrote the hint, so a missing next version cannot be a freed one.)
        if known is not None and (hint is None or hint <= known.version) and not next_exists:
            return known.version
        if hint is not None and self._exists(hint):
            version = hint
        else:
            # No usable hint: one listing beats probing a long chain from 1.
            version = self._listed_max()
        while self._exists(version + 1):
            version += 1
        return version

    def load(self, version: int) -> ShardManifest:
        """Read, decode and validate one version; damage raises naming the file."""
        data = self.store.get(manifest_key(self.shard_id, version))
        where = self._where(version)
        m = decode_manifest(data, where)
        if m.version != version:
            raise CorruptEntryError(
                f"{where} is damaged ({len(data)} bytes): its body records version "
                f"{m.version}; refusing to trust its writer epoch")
        if m.shard_id != self.shard_id:
            raise CorruptEntryError(
                f"{where} is damaged ({len(data)} bytes): its body names shard "
                f"'{m.shard_id or '(none)'}'")
        if self._known is None or m.version >= self._known.version:
            self._known = m
        return m

    def _hinted_latest(self) -> ShardManifest | None:
        """On an object store, knowing no version yet: the hinted version read at once
        with the probe past it (one round trip after the hint's, not three). ``None``
        when the hint is missing, stale (a newer version exists) or names a collected
        version: then the full look decides. A version is immutable, so reading it
        beside the probe is the same as reading it after; the probe decides."""
        hint = self._hint()
        if hint is None:
            return None

        def load() -> ShardManifest | Exception:
            try:
                return self.load(hint)
            except (FileNotFoundError, CorruptEntryError) as exc:
                return exc  # only an error if the hinted version is the latest

        got, newer = read_both(self.store, load, lambda: self._exists(hint + 1))
        if newer or isinstance(got, FileNotFoundError):
            return None
        if isinstance(got, Exception):
            raise got
        return got

    def latest(self) -> ShardManifest | None:
        """The latest manifest, or ``None`` if the shard does not exist yet."""
        if self._known is None and self.store.remote:
            hinted = self._hinted_latest()
            if hinted is not None:
                return hinted
        version = self.latest_version()
        known = self._known
        if known is not None and known.version == version:
            return known  # immutable once written (callers copy before changing it)
        return self.load(version) if version else None

    def _write(self, m: ShardManifest, then: Callable[[ShardManifest], T] | None = None
               ) -> tuple[bool, T | None]:
        """Put version ``m.version``: (``True`` if it is ours, ``False`` if a rival's, and
        what ``then(m)`` returned). When ours, the version hint's PUT follows, and
        ``then(m)`` runs beside it (at once on an object store): ``then`` must not read
        the hint. Both are done when this returns."""
        ours = put_resolved(self.store, manifest_key(self.shard_id, m.version),
                            encode_manifest(m), retries=self.retries,
                            base_delay_ms=self.retry_base_delay_ms, what=self._where(m.version))
        if not ours:
            return False, None
        self._known = m
        if then is None:
            self._put_hint(m.version)
            return True, None
        hint = beside(self.store, lambda: self._put_hint(m.version))
        try:
            return True, then(m)  # in this thread: hooks and stalls see the caller
        finally:
            hint.result()  # never raises: a hint that failed was logged

    def _put_hint(self, version: int) -> None:
        try:
            self.store.put(version_hint_key(self.shard_id), encode_version_hint(version))
        except (StoreError, OSError) as exc:  # only a hint; readers probe past it
            log.warning("shard %s: could not update version_hint.json: %s", self.shard_id, exc)

    def initialize(self, shard_spec_id: int,
                   field_entries: list[tuple[str, bytes]]) -> ShardManifest:
        """Create the shard's version 1 recording its sharding identity; return the latest.

        As Lance's ``initialize_shard``: version 1 holds ``shard_spec_id`` and
        ``shard_field_entries`` at writer epoch 0, and the first claim (ours or
        pylance's) copies them into version 2 with epoch 1. If the shard already
        has a manifest (or a racing creator wins version 1), nothing is written
        and the latest version is returned for the caller to check.
        """
        latest = self.latest()
        if latest is not None:
            return latest
        first = ShardManifest(shard_id=self.shard_id, version=1, writer_epoch=0,
                              shard_spec_id=shard_spec_id, shard_field_entries=list(field_entries))
        if self._write(first)[0]:
            return first
        latest = self.latest()  # a racing creator (or claimer) won version 1
        assert latest is not None
        return latest

    def claim_epoch(self, create: bool = True) -> ShardManifest:
        """Claim the shard with ``writer_epoch + 1`` and return the new manifest.

        Refuses a SEALED shard and a damaged latest manifest (a claim never
        lowers an epoch). On a lost race it reloads and retries only while the
        stored epoch is still below the one it is claiming; if a concurrent
        claim took that epoch (or higher) it raises :class:`Fenced`.
        """
        return self.claim_then(lambda m: None, create)[0]

    def claim_then(self, then: Callable[[ShardManifest], T], create: bool = True
                   ) -> tuple[ShardManifest, T]:
        """:meth:`claim_epoch`, then ``then(new manifest)`` beside the version hint's PUT
        (an opener finding the WAL tip: one round trip less on an object store).
        ``then`` must not read the hint; both are done when this returns."""
        current = self.latest()
        if current is None and not create:
            raise StoreError(f"shard {self.shard_id} has no manifest in {self.store.uri}")
        target = (current.writer_epoch if current else 0) + 1
        for _ in range(_MAX_RACE_RETRIES):
            if current is not None and current.sealed:
                raise ShardSealedError(
                    f"shard {self.shard_id} is SEALED (manifest version {current.version}): "
                    "a drop is in flight and new writers are refused"
                )
            if current is not None and current.writer_epoch >= target:
                raise Fenced(self.shard_id, target, current.writer_epoch,
                             "a concurrent claim won this epoch")
            new = copy.deepcopy(current) if current else ShardManifest(shard_id=self.shard_id)
            new.version = (current.version if current else 0) + 1
            new.writer_epoch = target
            new.claim_nonce = os.urandom(16)

            def claimed(m: ShardManifest) -> T:
                hooks.point("claim.written", shard=self.shard_id, epoch=target,
                            version=m.version)
                return then(m)

            ours, out = self._write(new, claimed)
            if ours:
                return new, out
            current = self.latest()
        raise StoreError(f"shard {self.shard_id}: gave up claiming after {_MAX_RACE_RETRIES} races")

    def check_fenced(self, epoch: int) -> ShardManifest:
        """Return the latest manifest, or raise :class:`Fenced` if a newer epoch holds it."""
        m = self.latest()
        if m is None:
            raise StoreError(f"shard {self.shard_id} has no manifest in {self.store.uri}")
        if m.writer_epoch > epoch:
            raise Fenced(self.shard_id, epoch, m.writer_epoch)
        return m

    def commit_update(self, epoch: int, mutate: Callable[[ShardManifest], None]) -> ShardManifest:
        """Write the next version with ``mutate`` applied, checking the epoch first.

        Each attempt reloads the latest version and verifies ``epoch`` is still
        current before writing, so a fenced writer never updates the manifest.
        """
        for _ in range(_MAX_RACE_RETRIES):
            current = self.check_fenced(epoch)
            new = copy.deepcopy(current)
            new.version = current.version + 1
            new.claim_nonce = b""
            mutate(new)
            new.writer_epoch = current.writer_epoch
            if self._write(new)[0]:
                return new
        raise StoreError(f"shard {self.shard_id}: gave up updating after {_MAX_RACE_RETRIES} races")


def list_shards(store: ObjectStore) -> list[str]:
    """Shard ids found under ``_mem_wal/`` (directories named as UUIDs)."""
    shards = []
    for name in store.list_dirs(MEM_WAL_DIR):
        try:
            shards.append(str(uuid.UUID(name)))
        except ValueError:
            continue
    return shards
