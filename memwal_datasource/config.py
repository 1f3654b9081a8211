"""ShardWriter configuration: Lance's names and defaults, validated up front.

Validation runs before any claim, so a doomed open never fences a healthy
writer. Which knobs apply where:

=============================== ============== =================================
field                           WAL-only mode  MemTable mode (pylance native)
=============================== ============== =================================
durable_write                   yes            yes
max_wal_buffer_size             yes            yes
max_wal_flush_interval_ms       yes            yes
max_wal_persist_retries         yes            passed through if supported
wal_persist_retry_base_delay_ms yes            passed through if supported
max_memtable_size               no             yes
max_memtable_rows               no             yes
max_memtable_batches            no             yes
max_unflushed_memtable_bytes    yes: budget of yes
                                queued, not yet
                                durable bytes
                                (backpressure)
backpressure_timeout_ms         yes (ours)     no
wal_compression                 yes (ours)     no (pylance writes uncompressed entries)
=============================== ============== =================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from .errors import ConfigError

MiB = 1024 * 1024
GiB = 1024 * MiB

# (minimum, maximum) of each integer field.
RANGES: dict[str, tuple[int, int]] = {
    "max_wal_buffer_size": (1, 4 * GiB),
    "max_wal_flush_interval_ms": (0, 3_600_000),
    "max_wal_persist_retries": (0, 100),
    "wal_persist_retry_base_delay_ms": (0, 60_000),
    "max_memtable_size": (1, 64 * GiB),
    "max_memtable_rows": (1, 1 << 40),
    "max_memtable_batches": (1, 1 << 30),
    "max_unflushed_memtable_bytes": (1, 1 << 50),
    "backpressure_timeout_ms": (1, 86_400_000),
}
# The values of each string field: 'auto' compresses WAL entries on object stores only.
CHOICES: dict[str, tuple[str, ...]] = {"wal_compression": ("auto", "none", "lz4", "zstd")}


@dataclass(frozen=True)
class ShardWriterConfig:
    """Settings of one shard writer. Names and defaults follow Lance's ShardWriterConfig."""

    durable_write: bool = True
    # WAL-only mode cuts an entry once at least this many Arrow bytes are queued
    # (as Lance does), so an entry may exceed it by up to one batch.
    max_wal_buffer_size: int = 10 * MiB
    max_wal_flush_interval_ms: int = 100
    max_wal_persist_retries: int = 3
    wal_persist_retry_base_delay_ms: int = 50
    max_memtable_size: int = 256 * MiB
    max_memtable_rows: int = 100_000
    max_memtable_batches: int = 8_000
    max_unflushed_memtable_bytes: int = 1 * GiB
    enable_memtable: bool = True
    # Ours: how long a put may wait on a pipeline that makes no progress.
    backpressure_timeout_ms: int = 120_000
    # Ours: Arrow IPC buffer compression of WAL entries. On an object store every byte
    # is sent, stored and read back by compaction, so 'auto' compresses there (zstd);
    # on local disk the page cache takes bytes cheaper than the CPU would.
    wal_compression: str = "auto"

    def wal_codec(self, remote: bool) -> str | None:
        """The IPC codec of this writer's WAL entries on an object store (``remote``) or
        on local disk; ``None``: uncompressed."""
        if self.wal_compression == "auto":
            return "zstd" if remote else None
        return None if self.wal_compression == "none" else self.wal_compression

    def validate(self) -> ShardWriterConfig:
        """Raise :class:`ConfigError` naming the first bad field and its allowed range."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool", bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"'{f.name}' must be true or false, got {value!r}")
                continue
            if f.name in CHOICES:
                if value not in CHOICES[f.name]:
                    raise ConfigError(f"'{f.name}' must be one of {', '.join(CHOICES[f.name])}, "
                                      f"got {value!r}")
                continue
            lo, hi = RANGES[f.name]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ConfigError(
                    f"'{f.name}' must be an integer in [{lo}, {hi}], got {value!r}"
                )
        if self.max_unflushed_memtable_bytes < self.max_wal_buffer_size:
            raise ConfigError(
                f"'max_unflushed_memtable_bytes' ({self.max_unflushed_memtable_bytes}) must be "
                f">= 'max_wal_buffer_size' ({self.max_wal_buffer_size}), or no WAL entry "
                "could ever fill"
            )
        return self

    @classmethod
    def field_names(cls) -> list[str]:
        """Every option name this config accepts."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ShardWriterConfig:
        """Parse string options (as Spark passes them); unknown keys are not ours to judge."""
        kwargs: dict[str, object] = {}
        for f in fields(cls):
            if f.name not in options:
                continue
            raw = str(options[f.name]).strip()
            if f.type in ("bool", bool):
                low = raw.lower()
                if low not in ("true", "false"):
                    raise ConfigError(f"option '{f.name}' must be true or false, got '{raw}'")
                kwargs[f.name] = low == "true"
            elif f.name in CHOICES:
                if raw.lower() not in CHOICES[f.name]:
                    raise ConfigError(f"option '{f.name}' must be one of "
                                      f"{', '.join(CHOICES[f.name])}, got '{raw}'")
                kwargs[f.name] = raw.lower()
            else:
                try:
                    kwargs[f.name] = int(raw)
                except ValueError:
                    lo, hi = RANGES[f.name]
                    raise ConfigError(
                        f"option '{f.name}' must be an integer in [{lo}, {hi}], got '{raw}'"
                    ) from None
        return cls(**kwargs).validate()  # type: ignore[arg-type]
