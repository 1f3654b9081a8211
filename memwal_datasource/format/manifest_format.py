"""The shard manifest (``lance.table.ShardManifest``) and its version hint, as stored.

Facts from the Lance MemWAL specification (``docs/src/format/table/mem_wal.md``,
``protos/table.proto``): ``_mem_wal/{shard}/manifest/{name}.binpb`` holds one
protobuf ``ShardManifest`` per version (names:
:func:`~memwal_datasource.format.memwal.manifest_key`), and ``version_hint.json``
beside them ``{"version": N}``, only a hint. Fields this package does not know are
kept across rewrites; our claim nonce (a field outside
Lance's numbers) makes every claim's bytes unique. The WAL entries' format is in
:mod:`memwal_datasource.format.memwal`; reading and writing the chain, in
:mod:`memwal_datasource.shard.manifest`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from ..errors import CorruptEntryError
from ._proto import SHARD_ACTIVE, SHARD_SEALED, ShardManifestPB
from .protowire import spans, varint

__all__ = ["CLAIM_NONCE_FIELD", "MAX_HINT", "SHARD_ACTIVE", "SHARD_SEALED", "ShardManifest",
           "SsTable", "decode_manifest", "decode_version_hint", "encode_manifest",
           "encode_version_hint"]

# Hints above this are nonsense (or an attack): ignored, never probed.
MAX_HINT = (1 << 63) - 1


@dataclass
class SsTable:
    """A published SSTable (flushed MemTable) of a shard."""

    generation: int
    path: str
    in_memory_bytes: int | None = None
    physical_rows: int | None = None
    primary_key_bytes: int | None = None


# Ours, outside Lance's field numbers: random bytes that make every claim's
# manifest unique, so a claimer that lost its PUT's response and reads the
# version back can tell its own claim from an identical rival's. Decoders
# (pylance's prost among them) skip unknown fields; we drop it on rewrite.
CLAIM_NONCE_FIELD = 536_866_816


@dataclass
class ShardManifest:
    """A shard manifest version. ``raw`` keeps unknown fields across rewrites."""

    shard_id: str
    version: int = 0
    writer_epoch: int = 0
    replay_after_wal_entry_position: int = 0
    wal_entry_position_last_seen: int = 0
    current_generation: int = 1
    sstables: list[SsTable] = field(default_factory=list)
    shard_spec_id: int = 0
    shard_field_entries: list[tuple[str, bytes]] = field(default_factory=list)
    status: int = SHARD_ACTIVE
    raw: bytes = field(default=b"", repr=False)
    claim_nonce: bytes = field(default=b"", repr=False)

    @property
    def sealed(self) -> bool:
        """True when a drop is in flight and claims must be refused."""
        return self.status == SHARD_SEALED


def encode_manifest(m: ShardManifest) -> bytes:
    """Serialize, keeping fields this package does not know from ``m.raw``."""
    pb = ShardManifestPB()
    if m.raw:
        pb.ParseFromString(m.raw)
    pb.shard_id.uuid = uuid.UUID(m.shard_id).bytes
    pb.version = m.version
    pb.writer_epoch = m.writer_epoch
    pb.replay_after_wal_entry_position = m.replay_after_wal_entry_position
    pb.wal_entry_position_last_seen = m.wal_entry_position_last_seen
    pb.current_generation = m.current_generation
    pb.shard_spec_id = m.shard_spec_id
    pb.status = m.status
    del pb.sstables[:]
    for s in m.sstables:
        item = pb.sstables.add(generation=s.generation, path=s.path)
        for name in ("in_memory_bytes", "physical_rows", "primary_key_bytes"):
            value = getattr(s, name)
            if value is not None:
                setattr(item, name, value)
    del pb.shard_field_entries[:]
    for field_id, value in m.shard_field_entries:
        pb.shard_field_entries.add(field_id=field_id, value=value)
    out = pb.SerializeToString(deterministic=True)
    if m.claim_nonce:
        out += varint(CLAIM_NONCE_FIELD << 3 | 2) + varint(len(m.claim_nonce)) + m.claim_nonce
    return out


def _split_nonce(data: bytes) -> tuple[bytes, bytes]:
    """``(data without our claim-nonce field, the nonce)`` (top-level fields only)."""
    kept, nonce = bytearray(), b""
    for number, wire, value, start, end in spans(data):
        if number == CLAIM_NONCE_FIELD and wire == 2:
            nonce = value
        else:
            kept += data[start:end]
    return bytes(kept), nonce


def decode_manifest(data: bytes, where: str) -> ShardManifest:
    """Parse a ``ShardManifest``; unknown fields are tolerated and kept (but our nonce)."""
    pb = ShardManifestPB()
    try:
        data, nonce = _split_nonce(bytes(data))
        pb.ParseFromString(data)
        shard = str(uuid.UUID(bytes=pb.shard_id.uuid)) if pb.shard_id.uuid else ""
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and friends
        raise CorruptEntryError(f"shard manifest {where} is corrupt: {exc}") from None

    def opt(s, name: str) -> int | None:
        return getattr(s, name) if s.HasField(name) else None

    return ShardManifest(
        shard_id=shard,
        version=pb.version,
        writer_epoch=pb.writer_epoch,
        replay_after_wal_entry_position=pb.replay_after_wal_entry_position,
        wal_entry_position_last_seen=pb.wal_entry_position_last_seen,
        current_generation=pb.current_generation,
        sstables=[
            SsTable(s.generation, s.path, opt(s, "in_memory_bytes"), opt(s, "physical_rows"),
                    opt(s, "primary_key_bytes"))
            for s in pb.sstables
        ],
        shard_spec_id=pb.shard_spec_id,
        shard_field_entries=[(e.field_id, e.value) for e in pb.shard_field_entries],
        status=pb.status,
        raw=data,
        claim_nonce=nonce,
    )


def encode_version_hint(version: int) -> bytes:
    """``{"version": N}`` as written beside the manifests."""
    return json.dumps({"version": int(version)}).encode()


def decode_version_hint(data: bytes) -> int | None:
    """The hinted version, or ``None`` if the hint is unusable (it is only a hint).

    Only an integer in ``[1, 2^63)`` is a hint; ``Infinity``, floats, strings
    and huge numbers are ignored rather than probed.
    """
    try:
        value = json.loads(data)["version"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HINT:
        return None
    return value
