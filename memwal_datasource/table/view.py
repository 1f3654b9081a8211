"""The table: the Lance dataset a MemWAL belongs to, and :class:`TableView`.

Module-level helpers create and open the Lance dataset (its schema rules, the
primary-key marks and the checks a write's schema meets, are in
:mod:`memwal_datasource.format.table_schema`). :class:`TableView` is the one read view
through which every reader, the compactor, the garbage collector and the CLI
see shards, commit records and compaction state. The user's
:class:`~memwal_datasource.memwal_table.MemWalTable` adds the maintenance verbs
(compact, gc) on top of it, in a module above compaction; this one imports
neither.

Creating writes an empty Lance dataset (version 1) with the primary key set as
Lance expects (field metadata ``lance-schema:unenforced-primary-key`` on a
non-nullable field) and initialises the MemWAL index on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import (
    CollectedError,
    MemWalError,
    MissingEntryError,
    without_native_locations,
)
from ..format.manifest_format import ShardManifest
from ..format.memwal import TOMBSTONE, FieldId, entry_columns, has_field_ids
from ..format.table_schema import base_schema, data_schema, primary_key_of
from ..log.commit import CommitLog, CommittedRange
from ..log.rounds import (  # noqa: F401 - re-exported: compaction state as the table sees it
    LEDGER_SHARD,
    CompactionRound,
    folded_upto,
    read_round,
    recorded_round,
    round_key,
)
from ..options import lance_storage_options
from ..shard.manifest import ManifestStore, list_shards
from ..shard.wal import WalTailer
from ..store import ObjectStore, open_store

_View = TypeVar("_View", bound="TableView")  # open() returns the class it is called on


def table_exists(uri: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """True if a Lance dataset exists at ``uri``."""
    import lance

    try:
        lance.dataset(uri, storage_options=lance_storage_options(storage_options))
        return True
    except (OSError, ValueError, FileNotFoundError):
        return False


def open_table(uri: str, storage_options: Mapping[str, str] | None = None):
    """Open the Lance dataset at ``uri``, with a clear error if it is not there."""
    import lance

    try:
        return lance.dataset(uri, storage_options=lance_storage_options(storage_options))
    except (OSError, ValueError) as exc:
        raise MemWalError(f"no Lance table at {uri}: {without_native_locations(exc)}") from None


def field_ids(ds) -> dict[str, FieldId]:
    """``{name: FieldId}`` of the dataset's columns (their Lance field ids, nested too)."""

    def one(f) -> FieldId:
        return FieldId(f.id(), {c.name(): one(c) for c in f.children()})

    return {f.name(): one(f) for f in ds.lance_schema.fields()}


def lance_field_ids(uri: str, storage_options: Mapping[str, str] | None = None
                    ) -> dict[str, FieldId] | None:
    """The Lance field ids of the table at ``uri``; ``None`` if there is no Lance table
    (a bare MemWAL: entries are then written without ids and matched by name)."""
    import lance

    try:
        ds = lance.dataset(uri, storage_options=lance_storage_options(storage_options))
    except (OSError, ValueError) as exc:
        if table_exists(uri, storage_options):  # there is one: the error is real
            raise MemWalError(f"cannot read the Lance schema of {uri}: {exc}") from None
        return None
    return field_ids(ds)


def ensure_mem_wal(ds) -> None:
    """Initialise the MemWAL index unless it already is (racing creators are fine)."""
    if ds.mem_wal_index_details() is not None:
        return
    try:
        ds.initialize_mem_wal()
    except OSError as exc:
        if "already initialized" not in str(exc):
            raise


def create_table(uri: str, schema: pa.Schema, primary_key: Sequence[str] = (),
                 storage_options: Mapping[str, str] | None = None):
    """Create an empty table with ``schema`` (and primary key) and a MemWAL.

    A table without a primary key gets the hidden compaction key as Lance's
    primary key (:func:`base_schema`), so LanceDB can read it. If another
    process created it first, the existing table is returned.
    """
    import lance

    schema = base_schema(schema, primary_key)
    opts = lance_storage_options(storage_options)
    try:
        ds = lance.write_dataset(schema.empty_table(), uri, mode="create",
                                 storage_options=opts)
    except OSError as exc:
        if "already exists" not in str(exc).lower():
            raise MemWalError(
                f"cannot create Lance table at {uri}: {without_native_locations(exc)}") from None
        ds = lance.dataset(uri, storage_options=opts)
    ensure_mem_wal(ds)
    return lance.dataset(uri, storage_options=opts)


# --- the read view: one object every reader, writer and tool goes through ------------


@dataclass(frozen=True)
class TableSnapshot:
    """A consistent view: a base-table version plus the committed WAL tail above it.

    Every commit record up to ``compacted_seq`` is in the base table at
    ``base_version``; ``tail`` lists the committed ranges of the records after
    it (since the last overwrite among them). ``base_hidden`` is true when an
    uncompacted overwrite hides the base table's rows.
    """

    base_version: int | None
    compacted_round: int
    compacted_seq: int
    last_seq: int
    tail: list[CommittedRange]
    base_hidden: bool
    last_data_seq: int = 0  # the last record that is not a gc record

    @property
    def pending_records(self) -> int:
        """Commit records compaction has yet to fold (0 when only gc records are left)."""
        return self.last_seq - self.compacted_seq if self.last_data_seq > self.compacted_seq else 0


class TableView:
    """A memwal table as read: the Lance dataset, its shards, commit log and compaction state.

    Readers (batch, stream, CLI, whole-table), the compactor and the garbage
    collector all go through this object, so each visibility rule is written
    once. The user's :class:`~memwal_datasource.MemWalTable` is this view
    with the maintenance verbs.
    """

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None = None, *,
                 store: ObjectStore | None = None):
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        self.store = store or open_store(uri, self.storage_options)
        self.commits = CommitLog(self.store)

    # -- the user's reading verbs (as delta-rs's DeltaTable: history) ---------------------

    @classmethod
    def open(cls: type[_View], uri: str, storage_options: Mapping[str, str] | None = None
             ) -> _View:
        """Open an existing memwal table (errors name the path and the fix)."""
        table = cls(uri, storage_options)
        table.dataset()  # fails now, clearly, rather than on the first verb
        return table

    def read(self, version: int | None = None) -> pa.Table:
        """The whole table exactly once: the base at ``version`` (default: the latest)
        plus the committed tail above it. See :meth:`to_table`."""
        return self.to_table(version)

    def history(self, limit: int | None = None) -> list[dict]:
        """Stored commit records, newest first: what each job, batch or gc committed."""
        out = []
        last = self.commits.next_sequence() - 1
        first = self.commits.first_stored()
        for seq in range(last, first - 1, -1):
            if limit is not None and len(out) >= limit:
                break
            try:
                rec = self.commits.read(seq)
            except FileNotFoundError:
                break  # collected meanwhile
            # A group record answers several jobs: one row each (the leader's first).
            for part in rec.parts():
                out.append({"sequence": rec.sequence, "kind": rec.kind, "job_id": part.job_id,
                            "created_ms": rec.created_ms,
                            "rows": sum(r.rows for r in part.ranges),
                            "bytes": sum(r.bytes for r in part.ranges),
                            "shards": len({r.shard_id for r in part.ranges}),
                            "query_id": part.query_id, "batch_id": part.batch_id,
                            "txn_app_id": part.txn_app_id, "txn_version": part.txn_version,
                            "verdict": part.verdict})
        return out[:limit] if limit is not None else out

    # -- pieces ------------------------------------------------------------------------

    def dataset(self, version: int | None = None):
        """The base Lance dataset (latest version unless ``version``)."""
        import lance

        try:
            return lance.dataset(self.uri, version=version,
                                 storage_options=lance_storage_options(self.storage_options))
        except (OSError, ValueError) as exc:
            raise MemWalError(
                f"no Lance table at {self.uri}: {without_native_locations(exc)}") from None

    def shards(self) -> list[str]:
        """Shard ids under ``_mem_wal/``."""
        return list_shards(self.store)

    def manifest(self, shard_id: str) -> ShardManifest | None:
        """A shard's latest manifest."""
        return ManifestStore(self.store, shard_id).latest()

    def tailer(self, shard_id: str) -> WalTailer:
        """A read-only WAL tailer of one shard."""
        return WalTailer(self.store, shard_id)

    def round(self, number: int) -> CompactionRound:
        """Compaction round ``number``'s intent."""
        return read_round(self.store, number)

    # -- compaction state and the committed tail ----------------------------------------

    def compacted_round(self, base_version: int) -> int:
        """The last compaction round committed in base ``base_version`` (0 if none)."""
        return recorded_round(self.store, base_version)

    def snapshot(self, base_version: int | None = None) -> TableSnapshot:
        """The base table at a version and the committed tail that is not in it.

        The commit log is folded *before* the base version is fixed: a
        compaction round and a collection that land in between are then in the
        base version read afterwards, whatever the fold dropped. (Fixing the
        base first would lose the rows a round committed after it and a
        collection dropped from the fold.)
        """
        # The fold starts at the latest checkpoint: O(records since it), not O(history).
        state = self.commits.state()
        version = base_version
        if version is None:
            try:
                version = self.dataset().version
            except MemWalError:
                version = None  # a bare MemWAL without a base table: nothing compacted
        number, compacted = folded_upto(self.store, version)
        if compacted < state.released:
            raise CollectedError(
                f"read a newer version of the table: base version {version} holds commit "
                f"records up to {compacted}, and garbage collection deleted the WAL entries "
                f"of records up to {state.released}, so its rows since then are only in "
                "newer base versions")
        # Never fold again here: a collection after the base was fixed could drop
        # ranges of a round newer than this base version.
        tail = [r for r in state.visible if (r.sequence or 0) > compacted]
        hidden = (state.last_overwrite or 0) > compacted
        return TableSnapshot(version, number, compacted, max(state.sequence, compacted), tail,
                             hidden, state.last_data)

    def committed_tail(self) -> list[CommittedRange]:
        """Committed ranges not yet compacted (what a WAL-tail reader returns)."""
        return self.snapshot().tail

    def range_rows(self, ranges: Iterable[CommittedRange], schema: pa.Schema) -> pa.Table:
        """The rows of committed ``ranges`` in order, with a ``_tombstone`` column.

        Only entries of each range's epoch count: another attempt's entry inside
        a committed position range was never committed.
        """
        out_schema = schema.append(pa.field(TOMBSTONE, pa.bool_(), nullable=False))
        ids = None  # the table's field ids: columns renamed since an entry are found by id
        pieces: list[pa.RecordBatch] = []
        for rng in ranges:
            for _pos, entry in self.entries(rng.shard_id, rng.first, rng.last):
                if entry.writer_epoch != rng.epoch:
                    continue
                for batch in entry.batches:
                    if not batch.num_rows:
                        continue
                    if ids is None and has_field_ids(batch):
                        ids = field_ids(self.dataset())
                    cols = entry_columns(batch, schema, ids)
                    pieces.append(pa.RecordBatch.from_arrays(
                        [c if c.type.equals(f.type) else c.cast(f.type)
                         for c, f in zip(cols, out_schema, strict=True)], schema=out_schema))
        return pa.Table.from_batches(pieces, schema=out_schema)

    def entries(self, shard_id: str, first: int, last: int):
        """``(position, entry)`` of committed positions ``first..last`` of a shard.

        Raises :class:`CollectedError` (plan the read again) when garbage
        collection deleted them after the read was planned.
        """
        try:
            yield from self.tailer(shard_id).entries(first, last)
        except MissingEntryError as exc:
            raise self.missing_entry(exc, shard_id, first, last) from None

    def missing_entry(self, exc: MissingEntryError, shard_id: str, first: int,
                      last: int) -> Exception:
        """What to raise for ``exc``, an entry missing from positions ``first..last``:
        ``exc`` itself (damage) unless garbage collection released them after the read
        was planned (:class:`CollectedError`: plan the read again)."""
        floor = self.commits.state().floors.get(shard_id, 0)
        if first >= floor:
            return exc  # not collected: damage, reported as such
        return CollectedError(
            f"read again: WAL entries {first}..{last} of shard {shard_id} were "
            "garbage-collected after this read was planned (their rows are in the base "
            f"table now; {exc})")

    def to_table(self, base_version: int | None = None) -> pa.Table:
        """The whole table, fresh to the last commit: base plus the committed tail.

        With a primary key the newest row of each key wins (the tail is newer
        than the base, later commits newer than earlier ones) and tombstones
        delete; without one the tail's rows are appended to the base's. A read
        of the latest version that meets entries collected after it planned
        plans once more (the newer base version holds them).
        """
        try:
            return self._to_table(base_version)
        except CollectedError:
            if base_version is not None:
                raise
            return self._to_table(None)

    def _to_table(self, base_version: int | None) -> pa.Table:
        snap = self.snapshot(base_version)
        ds = self.dataset(snap.base_version)
        schema = data_schema(ds.schema)
        pk = primary_key_of(ds.schema)
        tail = self.range_rows(snap.tail, schema)
        if pk:
            tail = last_per_key(tail, pk)
        live = tail.filter(pc.invert(tail.column(TOMBSTONE))).drop_columns([TOMBSTONE])
        if snap.base_hidden:
            return live.cast(schema)
        base = ds.to_table()
        if pk and tail.num_rows:  # rows the tail replaced or deleted
            base = base.join(tail.select(pk), keys=pk, join_type="left anti")
        return pa.concat_tables([base.select(schema.names).cast(schema), live.cast(schema)])


def _distinct(column: pa.ChunkedArray) -> bool:
    """Whether no value of ``column`` repeats: strictly ascending (one vectorised
    comparison, 0.1 ms at 200k rows) or, failing that, as many unique values as rows
    (one hash pass, 5 ms). A null makes the quick test fail over to the hash pass."""
    n = len(column)
    if n < 2:
        return True
    try:
        if pc.all(pc.greater(column.slice(1), column.slice(0, n - 1)),
                  skip_nulls=False).as_py():
            return True
    except pa.ArrowNotImplementedError:  # a key type without an order: hash it
        pass
    return len(pc.unique(column)) == n


def last_per_key(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last row of every key (rows in commit, then WAL, order), in that order."""
    if not table.num_rows:
        return table
    if len(keys) == 1 and _distinct(table.column(keys[0])):
        # Every key once (the usual upsert batches): nothing to group and take again
        # (a fifth of a 200k-row compaction).
        return table
    indexed = table.append_column("__order", pa.array(np.arange(table.num_rows)))
    last = indexed.group_by(list(keys), use_threads=False).aggregate([("__order", "max")])
    rows = last.column("__order_max")
    return table.take(pc.take(rows, pc.sort_indices(rows)))


def read_table(uri: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """The whole table (base + committed, uncompacted tail), exactly once. See
    :meth:`TableView.to_table`."""
    return TableView(uri, storage_options).to_table()
