"""Compacting 200k upserts into a large base vs a plain Lance ``merge_insert``.

Bases of 1M, 10M, 30M rows (key ``id``, copied per repeat); upserts are half updates of
keys drawn uniformly from the whole base, half inserts. They go to the WAL by 4 appends,
then ``compact(uri)`` is timed vs ``merge_insert("id")`` of the same rows into plain Lance
with a BTREE on the key (also forced to scan the key, and a plain append: the floor).
memwal's base keeps the key index its own first compaction built (untimed). Sustained:
32 x 200k into 10M, a round each.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np
import pyarrow as pa

from memwal_datasource import compact

from . import harness as h

NAME = "pk_compaction"
MEMWAL, LANCE = "memwal compact()", "Lance merge_insert (Arrow in memory)"
# Lance's other join: with LANCE's (through the BTREE), how flat its best join is.
LANCE_SCAN = "Lance merge_insert, scan join (use_index=False)"
FLOOR = "Lance append of the same rows (no join; the floor)"


def _base(uri: str, rows: int, memwal: bool) -> None:
    import lance

    if memwal:
        h.create_table(uri)
    chunks = (b for s in range(0, rows, 1_000_000)
              for b in h.arrow_rows(s, min(1_000_000, rows - s)).to_batches())
    ds = lance.write_dataset(pa.RecordBatchReader.from_batches(h.SCHEMA, chunks), uri,
                             mode="append" if memwal else "create")
    if memwal:  # the key index the table builds and keeps: its first compaction's
        h.inproc_append(uri, h.arrow_rows(0, 1), enable_memtable="false")
        compact(uri)
        assert any(i.field_names == ["id"] for i in lance.dataset(uri).describe_indices())
    else:
        ds.create_scalar_index("id", "BTREE")  # as a merge_insert user would


def _upserts(base: int, upserts: int, i: int) -> pa.Table:
    """Batch ``i``: updates of keys drawn uniformly from the base, then new keys."""
    rng = np.random.default_rng(i)
    ids = np.concatenate([rng.choice(base, upserts // 2, replace=False),
                          np.arange(base + i * upserts // 2, base + (i + 1) * upserts // 2)])
    rng.shuffle(ids)
    return h.rows_of(ids, "upd", 0.002)


def _copy(src: str, dst: str) -> str:
    """Lance's data files are immutable: hard links; everything else is copied."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, copy_function=lambda s, d: (
        os.link(s, d) if f"{os.sep}data{os.sep}" in s else shutil.copy2(s, d)))
    return dst


def _case(ctx: h.Ctx, base: int, upserts: int, rounds: int = 1) -> dict[str, Any]:
    """``rounds`` batches of ``upserts`` into one base: compaction (one batch: 4 appends,
    a round; more: an append and a round each) vs a ``merge_insert`` per batch; with one
    batch also the scan join and the floor."""
    import lance

    root = ctx.scratch(f"pkc{base}")
    srcs = {MEMWAL: str(root / "memwal.lance"), LANCE: str(root / "lance.lance")}
    secs = h.seconds(lambda: [_base(src, base, name == MEMWAL) for name, src in srcs.items()])
    ctx.log(f"  base of {base:,} rows built twice in {secs:.0f} s")
    batches = [_upserts(base, upserts, i) for i in range(rounds)]
    parts, total, final = 4 if rounds == 1 else 1, upserts * rounds, base + rounds * upserts // 2

    def timed(body, src: str = LANCE):
        def run(r: int) -> dict[str, Any]:
            uri, out = _copy(srcs[src], str(root / "run.lance")), []
            for b in batches if src == MEMWAL else ():  # untimed: the upserts into the WAL
                for part in range(parts):
                    h.inproc_append(uri, b.slice(part * upserts // parts, upserts // parts),
                                    enable_memtable="false")
            secs = h.seconds(lambda: out.append(body(uri)))
            assert (got := lance.dataset(uri).count_rows()) == final or src == LANCE and got > final
            return {"rows_s": total / secs, "seconds": secs,
                    **({"merge_s": out[0], "own_s": secs - out[0]} if src == MEMWAL else {})}
        return run

    def compaction(uri: str) -> float:
        # merge_s: in merge_insert (its commit carries the mark); own_s: WAL reads, the fold
        summary = compact(uri, max_records_per_round=parts)
        assert len(summary.rounds) == rounds
        return sum(x.merge_seconds for x in summary.rounds)

    def merge(uri: str, index: bool = True) -> None:
        ds = lance.dataset(uri)
        for b in batches:
            ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all(
                ).use_index(index).execute(b)

    comps = {MEMWAL: timed(compaction, MEMWAL), LANCE: timed(merge)}
    if rounds == 1:
        comps.update({LANCE_SCAN: timed(lambda u: merge(u, index=False)),
                      FLOOR: timed(lambda u: lance.write_dataset(batches[0], u, mode="append"))})
    runs = h.alternate(ctx, comps, warmup=0, label=f"{rounds} x {upserts:,} into {base:,}: ")
    shutil.rmtree(root, ignore_errors=True)
    rt = h.ratios(runs, MEMWAL, "rows_s", list(comps)[1:])
    return {"label": f"{base:,} x{rounds}", "base_rows": base, "rounds": rounds,
            "competitors": h.stats(runs), "ratio": rt[LANCE], "floor_ratio": rt.get(FLOOR),
            # the same repeat's plain merge_insert beside compaction's own merge
            "inside_merge": h.paired([x["merge_s"] for x in runs[MEMWAL]],
                                     [x["seconds"] for x in runs[LANCE]])}


def _spread(what: str, med: list[float], goal: float | None) -> dict[str, Any]:
    """Fastest / slowest base of the median rows/s per base."""
    spread = max(med) / min(med)
    return {"what": what, "met": None if goal is None else spread <= goal,
            "value": f"{spread:.2f} (medians " + ", ".join(f"{m / 1e6:.2f}M" for m in med)
            + " rows/s)"}


def run(ctx: h.Ctx) -> dict[str, Any]:
    upserts = ctx.pick(10_000, 200_000)
    cases = [_case(ctx, base, upserts)
             for base in ctx.pick((20_000, 100_000), (1_000_000, 10_000_000, 30_000_000))]
    sus = _case(ctx, ctx.pick(100_000, 10_000_000), upserts, ctx.pick(3, 32))
    med = {k: [c["competitors"][k]["rows_s"]["median"] for c in cases]
           for k in (MEMWAL, LANCE, LANCE_SCAN)}
    out = h.per_case(
        f"{upserts:,} upserts into a primary-key base: memwal compaction vs Lance merge_insert",
        {"upserts": upserts, "wal": "4 in-process appends, enable_memtable=false"},
        [*cases, sus], "base rows x batches", [
            ("upserted rows/s", "rows_s", "{:,.0f}"), ("s", "seconds", "{:.3g}"),
            ("in merge_insert s", "merge_s", "{:.3g}"), ("compaction's own s", "own_s", "{:.3g}")],
        lambda c, b: [h.target(f"{b}, a round / a merge_insert per append rows/s", c["ratio"])]
        if c["rounds"] > 1 else [
            h.target(f"base {b}: compaction / merge_insert rows/s", c["ratio"], 1.0),
            h.target(f"base {b}: compaction / a plain append (the floor) rows/s", c["floor_ratio"]),
            h.target(f"base {b}: time in merge_insert, compaction's / the plain one's",
                     c["inside_merge"])], [("upserted rows/s", "rows_s", "rows/s")])
    out["targets"] += [
        _spread("compaction rows/s, fastest / slowest base <= 2", med[MEMWAL], 2.0),
        _spread("Lance merge_insert's best join (BTREE or scan), fastest / slowest base (reported)",
                [max(a, b) for a, b in zip(med[LANCE], med[LANCE_SCAN], strict=True)], None)]
    return out
