"""The protobuf wire helpers (``protowire``) against ``google.protobuf``'s own encoding."""

from __future__ import annotations

import pytest

from memwal_datasource.format._proto import ShardManifestPB
from memwal_datasource.format.protowire import fields, read_varint, spans, varint


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**32, 2**63 - 1, 2**64 - 1])
def test_varint_round_trips(n):
    data = b"\x00" + varint(n) + b"\x01"
    assert read_varint(data, 1) == (n, len(data) - 1)


def test_truncated_or_overlong_varints_raise():
    with pytest.raises(ValueError, match="truncated"):
        read_varint(b"\x80\x80", 0)
    with pytest.raises(ValueError, match="truncated"):
        read_varint(b"\xff" * 11, 0)


def test_fields_read_what_protobuf_wrote():
    pb = ShardManifestPB(version=7, writer_epoch=3)
    pb.sstables.add(generation=2, path="p")
    data = pb.SerializeToString(deterministic=True)
    got = list(fields(data))
    assert (1, 7) in got and (2, 3) in got
    (sst,) = [v for n, v in got if n == 8]
    assert dict(fields(sst)) == {1: 2, 2: b"p"}
    # Spans cover the message exactly, field after field.
    cuts = [(s, e) for _n, _w, _v, s, e in spans(data)]
    assert cuts[0][0] == 0 and cuts[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:], strict=False))


def test_a_field_running_past_the_end_raises():
    data = varint(8 << 3 | 2) + varint(10) + b"abc"
    with pytest.raises(ValueError, match="truncated"):
        list(spans(data))
    with pytest.raises(ValueError, match="wire type"):
        list(spans(varint(1 << 3 | 3)))
