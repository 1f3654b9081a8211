"""A table as readers and writers see it: the committed view and the table's facts.

``view`` joins the base Lance table, the commit log and the shard manifests
into the rows a reader sees (``read_table``, ``TableView``); ``sharding``
holds the table's sharding spec and shard routing; ``table_info`` the facts a
write checks before it starts (schema, primary key, field ids).

May import: ``log``, ``shard``, ``format``, ``store`` and the top-level modules.
"""
