"""Spark option parsing, done once on the driver before any task runs.

Spark hands options over as lower-cased string keys with string values. Every
option is checked here; an unknown key or a bad value fails with a message
that names the option and what is allowed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

from ..config import ShardWriterConfig
from ..errors import ConfigError
from ..format.memwal import FieldId
from ..log.commit import STREAM_KEY_PREFIX, Txn
from ..maintenance.thresholds import Thresholds
from ..options import normalize, redact
from ..shard.leases import DEFAULT_TTL_S
from ..table.sharding import Sharding, ShardingRequest
from ..table.tail_scan import MAX_PARTITION_BYTES
from ..write.native import check_native_config
from .connect import resolve_local
from .option_table import (
    DEFAULT_LEASE_WAIT_S,
    READS,
    STORAGE_PREFIX,
    WRITES,
    check_known,
    flag,
)

if TYPE_CHECKING:
    from ..table.table_info import TableStamp

# WAL-only Spark tasks queue at most this many WAL entries' worth of batches.
SPARK_QUEUE_ENTRIES = 2
# Shard ids are uuid5 in this namespace of (table, writer group, slot).
SHARD_NAMESPACE = uuid.UUID("5d0f3c39-2a64-4a55-9a0e-6d2c7c3b8b1e")
OPERATIONS = ("upsert", "delete")
# How errors name the table location (Spark passes .save(p) / .load(p) as option 'path').
PATH_OPTION = "option 'path' (the .save() / .load() argument)"
VIEWS = ("tail", "table")
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


def storage_options(options: Mapping[str, str]) -> dict[str, str]:
    """``storage.<name>`` options with the prefix removed, aliases folded."""
    return normalize({k[len(STORAGE_PREFIX):]: v for k, v in options.items()
                      if k.startswith(STORAGE_PREFIX)})


def table_path(options: Mapping[str, str]) -> str:
    """The table URI from ``path`` (``.save(path)`` / ``.load(path)``).

    A relative local path is made absolute here, on the driver, once: executors
    run in other working directories, and would otherwise write the WAL under
    theirs while the driver commits under its own. It is resolved where Spark
    resolves its own sources' relative paths, also under Spark Connect, whose
    planning workers run elsewhere (:func:`~.connect.resolve_local`).
    """
    path = options.get("path") or options.get("location")
    if not path:
        # Spark's Python data source API hands a source no table location for a
        # catalog table: saveAsTable without a path, writeTo and spark.table get {}.
        raise ConfigError(
            "option 'path' is required: the memwal format addresses a table by its URI. "
            "Catalog tables (saveAsTable without a path, df.writeTo(name), spark.table(name)) "
            "are not supported: Spark's Python data source API gives the source no location "
            "for them. Use df.write.format('memwal').save('<table uri>') and "
            "spark.read.format('memwal').load('<table uri>'), and for SQL "
            "spark.read.format('memwal').load('<table uri>').createOrReplaceTempView('<name>') "
            f"(got options {sorted(options)})")
    path = path.rstrip("/") or "/"
    # A local path or file:// URI becomes one plain absolute path, given to our
    # store and to pylance alike (see store.local_path).
    return resolve_local(path, PATH_OPTION) or path


def _seconds(options: Mapping[str, str], name: str, default: float, zero_ok: bool) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
        bound = "a number of seconds >= 0" if zero_ok else "a positive number of seconds"
        raise ConfigError(f"option '{name}' must be {bound}, got '{raw}'")
    return value


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"option '{name}' must be a positive integer, got '{raw}'")
    return value


@dataclass(frozen=True)
class WriteOptions:
    """Everything a write job needs, validated."""

    path: str
    writer_group: str
    primary_key: tuple[str, ...]
    create_table: bool
    num_shards: int | None
    config: ShardWriterConfig
    storage: dict[str, str] = field(repr=False)
    txn: Txn | None = None
    operation: str = "upsert"
    shard_by: ShardingRequest | None = None
    # The table's sharding spec, resolved on the driver once the table exists.
    sharding: Sharding | None = None
    # The table's Lance field ids, resolved with it: tasks then never open the table.
    field_ids: Mapping[str, FieldId] | None = field(default=None, repr=False)
    lease_wait_s: float = DEFAULT_LEASE_WAIT_S
    lease_ttl_s: float = DEFAULT_TTL_S
    # A first attempt may continue a writer its Python worker kept (writer_pool).
    keep_writers: bool = False
    # The table the job's planner read: a kept writer continues only on the same one.
    table_stamp: TableStamp | None = None
    # enable_memtable was not set: the table's primary key decides (see with_table_key).
    memtable_auto: bool = False
    # The writer options set explicitly (Spark defaults apply to the others).
    explicit: frozenset[str] = frozenset()
    # Add the DataFrame's new nullable columns to the table before writing.
    merge_schema: bool = False
    # Automatic maintenance after a commit (None: unset, on for streams only).
    auto_maintain: bool | None = None
    maintain: Thresholds = field(default_factory=Thresholds)

    @property
    def delete(self) -> bool:
        """True for ``operation=delete``."""
        return self.operation == "delete"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """Validate every write option; raise :class:`ConfigError` naming the bad one."""
        opts = {k.lower(): v for k, v in options.items()}
        check_known(opts, WRITES, "write")
        group = opts.get("writer_group", "default")
        if not group or "/" in group:
            raise ConfigError(f"option 'writer_group' must be a non-empty name without '/', "
                              f"got '{group}'")
        pk = tuple(c.strip() for c in opts.get("primary_key", "").split(",") if c.strip())
        operation = opts.get("operation", "upsert").strip().lower()
        if operation not in OPERATIONS:
            raise ConfigError(f"option 'operation' must be one of {OPERATIONS}, "
                              f"got '{opts['operation']}'")
        if operation == "delete" and "enable_memtable" not in opts:
            # Deletes are written as WAL entries with Lance's _tombstone column, which
            # pylance's native writer takes only through its own delete(); WAL-only
            # mode writes them (and pylance replays them).
            opts = {**opts, "enable_memtable": "false"}
        # Unset, MemTable mode follows the table's primary key (Lance's LSM needs
        # one), decided by with_table_key once the driver knows the table.
        auto = "enable_memtable" not in opts
        config = ShardWriterConfig.from_options(opts)
        if operation == "delete" and config.enable_memtable:
            raise ConfigError("option 'operation=delete' is written WAL-only: drop "
                              "'enable_memtable=true' (or set it to false)")
        explicit = frozenset(k for k in opts if k in ShardWriterConfig.field_names())
        return cls(path=table_path(opts), writer_group=group, primary_key=pk,
                   create_table=flag(opts, "create_table"),
                   num_shards=_positive_int(opts, "num_shards"),
                   config=_spark_defaults(config, explicit, auto, native=not auto),
                   storage=storage_options(opts), txn=_txn(opts), operation=operation,
                   shard_by=_shard_by(opts),
                   lease_wait_s=_seconds(opts, "lease_wait_s", DEFAULT_LEASE_WAIT_S, True),
                   lease_ttl_s=_seconds(opts, "lease_ttl_s", DEFAULT_TTL_S, False),
                   keep_writers=flag(opts, "keep_writers"),
                   memtable_auto=auto, explicit=explicit,
                   merge_schema=flag(opts, "merge_schema"),
                   auto_maintain=(flag(opts, "auto_maintain") if "auto_maintain" in opts
                                  else None),
                   maintain=_thresholds(opts))

    def with_table_key(self, has_primary_key: bool) -> WriteOptions:
        """These options for a table with or without a primary key.

        An unset ``enable_memtable`` becomes true exactly when the table has a
        primary key (MemTable mode needs one); an explicit value is kept.
        """
        if not self.memtable_auto:
            return self
        config = replace(self.config, enable_memtable=has_primary_key)
        if "max_unflushed_memtable_bytes" not in self.explicit:
            config = replace(config, max_unflushed_memtable_bytes=ShardWriterConfig()
                             .max_unflushed_memtable_bytes)
        return replace(self, config=_spark_defaults(config, self.explicit, auto=True,
                                                    native=has_primary_key),
                       memtable_auto=False)

    def shard_for(self, slot: int) -> str:
        """The shard of pool slot ``slot`` (modulo ``num_shards``) in this writer group.

        A task leases a slot's shard before writing: its partition id's slot
        when free (so uncontended jobs reuse the same shards), the next free
        one otherwise.
        """
        slot = slot % self.num_shards if self.num_shards else slot
        return str(uuid.uuid5(SHARD_NAMESPACE, f"{self.path}|{self.writer_group}|{slot}"))

    def describe(self) -> str:
        """Loggable summary (secrets redacted)."""
        return (f"path={self.path} writer_group={self.writer_group} "
                f"enable_memtable={self.config.enable_memtable} "
                f"storage={redact(self.storage)}")


def _spark_defaults(config: ShardWriterConfig, explicit: frozenset[str],
                    auto: bool = False, native: bool = True) -> ShardWriterConfig:
    """``config`` with the Spark task defaults for the options not set explicitly.

    ``auto``: MemTable mode was chosen by the primary key, not by the user
    (``native=False`` defers the MemTable-mode checks until it is chosen).
    """
    if "durable_write" not in explicit:
        # A task's commit message is returned only after close() has made
        # every row durable, so per-put durability buys a Spark task nothing
        # but latency; an explicit durable_write is honoured.
        config = replace(config, durable_write=False)
    if not config.enable_memtable and "max_unflushed_memtable_bytes" not in explicit:
        # Lance's 1 GiB queue budget would let a task's Python worker hold a GiB of
        # batches; two WAL entries' worth keeps the pipeline full and memory bounded.
        config = replace(config, max_unflushed_memtable_bytes=SPARK_QUEUE_ENTRIES
                         * config.max_wal_buffer_size)
    config = config.validate()
    if config.enable_memtable and native:
        try:
            check_native_config(config)
        except ConfigError as exc:
            if not auto:
                raise
            raise ConfigError(f"{exc} (option 'enable_memtable' is unset, and a table with a "
                              "primary key defaults to true)") from None
    return config


def _thresholds(options: Mapping[str, str]) -> Thresholds:
    """The ``maintain_*`` options as automatic maintenance's thresholds."""
    from ..maintenance.gc import MIN_RETAIN_SECONDS

    base = Thresholds()
    retain = _seconds(options, "maintain_gc_retain_s", base.gc_retain_s, False)
    if retain < MIN_RETAIN_SECONDS:
        raise ConfigError(f"option 'maintain_gc_retain_s' must be at least "
                          f"{MIN_RETAIN_SECONDS:g} (gc's minimum retention), got "
                          f"'{options['maintain_gc_retain_s']}'")
    return replace(
        base, pending_records=_positive_int(options, "maintain_pending_records")
        or base.pending_records,
        pending_bytes=_positive_int(options, "maintain_pending_bytes") or base.pending_bytes,
        pending_age_s=_seconds(options, "maintain_pending_age_s", base.pending_age_s, False),
        gc_retain_s=retain)


def _shard_by(options: Mapping[str, str]) -> ShardingRequest | None:
    bucket, identity = options.get("shard_by_bucket"), options.get("shard_by_identity")
    if bucket is None and identity is None and "num_buckets" not in options:
        return None
    return ShardingRequest(bucket_column=(bucket or "").strip() or None,
                           num_buckets=_positive_int(options, "num_buckets"),
                           identity_column=(identity or "").strip() or None).validate()


def _txn(options: Mapping[str, str]) -> Txn | None:
    app_id, version = options.get("txnappid"), options.get("txnversion")
    if app_id is None and version is None:
        return None
    app_id = (app_id or "").strip()
    if not app_id or version is None:
        raise ConfigError("options 'txnAppId' and 'txnVersion' go together: set both (an "
                          f"application id and a version), got txnAppId={app_id!r} "
                          f"txnVersion={version!r}")
    if app_id.startswith(STREAM_KEY_PREFIX):
        raise ConfigError(f"option 'txnAppId' may not start with '{STREAM_KEY_PREFIX}': that "
                          "prefix is reserved for streaming sinks' keys")
    if not version.strip().isdigit():
        raise ConfigError(f"option 'txnVersion' must be a non-negative integer, got '{version}'")
    return Txn(app_id, int(version))


def _positions(options: Mapping[str, str], name: str, keyword: str) -> dict[str, int] | None:
    raw = options.get(name, keyword).strip()
    if raw.lower() == keyword:
        return None
    try:
        parsed = json.loads(raw)
        if not isinstance(parsed, dict):
            raise ValueError("not an object")
        return {str(uuid.UUID(k)): int(v) for k, v in parsed.items()}
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"option '{name}' must be '{keyword}' or a JSON object "
            f"{{\"<shard uuid>\": <position>}}, got '{raw}' ({exc})"
        ) from None


@dataclass(frozen=True)
class StreamStart:
    """Where a new streaming query starts (a checkpoint, once written, decides instead).

    ``kind`` is ``earliest``, ``latest``, ``commit`` (``value`` is a sequence
    number, served first) or ``timestamp`` (``value`` is epoch milliseconds:
    the first record created at or after it is served first).
    """

    kind: str
    value: int = 0


def parse_time_ms(name: str, raw: str, allow_millis: bool) -> int:
    """Epoch milliseconds from ISO-8601 (local time unless it has an offset) or digits."""
    text = raw.strip()
    if allow_millis and text.isdigit():
        return int(text)
    try:
        iso = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
        return int(datetime.fromisoformat(iso).timestamp() * 1000)
    except (ValueError, IndexError, OverflowError, OSError):
        millis = "epoch milliseconds or " if allow_millis else ""
        raise ConfigError(f"option '{name}' must be {millis}an ISO-8601 time such as "
                          f"2026-01-31T12:00:00Z, got '{raw}'") from None


def _stream_start(options: Mapping[str, str]) -> StreamStart | None:
    commit, stamp = options.get("starting_commit"), options.get("starting_timestamp")
    if commit is not None and stamp is not None:
        raise ConfigError("set one of options 'starting_commit' and 'starting_timestamp', "
                          "not both")
    if stamp is not None:
        return StreamStart("timestamp", parse_time_ms("starting_timestamp", stamp, True))
    if commit is None:
        return None
    value = commit.strip().lower()
    if value in ("earliest", "latest"):
        return StreamStart(value)
    if value.isdigit():
        if int(value) < 1:
            raise ConfigError(f"option 'starting_commit' must be a commit sequence number >= 1 "
                              f"(records are numbered from 1), got '{commit}'")
        return StreamStart("commit", int(value))
    try:
        return StreamStart("timestamp", parse_time_ms("starting_commit", commit, False))
    except ConfigError:
        raise ConfigError(f"option 'starting_commit' must be 'earliest', 'latest', a commit "
                          f"sequence number or an ISO-8601 time such as 2026-01-31T12:00:00Z, "
                          f"got '{commit}'") from None


@dataclass(frozen=True)
class ReadOptions:
    """Everything a batch or streaming read needs, validated."""

    path: str
    isolation: str
    shards: tuple[str, ...] | None
    starting: dict[str, int] | None
    ending: dict[str, int] | None
    metadata_columns: bool
    max_entries_per_partition: int
    max_entries_per_trigger: int | None
    max_rows_per_trigger: int | None
    storage: dict[str, str] = field(repr=False)
    stream_start: StreamStart | None = None  # None: not set (a stream starts at the earliest)
    view: str = "tail"
    # max_entries_per_partition was set: a batch read splits by entries, not bytes.
    split_by_entries: bool = False
    max_bytes_per_partition: int = MAX_PARTITION_BYTES
    min_partitions: int | None = None  # None: twice the planner's cores
    read_threads: int | None = None  # None: READ_THREADS on object stores, 1 on local disk

    @property
    def committed(self) -> bool:
        """True for ``read_committed``."""
        return self.isolation == "read_committed"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Validate every read option; raise :class:`ConfigError` naming the bad one."""
        opts = {k.lower(): v for k, v in options.items()}
        check_known(opts, READS, "read")
        isolation = opts.get("isolation", "read_committed").lower()
        if isolation not in ISOLATION_LEVELS:
            raise ConfigError(f"option 'isolation' must be one of {ISOLATION_LEVELS}, "
                              f"got '{opts['isolation']}'")
        view = opts.get("view", "tail").strip().lower()
        if view not in VIEWS:
            raise ConfigError(f"option 'view' must be one of {VIEWS}, got '{opts['view']}'")
        if view == "table":
            clash = [k for k in ("isolation", "shards", "starting_positions", "ending_positions",
                                 "metadata_columns") if k in opts]
            if clash:
                raise ConfigError(f"option 'view=table' reads the whole table; it cannot be "
                                  f"combined with {clash} (those select parts of the WAL tail)")
        shards = None
        if opts.get("shards"):
            try:
                shards = tuple(str(uuid.UUID(s.strip())) for s in opts["shards"].split(",")
                               if s.strip())
            except ValueError:
                raise ConfigError(f"option 'shards' must list shard UUIDs, got "
                                  f"'{opts['shards']}'") from None
        return cls(
            path=table_path(opts), isolation=isolation, shards=shards,
            starting=_positions(opts, "starting_positions", "earliest"),
            ending=_positions(opts, "ending_positions", "latest"),
            metadata_columns=flag(opts, "metadata_columns"),
            max_entries_per_partition=_positive_int(opts, "max_entries_per_partition") or 64,
            max_entries_per_trigger=_positive_int(opts, "max_entries_per_trigger"),
            max_rows_per_trigger=_positive_int(opts, "max_rows_per_trigger"),
            storage=storage_options(opts),
            stream_start=_stream_start(opts),
            view=view,
            split_by_entries="max_entries_per_partition" in opts,
            max_bytes_per_partition=(_positive_int(opts, "max_bytes_per_partition")
                                     or MAX_PARTITION_BYTES),
            min_partitions=_positive_int(opts, "min_partitions"),
            read_threads=_positive_int(opts, "read_threads"),
        )
