"""memwal_datasource: Spark <-> Lance MemWAL.

The Spark-free core (``store``, ``format``, ``manifest``, ``wal``, ``writer``,
``commit``) imports no Spark; ``MemWalDataSource`` is imported lazily so the
core and the CLI stay light.
"""

from __future__ import annotations

from .config import ShardWriterConfig
from .errors import ConfigError, Fenced, MemWalError, ShardSealedError, WriterPoisoned
from .writer import open_shard_writer

__version__ = "0.1.0"
__all__ = [
    "ConfigError",
    "Fenced",
    "MemWalDataSource",
    "MemWalError",
    "ShardSealedError",
    "ShardWriterConfig",
    "WriterPoisoned",
    "open_shard_writer",
]


def __getattr__(name: str):
    if name == "MemWalDataSource":
        from .spark import MemWalDataSource

        return MemWalDataSource
    raise AttributeError(f"module 'memwal_datasource' has no attribute '{name}'")
