"""When automatic maintenance runs: the thresholds, in a module light enough for Spark's
planner to import (no compaction, numpy or lance)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PENDING_RECORDS = 64
DEFAULT_PENDING_BYTES = 64 << 20
DEFAULT_PENDING_AGE_S = 300.0
DEFAULT_GC_RETAIN_S = 3600.0  # gc's own default (maintenance.gc.DEFAULT_RETAIN_SECONDS)
DEFAULT_GC_EVERY_S = 600.0
DEFAULT_CHECK_EVERY_S = 10.0
DEFAULT_LEASE_TTL_S = 60.0


@dataclass(frozen=True)
class Thresholds:
    """Compaction runs once any ``pending_*`` bound is passed; gc after it, at most every
    ``gc_every_s`` (judged from the last gc any maintainer recorded), with retention
    ``gc_retain_s``. A background maintainer looks at the backlog at most every
    ``check_every_s``; its lease lives ``lease_ttl_s`` without renewal (a killed
    maintainer's work is taken over that long after)."""

    pending_records: int = DEFAULT_PENDING_RECORDS
    pending_bytes: int = DEFAULT_PENDING_BYTES
    pending_age_s: float = DEFAULT_PENDING_AGE_S
    gc_retain_s: float = DEFAULT_GC_RETAIN_S
    gc_every_s: float = DEFAULT_GC_EVERY_S
    check_every_s: float = DEFAULT_CHECK_EVERY_S
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    max_rounds: int = 16  # rounds per pass: a pass that ends lets the lease go to others
    max_records_per_round: int = 256  # as memwal compact's default

    def passed(self, pending_records: int, pending_bytes: int,
               oldest_age_s: float | None) -> str:
        """Which bound the backlog passed, for the log (``""``: none)."""
        if not pending_records:
            return ""
        if pending_records >= self.pending_records:
            return f"{pending_records} pending commit records >= {self.pending_records}"
        if pending_bytes >= self.pending_bytes:
            return f"{pending_bytes} pending bytes >= {self.pending_bytes}"
        if oldest_age_s is not None and oldest_age_s >= self.pending_age_s:
            return f"oldest pending commit {oldest_age_s:.0f}s old >= {self.pending_age_s:g}s"
        return ""
