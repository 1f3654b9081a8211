"""How a compaction round joins the base: scan or BTREE, the BTREE's upkeep rule, the
join's memory."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from memwal_datasource.maintenance import merge_join
from memwal_datasource.maintenance.merge_join import (
    JOIN_BATCH_ROWS,
    index_due,
    join_source,
    joins_by_scan,
    round_joins_by_scan,
)
from memwal_datasource.table.view import TableView


def test_spread_keys_scan_the_base_and_clustered_ones_probe_a_large_one():
    """The measured costs: 200k upserts into 10M rows by scan (0.20 s) against the
    BTREE with their keys in all 2,442 pages (1.78 s) or in 26 (0.15 s); 1M rows scan."""
    assert joins_by_scan(10_000_000, 200_000, pages=2_442)
    assert joins_by_scan(10_000_000, 200_000, pages=245)
    assert not joins_by_scan(10_000_000, 200_000, pages=26)
    assert joins_by_scan(1_000_000, 200_000, pages=26)
    assert not joins_by_scan(30_000_000, 200_000, pages=26)
    assert joins_by_scan(30_000_000, 200_000, pages=7_324)
    # Rows the BTREE lacks are scanned by a probe too; unknown pages count as spread.
    assert joins_by_scan(10_000_000, 200_000, pages=26, unindexed_rows=9_000_000)
    assert joins_by_scan(10_000_000, 200_000) and not joins_by_scan(10_000_000, 1, None)


def test_pages_touched_counts_the_pages_holding_a_key():
    bounds = (np.array([0, 10, 20, 40]), np.array([9, 19, 29, 49]))  # a gap: 30..39
    count = merge_join._pages_touched
    assert count(bounds, pa.array([1, 2, 3, None], pa.int64())) == 1
    assert count(bounds, pa.array([35, 50, -1], pa.int64())) == 0  # gaps and outside
    assert count(bounds, pa.chunked_array([[45, 11], [29, 0]], pa.int64())) == 4
    words = (np.array(["a", "m"], dtype=object), np.array(["k", "z"], dtype=object))
    assert count(words, pa.array(["b", "c", "zz", None])) == 1


@pytest.mark.parametrize("spread", [True, False])
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_round_reads_the_btree_pages_its_keys_fall_in(location, spread, monkeypatch):
    """On a real table: 100 updated keys spread over a 400k-row base's 98 BTREE pages
    scan it; the same number in one page probe the BTREE. The page lookup is read (once
    per index segment) where the table is, local disk or S3."""
    import lance

    uri, opts = location
    ds = lance.write_dataset(pa.table({"id": pa.array(range(400_000), pa.int64())}), uri,
                             storage_options=opts)
    ds.create_scalar_index("id", "BTREE")
    merge_join._pages_cache.clear()
    unread = []
    monkeypatch.setattr(merge_join.log, "info", lambda *a: unread.append(a))
    keys = np.arange(0, 400_000, 4_000) if spread else np.arange(200_000, 200_100)
    source = pa.table({"id": pa.array(keys, pa.int64())})
    table = TableView(uri, opts)
    assert round_joins_by_scan(table, lance.dataset(uri, storage_options=opts), source,
                               ["id"]) == spread
    assert not unread, unread  # the lookup was read, not guessed
    assert len(merge_join._pages_cache) == 1
    assert not round_joins_by_scan(  # inserts beyond the base fall in no page
        table, lance.dataset(uri, storage_options=opts),
        pa.table({"id": pa.array(keys + 10**6)}), ["id"])
    assert round_joins_by_scan(table, lance.dataset(uri, storage_options=opts), source,
                               ["id", "x"])


def test_the_key_index_folds_its_missing_rows_when_they_outweigh_a_rewrite():
    """``index_due``: never while rounds scan the base or merged nothing; otherwise once
    the rows the BTREE lacks reach ``INDEX_FOLD * sqrt(indexed * round rows)`` (10M
    indexed, 100k a round: 1.6M, about every 16th round)."""
    assert not index_due(500_000, 500_000, 100_000)  # 10 base rows a round row: scan
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
