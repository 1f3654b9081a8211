"""Keeping a table small: compaction into the base table and garbage collection.

``compact`` folds committed WAL entries into the base Lance table in rounds
(``merge_join`` picks how a primary-key round joins the base); ``gc`` deletes
what compaction made unneeded, behind the rules of docs/protocol.md. Every
step is safe to crash after and safe against a stalled process waking up.

May import: ``table``, ``log``, ``shard``, ``format``, ``store`` and the
top-level modules. Not ``write``.
"""
