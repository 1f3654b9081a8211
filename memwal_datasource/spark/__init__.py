"""Spark glue: the ``memwal`` data source (thin layer over the Spark-free core)."""

from .source import MemWalDataSource

__all__ = ["MemWalDataSource"]
