"""What Lance's own readers see of a memwal table, and the call that hands LanceDB
the committed view.

LanceDB, ``lance.dataset(...)`` and an ``LsmScanner`` built from the shard
manifests (the spec's way) read the **base table**: exactly the rows
compaction committed, as of the last compaction. They never see an SSTable
(every shard opened in MemTable mode is hidden first, see
:func:`memwal_datasource.write.native.hide_shard`) and never read WAL entries, so a
running, failed or fenced attempt's rows never show there, deletes are
applied and no row shows twice. To see every committed row, compact:
:func:`lancedb_table` does that and opens the table in LanceDB.
"""

from __future__ import annotations

from collections.abc import Mapping

from .memwal_table import MemWalTable
from .options import lance_storage_options


def split_table_uri(uri: str) -> tuple[str, str]:
    """``(database uri, table name)`` as LanceDB names a table: ``/d/t.lance`` is
    table ``t`` of database ``/d``."""
    base = uri.rstrip("/")
    parent, _, leaf = base.rpartition("/")
    if not leaf or not parent:
        raise ValueError(f"'{uri}' is not a table path: give '<database dir>/<name>.lance'")
    return parent, leaf[:-len(".lance")] if leaf.endswith(".lance") else leaf


def lancedb_table(uri: str, storage_options: Mapping[str, str] | None = None, *,
                  fresh: bool = True):
    """The memwal table at ``uri`` as a LanceDB table showing exactly the committed rows.

    With ``fresh`` (the default) it first compacts (:func:`memwal_datasource.compact`),
    so the table holds every row committed before the call; LanceDB reads the
    base table, and nothing uncommitted is ever in it. ``fresh=False`` opens
    it as it is: exactly the rows committed as of the last compaction. Needs
    the ``lancedb`` package.
    """
    try:
        import lancedb
    except ImportError:
        raise ImportError("lancedb_table needs the lancedb package: pip install lancedb"
                          ) from None
    if fresh:
        MemWalTable(uri, storage_options).compact()
    parent, name = split_table_uri(uri)
    opts = lance_storage_options(storage_options)
    db = lancedb.connect(parent, storage_options=opts or None)
    return db.open_table(name)
