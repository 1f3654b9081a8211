"""The mode switch: :func:`open_shard_writer` opens a writer of the configured mode.

* ``enable_memtable=False``: our asynchronous batched WAL-only pipeline
  (:class:`~memwal_datasource.shard.writer.WalOnlyShardWriter`).
* ``enable_memtable=True``: pylance's native ShardWriter
  (:class:`~memwal_datasource.write.native.NativeShardWriter`), which owns the
  MemTable, replay on open, SSTable flush and indexes.

Both sit below this module and share :mod:`memwal_datasource.shard.writer_base`.
Opening a writer **writes**: it claims a new epoch on the shard manifest,
fencing any older writer, and may drop a fence sentinel at the WAL tip. A
writer that raises :class:`~memwal_datasource.errors.Fenced` must stop; reopen
only to take the shard back.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from ..config import ShardWriterConfig
from ..format.memwal import FieldId
from ..shard.manifest import ManifestStore
from ..shard.wal import WalAppender
from ..shard.writer import WalOnlyShardWriter
from ..shard.writer_base import ShardWriter
from ..store import ObjectStore, open_store
from ..table.view import lance_field_ids
from .native import NativeShardWriter


def open_shard_writer(
    uri: str,
    shard_id: str,
    schema: pa.Schema,
    config: ShardWriterConfig | None = None,
    storage_options: Mapping[str, str] | None = None,
    *,
    store: ObjectStore | None = None,
    field_ids: Mapping[str, FieldId] | None = None,
    manifests: ManifestStore | None = None,
) -> ShardWriter:
    """Validate ``config``, claim the shard and return a writer of the configured mode.

    WAL-only entries carry the table's Lance field ids as pylance's do:
    ``field_ids`` (from :func:`memwal_datasource.table.view.field_ids`) saves reading
    them from the table at ``uri``; without a Lance table there, entries carry none.
    ``manifests``: the shard's chain as the caller already read it (its store is used).
    """
    config = (config or ShardWriterConfig()).validate()
    if config.enable_memtable:
        return NativeShardWriter.open(uri, shard_id, schema, config, storage_options,
                                      manifests=manifests)
    store = store or (manifests.store if manifests is not None
                      else open_store(uri, storage_options))
    if field_ids is None:
        field_ids = lance_field_ids(uri, storage_options)
    appender = WalAppender.open(
        store, shard_id, schema=schema,
        max_retries=config.max_wal_persist_retries,
        retry_base_delay_ms=config.wal_persist_retry_base_delay_ms,
        manifests=manifests,
    )
    return WalOnlyShardWriter(appender, schema, config, field_ids)
