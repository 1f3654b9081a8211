"""The table's commit log: which WAL entries are committed, exactly once.

Commit records and checkpoints in one put-if-absent sequence (``commit``),
reading and folding them (``commit_reader``, ``commit_folds``), group commit's
intents (``commit_intents``), stream readers' holds on the log (``holds``) and
compaction rounds' markers (``rounds``). docs/protocol.md states the
invariants every step here keeps.

May import: ``shard``, ``format``, ``store`` and the top-level modules.
"""
