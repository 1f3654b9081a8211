"""Decoding many WAL entries in one Arrow IPC pass.

A WAL entry is one Arrow IPC stream: a schema message (the writer's epoch in
its metadata), record-batch messages, the end-of-stream marker. A writer's
consecutive entries carry the very same schema message: it is decoded once,
and each entry's record-batch messages are read in place against it (a stream
opened per entry costs as much as a small entry's read).

Each entry is checked as :func:`~memwal_datasource.format.memwal.decode_wal_entry`
checks it: it must open with a schema message and end with the end-of-stream
marker right after its last message; a run whose bodies are not whole messages
is decoded entry by entry, so a damaged entry is reported as it always was
(:class:`~memwal_datasource.errors.CorruptEntryError`, naming it). Schema
messages are decoded once (epoch, sentinel mark); a schema with dictionary
columns (whose dictionary messages belong to one stream) is decoded entry by
entry.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from ..format.memwal import IPC_EOS, decode_wal_entry

_PREFIX = struct.Struct("<Ii")  # continuation marker, metadata length
_CONTINUATION = 0xFFFFFFFF


@dataclass(frozen=True)
class Head:
    """A decoded schema message: the entries' schema, writer epoch and sentinel mark;
    ``shared``: entries with it may be read as one stream."""

    schema: pa.Schema
    epoch: int
    sentinel: bool
    shared: bool


def _has_dictionary(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return True
    return any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


def split(data) -> tuple[bytes, memoryview] | None:
    """``(schema message, batch messages)`` of an entry, or ``None`` if it is not framed
    as one (decode it alone: :func:`decode_wal_entry` says what is wrong)."""
    view = memoryview(data)
    n = len(view)
    if n < 16 or view[n - 8:] != IPC_EOS:
        return None
    marker, length = _PREFIX.unpack_from(view, 0)
    head = 8 + length
    if marker != _CONTINUATION or length <= 0 or head % 8 or head > n - 8:
        return None
    return bytes(view[:head]), view[head:n - 8]


class Decoder:
    """Decodes entries, each schema message once; see the module doc."""

    def __init__(self) -> None:
        self.heads: dict[bytes, Head] = {}

    def head(self, head: bytes, where: str | Callable[[], str]) -> Head:
        """The schema message ``head`` decoded (cached), as an entry of no batches;
        ``where`` names the entry for errors (or makes the name)."""
        got = self.heads.get(head)
        if got is None:
            e = decode_wal_entry(head + IPC_EOS, where() if callable(where) else where)
            shared = not any(_has_dictionary(f.type) for f in e.schema)
            got = self.heads[head] = Head(e.schema, e.writer_epoch, e.is_sentinel, shared)
        return got

    def run(self, head: bytes, bodies: Sequence[memoryview],
            entries: Sequence[tuple[Callable[[], str], object]]) -> list[pa.RecordBatch]:
        """The batches of consecutive entries sharing schema message ``head`` (their batch
        messages ``bodies``), in order, read in place against the one decoded schema;
        ``entries`` are their ``(where, data)`` (``where()`` names one for errors),
        decoded one by one when a body is not whole record-batch messages (a damaged
        entry raises)."""
        schema = self.heads[head].schema
        out: list[pa.RecordBatch] = []
        try:
            for body in bodies:
                source = pa.BufferReader(pa.py_buffer(body))
                while source.tell() < len(body):
                    message = pa.ipc.read_message(source)
                    if message.type != "record batch":
                        raise ValueError(f"a {message.type} message")
                    out.append(pa.ipc.read_record_batch(message, schema))
            return out
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError):
            return [b for where, data in entries for b in decode_wal_entry(data, where()).batches]
