"""Every Spark option of the ``memwal`` format, declared once.

Each :class:`Option` row (name, kind, default, scopes, description) drives
the unknown-option check and its error, the option reference docs/options.md
quotes (``tests/spark/test_option_table.py`` keeps them equal), and ``memwal
options`` in the CLI. :mod:`memwal_datasource.spark.options` parses the
values; the shard writer's knobs come from
:class:`~memwal_datasource.config.ShardWriterConfig` (Lance's names,
defaults and ranges), so they are not repeated here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from difflib import get_close_matches

from ..config import CHOICES, RANGES, ShardWriterConfig
from ..errors import ConfigError
from ..maintenance.thresholds import (
    DEFAULT_GC_RETAIN_S,
    DEFAULT_PENDING_AGE_S,
    DEFAULT_PENDING_BYTES,
    DEFAULT_PENDING_RECORDS,
)
from ..options import STORAGE_PREFIX
from ..shard.leases import DEFAULT_TTL_S
from ..table.tail_scan import MAX_PARTITION_BYTES, READ_THREADS

WRITE, STREAM_WRITE, READ, STREAM_READ = "write", "stream write", "read", "stream read"
WRITES = (WRITE, STREAM_WRITE)
READS = (READ, STREAM_READ)
# How long a task waits for a shard another job holds, unless option 'lease_wait_s' says.
DEFAULT_LEASE_WAIT_S = 60.0
# Keys Spark itself adds (catalog table properties, the sink's checkpoint).
SPARK_KEYS = frozenset({"owner", "provider", "location", "external", "is_managed_location",
                        "comment", "checkpointlocation"})


@dataclass(frozen=True)
class Option:
    """One option: ``name`` as documented (Spark lower-cases keys), its value kind,
    documented default (empty: unset), the scopes that accept it, a description."""

    name: str
    kind: str
    default: str
    scopes: tuple[str, ...]
    doc: str

    @property
    def key(self) -> str:
        """The key Spark hands a source (lower case)."""
        return self.name.lower()


_CONFIG_DOCS = {
    "durable_write": "a put returns once its rows are in a durable WAL entry (Spark's default "
                     "false: a task's rows are durable before its commit message exists)",
    "max_wal_buffer_size": "bytes: cut a WAL entry once at least this much is queued",
    "max_wal_flush_interval_ms": "cut a WAL entry at least this often",
    "max_wal_persist_retries": "retries of one WAL PUT (same key, same bytes; WAL-only mode)",
    "wal_persist_retry_base_delay_ms": "first retry delay, doubled per retry (WAL-only mode)",
    "max_memtable_size": "MemTable mode: flush the MemTable to an SSTable at this many bytes",
    "max_memtable_rows": "MemTable mode: flush at this many rows",
    "max_memtable_batches": "MemTable mode: flush at this many batches",
    "max_unflushed_memtable_bytes": "bytes queued and not yet durable before a put blocks "
                                    "(Spark WAL-only default: 2 x max_wal_buffer_size)",
    "enable_memtable": "MemTable mode (pylance's native writer, SSTables); unset: true exactly "
                       "when the table has a primary key",
    "backpressure_timeout_ms": "a put waiting on a pipeline that makes no progress fails "
                               "after this long (WAL-only mode)",
    "wal_compression": "Arrow IPC compression of WAL entries (WAL-only mode); 'auto': zstd on "
                       "object stores, none on local disk (pylance and every IPC reader decode "
                       "all three)",
}


def _config_rows() -> tuple[Option, ...]:
    rows = []
    defaults = ShardWriterConfig()
    for f in fields(ShardWriterConfig):
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            kind = "bool"
            default = "auto" if f.name == "enable_memtable" else str(value).lower()
        elif f.name in CHOICES:
            kind, default = "|".join(CHOICES[f.name]), value
        else:
            lo, hi = RANGES[f.name]
            kind, default = f"int {lo}..{hi}", str(value)
        rows.append(Option(f.name, kind, default, WRITES, _CONFIG_DOCS[f.name]))
    return tuple(rows)


OPTIONS: tuple[Option, ...] = (
    Option("path", "uri", "", WRITES + READS,
           "the Lance table: local path, file://, s3://, gs://bucket/prefix, az://container/prefix "
           "(.save(path)/.load(path))"),
    Option("create_table", "bool", "true", WRITES, "create the table if it is missing"),
    Option("primary_key", "columns", "", WRITES,
           "comma-separated primary-key columns, when the table is created"),
    Option("shard_by_bucket", "column", "", WRITES,
           "when creating the table: Lance's bucket(column, num_buckets) sharding spec"),
    Option("num_buckets", "int 1..1024", "", WRITES, "with shard_by_bucket: the number of shards"),
    Option("shard_by_identity", "column", "", WRITES,
           "when creating the table: one shard per value of the column (Lance's identity spec)"),
    Option("operation", "upsert|delete", "upsert", WRITES,
           "'delete' writes delete markers for the primary keys in the DataFrame"),
    Option("writer_group", "name", "default", WRITES,
           "the shard pool; concurrent jobs share one safely, so set it only to keep a job's "
           "shards apart"),
    Option("num_shards", "int >= 1", "", WRITES,
           "at most this many shards in the writer group; tasks take turns on them (unset: as "
           "many as tasks write at once)"),
    Option("lease_wait_s", "seconds >= 0", f"{DEFAULT_LEASE_WAIT_S:g}", WRITES,
           "how long a task waits for a shard another live job holds, then fails naming it "
           "(0: at once)"),
    Option("lease_ttl_s", "seconds > 0", f"{DEFAULT_TTL_S:g}", WRITES,
           "a shard lease's life without renewal; a crashed task's shard frees after it"),
    Option("keep_writers", "bool", "true", WRITES,
           "a task's shard writer stays open in its Python worker for the next task that "
           "leases the same shard (WAL-only tables without a primary key): no epoch claim, "
           "sentinel or replay move per append; placement is unchanged, retried attempts "
           "claim anew, an idle kept writer's shard is free to any task, and kept writers "
           "retire after 15 s idle or 60 s"),
    Option("txnAppId", "text", "", (WRITE,),
           "idempotency key, with txnVersion (Delta's names): a re-run commits nothing"),
    Option("txnVersion", "int >= 0", "", (WRITE,), "idempotency version, with txnAppId"),
    Option("query_id", "text", "", (STREAM_WRITE,),
           "the stream's identity for exactly-once commits (unset: from checkpointLocation)"),
    Option("merge_schema", "bool", "false", WRITES,
           "add the DataFrame's columns the table lacks (nullable; Lance's add_columns, nulls "
           "for existing rows) before the tasks write; a changed type is still refused"),
    Option("auto_maintain", "bool", "", WRITES,
           "compaction and then gc in the background of the driver's Python commit worker "
           "once the backlog passes a maintain_* threshold (one maintainer per table); unset: "
           "true for writeStream, false for write"),
    Option("maintain_pending_records", "int >= 1", str(DEFAULT_PENDING_RECORDS), WRITES,
           "auto_maintain: compact once this many commit records are pending"),
    Option("maintain_pending_bytes", "int >= 1", str(DEFAULT_PENDING_BYTES), WRITES,
           "auto_maintain: compact once the pending records hold this many Arrow bytes"),
    Option("maintain_pending_age_s", "seconds > 0", f"{DEFAULT_PENDING_AGE_S:g}", WRITES,
           "auto_maintain: compact once the oldest pending commit record is this old"),
    Option("maintain_gc_retain_s", "seconds >= 30", f"{DEFAULT_GC_RETAIN_S:g}", WRITES,
           "auto_maintain: gc's retention (memwal gc --retain-hours, in seconds)"),
    *_config_rows(),
    Option("view", "tail|table", "tail", (READ,),
           "'tail': committed rows not yet compacted; 'table': the whole table (base Lance "
           "table plus the committed tail, newest row per primary key)"),
    Option("isolation", "read_committed|read_uncommitted", "read_committed", (READ,),
           "read_uncommitted shows every durable WAL entry, committed or not"),
    Option("shards", "shard ids", "", READS, "comma-separated shard UUIDs to read (unset: all)"),
    Option("starting_positions", "earliest|JSON", "earliest", (READ,),
           "JSON {shard: first WAL position}"),
    Option("ending_positions", "latest|JSON", "latest", (READ,),
           "JSON {shard: last WAL position}"),
    Option("metadata_columns", "bool", "false", READS,
           "add _shard_id, _wal_position, _writer_epoch and _tombstone (delete markers shown)"),
    Option("max_entries_per_partition", "int >= 1", "", READS,
           "split a shard's range into Spark partitions of this many WAL entries (unset: a "
           "batch read splits by bytes, a stream by 64 entries)"),
    Option("max_bytes_per_partition", "int >= 1", str(MAX_PARTITION_BYTES), (READ,),
           "a batch read's partition holds about this many bytes at most (WAL entries as "
           "commit records count them, base data files)"),
    Option("min_partitions", "int >= 1", "", (READ,),
           "spread a batch read over about this many partitions, fewer if it is small (unset: "
           "twice the driver's cores); small entries and shards share partitions"),
    Option("read_threads", "int >= 1", "", READS,
           "WAL entries a task fetches at once, in order, a bounded window ahead (unset: "
           f"{READ_THREADS} on an object store; local disk reads one at a time, faster than a "
           "thread hand-off)"),
    Option("starting_commit", "earliest|latest|sequence|time", "earliest", (STREAM_READ,),
           "where a new query starts: a commit sequence number, or an ISO-8601 time"),
    Option("starting_timestamp", "epoch ms|ISO-8601", "", (STREAM_READ,),
           "start at the first commit record created at or after this time"),
    Option("max_entries_per_trigger", "int >= 1", "", (STREAM_READ,),
           "at most this many WAL entries per micro-batch (whole records)"),
    Option("max_rows_per_trigger", "int >= 1", "", (STREAM_READ,),
           "at most this many rows per micro-batch (whole records)"),
    Option("poll_interval_ms", "int", "", (STREAM_READ,),
           "accepted for compatibility; Spark's trigger decides"),
)
BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}


def options_for(scopes: tuple[str, ...]) -> dict[str, Option]:
    """The options any of ``scopes`` accepts, by key."""
    return {o.key: o for o in OPTIONS if set(o.scopes) & set(scopes)}


# Storage option names people pass without Spark's ``storage.`` prefix.
_STORAGE_STARTS = ("aws_", "azure_", "google_", "gcs_", "s3_")
_STORAGE_NAMES = frozenset({"endpoint", "region", "allow_http", "access_key_id",
                            "secret_access_key", "session_token"})


def suggestion(key: str, allowed: Mapping[str, Option]) -> str | None:
    """The option ``key`` was probably meant to be (difflib), or ``None``."""
    if key.startswith(_STORAGE_STARTS) or key in _STORAGE_NAMES:
        return f"{STORAGE_PREFIX}{key}"
    squashed = {k.replace("_", ""): k for k in allowed}
    close = (get_close_matches(key, list(allowed), n=1, cutoff=0.75)
             or [squashed[m] for m in get_close_matches(key.replace("_", ""), list(squashed),
                                                       n=1, cutoff=0.75)])
    return allowed[close[0]].name if close else None


def check_known(options: Mapping[str, str], scopes: tuple[str, ...], what: str) -> None:
    """Refuse a key no scope in ``scopes`` accepts: suggest the close one, or say where
    the key belongs, or where the option list is."""
    allowed = options_for(scopes)
    for key in options:
        if key.startswith(STORAGE_PREFIX) or key in allowed or key in SPARK_KEYS:
            continue
        if key in BY_KEY:
            raise ConfigError(
                f"unknown {what} option '{key}' (it is a {' / '.join(BY_KEY[key].scopes)} "
                f"option); drop it from this {what}")
        close = suggestion(key, allowed)
        if close:
            raise ConfigError(f"unknown {what} option '{key}': did you mean '{close}'? "
                              "(`memwal options` lists every option)")
        raise ConfigError(
            f"unknown {what} option '{key}': see `memwal options` (or docs/options.md's option "
            f"table) for the {what} options, or use '{STORAGE_PREFIX}<name>' for a storage "
            "option (e.g. storage.aws_endpoint)")


def flag(options: Mapping[str, str], name: str) -> bool:
    """A boolean option: ``true`` or ``false`` (any case), as every boolean here is parsed."""
    option = BY_KEY[name]
    raw = options.get(option.key, option.default)
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option '{option.name}' must be true or false, got '{raw}'")
    return value == "true"


def markdown() -> str:
    """The option reference as a Markdown table (docs/options.md quotes it)."""
    lines = ["| option | scope | value | default | meaning |", "|---|---|---|---|---|"]
    for o in OPTIONS:
        default = f"`{o.default}`" if o.default else "unset"
        lines.append(f"| `{o.name}` | {', '.join(o.scopes)} | {o.kind} | {default} | "
                     f"{o.doc} |")
    lines.append(f"| `{STORAGE_PREFIX}<name>` | all | text | unset | a storage option with "
                 "Lance's names (aws_endpoint, google_service_account, "
                 "azure_storage_account_name, ...), passed to pylance and our store client; "
                 "credentials are never logged |")
    return "\n".join(lines)
