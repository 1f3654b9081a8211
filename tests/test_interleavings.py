"""Randomized interleavings of writers on one shard, in threads and in processes,
under random lost acknowledgements. After every run the invariants of fencing hold:

* each epoch was opened by one writer only;
* no data entry of epoch E lies above a sentinel of a later epoch;
* every acknowledged append is in the WAL exactly once, at the position it was
  acknowledged at, with its writer's epoch.
"""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest

from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import WalTailer
from memwal_datasource.store import open_store
from tests import race_worker
from tests.helpers import RandomFaultStore, new_shard

WORKERS = 3


def check_invariants(store, shard: str, results: list[dict]) -> None:
    opens = [e for r in results for e in r["opens"]]
    assert opens, "no writer ever opened: the run tested nothing"
    assert len(opens) == len(set(opens)), f"an epoch was opened twice: {sorted(opens)}"
    ms = ManifestStore(store, shard)
    chain = [ms.load(v).writer_epoch for v in range(1, ms.latest_version() + 1)]
    assert chain == sorted(chain) and set(opens) <= set(chain)
    entries = list(WalTailer(store, shard).entries(1, include_sentinels=True))
    fence = 0
    for pos, entry in entries:
        # A stalled opener's own sentinel may land above a newer one (its open then
        # fails the fence re-check); a data entry never may.
        assert entry.is_sentinel or entry.writer_epoch >= fence, (
            f"position {pos}: epoch {entry.writer_epoch} above a sentinel of epoch {fence}")
        if entry.is_sentinel:
            fence = max(fence, entry.writer_epoch)
    assert [p for p, _ in entries] == list(range(1, len(entries) + 1))
    by_pos = {p: e for p, e in entries}
    ids = [b.column("id")[0].as_py() for _, e in entries if not e.is_sentinel
           for b in e.batches]
    assert len(ids) == len(set(ids)), "an entry was written twice"
    for epoch, pos, first in (a for r in results for a in r["acked"]):
        entry = by_pos[pos]
        assert entry.writer_epoch == epoch and entry.batches[0].column("id")[0].as_py() == first


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_thread_interleavings(any_store, seed):
    shard = new_shard()
    results: list[dict] = [{} for _ in range(WORKERS)]
    barrier = threading.Barrier(WORKERS)

    def work(i: int) -> None:
        store = RandomFaultStore(any_store, seed=seed * 10 + i, probability=0.15)
        barrier.wait()
        results[i] = race_worker.run_rounds(store, shard, seed * 10 + i, 3)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    check_invariants(any_store, shard, results)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_random_process_interleavings(location):
    uri, opts = location
    shard = new_shard()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(WORKERS)
        with ctx.Pool(WORKERS) as pool:
            results = pool.starmap(race_worker.random_rounds,
                                   [(uri, opts, shard, 40 + i, barrier) for i in range(WORKERS)])
    check_invariants(open_store(uri, opts), shard, results)
