"""The ``lance.table.ShardManifest`` protobuf, built at import time.

We describe the messages with ``descriptor_pb2`` instead of shipping generated
code, so no ``protoc`` is needed and the field numbers sit in one readable
table. Field numbers and types follow ``protos/table.proto`` in lance-format/lance.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
SHARD_ACTIVE = 0
SHARD_SEALED = 1


def _add_fields(msg, fields) -> None:
    for name, number, ftype, label, type_name, optional in fields:
        f = msg.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name
        if optional:
            # proto3 `optional`: a synthetic one-field oneof gives presence.
            f.proto3_optional = True
            f.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{name}")


def _build() -> descriptor_pool.DescriptorPool:
    fd = descriptor_pb2.FileDescriptorProto(
        name="memwal_datasource/shard_manifest.proto", package="lance.table", syntax="proto3"
    )
    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    enum = fd.enum_type.add(name="ShardStatus")
    enum.value.add(name="ACTIVE", number=SHARD_ACTIVE)
    enum.value.add(name="SEALED", number=SHARD_SEALED)

    _add_fields(fd.message_type.add(name="UUID"), [("uuid", 1, _F.TYPE_BYTES, opt, "", False)])
    _add_fields(fd.message_type.add(name="ShardFieldEntry"), [
        ("field_id", 1, _F.TYPE_STRING, opt, "", False),
        ("value", 2, _F.TYPE_BYTES, opt, "", False),
    ])
    _add_fields(fd.message_type.add(name="SsTable"), [
        ("generation", 1, _F.TYPE_UINT64, opt, "", False),
        ("path", 2, _F.TYPE_STRING, opt, "", False),
        ("in_memory_bytes", 3, _F.TYPE_UINT64, opt, "", True),
        ("physical_rows", 4, _F.TYPE_UINT64, opt, "", True),
        ("primary_key_bytes", 5, _F.TYPE_UINT64, opt, "", True),
    ])
    _add_fields(fd.message_type.add(name="ShardManifest"), [
        ("shard_id", 11, _F.TYPE_MESSAGE, opt, ".lance.table.UUID", False),
        ("version", 1, _F.TYPE_UINT64, opt, "", False),
        ("shard_spec_id", 10, _F.TYPE_UINT32, opt, "", False),
        ("shard_field_entries", 14, _F.TYPE_MESSAGE, rep, ".lance.table.ShardFieldEntry", False),
        ("writer_epoch", 2, _F.TYPE_UINT64, opt, "", False),
        ("replay_after_wal_entry_position", 3, _F.TYPE_UINT64, opt, "", False),
        ("wal_entry_position_last_seen", 4, _F.TYPE_UINT64, opt, "", False),
        ("current_generation", 6, _F.TYPE_UINT64, opt, "", False),
        ("sstables", 8, _F.TYPE_MESSAGE, rep, ".lance.table.SsTable", False),
        ("status", 15, _F.TYPE_ENUM, opt, ".lance.table.ShardStatus", False),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return pool


_POOL = _build()
ShardManifestPB = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("lance.table.ShardManifest")
)
