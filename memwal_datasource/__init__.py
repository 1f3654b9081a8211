"""memwal_datasource: Spark <-> Lance MemWAL.

The Spark-free core (``store``, ``format``, ``manifest``, ``wal``, ``writer``,
``commit``) imports no Spark. Importing the package loads only the errors and
the writer configuration: every other public name is loaded on first use
(PEP 562), so a Spark worker's ``import memwal_datasource`` pays for neither
compaction nor pyarrow, numpy, lance or pandas.
"""

from __future__ import annotations

import logging
import sys as _sys
import types as _types
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
    "open_shard_writer": "shard_writer",
    "read_table": "table",
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


class _Package(_types.ModuleType):
    """Keeps ``memwal_datasource.compact`` the function.

    Importing the submodule ``memwal_datasource.compact`` binds its name on the
    package (the import system's ``setattr``), which would replace the public
    function ``compact(uri)`` with the module; the module stays reachable as
    ``sys.modules["memwal_datasource.compact"]`` and by ``from .compact import``.
    """

    def __setattr__(self, name: str, value) -> None:
        if name == "compact" and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
