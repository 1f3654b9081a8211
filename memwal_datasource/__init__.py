"""memwal_datasource: Spark <-> Lance MemWAL.

The Spark-free core (``store``, ``format``, ``manifest``, ``wal``, ``writer``,
``commit``) imports no Spark; ``MemWalDataSource`` is imported lazily so the
core and the CLI stay light.
"""

from __future__ import annotations

import logging

# Loaded before ``def compact`` below: importing a submodule the first time binds its
# name on the package, which would replace the function with the module.
from . import compact as _compact_module  # noqa: F401

# Prepares LANCE_LOG before anything calls into lance (lance is imported lazily).
from . import lance_logging  # noqa: F401, I001
from .config import ShardWriterConfig
from .errors import (
    CollectedError,
    CommitRefused,
    ConfigError,
    Fenced,
    MemWalError,
    MissingEntryError,
    ShardSealedError,
    WriterPoisoned,
)
from .lance_readers import lancedb_table
from .table import MemWalTable, read_table
from .writer import open_shard_writer

# A library configures no logging: records go to whatever the application set up
# (Python's "Configuring Logging for a Library"). The NullHandler also tells the
# Spark writer's fallback (a handler of its own where nothing is configured) that
# logging is taken care of.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"
__all__ = [
    "CollectedError",
    "CommitRefused",
    "ConfigError",
    "Fenced",
    "MemWalDataSource",
    "MemWalError",
    "MemWalTable",
    "MissingEntryError",
    "ShardSealedError",
    "ShardWriterConfig",
    "WriterPoisoned",
    "compact",
    "lancedb_table",
    "open_shard_writer",
    "read_table",
]


def compact(uri: str, storage_options=None, **kwargs):
    """Fold committed WAL entries into the base Lance table, exactly once.

    Keyword arguments go to :func:`memwal_datasource.compact.compact`
    (``max_records_per_round``, ``max_rounds``, ``dry_run``, ``progress``).
    """
    from .compact import compact as run

    return run(MemWalTable(uri, storage_options), **kwargs)


def __getattr__(name: str):
    if name == "MemWalDataSource":
        from .spark import MemWalDataSource

        return MemWalDataSource
    raise AttributeError(f"module 'memwal_datasource' has no attribute '{name}'")
