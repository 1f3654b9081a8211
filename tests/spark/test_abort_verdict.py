"""A failed job's abort says what the commit log says about it, member by member."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from memwal_datasource.log.commit import (
    APPEND,
    COMMITTED,
    REFUSED,
    CommitLog,
    CommittedRange,
    record_key,
)
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.spark.writer import _record_of
from memwal_datasource.store import open_store


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_refused_member_of_a_group_record_is_not_reported_committed(location):
    uri, storage = location
    store = open_store(uri, storage)
    log = CommitLog(store)
    first = log.append(APPEND, [CommittedRange("s", 1, 1, 2, rows=2)], job_id="lead",
                       group=False).record
    members = [replace(first.parts()[0], job_id="lead2"),
               replace(first.parts()[0], job_id="refused", ranges=[], verdict=REFUSED,
                       reason="run the job again"),
               replace(first.parts()[0], job_id="member", verdict=COMMITTED,
                       ranges=[CommittedRange("t", 1, 1, 1, rows=1)])]
    group = replace(first, sequence=2, job_id="lead2", members=members)
    store.put(record_key(2), group.to_json())
    opts = WriteOptions.parse({"path": uri, **{f"storage.{k}": v for k, v in storage.items()}})
    assert _record_of(opts, "refused") == (None, True)
    found, searched = _record_of(opts, "member")
    assert searched and found is not None and found.sequence == 2
    assert _record_of(opts, "lead")[0].sequence == 1
    assert _record_of(opts, "nobody") == (None, True)


def test_an_unreadable_log_is_said_so_not_nothing_committed(tmp_path, caplog):
    opts = WriteOptions.parse({"path": str(tmp_path / "t.lance")})
    store = open_store(opts.path, {})
    CommitLog(store).append(APPEND, [CommittedRange("s", 1, 1, 2, rows=2)], job_id="j",
                            group=False)
    store.put(record_key(2), b"")  # a damaged record: the log cannot be searched
    with caplog.at_level(logging.DEBUG):
        assert _record_of(opts, "j") == (None, False)
