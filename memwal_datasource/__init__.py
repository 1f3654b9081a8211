"""memwal_datasource: Spark <-> Lance MemWAL.

The Spark-free core, in layers; each imports only the layers below it
(``tests/test_imports.py`` keeps it so):

====================  ==========================================================
``cli``               the ``memwal`` command
``spark``             the Spark data source (writer, readers, stream, compaction)
``memwal_table``      the public table object; ``lance_readers`` for pylance/LanceDB
``maintenance``       compaction and garbage collection
``write``             shard writers in both modes, the kept-writer pool, re-homes
``table``             the committed view of a table, sharding, table facts
``log``               the commit log: records, checkpoints, intents, holds, rounds
``shard``             one shard's manifests, WAL entries and leases
``format``            encodings of everything on storage
``store``             object stores (local disk, memory, S3, GCS, Azure)
top-level modules     ``errors``, ``hooks``, ``config``, ``options``
====================  ==========================================================

Importing the package loads only the errors and the writer configuration:
every other public name is loaded on first use (PEP 562), so a Spark worker's
``import memwal_datasource`` pays for neither compaction nor pyarrow, numpy,
lance or pandas.
"""

from __future__ import annotations

import logging
from importlib import import_module as _import_module

# Prepares LANCE_LOG before anything calls into lance (lance is imported lazily).
from . import lance_logging  # noqa: F401, I001
from .config import ShardWriterConfig
from .errors import (
    CollectedError,
    CommitRefused,
    CompactionError,
    ConfigError,
    Fenced,
    MemWalError,
    MissingEntryError,
    ShardSealedError,
    WriterPoisoned,
)

# A library configures no logging: records go to whatever the application set up
# (Python's "Configuring Logging for a Library"). The NullHandler also tells the
# Spark writer's fallback (a handler of its own where nothing is configured) that
# logging is taken care of.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"
__all__ = [
    "CollectedError",
    "CommitRefused",
    "CompactionError",
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

# Public name -> the submodule defining it, imported on first use.
_LAZY = {
    "MemWalDataSource": "spark",
    "MemWalTable": "memwal_table",
    "compact": "memwal_table",
    "lancedb_table": "lance_readers",
    "open_shard_writer": "write.shard_writer",
    "read_table": "table.view",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memwal_datasource' has no attribute '{name}'")
    value = getattr(_import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
