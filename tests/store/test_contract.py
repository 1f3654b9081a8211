"""The ObjectStore contract (:mod:`memwal_datasource.store.base`) on every backend."""

from __future__ import annotations

import threading

import pytest

from memwal_datasource.store import put_resolved


def test_put_if_absent_contract(any_store):
    any_store.put_if_absent("a/b/one", b"first")
    with pytest.raises(FileExistsError) as info:
        any_store.put_if_absent("a/b/one", b"second")
    assert "a/b/one" in str(info.value)
    assert any_store.get("a/b/one") == b"first"  # the loser changed nothing
    assert any_store.exists("a/b/one")
    assert any_store.head("a/b/one") == 5
    assert not any_store.exists("a/b/two")
    assert any_store.head("a/b/two") is None


def test_get_missing_raises_file_not_found(any_store):
    with pytest.raises(FileNotFoundError):
        any_store.get("nope/missing")


def test_put_overwrites_and_delete(any_store):
    any_store.put("h/hint.json", b"1")
    any_store.put("h/hint.json", b"2")
    assert any_store.get("h/hint.json") == b"2"
    any_store.delete("h/hint.json")
    assert not any_store.exists("h/hint.json")
    any_store.delete("h/hint.json")  # missing is fine


def test_delete_many(any_store):
    """Several keys go in one call; missing ones among them are no error; others stay."""
    for name in ("a", "b", "c", "keep"):
        any_store.put(f"m/{name}.json", b"x")
    any_store.delete_many(["m/a.json", "m/gone.json", "m/b.json", "m/c.json"])
    assert sorted(any_store.list("m/")) == ["m/keep.json"]
    any_store.delete_many(["m/a.json", "m/b.json"])  # all missing: fine
    any_store.delete_many([])
    any_store.delete_many(["m/keep.json"])
    assert list(any_store.list("m/")) == []


def test_list_and_list_dirs(any_store):
    for key in ("_mem_wal/s1/wal/x.arrow", "_mem_wal/s1/manifest/y.binpb",
                "_mem_wal/s2/wal/z.arrow", "other/k"):
        any_store.put_if_absent(key, b"v")
    assert sorted(any_store.list("_mem_wal/s1/")) == [
        "_mem_wal/s1/manifest/y.binpb", "_mem_wal/s1/wal/x.arrow"]
    assert any_store.list_dirs("_mem_wal") == ["s1", "s2"]
    assert any_store.list_dirs("_mem_wal/") == ["s1", "s2"]
    assert list(any_store.list("absent/")) == []
    assert any_store.list_dirs("absent") == []


def test_list_after_lists_the_directory_after_a_key_in_one_snapshot(any_store):
    """As the commit log's first look reads it: records after ``s``, then every key
    under ``_checkpoints/`` and ``_intents/`` (``_`` sorts after the digits)."""
    keys = ["c/01.json", "c/02.json", "c/03.json", "c/_checkpoints/02.json",
            "c/_intents/a.json", "c/_last.json", "d/04.json", "c0/x"]
    for key in keys:
        any_store.put_if_absent(key, b"v")
    assert any_store.list_after("c/", "c/02.json") == [
        "c/03.json", "c/_checkpoints/02.json", "c/_intents/a.json", "c/_last.json"]
    assert any_store.list_after("c/", "c/00.json") == sorted(k for k in keys
                                                           if k.startswith("c/"))
    assert any_store.list_after("c/", "c/_last.json") == []
    assert any_store.list_after("absent/", "absent/0") == []


def test_concurrent_put_if_absent_has_one_winner(any_store):
    n = 8
    wins: list[int] = []
    barrier = threading.Barrier(n)

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            any_store.put_if_absent("race/key", f"writer-{i}".encode())
            wins.append(i)
        except FileExistsError:
            pass

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert any_store.get("race/key") == f"writer-{wins[0]}".encode()


def _payloads() -> dict[str, object]:
    import numpy as np
    import pyarrow as pa

    raw = bytes(range(256)) * 5
    return {"bytes": raw, "bytearray": bytearray(raw), "memoryview": memoryview(raw)[7:900],
            "pyarrow.Buffer": pa.py_buffer(raw), "pyarrow slice": pa.py_buffer(raw).slice(3, 500),
            "numpy uint8": np.frombuffer(raw, dtype=np.uint8)}


def test_bytes_like_payloads_round_trip(any_store):
    for name, payload in _payloads().items():
        expected = bytes(memoryview(payload).cast("B"))
        any_store.put_if_absent(f"p/{name}", payload)
        assert any_store.get(f"p/{name}") == expected, name
        assert any_store.head(f"p/{name}") == len(expected)
        any_store.put(f"h/{name}", payload)
        assert any_store.get(f"h/{name}") == expected, name


def test_put_resolved_reads_back_any_bytes_like(any_store):
    import pyarrow as pa

    data = pa.py_buffer(b"entry-bytes" * 100)
    assert put_resolved(any_store, "r/k", data, retries=0, base_delay_ms=1, what="test")
    # A second call finds the key: the read-back compares against a pyarrow Buffer.
    assert put_resolved(any_store, "r/k", data, retries=0, base_delay_ms=1, what="test")
    assert not put_resolved(any_store, "r/k", memoryview(b"other"), retries=0,
                            base_delay_ms=1, what="test")


def test_version_tag_tells_an_object_written_anew(any_store):
    """A table deleted and made anew at the same path is told by its manifest's tag, even
    when both were written within the same second (S3's Last-Modified has seconds)."""
    assert any_store.version_tag("v/one") is None
    any_store.put_if_absent("v/one", b"manifest, committed at t1")
    first = any_store.version_tag("v/one")
    assert first is not None and any_store.version_tag("v/one") == first  # stable
    any_store.delete("v/one")
    # Anew, at once; a new table's manifest carries its own commit time.
    any_store.put_if_absent("v/one", b"manifest, committed at t2")
    assert any_store.version_tag("v/one") not in (None, first)


def test_a_listing_tags_keys_as_version_tag_does(any_store):
    """``list_tagged`` (one listing, where the store lists tags) gives every key of the
    directory the tag :meth:`version_tag` gives it, so a planner can take either."""
    for key in ("d/a.manifest", "d/sub/b.manifest", "other/c"):
        any_store.put_if_absent(key, key.encode())
    tagged = any_store.list_tagged("d/")
    if not any_store.remote:  # local disk and memory answer HEADs at no round trip
        assert tagged is None
        return
    assert tagged == {k: any_store.version_tag(k) for k in ("d/a.manifest", "d/sub/b.manifest")}
    assert any_store.list_tagged("absent/") == {}


def test_a_put_answers_the_etag_its_listing_after_a_key_shows(any_store):
    """What ``put_if_absent`` returns is the ETag ``list_after_etags`` lists for the key
    (``None`` on both where the store gives none), and a key written anew with other
    bytes lists another one: a commit's fold trusts its record by it."""
    etags = {key: any_store.put_if_absent(key, key.encode()) for key in ("e/1", "e/2")}
    listed = any_store.list_after_etags("e/", "e/0")
    assert listed == etags
    assert list(listed) == any_store.list_after("e/", "e/0")
    if etags["e/1"] is None:
        return
    assert etags["e/1"] != etags["e/2"]
    any_store.delete("e/1")
    again = any_store.put_if_absent("e/1", b"other bytes")
    assert again not in (None, etags["e/1"])
    assert any_store.list_after_etags("e/", "e/0")["e/1"] == again
