"""Writing a table: shard writers in both modes, the kept-writer pool, re-homes.

``shard_writer.open_shard_writer`` picks the WAL-only writer
(:mod:`memwal_datasource.shard.writer`) or pylance's native MemTable writer
(``native``); ``writer_pool`` keeps a process's writers open between jobs;
``rehome`` writes a primary-key job's overtaken shards again at their tip.

May import: ``table``, ``log``, ``shard``, ``format``, ``store`` and the
top-level modules. Not ``maintenance``: writers never wait for it.
"""
