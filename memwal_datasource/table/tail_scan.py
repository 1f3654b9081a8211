"""Reading many WAL entries as a few Arrow streams: planning by bytes, fetching
concurrently, coalescing small entries.

A read of the WAL tail costs per entry (a GET and a decode) and per row. This
module keeps the first small next to the second:

* :func:`plan_slices` cuts the shards' entries into groups of about equal
  estimated bytes (commit records carry each range's rows and bytes), about
  ``min_partitions`` of them: 10,000 small entries become a few partitions,
  however many shards hold them, and a long shard is cut so every core has
  work. Planning walks the committed ranges once (a kept writer's consecutive
  one-entry commits are one span), with no request per entry.
* :func:`visible_entries` fetches the entries of a group with a few threads
  on an object store (inline on local disk, where a read costs less than a
  thread hand-off), at most a bounded window ahead (by estimated bytes), and
  hands them on in position order. Only the positions a committed range lists are fetched:
  never a sentinel or another attempt's entry between them.
* :func:`tail_batches` concatenates consecutive small batches of one schema
  into batches of about :data:`TARGET_ROWS` rows before any per-batch work.

Visibility is unchanged: an entry counts only if its writer epoch is one a
committed range of its position names (or any epoch for a raw, uncommitted
read), sentinels never.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import islice

import pyarrow as pa

from ..errors import MissingEntryError
from ..format.memwal import (
    TOMBSTONE,
    FieldId,
    WalEntry,
    decode_wal_entry,
    entry_columns,
    has_field_ids,
    wal_key,
)
from ..store.local import LocalStore
from .entry_decode import Decoder, split

# (writer epoch, first, last): positions first..last whose entries of that epoch count;
# epoch None: every entry of the range counts (a raw, read_uncommitted read).
Span = tuple[int | None, int, int]

# What an entry costs beyond its bytes (a request and a decode), in bytes of reading.
ENTRY_COST = 32 * 1024
# A range whose bytes are unknown (a raw read) is costed at this much per entry.
UNKNOWN_ENTRY_BYTES = 1024 * 1024
# A partition below this is not worth a task of its own (Spark's openCostInBytes).
MIN_PARTITION_BYTES = 4 * 1024 * 1024
# Defaults: a partition's bytes at most (Spark's maxPartitionBytes), fetch threads
# per task, the bytes fetched ahead of the reader, and the size of a yielded batch.
MAX_PARTITION_BYTES = 128 * 1024 * 1024
READ_THREADS = 8  # on an object store; local disk and memory read inline
PREFETCH_BYTES = 32 * 1024 * 1024
MAX_PREFETCH_ENTRIES = 64
TARGET_ROWS = 64 * 1024
TARGET_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Segment:
    """One range of a shard's WAL to read: its epoch, positions and estimated bytes
    (``None``: unknown)."""

    epoch: int | None
    first: int
    last: int
    nbytes: int | None = None

    @property
    def entries(self) -> int:
        return self.last - self.first + 1

    def entry_bytes(self) -> float:
        return UNKNOWN_ENTRY_BYTES if self.nbytes is None else self.nbytes / self.entries


@dataclass(frozen=True)
class Slice:
    """Spans of one shard a task reads, in position order, and their estimated bytes."""

    shard_id: str
    spans: tuple[Span, ...]
    nbytes: int

    @property
    def entries(self) -> int:
        return sum(b - a + 1 for _e, a, b in self.spans)

    def cost(self) -> int:
        return self.nbytes + ENTRY_COST * self.entries


def clip(segments: Iterable[Segment], first: int | None, last: int | None) -> list[Segment]:
    """``segments`` cut to positions ``first..last`` (bytes in proportion), empty ones left out."""
    out = []
    for s in segments:
        a = s.first if first is None else max(s.first, first)
        b = s.last if last is None else min(s.last, last)
        if b < a:
            continue
        nbytes = None if s.nbytes is None else round(s.nbytes * (b - a + 1) / s.entries)
        out.append(Segment(s.epoch, a, b, nbytes))
    return out


def merged(ranges: Iterable[Segment | tuple]) -> list[Segment]:
    """Segments by first position, a range that continues the one before with the same
    epoch joined to it (a shard written by one kept writer, a commit per entry).
    ``ranges`` are segments or ``(epoch, first, last, bytes)`` tuples (0 bytes: unknown)."""
    rows = sorted(((r.epoch, r.first, r.last, r.nbytes) if isinstance(r, Segment) else r
                   for r in ranges), key=lambda r: (r[1], r[2]))
    out: list[list] = []
    for e, a, b, nbytes in rows:
        p = out[-1] if out else None
        if p is not None and p[0] == e and p[2] + 1 == a:
            p[2] = b
            p[3] = None if p[3] is None or not nbytes else p[3] + nbytes
        else:
            out.append([e, a, b, nbytes or None])
    return [Segment(*r) for r in out]


def plan_slices(shards: Mapping[str, Sequence[Segment]], *, target: int) -> list[list[Slice]]:
    """Groups of slices, a task's work each: every shard's entries, in shard then
    position order, cut at entry bounds into ``ceil(total / target)`` groups of about
    equal cost (bytes plus :data:`ENTRY_COST` per entry). A long shard is spread over
    several groups, small shards share one."""
    total = sum(cost(segs) for segs in shards.values())
    if not total:
        return []
    n = max(1, math.ceil(total / target))
    bounds = [total * i / n for i in range(1, n)]
    groups: list[list[Slice]] = [[]]
    spans: list[Span] = []
    nbytes, done, bi = 0.0, 0.0, 0

    def close_slice(shard: str) -> None:
        nonlocal spans, nbytes
        if spans:
            groups[-1].append(Slice(shard, tuple(spans), round(nbytes)))
        spans, nbytes = [], 0.0

    for shard in sorted(shards):
        for s in shards[shard]:
            per, each = s.entry_bytes(), s.entry_bytes() + ENTRY_COST
            pos = s.first
            while pos <= s.last:
                need = bounds[bi] - done if bi < len(bounds) else math.inf
                k = s.last - pos + 1 if need == math.inf else math.ceil(need / each - 1e-9)
                take = min(max(k, 1), s.last - pos + 1)
                spans.append((s.epoch, pos, pos + take - 1))
                nbytes += per * take
                done += each * take
                pos += take
                while bi < len(bounds) and done >= bounds[bi] - 1e-6 * total:
                    close_slice(shard)  # at a bound: the next entry starts a group
                    if groups[-1]:
                        groups.append([])
                    bi += 1
        close_slice(shard)
    return [g for g in groups if g]


def cost(segments: Iterable[Segment]) -> float:
    """What reading ``segments`` costs: their bytes plus :data:`ENTRY_COST` per entry."""
    return sum((s.entry_bytes() + ENTRY_COST) * s.entries for s in segments)


# --- fetching ----------------------------------------------------------------------------

def _positions(spans: Sequence[Span]) -> Iterator[tuple[int, frozenset | int | None, Span]]:
    """``(position, epochs that count, its span)`` in position order, each position once."""
    ordered = sorted(spans, key=lambda s: (s[1], s[2]))
    # Disjoint spans (the usual case) are walked as they are.
    if all(a[2] < b[1] for a, b in zip(ordered, ordered[1:], strict=False)):
        for span in ordered:
            e, a, b = span
            for pos in range(a, b + 1):
                yield pos, e, span
        return
    allowed: dict[int, set] = {}
    first: dict[int, Span] = {}
    for span in ordered:
        e, a, b = span
        for pos in range(a, b + 1):
            allowed.setdefault(pos, set()).add(e)
            first.setdefault(pos, span)
    for pos in sorted(allowed):
        epochs = allowed[pos]
        yield pos, (None if None in epochs else frozenset(epochs)), first[pos]


def _counts(epochs, epoch: int, sentinel: bool) -> bool:
    if sentinel:
        return False
    if epochs is None:
        return True
    return epoch in epochs if isinstance(epochs, frozenset) else epoch == epochs


def _local_get(store) -> Callable[[str], bytes] | None:
    """For local disk, :meth:`LocalStore.get` as two system calls: its buffered Python
    file costs 26 us an entry against 9 us, a third of a small entry's read."""
    if type(store) is not LocalStore:  # a wrapped store keeps its own get
        return None
    root = store.root + os.sep

    def get(key: str) -> bytes:
        fd = os.open(root + key.replace("/", os.sep), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            data = os.read(fd, size)
            while len(data) < size:  # a read returns at most 2 GiB at a time
                more = os.read(fd, size - len(data))
                if not more:
                    break
                data += more
            return data
        finally:
            os.close(fd)
    return get


def _where(store, shard: str, pos: int, key: str) -> str:
    """An entry as errors name it (as :class:`~..shard.wal.WalTailer` does)."""
    return f"shard {shard} position {pos} ({store.describe(key)})"


def _fetched(view, slices: Sequence[Slice], threads: int | None, prefetch_bytes: int
             ) -> Iterator[tuple[str, int, object, str, bytes]]:
    """``(shard, position, epochs that count, key, bytes)`` of every position of
    ``slices``, in order, fetched by ``threads`` threads (``None``: :data:`READ_THREADS`
    on an object store, the caller's own on local disk) in runs of consecutive
    positions at most ``prefetch_bytes`` (by the slices' estimate) ahead. A missing
    entry raises as :meth:`TableView.entries` does."""
    entries = sum(s.entries for s in slices)
    each = max(1.0, sum(s.nbytes for s in slices) / max(1, entries))
    window = max(2, min(MAX_PREFETCH_ENTRIES, int(prefetch_bytes // each)))
    store = view.store
    if threads is None:
        threads = READ_THREADS if store.remote else 1
    todo = ((s.shard_id, pos, epochs, span) for s in slices
            for pos, epochs, span in _positions(s.spans))

    get = _local_get(store) or store.get

    def fetch(run: list) -> list:
        out = []
        for item in run:
            key = wal_key(item[0], item[1])
            try:
                out.append((item, key, get(key)))
            except FileNotFoundError:
                out.append((item, key, None))
        return out

    def checked(done: list) -> Iterator[tuple[str, int, object, str, bytes]]:
        for (shard, pos, epochs, span), key, data in done:
            if data is None:
                exc = MissingEntryError(
                    f"WAL entry {_where(store, shard, pos, key)} is missing, inside the range "
                    f"{span[1]}..{span[2]} being read (deleted by hand, or by a garbage "
                    "collection this reader started before); nothing was returned past it")
                raise view.missing_entry(exc, shard, span[1], span[2])
            yield shard, pos, epochs, key, data

    if threads <= 1 or entries <= 2:
        for item in todo:
            yield from checked(fetch([item]))
        return
    # Runs of a few entries per request to the pool: small entries cost little each.
    run_len = max(1, window // (2 * threads))
    runs = iter(lambda: list(islice(todo, run_len)), [])
    pool = ThreadPoolExecutor(threads, thread_name_prefix="memwal-read")
    pending: deque = deque()
    try:
        for run in runs:
            pending.append(pool.submit(fetch, run))
            if len(pending) * run_len >= window:
                yield from checked(pending.popleft().result())
        while pending:
            yield from checked(pending.popleft().result())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def visible_entries(view, slices: Sequence[Slice], *, threads: int | None = None,
                    prefetch_bytes: int = PREFETCH_BYTES
                    ) -> Iterator[tuple[str, int, WalEntry]]:
    """``(shard, position, entry)`` of every entry of ``slices`` that counts, in order,
    each decoded on its own. ``view`` is a :class:`~.view.TableView`."""
    for shard, pos, epochs, key, data in _fetched(view, slices, threads, prefetch_bytes):
        entry = decode_wal_entry(data, _where(view.store, shard, pos, key))
        if _counts(epochs, entry.writer_epoch, entry.is_sentinel):
            yield shard, pos, entry


def _decoded(view, slices: Sequence[Slice], threads: int | None, run_bytes: int
             ) -> Iterator[tuple[list[pa.RecordBatch], tuple[str, int, int] | None]]:
    """The batches of the entries of ``slices`` that count, in order: runs of entries
    with one schema message decoded together (:mod:`.entry_decode`), ``None`` as whose."""
    decoder = Decoder()
    head: bytes | None = None
    bodies: list = []
    datas: list = []
    size = 0
    last, h = None, None  # the last schema message seen, decoded

    def run() -> list[pa.RecordBatch]:
        nonlocal head, bodies, datas, size
        out = decoder.run(head, bodies, datas)
        head, bodies, datas, size = None, [], [], 0
        return out

    for shard, pos, epochs, key, data in _fetched(view, slices, threads, PREFETCH_BYTES):
        parts = split(data)
        where = partial(_where, view.store, shard, pos, key)  # for errors only
        if parts is None:
            last = h = None
        elif parts[0] != last:  # a new schema message (a compare costs less than a hash)
            last, h = parts[0], decoder.head(parts[0], where)
        if h is None or not h.shared:
            if head is not None:
                yield run(), None
            entry = decode_wal_entry(data, where())
            if _counts(epochs, entry.writer_epoch, entry.is_sentinel):
                yield entry.batches, None
            continue
        if not _counts(epochs, h.epoch, h.sentinel):
            continue
        if head is not None and (parts[0] != head or size >= run_bytes):
            yield run(), None
        head = parts[0]
        bodies.append(parts[1])
        datas.append((where, data))
        size += len(parts[1])
    if head is not None:
        yield run(), None


# --- coalescing --------------------------------------------------------------------------

@dataclass
class TailBatch:
    """Rows of consecutive entries: ``rows`` has the wanted columns then ``_tombstone``;
    ``runs`` says whose they are, ``(shard, position, epoch, rows)`` per entry batch
    (only when asked for: :func:`tail_batches`)."""

    rows: pa.RecordBatch
    runs: list[tuple[str, int, int, int]]


def tail_batches(view, slices: Sequence[Slice], wanted: pa.Schema,
                 ids: Callable[[], Mapping[str, FieldId] | None], *,
                 threads: int | None = None, target_rows: int = TARGET_ROWS,
                 target_bytes: int = TARGET_BYTES, whose: bool = False) -> Iterator[TailBatch]:
    """The rows of ``slices``' visible entries, coalesced: consecutive batches with one
    schema are concatenated up to about ``target_rows`` rows or ``target_bytes``, then
    matched to ``wanted`` (by field id where entries carry ids: ``ids()`` gives the
    table's, asked once) in one step per coalesced batch. ``whose``: fill each
    batch's ``runs`` (entries are then decoded one by one)."""
    out_schema = wanted.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))
    table_ids: list = []  # [ids] once asked
    group: list[pa.RecordBatch] = []
    runs: list[tuple[str, int, int, int]] = []
    key: pa.Schema | None = None
    rows = nbytes = 0

    def flush() -> Iterator[TailBatch]:
        nonlocal group, runs, rows, nbytes
        batch = group[0] if len(group) == 1 else pa.concat_batches(group)
        if not table_ids and has_field_ids(batch):
            table_ids.append(ids())
        cols = entry_columns(batch, wanted, table_ids[0] if table_ids else None)
        out = pa.RecordBatch.from_arrays(cols, schema=out_schema)
        if whose or out.num_rows <= target_rows * 2:
            yield TailBatch(out, runs)
        else:  # a run decoded together: Spark-sized batches of it (slices, no copy)
            for at in range(0, out.num_rows, target_rows):
                yield TailBatch(out.slice(at, target_rows), [])
        group, runs, rows, nbytes = [], [], 0, 0

    if whose:
        units = ((entry.batches, (shard, pos, entry.writer_epoch)) for shard, pos, entry
                 in visible_entries(view, slices, threads=threads))
    else:
        units = _decoded(view, slices, threads, target_bytes)
    for batches, who in units:
        if not batches:
            continue
        # A unit is one IPC stream: one schema. Entries' epochs differ, fields need not.
        fields = batches[0].schema.remove_metadata()
        if group and not fields.equals(key, check_metadata=True):
            yield from flush()
        key = fields
        for batch in batches:
            if not batch.num_rows:
                continue
            group.append(batch)
            if who is not None:
                runs.append((*who, batch.num_rows))
            rows += batch.num_rows
            nbytes += batch.get_total_buffer_size()
            if rows >= target_rows or nbytes >= target_bytes:
                yield from flush()
    if group:
        yield from flush()


def commit_order_slices(ranges: Iterable) -> list[Slice]:
    """Committed ranges (``CommittedRange``) as slices in the order given (commit order),
    a range continuing the one before on its shard with the same epoch joined to it."""
    out: list[Slice] = []
    for r in ranges:
        if r.last < r.first:
            continue
        p = out[-1] if out else None
        if p is not None and p.shard_id == r.shard_id and p.spans[-1][0] == r.epoch \
                and p.spans[-1][2] + 1 == r.first:
            e, a, _b = p.spans[-1]
            out[-1] = Slice(p.shard_id, (*p.spans[:-1], (e, a, r.last)), p.nbytes + r.bytes)
        else:
            out.append(Slice(r.shard_id, ((r.epoch, r.first, r.last),), r.bytes))
    return out


def tail_table(view, slices: Sequence[Slice], schema: pa.Schema,
               ids: Callable[[], Mapping[str, FieldId] | None], *,
               threads: int | None = None) -> pa.Table:
    """What :meth:`TableView.range_rows` returns for the committed ranges ``slices`` came
    from (:func:`commit_order_slices`): their rows in order, with ``_tombstone``;
    fetched concurrently and coalesced."""
    out_schema = schema.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))
    batches = [t.rows for t in tail_batches(view, slices, schema, ids, threads=threads)]
    return pa.Table.from_batches(batches, schema=out_schema)
