"""Object stores with the one primitive fencing needs: put-if-absent.

The contract every backend honours (it is what makes WAL fencing safe):

* ``put_if_absent(key, data)`` creates ``key`` atomically with ``data`` or
  raises ``FileExistsError`` when ``key`` already exists. No reader ever sees a
  partially written object, and of N concurrent callers exactly one succeeds.
* ``get(key)`` returns the whole object or raises ``FileNotFoundError``.
* ``put(key, data)`` overwrites; used only for hints (``version_hint.json``) and
  probes (``now_ms``).
* ``modified_ms(key)`` / ``now_ms()`` read the store's own clock (gc's retention).
* ``list(prefix)`` yields keys (relative to the store root) under ``prefix``.
* ``delete(key)`` removes a key; only garbage collection deletes WAL files,
  under the rules of :mod:`memwal_datasource.gc` (docs/operations.md).

Stores are chosen by URI scheme (:func:`open_store`): a local path or
``file://`` URI, ``s3://bucket/prefix``, ``gs://bucket/prefix``
(:mod:`.gcs_store`), ``az://container/prefix`` or
``abfss://container@account.dfs.core.windows.net/prefix`` (:mod:`.azure_store`)
and ``memory://name``. Any other scheme is refused, because a backend without
conditional writes cannot fence writers.
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeAlias
from urllib.parse import unquote, urlparse

from . import s3_clients
from .errors import (
    OutcomeUnknown,
    StoreAuthError,
    StoreError,
    StoreNotFoundError,
    TransientStoreError,
    UnsupportedStoreError,
)
from .options import S3Options, scrub, scrub_url

SUPPORTED_SCHEMES = ("", "file", "s3", "s3a", "gs", "az", "abfss", "memory")

# Payloads: bytes, or any C-contiguous buffer (bytearray, memoryview, pyarrow.Buffer,
# numpy uint8 arrays), written without a copy where the backend allows.
BytesLike: TypeAlias = "bytes | bytearray | memoryview"


# The probe :meth:`ObjectStore.now_ms` overwrites to read the store's clock.
CLOCK_KEY = "_memwal_compaction/clock.json"


def byte_view(data: BytesLike) -> memoryview:
    """A flat unsigned-byte view of ``data`` without copying (a copy only if it is
    not C-contiguous). pyarrow Buffers export signed bytes, which obstore refuses."""
    view = memoryview(data)
    if view.format == "B" and view.ndim == 1:
        return view
    if not view.c_contiguous:
        return memoryview(view.tobytes())
    return view.cast("B")


def same_bytes(stored: bytes, data: BytesLike) -> bool:
    """True if ``stored`` holds exactly the bytes of ``data`` (any bytes-like)."""
    return stored == data if isinstance(data, bytes) else memoryview(stored) == byte_view(data)


def _boto3_body(data: BytesLike, view: memoryview) -> bytes | bytearray:
    """boto3 wants bytes (or a file); other buffers are copied on this rare path."""
    return data if isinstance(data, (bytes, bytearray)) else view.tobytes()


class ObjectStore(ABC):
    """A flat key space rooted at a table URI; keys use ``/`` separators."""

    uri: str

    @abstractmethod
    def put_if_absent(self, key: str, data: BytesLike) -> None:
        """Create ``key`` holding ``data``; raise ``FileExistsError`` if it exists."""

    def put_if_absent_unsynced(self, key: str, data: BytesLike) -> None:
        """Like :meth:`put_if_absent`, but may leave the object durable only after
        :meth:`sync` (local disk skips the per-object fsyncs). Object stores and
        memory are durable at once, so this is ``put_if_absent`` there."""
        self.put_if_absent(key, data)

    def sync(self, keys: list[str], *, data: bool = True,  # noqa: B027 - durable at once
             names: bool = True) -> None:
        """Make objects written with :meth:`put_if_absent_unsynced` durable: their
        ``data``, and their ``names`` (a caller may sync data first, names later)."""

    @abstractmethod
    def put(self, key: str, data: BytesLike) -> None:
        """Create or overwrite ``key`` (hints only; never WAL entries or manifests)."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Return the object's bytes; raise ``FileNotFoundError`` if absent."""

    @abstractmethod
    def head(self, key: str) -> int | None:
        """Return the object's size in bytes, or ``None`` if absent."""

    def exists(self, key: str) -> bool:
        """True if ``key`` exists."""
        return self.head(key) is not None

    @abstractmethod
    def list(self, prefix: str) -> Iterator[str]:
        """Yield every key under ``prefix`` (recursive), in no particular order."""

    @abstractmethod
    def list_dirs(self, prefix: str) -> list[str]:
        """Names of the immediate sub-directories (common prefixes) of ``prefix``."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; missing keys are ignored."""

    def describe(self, key: str) -> str:
        """A human-readable location for ``key`` (for error messages)."""
        return f"{self.uri.rstrip('/')}/{key}"

    @abstractmethod
    def modified_ms(self, key: str) -> int | None:
        """When ``key`` was last written, in ms on the store's clock; ``None`` if absent."""

    def now_ms(self) -> int:
        """The store's clock now (ms): the modification time of a probe written now.

        Retention is judged on this one clock, whatever the clocks of the
        processes that wrote the objects being judged.
        """
        self.put(CLOCK_KEY, b"{}")
        stamp = self.modified_ms(CLOCK_KEY)
        if stamp is None:
            raise StoreError(f"{self.describe(CLOCK_KEY)} vanished right after it was written")
        return stamp


class MemoryStore(ObjectStore):
    """In-process store for fast unit tests; ``memory://name`` shares one dict."""

    _registry: dict[str, dict[str, bytes]] = {}
    _mtimes: dict[str, dict[str, int]] = {}
    _registry_lock = threading.Lock()

    def __init__(self, name: str = "default"):
        self.uri = f"memory://{name}"
        with self._registry_lock:
            self._data = self._registry.setdefault(name, {})
            self._times = self._mtimes.setdefault(name, {})
        self._lock = threading.Lock()

    @classmethod
    def reset(cls, name: str) -> None:
        """Forget every object of the named in-memory store."""
        with cls._registry_lock:
            cls._registry.pop(name, None)
            cls._mtimes.pop(name, None)

    def put_if_absent(self, key: str, data: BytesLike) -> None:
        data = bytes(byte_view(data))  # a private copy: the caller may reuse its buffer
        with self._lock:
            if key in self._data:
                raise FileExistsError(self.describe(key))
            self._data[key] = data
            self._times[key] = int(time.time() * 1000)

    def put(self, key: str, data: BytesLike) -> None:
        data = bytes(byte_view(data))
        with self._lock:
            self._data[key] = data
            self._times[key] = int(time.time() * 1000)

    def modified_ms(self, key: str) -> int | None:
        with self._lock:
            return self._times.get(key) if key in self._data else None

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def get(self, key: str) -> bytes:
        with self._lock:
            try:
                return self._data[key]
            except KeyError:
                raise FileNotFoundError(self.describe(key)) from None

    def head(self, key: str) -> int | None:
        with self._lock:
            data = self._data.get(key)
        return None if data is None else len(data)

    def list(self, prefix: str) -> Iterator[str]:
        with self._lock:
            keys = [k for k in self._data if k.startswith(prefix)]
        yield from keys

    def list_dirs(self, prefix: str) -> list[str]:
        prefix = _dir_prefix(prefix)
        with self._lock:
            rest = [k[len(prefix):] for k in self._data if k.startswith(prefix)]
        return sorted({r.split("/", 1)[0] for r in rest if "/" in r})

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)
            self._times.pop(key, None)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_FSYNC_POOL: tuple[int, ThreadPoolExecutor] | None = None
_FSYNC_POOL_LOCK = threading.Lock()


def _fsync_pool() -> ThreadPoolExecutor:
    """One small fsync pool per process (recreated in a forked child, e.g. a Spark worker)."""
    global _FSYNC_POOL
    with _FSYNC_POOL_LOCK:
        if _FSYNC_POOL is None or _FSYNC_POOL[0] != os.getpid():
            _FSYNC_POOL = (os.getpid(), ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="memwal-fsync"))
        return _FSYNC_POOL[1]


class LocalStore(ObjectStore):
    """Local disk. put-if-absent = temp file, fsync, ``os.link`` (fails if the
    name exists), fsync the directory: atomic and durable across power loss."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.uri = "file://" + self.root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _write_temp(self, path: str, data: BytesLike, fsync: bool = True) -> str:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        # Dot-prefixed so listings and Lance readers never take it for an entry.
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = byte_view(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    @staticmethod
    def _fsync_dir(directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put_if_absent(self, key: str, data: BytesLike) -> None:
        self._link_new(key, data, fsync=True)

    def put_if_absent_unsynced(self, key: str, data: BytesLike) -> None:
        self._link_new(key, data, fsync=False)

    def _link_new(self, key: str, data: BytesLike, fsync: bool) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data, fsync)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise FileExistsError(self.describe(key)) from None
        finally:
            os.unlink(tmp)
        if fsync:
            self._fsync_dir(os.path.dirname(path))

    def sync(self, keys: list[str], *, data: bool = True, names: bool = True) -> None:
        """fsync each object (``data``; several at once, since the filesystem
        journal commits concurrent fsyncs together), then each directory once
        (``names``)."""
        paths = [self._path(key) for key in keys]
        if data and len(paths) > 1:
            list(_fsync_pool().map(_fsync_path, paths))
        elif data:
            for path in paths:
                _fsync_path(path)
        for directory in {os.path.dirname(p) for p in paths} if names else ():
            self._fsync_dir(directory)

    def put(self, key: str, data: BytesLike) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        os.replace(tmp, path)
        self._fsync_dir(os.path.dirname(path))

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(self.describe(key)) from None

    def head(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError:
            return None

    def modified_ms(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return None

    def now_ms(self) -> int:
        return int(time.time() * 1000)  # the clock that stamps this disk's files

    def list(self, prefix: str) -> Iterator[str]:
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if os.path.isfile(base):
            yield prefix
            return
        for dirpath, _dirs, files in os.walk(base):
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in files:
                if name.startswith("."):
                    continue
                yield name if rel == "." else f"{rel}/{name}"

    def list_dirs(self, prefix: str) -> list[str]:
        try:
            entries = os.scandir(self._path(prefix.rstrip("/")) if prefix else self.root)
        except FileNotFoundError:
            return []
        with entries:
            return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass


class S3Store(ObjectStore):
    """S3; put-if-absent is ``PUT`` with ``If-None-Match: *``.

    The data path (conditional and plain PUTs, GETs, HEADs) goes through
    obstore, listings, deletes and the bucket check through boto3 (see
    :mod:`memwal_datasource.s3_clients` for why, and for forked processes,
    which use boto3 throughout). Both clients are built once per process and
    configuration, on first use.

    HTTP 412 means the key exists. A conditional PUT is sent exactly once; any
    other failure (5xx, 409, a timeout, a lost response) is raised as
    :class:`TransientStoreError` because the object may or may not have
    landed, and the caller resolves it by reading the key back
    (:func:`put_resolved`). Reads, listings and deletes keep the clients'
    retries (``s3_max_attempts``).
    """

    def __init__(self, bucket: str, prefix: str, options: S3Options):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.options = options
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._obstores: dict[bool, tuple[int, object]] = {}  # conditional -> (pid, store)

    def __repr__(self) -> str:
        return f"S3Store(uri='{self.uri}', options={self.options!r})"

    @property
    def _client(self):
        """The boto3 client for listings, deletes, the bucket check (and reads after fork)."""
        return s3_clients.boto3_client(self.options, conditional=False)

    def data_client(self) -> str:
        """Which client carries this process's data path: ``"obstore"`` or ``"boto3"``."""
        return "obstore" if s3_clients.obstore_usable() else "boto3"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _obstore_call(self, key: str, call, *, conditional: bool = False):
        """Run ``call(store, path)`` on this process's obstore store, errors mapped."""
        pid = os.getpid()
        cached = self._obstores.get(conditional)
        if cached is None or cached[0] != pid:  # first use, or a forked copy of this object
            cached = self._obstores[conditional] = (
                pid, s3_clients.obstore_store(self.options, self.bucket, conditional))
        store = cached[1]
        try:
            return call(store, self._key(key))
        except Exception as exc:  # noqa: BLE001 - mapped to typed errors
            mapped = s3_clients.obstore_error(
                exc, where=self.describe(key), bucket=self.bucket,
                endpoint=self._endpoint_name(), conditional=conditional)
            if mapped is exc:
                raise
            # Auth and existence errors say all there is to say; keep the rest's cause.
            cause = None if isinstance(mapped, (FileExistsError, FileNotFoundError,
                                                StoreAuthError, StoreNotFoundError)) else exc
            raise mapped from self._safe_cause(cause)

    def _raise(self, exc: Exception, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        where = self.describe(key)
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(where) from None
            if code == "NoSuchBucket":
                raise StoreNotFoundError(
                    f"bucket '{self.bucket}' does not exist at {self._endpoint_name()} "
                    f"(while accessing {where})"
                ) from None
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
                raise StoreAuthError(
                    f"S3 at {self._endpoint_name()} rejected the credentials for bucket "
                    f"'{self.bucket}' ({code}) while accessing {where}; check "
                    "aws_access_key_id / aws_secret_access_key"
                ) from None
            cause = self._safe_cause(exc)  # only for the errors that keep it
            if status == 409 or code in ("ConditionalRequestConflict", "OperationAborted"):
                raise TransientStoreError(f"conflict writing {where}: {code}") from cause
            if status is not None and status >= 500 or code in ("SlowDown", "RequestTimeout"):
                raise TransientStoreError(f"S3 error on {where}: {code}") from cause
            raise StoreError(f"S3 error on {where}: {code} (HTTP {status})") from cause
        from botocore.exceptions import NoCredentialsError

        if isinstance(exc, NoCredentialsError):
            raise StoreAuthError(
                "Set storage.aws_access_key_id and storage.aws_secret_access_key (or "
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile or an instance role where "
                f"the driver and every executor run): no S3 credentials were found for bucket "
                f"'{self.bucket}' at {self._endpoint_name()} (while accessing {where})."
            ) from None
        if isinstance(exc, BotoCoreError):
            raise TransientStoreError(
                f"cannot reach S3 at {self._endpoint_name()} for {where}: {type(exc).__name__}"
            ) from self._safe_cause(exc)
        raise exc

    def _safe_cause(self, exc: BaseException | None) -> BaseException | None:
        """``exc`` to chain to a mapped error, or ``None`` if its traceback would quote a
        credential (SDKs print the request URL, with an endpoint's ``user:password@``)."""
        if exc is None:
            return None
        text = "".join(traceback.format_exception(exc))
        return exc if scrub(text, self.options.secret_values()) == text else None

    def _endpoint_name(self) -> str:
        endpoint = self.options.endpoint
        return scrub_url(endpoint) if endpoint else "the default AWS endpoint"

    def put_if_absent(self, key: str, data: BytesLike) -> None:
        view = byte_view(data)
        if s3_clients.obstore_usable():
            import obstore

            self._obstore_call(key, lambda st, path: obstore.put(st, path, view, mode="create"),
                               conditional=True)
            return
        from botocore.exceptions import ClientError

        try:
            s3_clients.boto3_client(self.options, conditional=True).put_object(
                Bucket=self.bucket, Key=self._key(key), Body=_boto3_body(data, view),
                IfNoneMatch="*")
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 412 or code == "PreconditionFailed":
                raise FileExistsError(self.describe(key)) from None
            self._raise(exc, key)
        except Exception as exc:  # noqa: BLE001 - mapped to typed errors
            self._raise(exc, key)

    def put(self, key: str, data: BytesLike) -> None:
        view = byte_view(data)
        if s3_clients.obstore_usable():
            import obstore

            self._obstore_call(key, lambda st, path: obstore.put(st, path, view))
            return
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key),
                                    Body=_boto3_body(data, view))
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, key)

    def get(self, key: str) -> bytes:
        if s3_clients.obstore_usable():
            import obstore

            return self._obstore_call(
                key, lambda st, path: bytes(obstore.get(st, path).bytes()))
        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, key)
            raise  # unreachable; keeps type checkers honest

    def _head(self, key: str) -> tuple[int, int] | None:
        """(size, last-modified ms on the server's clock), or ``None`` if absent."""
        try:
            if s3_clients.obstore_usable():
                import obstore

                meta = self._obstore_call(key, lambda st, path: obstore.head(st, path))
                size, stamp = meta["size"], meta["last_modified"]
            else:
                meta = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
                size, stamp = meta["ContentLength"], meta["LastModified"]
            return int(size), int(stamp.timestamp() * 1000)
        except FileNotFoundError:
            return None
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            try:
                self._raise(exc, key)
            except FileNotFoundError:
                return None
            raise

    def head(self, key: str) -> int | None:
        meta = self._head(key)
        return None if meta is None else meta[0]

    def modified_ms(self, key: str) -> int | None:
        meta = self._head(key)
        return None if meta is None else meta[1]

    def list(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    yield obj["Key"][strip:]
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, prefix)

    def list_dirs(self, prefix: str) -> list[str]:
        full = _dir_prefix(self._key(prefix))
        names: set[str] = set()
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    names.add(common["Prefix"][len(full):].rstrip("/"))
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, prefix)
        return sorted(names)

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, key)

    def check_bucket(self) -> None:
        """Fail fast with a clear error when the bucket is missing or creds are wrong."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except Exception as exc:  # noqa: BLE001
            from botocore.exceptions import ClientError

            if isinstance(exc, ClientError):
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code in ("404", "NoSuchBucket", "NotFound"):
                    raise StoreNotFoundError(
                        f"bucket '{self.bucket}' does not exist at {self._endpoint_name()}"
                    ) from None
            self._raise(exc, "")


MAX_BACKOFF_S = 5.0  # Lance's cap on the delay between retries of one write


def backoff_delay(failures: int, base_delay_ms: int) -> float:
    """Jittered exponential backoff in seconds, capped at :data:`MAX_BACKOFF_S`."""
    delay = min(MAX_BACKOFF_S, base_delay_ms * (2 ** min(failures - 1, 30)) / 1000.0)
    return delay * (0.5 + random.random() / 2)


def put_resolved(store: ObjectStore, key: str, data: BytesLike, *, retries: int,
                 base_delay_ms: int, what: str, sync: bool = True) -> bool:
    """Put-if-absent ``data`` at ``key`` and know the outcome.

    Returns ``True`` when ``key`` holds ``data`` because of this call (the PUT
    succeeded, or an earlier attempt of it whose response was lost landed) and
    ``False`` when ``key`` holds someone else's object. Every collision is read
    back, so a lost acknowledgement is never mistaken for another writer. A
    failed attempt is retried at the same key with the same bytes, at most
    ``retries`` times; when the outcome is still unknowable
    :class:`OutcomeUnknown` is raised (the caller must stop: poison, reopen).
    ``what`` names the write in errors (shard, position, file). With
    ``sync=False`` the object may be durable only after ``store.sync([key])``.
    """
    put = store.put_if_absent if sync else store.put_if_absent_unsynced
    failures = 0
    while True:
        try:
            put(key, data)
            return True
        except FileExistsError:
            try:
                return same_bytes(store.get(key), data)
            except FileNotFoundError:
                # Removed between the two calls: only a collector deletes such keys, so
                # creating it again could put back a number readers have moved past.
                raise OutcomeUnknown(
                    f"{what}: {store.describe(key)} existed and was deleted before it could "
                    "be read back, so whether it was ours is unknowable") from None
            except Exception as exc:  # noqa: BLE001 - any failure here leaves us blind
                raise OutcomeUnknown(
                    f"{what}: {store.describe(key)} exists but could not be read back to "
                    f"tell whether it is ours ({exc})"
                ) from exc
        except (TransientStoreError, OSError) as exc:
            failures += 1
            if failures > retries:
                raise OutcomeUnknown(
                    f"{what}: writing {store.describe(key)} failed {failures} time(s) and may "
                    f"or may not have landed (last error: {exc})"
                ) from exc
            time.sleep(backoff_delay(failures, base_delay_ms))


def _dir_prefix(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def local_path(uri: str) -> str | None:
    """The plain absolute path of a local table location, or ``None`` for other schemes.

    The one rule for local locations, used by our store and (through
    :func:`memwal_datasource.spark.options.table_path`) by what Spark hands
    pylance: a ``file://`` URI is percent-decoded (``Path.as_uri()`` writes a
    space as ``%20`` and Lance decodes it, so keeping it would split one table
    into two directories), a plain path is taken as it is; both become absolute.
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter, not a scheme
        return os.path.abspath(uri)
    if scheme == "":
        return os.path.abspath(uri)
    if scheme != "file":
        return None
    if parsed.netloc not in ("", "localhost"):
        raise UnsupportedStoreError(
            f"write file:///{parsed.netloc}{parsed.path} (three slashes) or a plain path: "
            f"'{scrub_url(uri)}' names host '{parsed.netloc}', and file:// URIs are local")
    return os.path.abspath(unquote(parsed.path))


def open_store(uri: str, storage_options: Mapping[str, str] | None = None) -> ObjectStore:
    """Open the store for a table URI; refuse schemes without put-if-absent."""
    path = local_path(uri)
    if path is not None:
        return LocalStore(path)
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "memory":
        return MemoryStore(parsed.netloc + parsed.path)
    if scheme in ("s3", "s3a"):
        if "@" in parsed.netloc:  # the URI itself is not echoed: its user part is a credential
            raise StoreError(f"the S3 URI for bucket '{parsed.netloc.rsplit('@', 1)[1]}' "
                             "carries credentials (user@ or user:password@); give them as "
                             "storage options (aws_access_key_id, aws_secret_access_key)")
        if not parsed.netloc:
            raise StoreError(f"S3 URI '{uri}' has no bucket (expected s3://bucket/path)")
        return S3Store(parsed.netloc, parsed.path, S3Options.from_storage_options(storage_options))
    if scheme in ("gs", "az", "abfss"):
        if not parsed.netloc:
            root = "container@account.dfs.core.windows.net" if scheme == "abfss" else "bucket"
            raise StoreError(f"write the URI as {scheme}://{root}/path: '{scrub_url(uri)}' "
                             "names no bucket or container")
        if scheme == "gs":
            from .gcs_store import GCSStore

            if "@" in parsed.netloc:
                raise StoreError("give credentials as storage options (google_service_account"
                                 "...), not in the URI: the gs:// URI has a user part")
            return GCSStore.from_uri(parsed.netloc, parsed.path, storage_options)
        from .azure_store import AzureStore

        return AzureStore.from_uri(scheme, parsed.netloc, parsed.path, storage_options)
    raise UnsupportedStoreError(
        f"unsupported storage scheme '{scheme}://' in '{scrub_url(uri)}': the MemWAL needs "
        "conditional writes (put-if-absent) for writer fencing, and this package supports "
        "only local paths, file://, s3://, gs://, az://, abfss:// and memory://"
    )
