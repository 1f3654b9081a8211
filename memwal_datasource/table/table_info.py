"""What a writer needs to know of a Lance table, read without pylance where it can be.

Importing pylance costs ~250 ms and brings in pandas, in every fresh process
that plans a write (Spark plans each one in a Python worker). What a planner
needs of an existing table — is it there, its schema, its Lance field ids, its
MemWAL sharding spec — belongs to one Lance version, and versions never
change once written. So:

* **existence and the latest version** are read through our own store:
  pylance 14 writes version ``v``'s manifest as
  ``_versions/{u64::MAX - v:020d}.manifest`` (V2 names; ``{v}.manifest``
  before them) next to ``_versions/latest_version_hint.json``; a table exists
  iff a manifest is there, and the latest version is the highest one listed.
* **a version's description** (:class:`TableInfo`) is read once with pylance
  by the first writer that needs it and kept in
  ``_memwal_tables/{v:020d}.json``, with the manifest's version tag (its
  ETag and time: a table deleted and made anew at the same place reuses
  version numbers, not manifests); later planners read that small file instead, and each process
  keeps what it read.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..errors import without_native_locations
from ..format.memwal import FieldId
from ..format.table_schema import primary_key_of
from ..options import lance_storage_options
from ..store import ObjectStore, open_store
from .sharding import Sharding, spec_of
from .view import field_ids, open_table

log = logging.getLogger("memwal_datasource")

VERSIONS_DIR = "_versions"
INFO_DIR = "_memwal_tables"
INFO_FORMAT = 2  # 2: the manifest's version tag (1: its modification time)
# Descriptions of older versions are removed when a newer one is kept (a planner
# that listed an older version a moment ago reads it from pylance instead).
KEEP_INFOS = 4
_U64_MAX = (1 << 64) - 1
_CACHE_SIZE = 64

_cache: dict[tuple[str, int, str | None], TableInfo] = {}
_lock = threading.Lock()


def manifest_version(key: str) -> int | None:
    """The version whose manifest ``key`` is; None for other files (hint, temporary, detached)."""
    stem, _, ext = key.rsplit("/", 1)[-1].partition(".")
    if ext != "manifest" or not stem.isdigit():
        return None
    n = int(stem)
    return _U64_MAX - n if n >= 1 << 63 else n  # V2 names count down from u64::MAX


def latest_manifest(store: ObjectStore) -> tuple[int, str] | None:
    """``(version, manifest key)`` of the table's latest version; None if there is no table."""
    return _newest(store.list(f"{VERSIONS_DIR}/"))


def _newest(keys: Iterable[str]) -> tuple[int, str] | None:
    """``(version, key)`` of the newest manifest among ``keys`` under ``_versions/``."""
    return max(((v, k) for k in keys if (v := manifest_version(k)) is not None), default=None)


def manifest_keys(version: int) -> tuple[str, str]:
    """Where version ``version``'s manifest is: its V2 name, then its V1 name."""
    return (f"{VERSIONS_DIR}/{_U64_MAX - version:020d}.manifest",
            f"{VERSIONS_DIR}/{version}.manifest")


@dataclass(frozen=True)
class TableStamp:
    """Which table a writer works on: a Lance version and its manifest's version tag.

    A table deleted and made anew at the same path reuses version numbers (and
    a writer group's shard ids), not manifests: a long-lived writer (a kept
    one) checks its stamp before it writes again, so it never writes into the
    new table's shards.
    """

    version: int
    manifest_tag: str

    @classmethod
    def of(cls, info: TableInfo) -> TableStamp | None:
        return None if info.manifest_tag is None else cls(info.version, info.manifest_tag)

    def still_there(self, store: ObjectStore) -> bool:
        """Whether the table at ``store`` is still this one: this version's manifest is
        there, the same object (one or two HEADs)."""
        for key in manifest_keys(self.version):
            tag = store.version_tag(key)
            if tag is not None:
                return tag == self.manifest_tag
        return False  # removed (a new table, or old versions cleaned up): cannot tell

    def same_table(self, later: TableStamp | None, store: ObjectStore) -> bool:
        """Whether ``later`` (what a planner read since) is of the same table: equal,
        or a later version while this one's manifest is still there."""
        if later is None or later.version < self.version:
            return False
        return later == self or (later.version > self.version and self.still_there(store))


def lance_table_exists(store: ObjectStore) -> bool:
    """True if a Lance table is at ``store`` (a manifest under ``_versions/``)."""
    return any(manifest_version(k) is not None for k in store.list(f"{VERSIONS_DIR}/"))


def _ids_to_json(ids: Mapping[str, FieldId]) -> dict[str, Any]:
    return {name: [f.id, _ids_to_json(f.children)] for name, f in ids.items()}


def _ids_from_json(raw: Mapping[str, Any]) -> dict[str, FieldId]:
    return {name: FieldId(int(i), _ids_from_json(children)) for name, (i, children) in raw.items()}


@dataclass(frozen=True)
class TableInfo:
    """One Lance version of a table, as writers need it.

    ``schema`` is pylance's ``dataset.schema`` (with the hidden row key of a
    table without a primary key); ``sharding_spec`` the MemWAL index's
    recorded sharding spec, if any, on ``sharding_columns``.
    """

    version: int
    schema: pa.Schema
    field_ids: dict[str, FieldId] = field(repr=False)
    sharding_spec: Mapping[str, Any] | None = None
    sharding_columns: tuple[str, ...] = ()
    has_mem_wal: bool = True
    manifest_tag: str | None = None  # the manifest's version tag, to spot a new table

    @classmethod
    def of_dataset(cls, ds, manifest_tag: str | None = None) -> TableInfo:
        """The description of an open pylance dataset."""
        details = ds.mem_wal_index_details()
        spec = spec_of(details, ds.lance_schema, ds.uri)
        return cls(ds.version, ds.schema, field_ids(ds),
                   None if spec is None else dict(spec.spec),
                   () if spec is None else spec.columns, details is not None, manifest_tag)

    def sharding(self, uri: str, storage: Mapping[str, str] | None = None) -> Sharding | None:
        """The sharding of the table at ``uri``, as
        :func:`~memwal_datasource.table.sharding.table_sharding` gives it, without its
        ``LanceSchema`` until it evaluates the spec on rows (:class:`TableSharding`)."""
        if self.sharding_spec is not None:
            return TableSharding(spec=self.sharding_spec, lance_schema=None,
                                 columns=self.sharding_columns, uri=uri,
                                 storage=dict(storage or {}), version=self.version,
                                 manifest_tag=self.manifest_tag)
        if primary_key_of(self.schema):
            return Sharding.unrecorded(None)
        return None

    def to_json(self) -> bytes:
        return json.dumps({
            "format": INFO_FORMAT, "version": self.version, "manifest_tag": self.manifest_tag,
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            "field_ids": _ids_to_json(self.field_ids), "sharding_spec": self.sharding_spec,
            "sharding_columns": list(self.sharding_columns), "has_mem_wal": self.has_mem_wal,
        }, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TableInfo:
        raw = json.loads(data)
        if raw.get("format") != INFO_FORMAT:
            raise ValueError(f"unknown format {raw.get('format')!r}")
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["schema"])))
        return cls(int(raw["version"]), schema, _ids_from_json(raw["field_ids"]),
                   raw["sharding_spec"], tuple(raw["sharding_columns"]),
                   bool(raw["has_mem_wal"]), raw["manifest_tag"])


@dataclass(frozen=True)
class TableSharding(Sharding):
    """A recorded sharding spec that opens its table's version for pylance's
    ``LanceSchema`` only when it first evaluates the spec on rows.

    A planner hands it to tasks without importing pylance; a task that routes
    rows (which pylance evaluates) opens the version once per process. The
    schema is not pickled: it stays in the process that opened it.
    """

    uri: str = ""
    storage: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    version: int = 0
    manifest_tag: str | None = None  # which table's version (one made anew reuses numbers)

    def values(self, batch: pa.RecordBatch) -> pa.Array:
        if self.lance_schema is None:
            object.__setattr__(self, "lance_schema",
                               _lance_schema(self.uri, self.storage, self.version,
                                             self.manifest_tag))
        return super().values(batch)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "lance_schema": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


_schemas: dict[tuple[str, int, str | None], Any] = {}


def _lance_schema(uri: str, storage: Mapping[str, str] | None, version: int,
                  manifest_tag: str | None = None):
    """pylance's ``LanceSchema`` of version ``version`` (kept per process, by the
    manifest's tag: a table made anew at the same path reuses version numbers)."""
    key = (uri, version, manifest_tag)
    with _lock:
        found = _schemas.get(key) if manifest_tag is not None else None
    if found is None:
        found = _open_version(uri, storage, version).lance_schema
        with _lock:
            if len(_schemas) >= _CACHE_SIZE:
                _schemas.pop(next(iter(_schemas)))
            _schemas[key] = found
    return found


def info_key(version: int) -> str:
    return f"{INFO_DIR}/{version:020d}.json"


def _read_kept(store: ObjectStore, version: int, manifest_tag: str | None) -> TableInfo | None:
    try:
        info = TableInfo.from_json(store.get(info_key(version)))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:  # a damaged file is rewritten
        log.debug("ignoring %s: %s", store.describe(info_key(version)), exc)
        return None
    if info.version != version or info.manifest_tag != manifest_tag:
        return None  # another table's version of the same number
    return info


def keep(store: ObjectStore, info: TableInfo) -> None:
    """Keep ``info`` for later planners, and drop descriptions of older versions (best
    effort: a planner that cannot write, e.g. with read-only credentials, still works)."""
    try:
        store.put(info_key(info.version), info.to_json())
        older = sorted(k for k in store.list(f"{INFO_DIR}/") if k < info_key(info.version))
        for key in older[:max(0, len(older) - KEEP_INFOS + 1)]:
            store.delete(key)
    except Exception as exc:  # noqa: BLE001 - only a later planner's speed depends on it
        log.debug("could not keep the table description %s: %s",
                  store.describe(info_key(info.version)), exc)


def _open_version(uri: str, storage: Mapping[str, str] | None, version: int):
    # Lazy: pylance (and pandas with it) only when a version is first described.
    import lance

    try:
        return lance.dataset(uri, version=version,
                             storage_options=lance_storage_options(storage))
    except (OSError, ValueError) as exc:
        # Removed since it was listed (cleanup_old_versions): the latest one then.
        log.debug("version %d of %s: %s", version, uri, without_native_locations(exc))
        return open_table(uri, storage)


def describe_table(uri: str, storage: Mapping[str, str] | None = None, *,
                   store: ObjectStore | None = None, remember: bool = True
                   ) -> TableInfo | None:
    """The latest version of the Lance table at ``uri``; None if there is no table.

    Reads the version's kept description (``_memwal_tables/``) when there is
    one, else opens that version with pylance and, with ``remember``, keeps
    its description for later planners.
    """
    store = store or open_store(uri, storage)
    latest, tag = _latest_and_tag(store)
    if latest is None:
        return None
    version, key = latest
    cache_key = (uri, version, tag)
    with _lock:
        info = _cache.get(cache_key)
    if info is not None:
        return info
    info = _read_kept(store, version, tag)
    if info is None:
        ds = _open_version(uri, storage, version)
        if ds.version != version:
            tag = None  # not the listed version: described, not kept
        info = TableInfo.of_dataset(ds, tag)
        if remember and tag is not None:
            keep(store, info)
    remember_info(uri, info)
    return info


def _latest_and_tag(store: ObjectStore) -> tuple[tuple[int, str] | None, str | None]:
    """The latest manifest (:func:`latest_manifest`) and its version tag.

    On a store whose listings carry tags (S3, GCS, Azure), one listing answers both;
    elsewhere (local disk, memory: no round trips) the tag is read after the listing.
    A version's manifest is never rewritten, only removed, or made anew with a table at
    the same path, which the tag tells apart.
    """
    tagged = store.list_tagged(f"{VERSIONS_DIR}/")
    if tagged is None:
        latest = latest_manifest(store)
        return latest, None if latest is None else store.version_tag(latest[1])
    latest = _newest(tagged)
    return latest, None if latest is None else tagged[latest[1]]


def remember_info(uri: str, info: TableInfo) -> None:
    """Keep ``info`` in this process (for :func:`describe_table` of the same version)."""
    with _lock:
        if len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[(uri, info.version, info.manifest_tag)] = info


def describe_created(uri: str, storage: Mapping[str, str] | None, ds, *,
                     store: ObjectStore | None = None) -> TableInfo:
    """The description of a table this process just created (pylance's dataset ``ds``),
    kept so that the first write after it needs no pylance."""
    store = store or open_store(uri, storage)
    latest = latest_manifest(store)
    tag = store.version_tag(latest[1]) if latest and latest[0] == ds.version else None
    info = TableInfo.of_dataset(ds, tag)
    if tag is not None:
        keep(store, info)
        remember_info(uri, info)
    return info
