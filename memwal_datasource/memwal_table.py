"""The user's table object: :class:`MemWalTable`, the read view plus maintenance.

:class:`~memwal_datasource.table.view.TableView` is what readers, the compactor and
the garbage collector see; :class:`MemWalTable` adds the verbs that run them
(as delta-rs's ``DeltaTable``: ``optimize``, ``vacuum``, ``history``), so it
sits above :mod:`memwal_datasource.maintenance.compact` and :mod:`memwal_datasource.maintenance.gc`
and nothing below imports it.
"""

from __future__ import annotations

from collections.abc import Mapping

from .maintenance.backlog import Backlog, backlog
from .maintenance.compact import CompactionSummary
from .maintenance.compact import compact as run_compaction
from .maintenance.gc import GcPlan, collect
from .table.view import TableView


class MemWalTable(TableView):
    """A memwal table: read it, compact it, collect its garbage, list its history.

    Everything :class:`~memwal_datasource.table.view.TableView` reads, plus
    :meth:`compact`, :meth:`gc` and :meth:`stats`.
    """

    def stats(self, full: bool = True) -> Backlog:
        """The backlog: pending commit records, rows, bytes and the oldest one's age; with
        ``full``, WAL objects and bytes per shard, checkpoints, stream holds and pending
        commit intents; and the last compaction and gc (``Backlog.to_json()`` is the
        ``backlog`` object of ``memwal inspect --json``, see docs/operations.md)."""
        return backlog(self, full=full)

    def compact(self, **kwargs) -> CompactionSummary:
        """Fold committed WAL entries into the base table, exactly once.

        Keyword arguments go to :func:`memwal_datasource.maintenance.compact.compact`
        (``max_records_per_round``, ``max_bytes_per_round``, ``max_rounds``, ``dry_run``,
        ``progress``).
        """
        return run_compaction(self, **kwargs)

    def gc(self, **kwargs) -> GcPlan:
        """Delete what compaction made unnecessary (see :mod:`memwal_datasource.maintenance.gc`).

        Keyword arguments go to :func:`memwal_datasource.maintenance.gc.collect`
        (``retain_seconds``, ``retain_manifest_versions``, ``dry_run``, ``progress``).
        """
        return collect(self, **kwargs)


def compact(uri: str, storage_options: Mapping[str, str] | None = None,
            **kwargs) -> CompactionSummary:
    """Fold committed WAL entries into the base Lance table at ``uri``, exactly once.

    Keyword arguments go to :func:`memwal_datasource.maintenance.compact.compact`
    (``max_records_per_round``, ``max_bytes_per_round``, ``max_rounds``, ``dry_run``,
    ``progress``).
    """
    return MemWalTable(uri, storage_options).compact(**kwargs)
