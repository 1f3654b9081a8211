"""Choosing a backend by URI (:func:`memwal_datasource.store.open_store`)."""

from __future__ import annotations

import pytest

from memwal_datasource.errors import UnsupportedStoreError
from memwal_datasource.store import LocalStore, MemoryStore, S3Store, open_store


def test_open_store_by_scheme(tmp_path):
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert open_store(f"file://{tmp_path}").root == str(tmp_path)
    assert isinstance(open_store("memory://x"), MemoryStore)
    MemoryStore.reset("x")
    s3 = open_store("s3://bucket/prefix/t.lance", {"aws_region": "us-east-1"})
    assert isinstance(s3, S3Store) and s3.prefix == "prefix/t.lance"


@pytest.mark.parametrize("uri", ["gcs://b/t", "azure://c/t", "hdfs://nn/t", "http://h/t"])
def test_unknown_scheme_is_refused(uri):
    with pytest.raises(UnsupportedStoreError, match="conditional writes"):
        open_store(uri)


def test_local_path_is_one_plain_absolute_path(tmp_path, monkeypatch):
    from memwal_datasource.store import local_path

    spaced = tmp_path / "a b" / "t.lance"
    assert local_path(spaced.as_uri()) == str(spaced)  # %20 decoded, as Lance decodes it
    assert local_path(str(spaced)) == str(spaced)
    assert local_path("file://localhost" + str(spaced)) == str(spaced)
    monkeypatch.chdir(tmp_path)
    assert local_path("rel/t.lance") == str(tmp_path / "rel" / "t.lance")
    assert local_path("s3://b/t.lance") is None and local_path("memory://x") is None
    assert open_store(spaced.as_uri()).root == open_store(str(spaced)).root == str(spaced)
    with pytest.raises(UnsupportedStoreError) as err:
        local_path("file://tmp/t.lance")
    assert str(err.value).startswith("write file:///tmp/t.lance (three slashes) or a plain path")
