"""MemTable mode: pylance's native ShardWriter behind our ShardWriter interface.

pylance owns the MemTable, replay on open, SSTable flush and indexes; we only
map the configuration, translate its errors into our typed ones, and recover
what pylance does not report (epoch, WAL position range, new SSTables) from
the shard's manifest and WAL, which is the format's truth anyway.

Exactly once: pylance's writer replays every WAL entry after the manifest's
replay position into its MemTable and flushes them into SSTables. On a shard
with history those entries are a failed or fenced attempt's uncommitted rows,
or rows written WAL-only (read from their WAL ranges already). So before
pylance opens a shard that has a manifest, :func:`advance_replay_to_tip`
fences it (a claim and a sentinel, as any new writer) and moves the replay
position to that sentinel: pylance replays nothing, and the SSTables an
attempt flushes hold only its own rows, which its commit message names.

What Lance's own readers see: every shard this package opens in MemTable mode
is first **hidden** (:func:`hide_shard`): the base table records the shard's
compacted generation as :data:`HIDDEN_GENERATION`, far above any generation a
writer reaches, so spec-following readers (LanceDB, an ``LsmScanner`` built
from shard manifests) skip every SSTable of the shard, committed or not, and
read the base table: exactly what compaction committed, never a running,
failed or fenced attempt's SSTable. Committed MemTable rows reach them when
compaction folds their WAL ranges into the base (as WAL-only rows do).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import pyarrow as pa

from .. import hooks
from ..config import ShardWriterConfig
from ..errors import (
    ConfigError,
    Fenced,
    MemWalError,
    NotInThisMode,
    WriterPoisoned,
    raised_again,
)
from ..format.lance_manifest import compacted_generations
from ..format.manifest_format import ShardManifest
from ..format.table_schema import primary_key_of
from ..options import lance_storage_options
from ..shard.manifest import ManifestStore
from ..shard.wal import WalAppender, WalTailer, find_tip
from ..shard.writer_base import ShardWriter, WriterStats, as_batches, check_schema
from ..store import ObjectStore, open_store
from ..table.view import TableSnapshot, TableView

# Config fields pylance 14's mem_wal_writer accepts as keyword arguments.
NATIVE_KWARGS = (
    "durable_write",
    "max_wal_buffer_size",
    "max_wal_flush_interval_ms",
    "max_memtable_size",
    "max_memtable_rows",
    "max_memtable_batches",
    "max_unflushed_memtable_bytes",
)
# Ours or Lance's, but not settable through pylance 14: only their defaults fit.
_NOT_SETTABLE = ("max_wal_persist_retries", "wal_persist_retry_base_delay_ms",
                 "backpressure_timeout_ms")
_FENCED = re.compile(r"local epoch (\d+) < stored epoch (\d+)")
_GENERATION = re.compile(r"_gen_(\d+)$")  # SSTable directories are {8 hex}_gen_{G}
# A shard's compacted generation in the base table that hides all its SSTables from
# spec-following readers (they skip generations at or below it). Far above any
# generation a writer reaches, with room left in Lance's u64.
HIDDEN_GENERATION = 1 << 62
_STALE = re.compile(r"Stale SSTable compaction", re.IGNORECASE)
_HIDE_ATTEMPTS = 10

log = logging.getLogger(__name__)


def native_storage_options(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """pylance's options for the writer, with object_store's own retries off by default.

    object_store retries a conditional PUT whose response was lost; the retry
    gets 412 and pylance's writer takes its own entry for a rival's and writes
    it again at the next position: the WAL then holds those rows twice and
    the writer reports success. With retries off, pylance sees the failure,
    finds the position taken and stops with "persistence failure ... reopen",
    which we raise as :class:`WriterPoisoned`: nothing is committed twice.
    A user who sets ``client_max_retries`` explicitly keeps their value.
    """
    opts = lance_storage_options(storage_options)
    opts.setdefault("client_max_retries", "0")
    return opts


def check_native_config(config: ShardWriterConfig) -> None:
    """Refuse settings pylance's native writer cannot honour, naming the field."""
    default = ShardWriterConfig()
    for name in _NOT_SETTABLE:
        if getattr(config, name) != getattr(default, name):
            raise ConfigError(
                f"'{name}' cannot be set with enable_memtable=true: pylance's native "
                f"writer does not expose it (it uses {getattr(default, name)}); "
                "use enable_memtable=false to control it"
            )
    if config.wal_compression not in ("auto", "none"):
        raise ConfigError(
            f"set 'wal_compression' to auto or none with enable_memtable=true: pylance's "
            f"native writer writes uncompressed WAL entries and cannot write "
            f"{config.wal_compression}")
    if config.durable_write and config.max_wal_flush_interval_ms == 0:
        raise ConfigError(
            "'max_wal_flush_interval_ms' must be > 0 with durable_write=true in MemTable mode"
        )


def check_primary_key(uri: str, schema: pa.Schema) -> None:
    """Refuse MemTable mode on a table without a primary key, before anything is written.

    pylance's writer accepts puts on such a table, but its LSM reads
    (``LsmScanner``, point lookups) and SSTable compaction deduplicate rows by
    the primary key and fail without one, so the SSTables would be unreadable.
    """
    if not primary_key_of(schema):
        raise ConfigError(
            f"enable_memtable=true needs a table with a primary key, and the table at {uri} "
            "has none: Lance's LSM reads (LsmScanner, point lookups) and SSTable compaction "
            "keep the newest row per primary key and refuse a table without one. Create the "
            "table with option 'primary_key' (Lance's 'lance-schema:unenforced-primary-key' "
            "field metadata), or write with enable_memtable=false")


def hide_shard(table: TableView, shard_id: str, ds=None) -> bool:
    """Hide every SSTable of ``shard_id`` from Lance's readers; ``True`` if this call did.

    Commits one base-table version (an empty ``merge_insert`` on the primary
    key carrying ``mark_sstables_as_compacted([(shard, HIDDEN_GENERATION)])``)
    unless the base already records the shard at that generation. Lance merges
    concurrent marks of different shards; a concurrent mark of the same shard
    is refused as stale, which means it is hidden. Done once per shard, before
    its first MemTable SSTable exists (see the module doc).
    """
    from lance.mem_wal import CompactedSsTable

    shard_id = ManifestStore(table.store, shard_id).shard_id
    for _ in range(_HIDE_ATTEMPTS):
        ds = ds if ds is not None else table.dataset()
        if compacted_generations(table.store, ds.version).get(shard_id, 0) >= HIDDEN_GENERATION:
            return False
        pk = primary_key_of(ds.schema)
        if not pk:
            return False  # no MemTable mode, so no SSTables to hide
        try:
            (ds.merge_insert(pk).when_matched_update_all().when_not_matched_insert_all()
             .mark_sstables_as_compacted([CompactedSsTable(shard_id, HIDDEN_GENERATION)])
             .execute(ds.schema.empty_table()))
        except OSError as exc:
            if _STALE.search(str(exc)):
                return False  # a concurrent opener hid it
            if "conflict" not in str(exc).lower():
                raise MemWalError(
                    f"shard {shard_id}: could not record it as hidden in the base table at "
                    f"{table.uri} ({exc}); check write access to the table and retry") from None
            ds = None  # a conflicting commit: re-read and try again
            continue
        hooks.point("native.hidden", shard=shard_id)
        log.info("shard %s: SSTables hidden from Lance readers until compaction", shard_id)
        return True
    raise MemWalError(f"shard {shard_id}: gave up recording it as hidden in {table.uri} after "
                      f"{_HIDE_ATTEMPTS} commit conflicts; retry the write")


def advance_replay_to_tip(store: ObjectStore, shard_id: str,
                          manifests: ManifestStore | None = None) -> ShardManifest | None:
    """Fence ``shard_id`` and move its replay position past every stored WAL entry.

    Returns the new manifest, or ``None`` for a shard without one (nothing to
    replay, no writer to fence; a writer claiming meanwhile makes the native
    open refuse, see :func:`claimed_epoch`). The claim and sentinel are a new
    writer's (:meth:`WalAppender.open`): a fenced writer can still land
    entries below the sentinel, never above it, so a replay position at the
    sentinel leaves no entry of an older attempt for pylance to replay. What
    was committed before stays readable from the WAL ranges its commit records
    name, which is where every reader of this package and the compactor read it.
    """
    manifests = manifests or ManifestStore(store, shard_id)
    if manifests.latest() is None:
        return None
    fence = WalAppender.open(store, manifests.shard_id, create=False, manifests=manifests)
    last = fence.next_position - 1  # the sentinel (or an entry above it, if one won the slot)

    def past_tip(m: ShardManifest) -> None:
        m.replay_after_wal_entry_position = max(m.replay_after_wal_entry_position, last)
        m.wal_entry_position_last_seen = max(m.wal_entry_position_last_seen, last)

    advanced = manifests.commit_update(fence.epoch, past_tip)
    hooks.point("native.advanced", shard=manifests.shard_id, epoch=fence.epoch, position=last)
    return advanced


def translate(exc: Exception, shard_id: str, epoch: int,
              manifests: ManifestStore | None = None) -> Exception:
    """Map pylance's OSError strings to what the user should do.

    * "fenced (persistence failure) ... reopen": a WAL write had an unknowable
      outcome; :class:`WriterPoisoned` (reopen to recover), never ``Fenced``.
    * "fenced (peer claimed epoch) ... local epoch L < stored epoch S":
      :class:`Fenced` by the real stored epoch (stop writing).
    * Any other "fenced": the stored epoch is read from the manifest; only a
      newer epoch there makes it ``Fenced``.
    """
    msg = str(exc)
    low = msg.lower()
    if "persistence failure" in low or ("fenced" in low and "reopen" in low
                                         and not _FENCED.search(msg)):
        return WriterPoisoned(
            f"shard {shard_id} epoch {epoch}: pylance's writer could not make a WAL write "
            f"durable and stopped ({msg.splitlines()[0][:300]}); no acknowledged row is lost: "
            "reopen the writer to replay the WAL and write the unacknowledged rows again")
    if "fenced" in low:
        m = _FENCED.search(msg)
        stored = int(m.group(2)) if m else None
        if stored is None and manifests is not None:
            try:
                latest = manifests.latest()
                stored = latest.writer_epoch if latest else None
            except Exception:  # noqa: BLE001 - fall through to the generic error
                stored = None
        if stored is not None and stored > epoch:
            return Fenced(shard_id, epoch, stored, "reported by pylance")
    return MemWalError(f"shard {shard_id}: pylance writer failed: {msg}")


def claimed_epoch(manifests: ManifestStore, before_version: int, before_epoch: int,
                  native) -> int:
    """The epoch pylance's writer claimed at open, from the manifest chain.

    pylance does not report it, and the latest manifest may already be a
    newer writer's. The versions written during our open hold every claim
    made meanwhile; exactly one means it is ours. With several, which is ours
    cannot be known, so the writer is closed and the open refused.
    """
    latest = manifests.latest_version()
    claims, epoch = [], before_epoch
    for version in range(before_version + 1, latest + 1):
        m = manifests.load(version)
        if m.writer_epoch > epoch:
            claims.append(m.writer_epoch)
            epoch = m.writer_epoch
    if len(claims) == 1:
        return claims[0]
    try:
        native.close()
    except OSError:
        pass
    raise WriterPoisoned(
        f"shard {manifests.shard_id}: {len(claims)} writer epochs {claims} were claimed while "
        "pylance's writer opened, so the epoch this writer holds cannot be told; it was "
        "closed. Another writer is opening this shard at the same time: retry the open")


class NativeShardWriter(ShardWriter):
    """pylance's ``LanceDataset.mem_wal_writer`` with our interface and stats."""

    def __init__(self, native, uri, store, shard_id, schema, config, epoch, tip_before,
                 sstables_before, manifests: ManifestStore | None = None):
        self._native = native
        self.uri = uri
        self._store = store
        self._manifests = manifests or ManifestStore(store, shard_id)
        self.shard_id = shard_id
        self.schema = schema
        self.config = config
        self.epoch = epoch
        self._tip_before = tip_before
        self._sstables_before = sstables_before
        self._stats = WriterStats(shard_id, epoch, "memtable")
        self._closed = False
        self._error: Exception | None = None
        self._final: WriterStats | None = None

    @classmethod
    def open(cls, uri: str, shard_id: str, schema: pa.Schema, config: ShardWriterConfig,
             storage_options: Mapping[str, str] | None = None, *,
             manifests: ManifestStore | None = None) -> NativeShardWriter:
        """Open the native writer with nothing to replay (see :func:`advance_replay_to_tip`).

        Writes twice on a shard with history: our fence (claim, sentinel and
        replay position at the tip), then pylance's own open (another claim
        and sentinel; its replay finds nothing). The epoch is pylance's.
        """
        import lance

        check_native_config(config)
        store = manifests.store if manifests is not None else open_store(uri, storage_options)
        try:
            ds = lance.dataset(uri, storage_options=native_storage_options(storage_options))
        except (OSError, ValueError) as exc:
            raise MemWalError(
                f"MemTable mode needs an existing Lance table with a MemWAL at {uri}: {exc}"
            ) from None
        check_primary_key(uri, ds.schema)
        # One chain object for the whole open and the writer's life: each step after the
        # first re-checks the version it knows (one round trip) instead of reading anew.
        manifests = manifests or ManifestStore(store, shard_id)
        if hide_shard(TableView(uri, storage_options, store=store), manifests.shard_id, ds):
            ds = lance.dataset(uri, storage_options=native_storage_options(storage_options))
        before = advance_replay_to_tip(store, manifests.shard_id, manifests)
        tip_before = WalTailer(store, manifests.shard_id, manifests).next_position()
        kwargs = {name: getattr(config, name) for name in NATIVE_KWARGS}
        try:
            native = ds.mem_wal_writer(manifests.shard_id, **kwargs)
        except OSError as exc:
            raise translate(exc, manifests.shard_id, before.writer_epoch if before else 0,
                            manifests) from None
        epoch = claimed_epoch(manifests, before.version if before else 0,
                              before.writer_epoch if before else 0, native)
        writer = cls(native, uri, store, manifests.shard_id, schema, config, epoch, tip_before,
                     {s.path for s in (before.sstables if before else [])}, manifests)
        # Known right from open: the native open has already dropped its sentinel.
        writer._stats.next_wal_entry_position = find_tip(store, manifests.shard_id, tip_before)
        return writer

    def put(self, batches) -> None:
        if self._error is not None:
            raise raised_again(self._error)
        items = [check_schema(self.shard_id, self.schema, b) for b in as_batches(batches)]
        items = [b for b in items if b.num_rows]
        if not items:
            return
        try:
            self._native.put(pa.Table.from_batches(items, schema=self.schema))
        except OSError as exc:
            self._error = translate(exc, self.shard_id, self.epoch, self._manifests)
            raise self._error from None
        self._stats.puts += 1
        rows = sum(b.num_rows for b in items)
        self._stats.rows += rows
        self._stats.bytes += sum(b.get_total_buffer_size() for b in items)
        if self.config.durable_write:
            self._stats.rows_durable += rows
        else:
            self._stats.rows_not_durable += rows

    def flush(self) -> None:
        if self._error is not None:
            raise raised_again(self._error)
        if not self.config.durable_write:
            raise NotInThisMode(
                f"shard {self.shard_id}: pylance's native writer has no flush(); with "
                "durable_write=false rows become durable at close()"
            )

    def close(self) -> None:
        if self._closed:
            if self._error is not None:
                raise raised_again(self._error)
            return
        self._closed = True
        try:
            self._native.close()
        except OSError as exc:
            self._error = self._error or translate(exc, self.shard_id, self.epoch,
                                                   self._manifests)
        self._final = self._collect()
        if self._error is not None:
            raise raised_again(self._error)
        self._final.rows_durable += self._final.rows_not_durable
        self._final.rows_not_durable = 0

    def abort(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - aborting; the caller's error wins
            pass

    def _collect(self) -> WriterStats:
        """Merge pylance's counters with what the manifest and WAL say."""
        s = self._stats.copy()
        try:
            native = self._native.stats()
            s.wal_entries = int(native.get("wal_flush_count", 0))
            s.wal_bytes = int(native.get("wal_flush_bytes", 0))
            s.memtable = dict(native)
        except OSError:
            s.memtable = {}
        tailer = WalTailer(self._store, self.shard_id, self._manifests)
        tip = tailer.next_position()
        s.next_wal_entry_position = tip
        first = None
        for pos, entry in tailer.entries(self._tip_before, include_sentinels=True):
            if entry.writer_epoch == self.epoch and not entry.is_sentinel:
                first = pos
                break
            if entry.writer_epoch == self.epoch and entry.is_sentinel:
                s.sentinel_position = pos
        if first is not None:
            s.first_wal_position, s.last_wal_position = first, tip - 1
            # pylance 14's wal_flush_count misses some flushes; the WAL itself does not.
            s.wal_entries = tip - first
        latest = self._manifests.latest()
        if latest is not None:
            s.sstables = [t.path for t in latest.sstables if t.path not in self._sstables_before]
        return s

    def stats(self) -> WriterStats:
        if self._final is not None:
            return self._final
        s = self._stats.copy()
        s.next_wal_entry_position = find_tip(self._store, self.shard_id,
                                             s.next_wal_entry_position)
        try:
            s.memtable = dict(self._native.memtable_stats())
            native = self._native.stats()
            s.wal_entries = int(native.get("wal_flush_count", 0))
            s.wal_bytes = int(native.get("wal_flush_bytes", 0))
        except OSError as exc:
            raise translate(exc, self.shard_id, self.epoch, self._manifests) from None
        return s


def committed_sstables(table: TableView, snap: TableSnapshot | None = None
                       ) -> dict[str, list[tuple[int, str]]]:
    """``{shard: [(generation, path), ...]}`` of the SSTables commit records name.

    Only the uncompacted committed tail (of ``snap``, or a fresh snapshot)
    counts: an SSTable a failed, fenced or aborted attempt flushed (it may be
    in the shard manifest) is never named, and the rows of compacted records
    are in the base table already. Rows written WAL-only have no SSTable: they
    reach Lance's readers through compaction (and ours through their WAL ranges).
    """
    out: dict[str, list[tuple[int, str]]] = {}
    for rng in (snap or table.snapshot()).tail:
        for path in rng.sstables:
            m = _GENERATION.search(path)
            if m is None:
                raise MemWalError(f"shard {rng.shard_id}: commit record {rng.sequence} names "
                                  f"SSTable '{path}', which is not '<id>_gen_<generation>'")
            out.setdefault(rng.shard_id, []).append((int(m.group(1)), path))
    return out


def committed_lsm_scanner(table: TableView):
    """pylance's ``LsmScanner`` over the base table and the committed SSTables only.

    This is Lance's LSM view (newest row per primary key) of what MemTable-mode
    jobs committed: never an uncommitted attempt's SSTable, whatever the shard
    manifests list. Rows committed WAL-only join it when compaction folds them
    into the base table; until then :func:`memwal_datasource.table.view.read_table`
    is the fresher view. Refused while an uncompacted overwrite hides the base
    table, which ``LsmScanner`` cannot hide.
    """
    from lance.mem_wal import LsmScanner, ShardSnapshot

    snap = table.snapshot()
    if snap.base_hidden:
        raise MemWalError(f"table {table.uri}: an overwrite newer than the last compaction "
                          "hides the base table, which LsmScanner would show; compact first "
                          "or read with read_table()")
    shards = []
    for shard, tables in committed_sstables(table, snap).items():
        s = ShardSnapshot(shard)
        for generation, path in sorted(tables):
            s = s.with_sstable(generation, path)
        shards.append(s)
    return LsmScanner.from_snapshots(table.dataset(snap.base_version), shards)
