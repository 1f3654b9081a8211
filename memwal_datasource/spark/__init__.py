"""Spark glue: the ``memwal`` data source (thin layer over the Spark-free core).

Names are loaded on first use (PEP 562): Spark's Python workers import this
package to unpickle a writer or reader, and should not pay for the
compaction job's or the router's modules.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the submodule that defines it.
_EXPORTS = {
    "MemWalDataSource": "source",
    "compact": "compaction",
    "partition_for_table": "routing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
