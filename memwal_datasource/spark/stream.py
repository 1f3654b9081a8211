"""The WAL as a Spark streaming source.

An offset is ``{"commit": S, "positions": {shard: next position}}``: every
commit record up to sequence ``S`` has been served, and ``positions`` says
where each shard stands (for people and progress reports). Progress follows
commit records rather than raw positions on purpose: a job's record can land
after a later job's record for the same shard, and a position-only offset
would skip it. Each micro-batch serves the ranges of the records after the
start offset, so only committed entries are served, each exactly once, and a
restart from the checkpoint resumes exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader

from ..commit import CommitLog
from ..store import open_store
from .options import ReadOptions
from .reader import WalRange, read_partition, split


class MemWalStreamReader(DataSourceStreamReader):
    """Serves committed WAL entries micro-batch by micro-batch."""

    def __init__(self, opts: ReadOptions, table_schema: pa.Schema):
        self.opts = opts
        self.table_schema = table_schema
        self._log: CommitLog | None = None

    @property
    def log(self) -> CommitLog:
        if self._log is None:  # created lazily: this object is pickled
            self._log = CommitLog(open_store(self.opts.path, self.opts.storage))
        return self._log

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_log"] = None
        return state

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        return {"commit": 0, "positions": {}}

    def getDefaultReadLimit(self):  # noqa: N802
        from pyspark.sql.datasource import ReadAllAvailable

        try:
            from pyspark.sql.streaming.datasource import ReadMaxRows
        except ImportError:  # pragma: no cover - older pyspark
            return ReadAllAvailable()
        if self.opts.max_rows_per_trigger:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:  # noqa: N802
        start = start or self.initialOffset()
        seq = int(start["commit"])
        positions = dict(start.get("positions", {}))
        max_rows = getattr(limit, "maxRows", None) or getattr(limit, "max_rows", None)
        max_entries = self.opts.max_entries_per_trigger
        rows = entries = 0
        for rec in self.log.records(after=seq):
            if seq > int(start["commit"]) and (
                (max_rows is not None and rows >= max_rows)
                or (max_entries is not None and entries >= max_entries)
            ):
                break
            seq = rec.sequence
            for r in rec.ranges:
                rows += r.rows
                entries += r.last - r.first + 1
                positions[r.shard_id] = max(positions.get(r.shard_id, 1), r.last + 1)
        return {"commit": seq, "positions": positions}

    def reportLatestOffset(self):  # noqa: N802
        return None

    def partitions(self, start: dict, end: dict) -> list[WalRange]:
        parts: list[WalRange] = []
        for seq in range(int(start["commit"]) + 1, int(end["commit"]) + 1):
            # A stream is append-only: an overwrite's new rows are served like
            # any others (the rows it hid were served when they were committed).
            for r in self.log.read(seq).ranges:
                if self.opts.shards is not None and r.shard_id not in self.opts.shards:
                    continue
                parts.extend(split(r.shard_id, r.first, r.last,
                                   self.opts.max_entries_per_partition,
                                   [(r.epoch, r.first, r.last)]))
        return parts

    def read(self, partition: WalRange) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, self.table_schema, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the WAL is retained until a fenced GC removes it."""

    def stop(self) -> None:
        self._log = None
