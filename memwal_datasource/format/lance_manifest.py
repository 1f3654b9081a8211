"""Read the MemWAL index's ``compacted_sstables`` from a Lance table version.

pylance 14 records compaction progress (``merge_insert(...).mark_sstables_as_compacted``)
in the ``__lance_mem_wal`` system index of the table manifest, but exposes no
Python API to read it back (``mem_wal_index_details()`` omits it). We read it
from the manifest file itself, read-only, through our object store:

* ``_versions/{u64::MAX - v}.manifest`` (V2 names; ``{v}.manifest`` before),
  ending ``<i64 manifest position><u16><u16>"LANC"``;
* the manifest (u32-length-prefixed protobuf) holds field 6, the file offset
  of the index section (u32-length-prefixed, field 1: ``IndexMetadata``);
* the index named (field 3) ``__lance_mem_wal`` carries ``index_details``
  (field 6, a protobuf ``Any``: 1 type url, 2 value); in
  ``MemWalIndexDetails`` field 9 is ``repeated CompactedSsTable {UUID shard
  = 1 (bytes 16 in field 1); uint64 generation = 2}``.
"""

from __future__ import annotations

import struct
import uuid

from ..errors import CorruptEntryError
from ..store import ObjectStore
from .protowire import fields as _fields

MEM_WAL_INDEX = "__lance_mem_wal"
_U64_MAX = (1 << 64) - 1


def manifest_keys(version: int) -> tuple[str, str]:
    """Keys of a version's manifest: V2 naming first, then the legacy one."""
    return f"_versions/{_U64_MAX - version:020d}.manifest", f"_versions/{version}.manifest"


def _manifest_file(store: ObjectStore, version: int) -> tuple[bytes, str]:
    for key in manifest_keys(version):
        try:
            return store.get(key), key
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"no manifest for version {version} under {store.uri}/_versions/")


def compacted_generations(store: ObjectStore, version: int) -> dict[str, int]:
    """``{shard id: compacted generation}`` recorded in table ``version``'s MemWAL index."""
    data, key = _manifest_file(store, version)
    where = store.describe(key)
    try:
        if data[-4:] != b"LANC":
            raise ValueError("no LANC footer")
        pos = struct.unpack("<q", data[-16:-8])[0]
        length = struct.unpack("<I", data[pos:pos + 4])[0]
        manifest = data[pos + 4:pos + 4 + length]
        index_pos = dict(_fields(manifest)).get(6)
        if index_pos is None:
            return {}
        length = struct.unpack("<I", data[index_pos:index_pos + 4])[0]
        for number, meta in _fields(data[index_pos + 4:index_pos + 4 + length]):
            if number != 1:
                continue
            fields = list(_fields(meta))
            name = next((v.decode() for f, v in fields if f == 3), "")
            if name != MEM_WAL_INDEX:
                continue
            details = dict(_fields(next(v for f, v in fields if f == 6)))
            out: dict[str, int] = {}
            for f, value in _fields(details.get(2, b"")):
                if f == 9:
                    item = dict(_fields(value))
                    shard = str(uuid.UUID(bytes=dict(_fields(item[1]))[1]))
                    out[shard] = int(item.get(2, 0))
            return out
        return {}
    except (ValueError, KeyError, IndexError, struct.error, StopIteration) as exc:
        raise CorruptEntryError(
            f"cannot read the MemWAL index of Lance manifest {where}: {exc}") from None
