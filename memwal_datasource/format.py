"""The Lance MemWAL on-storage format: names, WAL entries, shard manifests.

Facts from the Lance MemWAL specification (``docs/src/format/table/mem_wal.md``):

* Layout: ``_mem_wal/{shard}/wal/{name}.arrow``,
  ``_mem_wal/{shard}/manifest/{name}.binpb`` and ``version_hint.json``.
* ``{name}`` is the 64-bit number's bits reversed, written as 64 ``0``/``1``
  characters, so sequential numbers spread over object-store partitions.
  WAL positions and manifest versions both start at 1.
* A WAL entry is one Arrow IPC stream; its schema metadata carries
  ``writer_epoch`` (decimal), ``generation`` (MemTable mode only) and
  ``fence_sentinel`` on the data-less entry a new writer drops at the tip.
* The shard manifest is the ``lance.table.ShardManifest`` protobuf.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from ._proto import SHARD_ACTIVE, SHARD_SEALED, ShardManifestPB
from .errors import CorruptEntryError

MEM_WAL_DIR = "_mem_wal"
WRITER_EPOCH_KEY = b"writer_epoch"
GENERATION_KEY = b"generation"
FENCE_SENTINEL_KEY = b"fence_sentinel"
FENCE_SENTINEL_VALUE = b"true"
_MAX_U64 = (1 << 64) - 1

__all__ = [
    "SHARD_ACTIVE",
    "SHARD_SEALED",
    "ShardManifest",
    "SsTable",
    "WalEntry",
    "bit_reversed_name",
    "decode_manifest",
    "decode_version_hint",
    "decode_wal_entry",
    "encode_manifest",
    "encode_version_hint",
    "encode_wal_entry",
    "manifest_key",
    "parse_bit_reversed_name",
    "version_hint_key",
    "wal_key",
]


# --- names and keys ---------------------------------------------------------

def bit_reversed_name(n: int) -> str:
    """The 64-character bit-reversed binary name of ``n`` (1-based numbers)."""
    if not 1 <= n <= _MAX_U64:
        raise ValueError(f"WAL position / manifest version must be in [1, 2^64), got {n}")
    return format(n, "064b")[::-1]


def parse_bit_reversed_name(name: str) -> int:
    """Inverse of :func:`bit_reversed_name`; accepts a trailing file suffix."""
    stem = name.rsplit("/", 1)[-1].split(".", 1)[0]
    if len(stem) != 64 or set(stem) - {"0", "1"}:
        raise ValueError(f"'{name}' is not a 64-character bit-reversed name")
    return int(stem[::-1], 2)


def shard_dir(shard_id: str) -> str:
    """The shard's directory key, relative to the table root."""
    return f"{MEM_WAL_DIR}/{shard_id}"


def wal_key(shard_id: str, position: int) -> str:
    """Key of the WAL entry at ``position`` (1-based)."""
    return f"{MEM_WAL_DIR}/{shard_id}/wal/{bit_reversed_name(position)}.arrow"


def manifest_key(shard_id: str, version: int) -> str:
    """Key of manifest ``version`` (1-based)."""
    return f"{MEM_WAL_DIR}/{shard_id}/manifest/{bit_reversed_name(version)}.binpb"


def version_hint_key(shard_id: str) -> str:
    """Key of the best-effort ``version_hint.json``."""
    return f"{MEM_WAL_DIR}/{shard_id}/manifest/version_hint.json"


# --- WAL entries ------------------------------------------------------------

@dataclass
class WalEntry:
    """One decoded WAL entry."""

    schema: pa.Schema
    batches: list[pa.RecordBatch]
    writer_epoch: int
    generation: int | None
    is_sentinel: bool
    nbytes: int

    @property
    def num_rows(self) -> int:
        """Rows across all batches (0 for a sentinel)."""
        return sum(b.num_rows for b in self.batches)


def encode_wal_entry(
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    writer_epoch: int,
    generation: int | None = None,
    fence_sentinel: bool = False,
) -> bytes:
    """Serialize batches as one Arrow IPC stream carrying the MemWAL metadata."""
    metadata = dict(schema.metadata or {})
    metadata[WRITER_EPOCH_KEY] = str(int(writer_epoch)).encode()
    if generation is not None:
        metadata[GENERATION_KEY] = str(int(generation)).encode()
    if fence_sentinel:
        metadata[FENCE_SENTINEL_KEY] = FENCE_SENTINEL_VALUE
    tagged = schema.with_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tagged) as writer:
        if not fence_sentinel:
            for batch in batches:
                # Batches may carry their own schema metadata; the stream's wins.
                writer.write_batch(batch if batch.schema.equals(tagged) else
                                   pa.RecordBatch.from_arrays(batch.columns, schema=tagged))
    return sink.getvalue().to_pybytes()


def encode_sentinel(writer_epoch: int) -> bytes:
    """The data-less fence sentinel for ``writer_epoch`` (empty schema, as Lance writes it)."""
    return encode_wal_entry(pa.schema([]), (), writer_epoch, fence_sentinel=True)


def decode_wal_entry(data: bytes, where: str) -> WalEntry:
    """Decode a WAL entry; ``where`` names shard and position for errors."""
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
        schema = reader.schema
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
        raise CorruptEntryError(
            f"WAL entry {where} is truncated or corrupt ({len(data)} bytes): {exc}"
        ) from None
    meta = schema.metadata or {}
    raw_epoch = meta.get(WRITER_EPOCH_KEY)
    try:
        epoch = int(raw_epoch) if raw_epoch is not None else None
        raw_gen = meta.get(GENERATION_KEY)
        generation = int(raw_gen) if raw_gen is not None else None
    except ValueError:
        epoch = None
        generation = None
    if epoch is None:
        raise CorruptEntryError(
            f"WAL entry {where} has no valid 'writer_epoch' in its schema metadata"
        )
    is_sentinel = FENCE_SENTINEL_KEY in meta
    return WalEntry(schema, batches, epoch, generation, is_sentinel, len(data))


# --- shard manifests ----------------------------------------------------------

@dataclass
class SsTable:
    """A published SSTable (flushed MemTable) of a shard."""

    generation: int
    path: str
    in_memory_bytes: int | None = None
    physical_rows: int | None = None
    primary_key_bytes: int | None = None


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
    return pb.SerializeToString(deterministic=True)


def decode_manifest(data: bytes, where: str) -> ShardManifest:
    """Parse a ``ShardManifest``; unknown fields are tolerated and kept."""
    pb = ShardManifestPB()
    try:
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
        raw=bytes(data),
    )


def encode_version_hint(version: int) -> bytes:
    """``{"version": N}`` as written beside the manifests."""
    return json.dumps({"version": int(version)}).encode()


def decode_version_hint(data: bytes) -> int | None:
    """The hinted version, or ``None`` if the hint is unreadable (it is only a hint)."""
    try:
        value = json.loads(data)["version"]
        return int(value) if int(value) >= 1 else None
    except (ValueError, KeyError, TypeError):
        return None

