"""Local disk (:mod:`memwal_datasource.store.local`)."""

from __future__ import annotations

import os

import pytest

from memwal_datasource.store import LocalStore


def test_local_store_leaves_no_temp_files(tmp_path):
    store = LocalStore(str(tmp_path))
    store.put_if_absent("d/k", b"x")
    with pytest.raises(FileExistsError):
        store.put_if_absent("d/k", b"y")
    assert os.listdir(tmp_path / "d") == ["k"]


def test_local_store_ignores_hidden_temp_files_in_listing(tmp_path):
    store = LocalStore(str(tmp_path))
    store.put_if_absent("d/k", b"x")
    (tmp_path / "d" / ".k.123.tmp").write_bytes(b"half")  # a crashed writer's leftover
    assert list(store.list("d/")) == ["d/k"]
