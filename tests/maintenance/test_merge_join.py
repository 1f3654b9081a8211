"""How a compaction round joins the base: the BTREE's upkeep rule, the join's memory."""

from __future__ import annotations

import pyarrow as pa

from memwal_datasource.maintenance.merge_join import JOIN_BATCH_ROWS, index_due, join_source


def test_the_key_index_folds_its_missing_rows_when_they_outweigh_a_rewrite():
    """``index_due``: never while rounds scan the base or merged nothing; otherwise once
    the rows the BTREE lacks reach ``INDEX_FOLD * sqrt(indexed * round rows)`` (10M
    indexed, 100k a round: 1.6M, about every 16th round)."""
    assert not index_due(1_000_000, 1_000_000, 100_000)  # 20 base rows a round row: scan
    assert not index_due(10_000_000, 10_000_000, 0)
    assert not index_due(10_000_000, 1_500_000, 100_000)
    assert index_due(10_000_000, 1_700_000, 100_000)
    assert not index_due(10_000_000, 300_000, 5_000)  # small rounds: rarely (358k)
    assert index_due(10_000_000, 400_000, 5_000)


def test_a_round_is_recut_into_owned_batches_only_when_lance_would_overcharge_it(monkeypatch):
    """Lance charges each 8k-row slice of a batch the whole batch: a batch whose slices
    would cost more than half the pool is copied into owned 8k-row batches; smaller
    ones are passed as they are (no copy)."""
    rows = pa.table({"id": pa.array(range(40_000), pa.int64()), "v": ["x" * 500] * 40_000})
    monkeypatch.setenv("LANCE_MEM_POOL_SIZE", str(60_000_000))
    out = join_source(rows)
    assert out.equals(rows) and out.schema == rows.schema
    sizes = [b.num_rows for b in out.to_batches()]
    assert max(sizes) == JOIN_BATCH_ROWS and sum(sizes) == 40_000
    assert all(b.get_total_buffer_size() < 5_000_000 for b in out.to_batches())  # owned
    monkeypatch.setenv("LANCE_MEM_POOL_SIZE", str(10**12))
    assert join_source(rows) is rows
