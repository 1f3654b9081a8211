"""Spark glue: the ``memwal`` data source (thin layer over the Spark-free core)."""

from .compact import compact
from .routing import partition_for_table
from .source import MemWalDataSource

__all__ = ["MemWalDataSource", "compact", "partition_for_table"]
