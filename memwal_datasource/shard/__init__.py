"""One shard's log: its manifests, its WAL entries, and who may write them.

Claiming a shard's epoch and the fence (``manifest``), appending and tailing
WAL entries (``wal``), the WAL-only shard writer (``writer``, over the
interface in ``writer_base``), and the leases that give one job a shard at a
time (``leases``, ``lease_holding``). Nothing here knows about commits: a WAL
entry is committed only once the commit log names it.

May import: ``format``, ``store`` and the package's top-level modules
(``errors``, ``hooks``, ``config``, ``options``).
"""
