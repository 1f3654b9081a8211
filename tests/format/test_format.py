"""Bit-reversed names and WAL entries (shard manifests: test_manifest_format.py)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from memwal_datasource.errors import CorruptEntryError
from memwal_datasource.format.memwal import (
    bit_reversed_name,
    decode_wal_entry,
    encode_sentinel,
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


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_entry_decodes_to_the_same_rows_and_is_smaller(codec):
    """IPC buffer compression: the same rows, metadata and order, in fewer bytes."""
    rows = [batch(0, 2000), batch(2000, 500)]
    plain = encode_wal_buffer(SCHEMA, rows, writer_epoch=5)
    packed = encode_wal_buffer(SCHEMA, rows, writer_epoch=5, compression=codec)
    assert packed.size < 0.8 * plain.size  # sequential ids and "rN" strings shrink
    entry = decode_wal_entry(packed, "t")
    assert entry.writer_epoch == 5 and entry.num_rows == 2500 and entry.nbytes == packed.size
    assert pa.Table.from_batches(entry.batches).equals(pa.Table.from_batches(rows))
    # A compressed entry cut short is caught like a plain one.
    with pytest.raises(CorruptEntryError, match="position 4"):
        decode_wal_entry(packed.to_pybytes()[: packed.size - 9], "position 4")


def test_a_sentinel_is_never_compressed():
    """A sentinel has no buffers; it stays byte for byte what pylance writes."""
    assert (encode_wal_buffer(pa.schema([]), (), 3, fence_sentinel=True, compression="zstd")
            .to_pybytes() == encode_sentinel(3))


def test_a_read_record_has_the_digest_of_the_bytes_its_writer_stored():
    from memwal_datasource.format.commit_format import CommitRecord, CommittedRange, Member

    ranges = [CommittedRange(shard_id="s", epoch=1, first=1, last=2, rows=5, bytes=9)]
    built = CommitRecord(sequence=7, kind="append", job_id="j", ranges=ranges, members=[
        Member(job_id="j", ranges=ranges, intent_id="i1"),
        Member(job_id="k", ranges=[], intent_id="i2", verdict="duplicate")])
    read = CommitRecord.from_json(built.to_json(), "7.json")
    assert read.digest() == built.digest()  # the checkpoints' digests compare the two
    other = CommitRecord.from_json(built.to_json().replace(b'"k"', b'"x"'), "7.json")
    assert other.digest() != built.digest()
