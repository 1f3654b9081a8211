"""The Lance MemWAL on-storage format: names and keys, WAL entries.

Facts from the Lance MemWAL specification (``docs/src/format/table/mem_wal.md``):

* Layout: ``_mem_wal/{shard}/wal/{name}.arrow``,
  ``_mem_wal/{shard}/manifest/{name}.binpb`` and ``version_hint.json``.
* ``{name}`` is the 64-bit number's bits reversed, written as 64 ``0``/``1``
  characters, so sequential numbers spread over object-store partitions.
  WAL positions and manifest versions both start at 1.
* A WAL entry is one Arrow IPC stream (its buffers may be LZ4- or
  ZSTD-compressed, as the IPC format allows: pylance replays those too); its
  schema metadata carries
  ``writer_epoch`` (decimal), ``generation`` (MemTable mode only) and
  ``fence_sentinel`` on the data-less entry a new writer drops at the tip.
* The shard manifest is the ``lance.table.ShardManifest`` protobuf
  (:mod:`memwal_datasource.format.manifest_format`).

WAL entries are written as pylance's writer writes them: every field carries
its Lance field id (``lance:field_id`` field metadata, children of structs and
lists too) and the entry ends with the non-nullable ``_tombstone`` column.
Upstream Lance matches an entry's columns to the table's by field id (by name
only when an entry carries none), so a column renamed through Lance
(``alter_columns``) still replays. Entries written before that, without ids
or ``_tombstone``, stay readable: :func:`entry_columns` falls back to names
and a missing ``_tombstone`` means "not deleted".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from ..errors import CorruptEntryError

MEM_WAL_DIR = "_mem_wal"
WRITER_EPOCH_KEY = b"writer_epoch"
GENERATION_KEY = b"generation"
FENCE_SENTINEL_KEY = b"fence_sentinel"
FENCE_SENTINEL_VALUE = b"true"
FIELD_ID_KEY = b"lance:field_id"
TOMBSTONE = "_tombstone"  # the MemWAL format's delete marker column, last in every entry
TOMBSTONE_FIELD = pa.field(TOMBSTONE, pa.bool_(), nullable=False)
# Arrow IPC end-of-stream: continuation marker, then a zero metadata length.
IPC_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_MAX_U64 = (1 << 64) - 1

__all__ = [
    "WalEntry",
    "bit_reversed_name",
    "decode_wal_entry",
    "encode_wal_buffer",
    "encode_wal_entry",
    "entry_columns",
    "has_field_ids",
    "FieldId",
    "wal_entry_schema",
    "manifest_key",
    "parse_bit_reversed_name",
    "version_hint_key",
    "wal_key",
]


# --- names and keys ---------------------------------------------------------


def all_false(n: int) -> pa.Array:
    """``n`` false booleans, built from a zeroed bitmap: ``pa.repeat(False, n)`` makes
    pyarrow import pandas (it converts a Python value), which a Spark task never needs."""
    return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bytes((n + 7) // 8))])

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


# --- Lance field ids -----------------------------------------------------------

@dataclass(frozen=True)
class FieldId:
    """A Lance field id and its children's, by name (``LanceSchema.fields()``)."""

    id: int
    children: dict[str, FieldId] = field(default_factory=dict)


def field_id(f: pa.Field) -> int | None:
    """The ``lance:field_id`` an entry's field carries, or ``None`` (an old entry)."""
    raw = (f.metadata or {}).get(FIELD_ID_KEY)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def has_field_ids(batch: pa.RecordBatch | pa.Schema) -> bool:
    """True if an entry's fields carry Lance field ids (written by pylance or by us)."""
    schema = batch if isinstance(batch, pa.Schema) else batch.schema
    return any(field_id(f) is not None for f in schema)


def _stamp(f: pa.Field, ids: Mapping[str, FieldId]) -> pa.Field:
    fid = ids.get(f.name)
    if fid is None:
        return f
    t = f.type
    if pa.types.is_struct(t):
        t = pa.struct([_stamp(t.field(i), fid.children) for i in range(t.num_fields)])
    elif pa.types.is_list(t):
        t = pa.list_(_stamp(t.value_field, fid.children))
    elif pa.types.is_large_list(t):
        t = pa.large_list(_stamp(t.value_field, fid.children))
    elif pa.types.is_fixed_size_list(t):
        t = pa.list_(_stamp(t.value_field, fid.children), t.list_size)
    meta = dict(f.metadata or {})
    meta[FIELD_ID_KEY] = str(fid.id).encode()
    return pa.field(f.name, t, f.nullable, meta)


def wal_entry_schema(schema: pa.Schema, ids: Mapping[str, FieldId] | None) -> pa.Schema:
    """The schema of a data entry, as pylance's writer writes it.

    Every field of ``schema`` that the table knows gets its Lance field id
    (nested ones too), and ``_tombstone`` (non-nullable bool, no id) is
    appended unless ``schema`` has it already (delete markers). With ``ids``
    ``None`` (no Lance table to ask) fields keep no id and are matched by name.
    """
    fields = [_stamp(f, ids) if ids else f for f in schema]
    if TOMBSTONE not in schema.names:
        fields.append(TOMBSTONE_FIELD)
    return pa.schema(fields, metadata=schema.metadata)


def _relabel(col: pa.Array, want: pa.DataType) -> pa.Array:
    """``col`` as ``want`` when only nested field names differ (a rename), else cast."""
    if col.type.equals(want):
        return col
    try:
        return col.view(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
        return col.cast(want)


def entry_columns(batch: pa.RecordBatch, schema: pa.Schema,
                  ids: Mapping[str, FieldId] | None = None) -> list[pa.Array]:
    """``schema``'s columns (then ``_tombstone``) from one decoded entry batch.

    A column is found by the Lance field id ``ids`` gives its current name when
    the entry's fields carry ids (so a column renamed since the entry was written
    is found under its new name), else by name. A column the entry does not hold
    (added since) is null. ``_tombstone`` is all false when the entry has none.
    """
    by_id: dict[int, int] = {}
    for i, f in enumerate(batch.schema):
        fid = field_id(f)
        if fid is not None:
            by_id[fid] = i
    n = batch.num_rows
    cols = []
    for f in schema:
        if f.name == TOMBSTONE:
            continue
        want = ids.get(f.name) if ids else None
        i = by_id.get(want.id) if want is not None and by_id else None
        if i is None:
            j = batch.schema.get_field_index(f.name)
            # An entry with ids whose same-named field has another id holds another column.
            if j >= 0 and (want is None or field_id(batch.schema.field(j)) is None):
                i = j
        if i is None:
            if not f.nullable:
                raise CorruptEntryError(
                    f"a WAL entry has no column '{f.name}' (field id "
                    f"{want.id if want else 'unknown'}), which is not nullable")
            cols.append(pa.nulls(n, f.type))
        else:
            cols.append(_relabel(batch.column(i), f.type))
    t = batch.schema.get_field_index(TOMBSTONE)
    cols.append(batch.column(t) if t >= 0 else all_false(n))
    return cols


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


def encode_wal_buffer(
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    writer_epoch: int,
    generation: int | None = None,
    fence_sentinel: bool = False,
    compression: str | None = None,
) -> pa.Buffer:
    """Serialize batches as one Arrow IPC stream carrying the MemWAL metadata.

    Returns an Arrow buffer (bytes-like, no copy into Python bytes). Uncompressed,
    the stream is measured first with a counting sink, then written once into a
    buffer of exactly that size, so the batches' data is copied once and never
    reallocated. ``compression`` (``"lz4"`` or ``"zstd"``: Arrow IPC buffer
    compression, which every IPC reader and pylance's replay decode) compresses
    each buffer once, into a growing buffer.
    """
    metadata = dict(schema.metadata or {})
    metadata[WRITER_EPOCH_KEY] = str(int(writer_epoch)).encode()
    if generation is not None:
        metadata[GENERATION_KEY] = str(int(generation)).encode()
    if fence_sentinel:
        metadata[FENCE_SENTINEL_KEY] = FENCE_SENTINEL_VALUE
    tagged = schema.with_metadata(metadata)
    # Batches may carry their own schema metadata; the stream's wins. A batch
    # without the schema's trailing _tombstone column gets it all false (upserts).
    items = [] if fence_sentinel else [_as_entry_batch(b, tagged) for b in batches]
    if compression is not None and items:
        sink = pa.BufferOutputStream()
        _write_stream(sink, tagged, items, compression)
        return sink.getvalue()
    counter = pa.MockOutputStream()
    _write_stream(counter, tagged, items)
    out = pa.allocate_buffer(counter.size())
    _write_stream(pa.FixedSizeBufferWriter(out), tagged, items)
    return out


def _as_entry_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.equals(schema):
        return batch
    cols = batch.columns
    if (len(cols) + 1 == len(schema) and schema.names[-1] == TOMBSTONE
            and TOMBSTONE not in batch.schema.names):
        cols = [*cols, all_false(batch.num_rows)]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _write_stream(sink, schema: pa.Schema, batches: list[pa.RecordBatch],
                  compression: str | None = None) -> None:
    options = pa.ipc.IpcWriteOptions(compression=compression) if compression else None
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)


def encode_wal_entry(
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    writer_epoch: int,
    generation: int | None = None,
    fence_sentinel: bool = False,
) -> bytes:
    """:func:`encode_wal_buffer` as Python ``bytes`` (one more copy; for small entries)."""
    return encode_wal_buffer(schema, batches, writer_epoch, generation,
                             fence_sentinel).to_pybytes()


def encode_sentinel(writer_epoch: int) -> bytes:
    """The data-less fence sentinel for ``writer_epoch`` (empty schema, as Lance writes it)."""
    return encode_wal_entry(pa.schema([]), (), writer_epoch, fence_sentinel=True)


def decode_wal_entry(data: bytes | pa.Buffer, where: str) -> WalEntry:
    """Decode a WAL entry; ``where`` names shard and position for errors.

    An entry must be one complete IPC stream ending with the end-of-stream
    marker: a stream cut at a message boundary parses as valid with fewer rows,
    so without this check a damaged entry would lose rows silently.
    """
    source = pa.BufferReader(data)
    try:
        reader = pa.ipc.open_stream(source)
        schema = reader.schema
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
        raise CorruptEntryError(
            f"WAL entry {where} is truncated or corrupt ({len(data)} bytes): {exc}"
        ) from None
    tail = bytes(memoryview(data)[-len(IPC_EOS):])  # data may be any bytes-like object
    if tail != IPC_EOS or source.tell() != len(data):
        raise CorruptEntryError(
            f"WAL entry {where} is truncated or damaged ({len(data)} bytes): it does not end "
            "with the Arrow IPC end-of-stream marker right after its last message"
        )
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
