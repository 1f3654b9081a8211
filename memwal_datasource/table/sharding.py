"""Sharding specs: which shard each row goes to, the way Lance defines it.

A table's MemWAL index may record one sharding spec (``initialize_mem_wal``
with ``bucket_column``/``num_buckets``, ``identity_column`` or ``unsharded``;
Lance gives it spec id 1). Lance's rule for primary-key tables is that every
row of one key lands in one shard; the spec's value (``bucket(col, N)``, the
raw ``col`` value, or the constant 0) is what selects it, and
``lance.mem_wal.evaluate_sharding_spec`` computes it. This module:

* reads a table's spec (:func:`table_sharding`; a primary-key table without
  one is written to one shard, see :meth:`Sharding.unrecorded`), creates a
  table with one (:func:`create_table`; a primary-key table gets
  :func:`default_request` unless asked otherwise) and refuses a requested
  spec that conflicts with the recorded one (:func:`check_requested`);
* maps a sharding value to a shard id, deterministically
  (:meth:`Sharding.shard_id`: pylance leaves the shard id to its caller, so
  the rule is ours and public: ``uuid5(SHARDING_NAMESPACE, spec, value)``);
* splits a batch by shard (:meth:`Sharding.route`, vectorised, row order kept
  within each shard, which last-write-wins depends on);
* records the shard's identity as Lance's format defines it
  (:func:`initialize_shard`: ``shard_spec_id`` and ``shard_field_entries``,
  raw little-endian Arrow scalar bytes keyed by the spec's field id).

Spark-free: the Spark layer (``spark/writer.py``, ``spark/routing.py``) uses it.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ConfigError, MemWalError, without_native_locations
from ..options import lance_storage_options
from ..shard.manifest import ManifestStore
from ..store import ObjectStore

# Shard ids of sharded tables are uuid5 in this namespace of (spec, value).
SHARDING_NAMESPACE = uuid.UUID("0b7f6a2e-3c1d-5e84-9f2a-7d4c1b6e8a90")
BUCKET, IDENTITY, UNSHARDED = "bucket", "identity", "unsharded"
# Lance: num_buckets must be in [1, 1024].
MAX_NUM_BUCKETS = 1024
# A new primary-key table created without shard_by_* options is sharded by
# bucket(key column, DEFAULT_NUM_BUCKETS). The count bounds a job's write
# parallelism (partition_for_table makes one task per bucket), but every shard
# is one more WAL, manifest, lease and set of flushed generations that
# compaction, LsmScanner and the whole-table read visit, and a small write
# touches up to this many shards. 16 keeps 16 cores writing (2-4 executors of
# 4-8 cores) at a fan-out readers and compaction hardly notice; tables that
# need more parallel writers set shard_by_bucket/num_buckets (Lance allows 1024).
DEFAULT_NUM_BUCKETS = 16
# Identity values as Lance stores them: little-endian fixed width, or raw UTF-8.
_INT_FORMATS = {"int8": "<b", "int16": "<h", "int32": "<i", "int64": "<q", "uint8": "<B",
                "uint16": "<H", "uint32": "<I", "uint64": "<Q"}


@dataclass(frozen=True)
class ShardingRequest:
    """A spec asked for by options when creating a table (at most one kind).

    ``unsharded`` (Lance's constant-0 spec) has no option: it is only the
    default of a primary-key table whose key columns cannot be bucketed.
    """

    bucket_column: str | None = None
    num_buckets: int | None = None
    identity_column: str | None = None
    unsharded: bool = False

    def describe(self) -> str:
        """The request in option names."""
        if self.bucket_column:
            return f"shard_by_bucket={self.bucket_column}, num_buckets={self.num_buckets}"
        if self.identity_column:
            return f"shard_by_identity={self.identity_column}"
        return "unsharded"

    def validate(self) -> ShardingRequest:
        """Refuse half or doubly specified requests, naming the options."""
        if self.unsharded and (self.bucket_column or self.identity_column):
            raise ConfigError("an unsharded spec names no column: got "
                              f"{self.bucket_column or self.identity_column!r}")
        if self.bucket_column and self.identity_column:
            raise ConfigError("set one of options 'shard_by_bucket' and 'shard_by_identity', "
                              "not both")
        if bool(self.bucket_column) != (self.num_buckets is not None):
            raise ConfigError("options 'shard_by_bucket' and 'num_buckets' go together: "
                              f"got shard_by_bucket={self.bucket_column!r}, "
                              f"num_buckets={self.num_buckets!r}")
        if self.num_buckets is not None and not 1 <= self.num_buckets <= MAX_NUM_BUCKETS:
            raise ConfigError(f"option 'num_buckets' must be in [1, {MAX_NUM_BUCKETS}] (Lance's "
                              f"limit), got {self.num_buckets}")
        return self


@dataclass(frozen=True)
class Sharding:
    """A table's sharding spec, ready to evaluate on batches (picklable).

    ``spec`` is the dict ``mem_wal_index_details()['sharding_specs'][i]``;
    ``lance_schema`` resolves its source field ids to column names.
    ``recorded`` is False for :meth:`unrecorded`, the one shard of a
    primary-key table whose MemWAL records no spec.
    """

    spec: Mapping[str, Any]
    lance_schema: Any = field(repr=False)
    columns: tuple[str, ...] = ()
    recorded: bool = True

    @classmethod
    def unrecorded(cls, lance_schema) -> Sharding:
        """Lance's ``unsharded`` rule (every row has value 0) for a table without a spec.

        A primary-key table whose MemWAL records no sharding spec (an existing
        table, or pylance's ``initialize_mem_wal()`` without arguments) still
        falls under Lance's rule: all rows of one key in one shard. Routing by
        Spark partition would break it (a key written by two partitions, or
        two jobs, lands in two shards and LsmScanner returns it twice), so
        every row goes to one deterministic shard. That is correct but has one
        writer at a time: create primary-key tables with a spec (the default
        for tables this package creates) for parallel writes. The table
        records no spec to name, so the shard records spec id 0 and no field
        entries, as a shard of a manually sharded MemWAL does.
        """
        spec = {"spec_id": 0, "fields": [{
            "field_id": "bucket", "source_ids": [], "transform": UNSHARDED, "expression": None,
            "result_type": "int32", "parameters": {}}]}
        return cls(spec=spec, lance_schema=lance_schema, columns=(), recorded=False)

    @property
    def spec_id(self) -> int:
        """The spec's id (Lance's automatic spec is 1)."""
        return int(self.spec["spec_id"])

    @property
    def _field(self) -> Mapping[str, Any]:
        return self.spec["fields"][0]

    @property
    def field_id(self) -> str:
        """The spec field's id (``bucket`` for every spec Lance 14 creates)."""
        return str(self._field["field_id"])

    @property
    def transform(self) -> str:
        """``bucket``, ``identity`` or ``unsharded``."""
        return str(self._field.get("transform") or "")

    @property
    def num_buckets(self) -> int | None:
        """Bucket count of a ``bucket`` spec."""
        raw = (self._field.get("parameters") or {}).get("num_buckets")
        return int(raw) if raw is not None else None

    def describe(self) -> str:
        """The spec in words, for messages."""
        if not self.recorded:
            return ("one shard (a primary-key table whose MemWAL records no sharding spec; "
                    "Lance's unsharded rule)")
        if self.transform == BUCKET:
            return f"bucket({self.columns[0]}, {self.num_buckets}) (spec id {self.spec_id})"
        if self.transform == IDENTITY:
            return f"identity({self.columns[0]}) (spec id {self.spec_id})"
        return f"{self.transform} (spec id {self.spec_id})"

    def matches(self, request: ShardingRequest) -> bool:
        """True if ``request`` asks for exactly this spec."""
        if request.unsharded:
            return self.recorded and self.transform == UNSHARDED
        if request.bucket_column:
            return (self.transform == BUCKET and self.columns == (request.bucket_column,)
                    and self.num_buckets == request.num_buckets)
        return self.transform == IDENTITY and self.columns == (request.identity_column,)

    # -- values -------------------------------------------------------------------------

    def values(self, batch: pa.RecordBatch) -> pa.Array:
        """Each row's sharding value, computed by Lance itself (0 without a recorded spec)."""
        from lance.mem_wal import evaluate_sharding_spec

        if not self.recorded:  # Lance's unsharded value; there is no spec to hand Lance
            return pa.array(np.zeros(batch.num_rows, np.int32))
        missing = [c for c in self.columns if c not in batch.schema.names]
        if missing:
            raise ConfigError(f"the table is sharded by {self.describe()}: the rows must carry "
                              f"column(s) {missing} (got {batch.schema.names})")
        return evaluate_sharding_spec(batch, dict(self.spec), self.lance_schema).column(0)

    def value_bytes(self, value: Any) -> bytes | None:
        """A sharding value as Lance stores it in ``shard_field_entries`` (None for null)."""
        if value is None:
            return None
        kind = str(self._field.get("result_type") or "")
        if kind in _INT_FORMATS:
            return struct.pack(_INT_FORMATS[kind], value)
        if kind in ("utf8", "large_utf8", "string", "large_string"):
            return value.encode()
        if kind in ("boolean", "bool"):
            return b"\x01" if value else b"\x00"
        raise ConfigError(f"sharding value type '{kind}' of {self.describe()} is not supported")

    def decode_value(self, raw: bytes) -> Any:
        """The sharding value stored as ``raw`` in ``shard_field_entries`` (inverse of
        :meth:`value_bytes`); the bytes themselves when the type is not known here."""
        kind = str(self._field.get("result_type") or "")
        if kind in _INT_FORMATS and len(raw) == struct.calcsize(_INT_FORMATS[kind]):
            return struct.unpack(_INT_FORMATS[kind], raw)[0]
        if kind in ("utf8", "large_utf8", "string", "large_string"):
            return raw.decode(errors="replace")
        if kind in ("boolean", "bool") and len(raw) == 1:
            return raw != b"\x00"
        return raw

    def field_entries(self, value: Any) -> list[tuple[str, bytes]]:
        """``shard_field_entries`` of the shard holding ``value`` (none for a null value).

        None either without a recorded spec: the entries name a spec field.
        """
        raw = self.value_bytes(value) if self.recorded else None
        return [] if raw is None else [(self.field_id, raw)]

    def shard_id(self, value: Any) -> str:
        """The shard of a sharding value: ``uuid5(SHARDING_NAMESPACE, spec + value)``.

        Deterministic across jobs, processes and table URIs (shard ids only
        need to be unique inside one table's ``_mem_wal/``). The spec's
        transform and parameters are part of the name, so a table recreated
        with another bucket count never reuses a shard id for other rows.
        """
        raw = self.value_bytes(value)
        params = json.dumps(dict(self._field.get("parameters") or {}), sort_keys=True)
        name = (f"{self.spec_id}|{self.field_id}|{self.transform}|{params}|"
                f"{'null' if raw is None else raw.hex()}")
        return str(uuid.uuid5(SHARDING_NAMESPACE, name))

    # -- routing ------------------------------------------------------------------------

    def route(self, batch: pa.RecordBatch) -> dict[str, tuple[Any, pa.RecordBatch]]:
        """Split ``batch`` by shard: ``{shard_id: (sharding value, rows in order)}``."""
        if not batch.num_rows:
            return {}
        values = self.values(batch)
        encoded = values.dictionary_encode()
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        dictionary = encoded.dictionary.to_pylist()
        if encoded.indices.null_count:  # null values form one more group
            codes = np.where(np.asarray(encoded.indices.is_null()), len(dictionary),
                             codes).astype(np.int64)
            dictionary.append(None)
        if len(dictionary) == 1:
            return {self.shard_id(dictionary[0]): (dictionary[0], batch)}
        # A stable sort keeps each group's rows in their original order.
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(dictionary)))])
        out = {}
        for code, value in enumerate(dictionary):
            lo, hi = int(bounds[code]), int(bounds[code + 1])
            if hi > lo:
                out[self.shard_id(value)] = (value, batch.take(pa.array(order[lo:hi])))
        return out


def spec_of(details: Mapping[str, Any] | None, lance_schema, uri: str) -> Sharding | None:
    """The :class:`Sharding` recorded in MemWAL index ``details`` (None if manual)."""
    specs = list((details or {}).get("sharding_specs") or [])
    if not specs:
        return None
    if len(specs) > 1:
        raise MemWalError(f"the table at {uri} has {len(specs)} sharding specs; Lance's writer "
                          "(and this package) handle at most one")
    spec = specs[0]
    ids = {f.id(): f.name() for f in lance_schema.fields()}  # top-level columns only
    names = tuple(ids[i] for i in spec["fields"][0].get("source_ids") or [])
    return Sharding(spec=spec, lance_schema=lance_schema, columns=names)


def table_sharding(ds) -> Sharding | None:
    """How rows of an open Lance dataset are sharded: its recorded spec, or

    * :meth:`Sharding.unrecorded` (one shard) for a primary-key table without one;
    * None for a table without a primary key or a spec (shards follow writers).
    """
    from ..format.table_schema import primary_key_of

    recorded = spec_of(ds.mem_wal_index_details(), ds.lance_schema, ds.uri)
    if recorded is None and primary_key_of(ds.schema):
        return Sharding.unrecorded(ds.lance_schema)
    return recorded


def check_requested(existing: Sharding | None, request: ShardingRequest | None,
                    uri: str) -> None:
    """Refuse sharding options that disagree with the table's recorded spec."""
    if request is None:
        return
    if existing is None or not existing.recorded:
        raise ConfigError(f"options {request.describe()} ask for a sharding spec, but the table "
                          f"at {uri} already has a MemWAL without one (Lance cannot add a spec to "
                          "an existing MemWAL); drop these options or write to a new table")
    if not existing.matches(request):
        raise ConfigError(f"options {request.describe()} conflict with the table at {uri}, which "
                          f"is sharded by {existing.describe()}; drop the options (the table's "
                          "spec is used) or write to a new table")


def _bucketable(t: pa.DataType) -> bool:
    """Types Lance 14's ``bucket`` hashes (of those it allows as a MemWAL primary key)."""
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def default_request(schema: pa.Schema, primary_key: Sequence[str]) -> ShardingRequest:
    """The spec of a new primary-key table created without ``shard_by_*`` options.

    ``bucket(column, DEFAULT_NUM_BUCKETS)`` on the first key column Lance can
    bucket (integers, strings): every row of one key carries the same value in
    every key column, so any of them keeps a key in one shard. Lance 14's
    bucket refuses binary keys, and boolean keys fill at most two buckets, so
    those columns come last; a key of binary columns only gets Lance's
    ``unsharded`` spec (one shard: correct, one writer at a time).
    """
    types = {name: schema.field(name).type for name in primary_key}
    for usable in (_bucketable, pa.types.is_boolean):
        for name in primary_key:
            if usable(types[name]):
                return ShardingRequest(bucket_column=name, num_buckets=DEFAULT_NUM_BUCKETS)
    return ShardingRequest(unsharded=True)


def create_table(uri: str, schema: pa.Schema, primary_key: Sequence[str],
                 storage_options: Mapping[str, str] | None,
                 request: ShardingRequest | None):
    """Create an empty table whose MemWAL records a sharding spec.

    The spec is ``request``'s; without one a primary-key table gets
    :func:`default_request` (Lance's rule needs one key in one shard, and a
    recorded spec lets many writers share the table), and a table without a
    primary key gets none (:func:`memwal_datasource.table.view.create_table`: shards
    follow writers). A racing creator's table is accepted if its spec matches
    an explicit request (any spec, for a default one), refused if not.
    """
    import lance

    from ..format.table_schema import base_schema
    from . import view as table

    if request is None and not primary_key:
        return table.create_table(uri, schema, primary_key, storage_options)
    schema = base_schema(schema, primary_key)  # key names checked here
    explicit = request is not None
    if request is None:
        request = default_request(schema, primary_key)
    request.validate()
    column = request.bucket_column or request.identity_column
    if explicit and column not in schema.names:
        option = "shard_by_bucket" if request.bucket_column else "shard_by_identity"
        raise ConfigError(f"option '{option}' names column '{column}', which is not among the "
                          f"DataFrame's columns {schema.names}")
    opts = lance_storage_options(storage_options)
    try:
        ds = lance.write_dataset(schema.empty_table(), uri, mode="create", storage_options=opts)
    except OSError as exc:
        if "already exists" not in str(exc).lower():
            raise MemWalError(f"cannot create Lance table at {uri}: "
                              f"{without_native_locations(exc)}") from None
        ds = lance.dataset(uri, storage_options=opts)
    if ds.mem_wal_index_details() is None:
        try:
            if request.bucket_column:
                ds.initialize_mem_wal(bucket_column=request.bucket_column,
                                      num_buckets=request.num_buckets)
            elif request.identity_column:
                ds.initialize_mem_wal(identity_column=request.identity_column)
            else:
                ds.initialize_mem_wal(unsharded=True)
        except (OSError, ValueError) as exc:
            if "already initialized" not in str(exc):
                what = (f"by {request.describe()}" if explicit else
                        f"by its default spec ({request.describe()}, from primary key "
                        f"{list(primary_key)})")
                raise ConfigError(f"cannot shard the table at {uri} {what}: "
                                  f"{without_native_locations(exc)}") from None
    ds = lance.dataset(uri, storage_options=opts)
    if explicit:
        check_requested(table_sharding(ds), request, uri)
    return ds


def initialize_shard(store: ObjectStore, sharding: Sharding, shard_id: str,
                     value: Any, manifests: ManifestStore | None = None) -> None:
    """Make sure shard ``shard_id`` records ``value``'s identity before its first claim.

    A new shard gets version 1 with the spec id and field entries (epoch 0, as
    Lance's ``initialize_shard``); a claim copies them forward. An existing
    shard is accepted if it records this spec with these entries, or no
    entries (pylance 14's writer records none); other entries mean the shard
    holds another value's rows, and writing there would break Lance's
    one-key-one-shard rule, so it is refused.
    """
    manifests = manifests or ManifestStore(store, shard_id)
    entries = sharding.field_entries(value)
    current = manifests.initialize(sharding.spec_id, entries)
    if current.shard_spec_id not in (0, sharding.spec_id) or (
            current.shard_field_entries and current.shard_field_entries != entries):
        raise MemWalError(
            f"shard {shard_id} records spec id {current.shard_spec_id} with field entries "
            f"{current.shard_field_entries}, but {sharding.describe()} routes value {value!r} "
            f"(entries {entries}) there; refusing to mix values in one shard")


class ShardConflict(MemWalError):
    """Writes to one shard that its fencing order rules out: a newer claim while a task wrote
    it, or a job whose ranges on one shard overlap or do not rise in epoch."""
