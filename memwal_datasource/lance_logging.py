"""Lance's logging, made fit for users before ``lance`` is first imported.

* pylance reads ``LANCE_LOG`` (Rust ``env_logger`` syntax) for its Rust side
  and hands its first bare level to Python's ``logging``; ``off``, which Rust
  accepts, is not a Python level name and crashed any import of ``lance``
  (``ValueError: Unknown level: 'OFF'``). We register ``OFF`` as a level above
  ``CRITICAL``.
* Compaction's ``merge_insert`` makes Lance log ``ERROR lance::index] Index
  __lance_mem_wal has no fields`` on every run: harmless (the MemWAL system
  index has no columns by design). When ``LANCE_LOG`` is unset we default it to
  Lance's own default (errors) minus that module's noise. A user who sets
  ``LANCE_LOG`` gets exactly what they asked for.
"""

from __future__ import annotations

import logging
import os

QUIET_DEFAULT = "error,lance::index=off"


def prepare() -> None:
    """Apply both rules (idempotent; effective only before ``lance`` is imported)."""
    if logging.getLevelName("OFF") != logging.CRITICAL + 10:
        logging.addLevelName(logging.CRITICAL + 10, "OFF")
    os.environ.setdefault("LANCE_LOG", QUIET_DEFAULT)


prepare()
