"""Shard manifests and version hints as stored (``manifest_format``), and the claim nonce."""

from __future__ import annotations

import uuid

import pytest

from memwal_datasource.errors import CorruptEntryError
from memwal_datasource.format._proto import ShardManifestPB
from memwal_datasource.format.manifest_format import (
    CLAIM_NONCE_FIELD,
    SHARD_SEALED,
    ShardManifest,
    SsTable,
    decode_manifest,
    decode_version_hint,
    encode_manifest,
    encode_version_hint,
)


def test_manifest_roundtrip_all_fields():
    shard = str(uuid.uuid4())
    m = ShardManifest(
        shard_id=shard, version=4, writer_epoch=9, replay_after_wal_entry_position=10,
        wal_entry_position_last_seen=12, current_generation=3,
        sstables=[SsTable(1, "0a0b0c0d_gen_1", 100, 5, None), SsTable(2, "1a0b0c0d_gen_2")],
        shard_spec_id=2, shard_field_entries=[("f", b"\x01\x00\x00\x00")], status=SHARD_SEALED,
    )
    back = decode_manifest(encode_manifest(m), "t")
    for name in ("shard_id", "version", "writer_epoch", "replay_after_wal_entry_position",
                 "wal_entry_position_last_seen", "current_generation", "sstables",
                 "shard_spec_id", "shard_field_entries", "status"):
        assert getattr(back, name) == getattr(m, name), name
    assert back.sealed
    # Optional SSTable accounting keeps presence: absent is not zero.
    assert back.sstables[1].physical_rows is None and back.sstables[0].physical_rows == 5


def test_manifest_field_numbers_match_table_proto():
    fields = {f.name: f.number for f in ShardManifestPB.DESCRIPTOR.fields}
    assert fields == {"shard_id": 11, "version": 1, "shard_spec_id": 10,
                      "shard_field_entries": 14, "writer_epoch": 2,
                      "replay_after_wal_entry_position": 3, "wal_entry_position_last_seen": 4,
                      "current_generation": 6, "sstables": 8, "status": 15}


def test_manifest_unknown_fields_tolerated_and_kept():
    shard = str(uuid.uuid4())
    raw = encode_manifest(ShardManifest(shard_id=shard, version=1, writer_epoch=1))
    raw += bytes([0xA0, 0x06, 0x2A])  # field 100, varint 42: a future field
    m = decode_manifest(raw, "t")
    assert m.writer_epoch == 1
    m.version, m.writer_epoch = 2, 2
    assert encode_manifest(m).endswith(bytes([0xA0, 0x06, 0x2A]))


def test_corrupt_manifest_names_where():
    with pytest.raises(CorruptEntryError, match="shard X version 3"):
        decode_manifest(b"\xff\xff\xff", "shard X version 3")


def test_version_hint():
    assert decode_version_hint(encode_version_hint(12)) == 12
    assert encode_version_hint(3) == b'{"version": 3}'
    assert decode_version_hint(b"{broken") is None
    assert decode_version_hint(b'{"version": 0}') is None


def test_claim_nonce_round_trips_and_stays_out_of_lances_fields():
    shard = str(uuid.uuid4())
    m = ShardManifest(shard_id=shard, version=1, writer_epoch=1, claim_nonce=b"n" * 16)
    raw = encode_manifest(m)
    pb = ShardManifestPB()
    pb.ParseFromString(raw)  # a decoder that does not know the field skips it
    assert pb.writer_epoch == 1 and pb.version == 1
    back = decode_manifest(raw, "t")
    assert back.claim_nonce == b"n" * 16 and back.writer_epoch == 1
    assert CLAIM_NONCE_FIELD not in {f.number for f in ShardManifestPB.DESCRIPTOR.fields}
    # Rewritten (a new version), the nonce is ours to set again: the old one is dropped.
    back.version, back.claim_nonce = 2, b""
    assert decode_manifest(encode_manifest(back), "t").claim_nonce == b""


def test_a_truncated_nonce_field_is_corrupt():
    shard = str(uuid.uuid4())
    raw = encode_manifest(ShardManifest(shard_id=shard, version=1, writer_epoch=1,
                                        claim_nonce=b"n" * 16))
    with pytest.raises(CorruptEntryError, match="version 1 of X"):
        decode_manifest(raw[:-3], "version 1 of X")
