"""The ``memwal`` format, registered by Spark itself.

PySpark 4.x looks, when a session first needs a Python data source, for
installed top-level modules named ``pyspark_*`` and registers each one's
``DefaultSource`` under its ``name()``. This module is that hook, so
``spark.read.format("memwal")`` and ``df.write.format("memwal")`` work in any
new session without ``spark.dataSource.register(MemWalDataSource)`` (which
keeps working).
"""

from memwal_datasource.spark.source import MemWalDataSource as DefaultSource

__all__ = ["DefaultSource"]
