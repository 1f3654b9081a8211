"""Bit-reversed names, WAL entries and shard manifests."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from memwal_datasource._proto import ShardManifestPB
from memwal_datasource.errors import CorruptEntryError
from memwal_datasource.format import (
    SHARD_SEALED,
    ShardManifest,
    SsTable,
    bit_reversed_name,
    decode_manifest,
    decode_version_hint,
    decode_wal_entry,
    encode_manifest,
    encode_sentinel,
    encode_version_hint,
    encode_wal_buffer,
    encode_wal_entry,
    manifest_key,
    parse_bit_reversed_name,
    wal_key,
)

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n)),
                            pa.array([f"r{i}" for i in range(start, start + n)])], schema=SCHEMA)


def test_bit_reversed_name_matches_spec_example():
    assert bit_reversed_name(5) == "101" + "0" * 61
    assert bit_reversed_name(1) == "1" + "0" * 63
    assert len(bit_reversed_name(2**64 - 1)) == 64


@pytest.mark.parametrize("n", [1, 2, 3, 5, 1000, 2**40 + 7, 2**64 - 1])
def test_bit_reversed_roundtrip(n):
    assert parse_bit_reversed_name(bit_reversed_name(n) + ".arrow") == n


@pytest.mark.parametrize("n", [0, -1, 2**64])
def test_bit_reversed_rejects_out_of_range(n):
    with pytest.raises(ValueError):
        bit_reversed_name(n)


def test_keys_follow_layout():
    shard = str(uuid.uuid4())
    assert wal_key(shard, 5) == f"_mem_wal/{shard}/wal/{'101' + '0' * 61}.arrow"
    assert manifest_key(shard, 1) == f"_mem_wal/{shard}/manifest/{'1' + '0' * 63}.binpb"


def test_wal_entry_roundtrip_with_metadata():
    data = encode_wal_entry(SCHEMA, [batch(0, 3), batch(3, 2)], writer_epoch=7, generation=4)
    entry = decode_wal_entry(data, "test")
    assert entry.writer_epoch == 7 and entry.generation == 4 and not entry.is_sentinel
    assert entry.num_rows == 5
    assert pa.Table.from_batches(entry.batches).column("id").to_pylist() == [0, 1, 2, 3, 4]
    assert entry.schema.metadata[b"writer_epoch"] == b"7"


def test_wal_buffer_is_the_plain_arrow_stream_in_one_exact_allocation():
    """The zero-copy encoding is byte for byte what pyarrow's stream writer writes
    (pylance reads that), in a buffer of exactly its size, and decodes as bytes do."""
    b0 = batch(0, 50).replace_schema_metadata({b"other": b"x"})  # the stream's metadata wins
    buf = encode_wal_buffer(SCHEMA, [b0, batch(50, 7)], writer_epoch=3)
    assert isinstance(buf, pa.Buffer)
    tagged = SCHEMA.with_metadata({**(SCHEMA.metadata or {}), b"writer_epoch": b"3"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tagged) as w:
        w.write_batch(pa.RecordBatch.from_arrays(b0.columns, schema=tagged))
        w.write_batch(batch(50, 7).replace_schema_metadata(tagged.metadata))
    assert buf.to_pybytes() == sink.getvalue().to_pybytes()
    assert encode_wal_entry(SCHEMA, [b0, batch(50, 7)], 3) == buf.to_pybytes()
    entry = decode_wal_entry(buf, "t")
    assert entry.num_rows == 57 and entry.writer_epoch == 3 and entry.nbytes == buf.size


def test_wal_only_entry_has_no_generation():
    entry = decode_wal_entry(encode_wal_entry(SCHEMA, [batch(0, 1)], 1), "t")
    assert entry.generation is None
    assert b"generation" not in entry.schema.metadata


def test_sentinel_has_no_batches():
    entry = decode_wal_entry(encode_sentinel(3), "t")
    assert entry.is_sentinel and entry.batches == [] and entry.writer_epoch == 3
    assert len(entry.schema) == 0
    assert entry.schema.metadata == {b"fence_sentinel": b"true", b"writer_epoch": b"3"}


def test_truncated_entry_names_where():
    data = encode_wal_entry(SCHEMA, [batch(0, 100)], 1)
    with pytest.raises(CorruptEntryError, match="shard S position 9"):
        decode_wal_entry(data[: len(data) // 2], "shard S position 9")
    with pytest.raises(CorruptEntryError, match="shard S position 9"):
        decode_wal_entry(b"garbage", "shard S position 9")


def test_entry_without_epoch_is_corrupt():
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as w:
        w.write_batch(batch(0, 1))
    with pytest.raises(CorruptEntryError, match="writer_epoch"):
        decode_wal_entry(sink.getvalue().to_pybytes(), "p1")


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
