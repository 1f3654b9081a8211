"""The protobuf wire format, read and written by hand where the generated classes cannot.

Two places need the raw fields rather than ``google.protobuf`` messages: our claim
nonce, a field outside Lance's numbers on the shard manifest
(:mod:`memwal_datasource.format.manifest_format`), and the MemWAL index inside a Lance table
manifest, for which pylance ships no message class
(:mod:`memwal_datasource.format.lance_manifest`). Malformed input raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterator


def read_varint(data: bytes, i: int) -> tuple[int, int]:
    """The varint at ``data[i:]`` and the position after it."""
    shift = value = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        shift += 7
        if not byte & 0x80:
            return value, i


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a varint."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def spans(data: bytes) -> Iterator[tuple[int, int, int | bytes, int, int]]:
    """Each top-level field: ``(number, wire type, value, start, end)``, where
    ``data[start:end]`` is the whole field (tag included). Values are ints for
    varints, bytes otherwise."""
    i = 0
    while i < len(data):
        start = i
        tag, i = read_varint(data, i)
        wire = tag & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            length, i = read_varint(data, i)
            value, i = data[i:i + length], i + length
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > len(data):
            raise ValueError("truncated field")
        yield tag >> 3, wire, value, start, i


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Each top-level field as ``(number, value)``."""
    for number, _wire, value, _start, _end in spans(data):
        yield number, value
