"""Bytes on storage: every encoding the table holds, and no protocol.

Lance's MemWAL format (bit-reversed names, WAL entries as Arrow IPC streams, the
``ShardManifest`` protobuf), the base table's MemWAL index as the base manifest
stores it, and this package's own records (commit records, checkpoints, lease
records) and table schema rules. A function here turns bytes into values and
back; it decides nothing about who may write what.

May import: :mod:`memwal_datasource.errors`, :mod:`memwal_datasource.store`.
"""
