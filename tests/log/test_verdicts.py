"""Commit answers stay exact in the log's corners: damaged records, strays, followers.

Every test runs on memory, local disk, the S3 server and both emulators (``backend``).
"""

from __future__ import annotations

import pytest

from memwal_datasource.errors import CorruptEntryError
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, record_key
from memwal_datasource.log.commit_reader import forget_folds


def _commit(log: CommitLog, shard: str, first: int, last: int):
    return log.append(APPEND, [CommittedRange(shard, 1, first, last, rows=last - first + 1)],
                      group=False)


@pytest.mark.parametrize("damage", [b"", b"{\"sequence\": 2", b"not json"])
def test_a_damaged_record_is_refused_naming_it_never_read_as_the_end(any_store, damage):
    log = CommitLog(any_store, checkpoint_interval=None)
    for i in range(3):
        _commit(log, "s", 10 * i + 1, 10 * i + 5)
    good = any_store.get(record_key(2))
    any_store.delete(record_key(2))
    any_store.put(record_key(2), damage)
    forget_folds()
    for read in (lambda c: c.visible(), lambda c: list(c.records()),
                 lambda c: c.read(2)):
        with pytest.raises(CorruptEntryError, match=record_key(2).split("/")[-1]):
            read(CommitLog(any_store, checkpoint_interval=None))
    # A committer never writes past it either: nothing was committed meanwhile.
    with pytest.raises(CorruptEntryError):
        _commit(CommitLog(any_store, checkpoint_interval=None), "s", 100, 101)
    any_store.delete(record_key(2))
    any_store.put(record_key(2), good)
    forget_folds()
    assert [r.first for r in CommitLog(any_store).visible()] == [1, 11, 21]


def test_an_empty_record_error_leads_with_the_fix(memory_store):
    log = CommitLog(memory_store)
    _commit(log, "s", 1, 2)
    memory_store.delete(record_key(1))
    memory_store.put(record_key(1), b"")
    forget_folds()
    with pytest.raises(CorruptEntryError) as err:
        CommitLog(memory_store).visible()
    assert str(err.value).startswith("restore commit record")
    assert "empty (0 bytes" in str(err.value)


def test_a_record_stored_under_another_number_is_refused(memory_store):
    log = CommitLog(memory_store)
    _commit(log, "s", 1, 2)
    _commit(log, "s", 3, 4)
    memory_store.delete(record_key(2))
    memory_store.put(record_key(2), memory_store.get(record_key(1)))
    forget_folds()
    with pytest.raises(CorruptEntryError, match="holds record 1, not 2"):
        CommitLog(memory_store).visible()


@pytest.fixture
def memory_store():
    import uuid

    from memwal_datasource.store import MemoryStore, open_store

    name = uuid.uuid4().hex
    yield open_store(f"memory://{name}", {})
    MemoryStore.reset(name)
