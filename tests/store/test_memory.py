"""The in-process store (:mod:`memwal_datasource.store.memory`)."""

from __future__ import annotations

import uuid

from memwal_datasource.store import MemoryStore


def test_memory_store_keeps_its_own_copy():
    store = MemoryStore(uuid.uuid4().hex)
    buf = bytearray(b"abc")
    store.put_if_absent("k", buf)
    buf[0:1] = b"X"  # the writer reuses its buffer
    assert store.get("k") == b"abc"
