"""Commit answers stay exact in the log's corners: damaged records, strays, followers.

Every test runs on memory, local disk, the S3 server and both emulators (``backend``).
"""

from __future__ import annotations

import pytest

from memwal_datasource.errors import CorruptEntryError
from memwal_datasource.format.commit_format import released_key
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


def test_a_stray_below_the_released_boundary_is_never_a_record(any_store):
    """A committer stalled past a collection put its record into a freed number: no
    reader takes it, whatever it holds (the first stored record, a stream from the
    start, the fold, a new committer)."""
    log = CommitLog(any_store, checkpoint_interval=None)
    for i in range(6):
        _commit(log, "s", 10 * i + 1, 10 * i + 5)
    stray = any_store.get(record_key(2))
    log.checkpoint()
    any_store.put(released_key(3), b"{}")  # a collection: the boundary, then deletes
    for seq in (1, 2, 3):
        any_store.delete(record_key(seq))
    any_store.put(record_key(3), stray.replace(b'"sequence": 2', b'"sequence": 3'))
    forget_folds()
    fresh = CommitLog(any_store, checkpoint_interval=None)
    assert fresh.first_stored() == 4
    assert [r.sequence for r in fresh.records(after=fresh.first_stored() - 1)] == [4, 5, 6]
    assert [r.first for r in fresh.visible()] == [1, 11, 21, 31, 41, 51]
    assert _commit(fresh, "s", 61, 65).record.sequence == 7
    with pytest.raises(Exception, match="released commit records"):
        list(CommitLog(any_store).records(after=2))


def test_gc_keeps_only_the_newest_checkpoints_and_markers(tmp_path):
    from memwal_datasource.format.commit_format import CHECKPOINTS_DIR
    from memwal_datasource.maintenance.gc import KEEP_CHECKPOINTS, _collect_checkpoints
    from memwal_datasource.store import open_store

    class _Table:
        store = open_store(str(tmp_path / "t.lance"), {})

    log = CommitLog(_Table.store, checkpoint_interval=2)
    for i in range(12):
        _commit(log, "s", i + 1, i + 1)
    for n in (2, 4, 6, 8):
        _Table.store.put(released_key(n), b"{}")
    _collect_checkpoints(_Table)
    names = sorted(k.rsplit("/", 1)[-1] for k in _Table.store.list(CHECKPOINTS_DIR + "/"))
    assert len([n for n in names if n.startswith("released-")]) == KEEP_CHECKPOINTS
    kept = [int(n[:-5]) for n in names if n[:-5].isdigit()]
    assert kept == [8, 10, 12]
    assert CommitLog(_Table.store).boundary(refresh=True) == 8
    forget_folds()
    assert [r.first for r in CommitLog(_Table.store).visible()] == list(range(1, 13))
