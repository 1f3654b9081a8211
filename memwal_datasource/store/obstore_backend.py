"""The shared base of object stores reached only through obstore (GCS, Azure Blob),
and what every obstore user shares (S3's data path too): the fork guard and the
reading of obstore's error text.

Each backend module (:mod:`.gcs`, :mod:`.azure`) says how to build its obstore
client; this module holds the rest of the
:class:`~memwal_datasource.store.base.ObjectStore` contract:

* ``put_if_absent`` is one create-only PUT (``obstore.put(..., mode="create")``)
  on a client with ``max_retries=0``: an SDK retry of a PUT whose response was
  lost comes back "exists" and would look like another writer's object. An
  "exists" answer (:func:`~.base.conditional_put_outcome`, shared with S3) raises
  ``FileExistsError``; every other failure raises
  :class:`~memwal_datasource.errors.TransientStoreError` (the object may or may
  not have landed) and :func:`~.base.put_resolved` retries at the same key with
  the same bytes and reads collisions back.
* reads, listings, deletes and hint PUTs keep the client's retries
  (``s3_max_attempts``, which applies to every object store).

Clients are built once per process and configuration. obstore's runtime does
not survive ``fork()`` (see :mod:`.s3_clients`), and these backends have no
boto3 to fall back on, so a process forked from one that used obstore is refused
with an error that says to use the ``spawn`` start method. obstore itself is
imported inside the methods that call it, to keep it lazy: importing the package
must not start its runtime.
"""

from __future__ import annotations

import os
import re
import threading
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

from ..errors import (
    ConfigError,
    StoreAuthError,
    StoreError,
    StoreNotFoundError,
    TransientStoreError,
)
from ..options import (
    ALLOW_HTTP,
    OUR_KEYS,
    REDACTED,
    S3_CONNECT_TIMEOUT,
    S3_MAX_ATTEMPTS,
    S3_READ_TIMEOUT,
    _parse_number,
    is_secret,
    normalize,
    parse_bool,
    scrub,
    scrub_url,
    secret_values,
)
from .base import (
    BytesLike,
    ObjectStore,
    _dir_prefix,
    byte_view,
    conditional_put_error,
    tag_of,
)

_LOCK = threading.Lock()
_CLIENTS: dict[tuple, Any] = {}
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_KIND = re.compile(r"kind: (\w+)")
# The process whose calls started obstore's runtime (inherited by forked children).
_OBSTORE_PID: int | None = None


def obstore_usable() -> bool:
    """True unless this process was forked from one that already ran obstore calls."""
    return _OBSTORE_PID is None or _OBSTORE_PID == os.getpid()


def note_obstore_use() -> None:
    """Record that this process runs obstore calls (its forked children then cannot)."""
    global _OBSTORE_PID
    if _OBSTORE_PID is None:
        _OBSTORE_PID = os.getpid()


def parse_obstore_error(exc: BaseException) -> tuple[int | None, str, str | None]:
    """``(status, code, kind)`` read from an obstore error's text: the HTTP status
    (``None`` if it carries none), the service's error code (else ``"HTTP <status>"``,
    else ``""``) and, for a failure without a response, its kind (``None`` if unsaid)."""
    text = str(exc)
    match = _STATUS.search(text)
    status = int(match.group(1)) if match else None
    found = _CODE.search(text)
    code = found.group(1) if found else (f"HTTP {status}" if status else "")
    kind = _KIND.search(text)
    return status, code, kind.group(1) if kind else None


def safe_cause(exc: BaseException | None, secrets: list[str]) -> BaseException | None:
    """``exc`` to chain to a mapped error, or ``None`` if its traceback would quote a
    credential (SDKs print the request URL, with an endpoint's ``user:password@``)."""
    if exc is None:
        return None
    text = "".join(traceback.format_exception(exc))
    return exc if scrub(text, secrets) == text else None


def raise_mapped(exc: BaseException, mapped: BaseException, secrets: list[str]) -> NoReturn:
    """Raise ``mapped``, the package's error for ``exc`` (``exc`` itself if it has none).

    Auth and existence errors say all there is to say; the rest keep ``exc`` as their
    cause unless its traceback would quote a credential (:func:`safe_cause`).
    """
    if mapped is exc:
        raise exc
    cause = None if isinstance(mapped, (FileExistsError, FileNotFoundError,
                                        StoreAuthError, StoreNotFoundError)) else exc
    raise mapped from safe_cause(cause, secrets)

def map_obstore_error(exc: BaseException, *, where: str, service: str, container_word: str,
                      container: str, endpoint: str, credential_hint: str,
                      conditional: bool = False, listing: bool = False) -> BaseException:
    """The package's exception for an obstore failure (the caller raises it), for every
    backend obstore carries (S3's data path, GCS, Azure Blob).

    * a create-only PUT's answer about the key -> :func:`~.base.conditional_put_error`:
      "exists" (412, Azure's 409 ``BlobAlreadyExists``) -> ``FileExistsError``,
      whatever obstore class carries it (object_store before
      apache/arrow-rs-object-store#830 reported Azure's as a ``PreconditionError``),
      any other 409 -> ``TransientStoreError``;
    * 404 -> ``FileNotFoundError``, or ``StoreNotFoundError`` for a missing bucket
      or container (and for a 404 on a PUT or a listing that is not about the key);
    * 401/403 -> ``StoreAuthError`` naming the options to check, never their values;
    * 5xx, 408, 409, 412, 429, timeouts, refused or reset connections ->
      ``TransientStoreError`` (for a PUT: it may or may not have landed);
    * any other status -> ``StoreError``.
    """
    from obstore.exceptions import (  # lazy (module docstring)
        BaseError,
        NotModifiedError,
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )

    if not isinstance(exc, (BaseError, OSError)):
        return exc  # a programming error (a bad payload type, ...): raised as it is
    status, code, kind = parse_obstore_error(exc)
    if conditional:
        mapped = conditional_put_error(
            status, code, where,
            precondition_failed=isinstance(exc, (PreconditionError, NotModifiedError)))
        if mapped is not None:
            return mapped
    if isinstance(exc, FileNotFoundError) or status == 404:
        if code in ("NoSuchBucket", "ContainerNotFound") or (
                (conditional or listing) and code != "NoSuchKey"):
            return StoreNotFoundError(
                f"create the {container_word} first: {container_word} '{container}' does not "
                f"exist at {endpoint} (while accessing {where})")
        return FileNotFoundError(where)
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or status in (401, 403):
        return StoreAuthError(
            f"check {credential_hint}: {service} at {endpoint} rejected the credentials for "
            f"{container_word} '{container}' ({code}) while accessing {where}")
    if status is None:
        return TransientStoreError(
            f"cannot reach {service} at {endpoint} for {where}: {kind or type(exc).__name__}")
    if status >= 500 or status in (408, 409, 412, 429):
        return TransientStoreError(f"{service} error on {where}: {code} (HTTP {status})")
    return StoreError(f"{service} error on {where}: {code} (HTTP {status})")


@dataclass(frozen=True)
class ObstoreOptions:
    """The storage options one backend hands to obstore, parsed once.

    ``config`` holds the backend's own ``object_store`` keys (``google_*``,
    ``azure_*``) exactly as given, so pylance and this store read one mapping
    the same way. ``repr`` never shows a credential.
    """

    config: tuple[tuple[str, str], ...]
    allow_http: bool = False
    max_attempts: int = 5
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    @classmethod
    def from_storage_options(cls, storage_options: Mapping[str, str] | None,
                             prefix: str) -> ObstoreOptions:
        """Keep the keys starting with ``prefix``; the rest are other backends' (ignored)."""
        opts = normalize(storage_options)
        config = tuple(sorted((k, v) for k, v in opts.items()
                              if k.startswith(prefix) and k not in OUR_KEYS))
        return cls(
            config=config,
            allow_http=parse_bool(ALLOW_HTTP, opts.get(ALLOW_HTTP, "false")),
            max_attempts=int(_parse_number(S3_MAX_ATTEMPTS, opts.get(S3_MAX_ATTEMPTS, "5"),
                                           int, 1)),
            connect_timeout_s=_parse_number(S3_CONNECT_TIMEOUT,
                                            opts.get(S3_CONNECT_TIMEOUT, "10"), float, 0.1),
            read_timeout_s=_parse_number(S3_READ_TIMEOUT, opts.get(S3_READ_TIMEOUT, "60"),
                                         float, 0.1),
        )

    def get(self, name: str) -> str | None:
        return dict(self.config).get(name)

    def secret_values(self) -> list[str]:
        """Credentials (and URL passwords) these options hold, for :func:`scrub`."""
        return secret_values(dict(self.config))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}='{REDACTED if is_secret(k) else scrub_url(v)}'"
                          for k, v in self.config)
        return (f"ObstoreOptions({shown}, allow_http={self.allow_http}, "
                f"max_attempts={self.max_attempts})")

    __str__ = __repr__

    def client_options(self) -> dict[str, Any]:
        return {"allow_http": self.allow_http,
                "connect_timeout": timedelta(seconds=self.connect_timeout_s),
                # A bound on the whole request: a stalled server is a timeout, not a hang.
                "timeout": timedelta(seconds=self.read_timeout_s)}

    def check_http(self, endpoint_key: str) -> None:
        """Refuse a plain-http endpoint unless ``allow_http`` is set (as for S3)."""
        endpoint = self.get(endpoint_key)
        if endpoint and endpoint.startswith("http://") and not self.allow_http:
            raise ConfigError(f"set {ALLOW_HTTP}=true to allow it: storage option "
                              f"'{endpoint_key}' is plain http ({scrub_url(endpoint)})")


def _tag(meta) -> str:
    """:func:`~.base.tag_of` an obstore ``ObjectMeta``."""
    return tag_of(meta.get("e_tag"), meta["last_modified"].timestamp(), meta["size"])


class ObstoreStore(ObjectStore):
    """An :class:`ObjectStore` over one obstore client; subclasses name the backend.

    Subclasses set ``service`` (for messages), ``container_word`` ("bucket",
    "container"), ``container``, ``prefix``, ``options``, ``uri``, and implement
    :meth:`_new_client`.
    """

    remote = True  # every request is a round trip (read_both overlaps two)

    service: str = "object store"
    container_word: str = "bucket"
    credential_hint: str = "the storage options"
    container: str
    prefix: str
    options: ObstoreOptions

    # -- backend hooks -------------------------------------------------------------------

    def _new_client(self, retry: dict[str, Any]) -> Any:
        """Build the obstore store (``retry`` is its ``retry_config``)."""
        raise NotImplementedError

    def _endpoint_name(self) -> str:
        return f"the {self.service} endpoint"

    # -- plumbing --------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"{type(self).__name__}(uri='{self.uri}', options={self.options!r})"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _client(self, conditional: bool) -> Any:
        if not obstore_usable():
            raise StoreError(
                f"start this process with multiprocessing's 'spawn' method (or a fresh "
                f"interpreter): it was forked from one that already used obstore, whose "
                f"runtime does not survive fork(), and {self.service} has no other client")
        key = (os.getpid(), type(self), self.container, self.options, conditional)
        client = _CLIENTS.get(key)
        if client is None:
            with _LOCK:
                client = _CLIENTS.get(key)
                if client is None:
                    retries = 0 if conditional else max(0, self.options.max_attempts - 1)
                    try:
                        client = self._new_client({"max_retries": retries})
                    except ConfigError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - configuration error, scrubbed
                        raise StoreError(
                            f"check the {self.service} storage options: the client for "
                            f"{self.container_word} '{self.container}' cannot be configured "
                            f"({type(exc).__name__}: {self._first_line(exc)})") from None
                    _CLIENTS[key] = client
        note_obstore_use()
        return client

    def _first_line(self, exc: BaseException) -> str:
        return scrub(str(exc), self.options.secret_values()).split("\n", 1)[0][:300]

    def _call(self, key: str, call, *, conditional: bool = False, listing: bool = False):
        """Run ``call(client, path)``; map failures to the package's errors."""
        client = self._client(conditional)
        try:
            return call(client, self._key(key))
        except Exception as exc:  # noqa: BLE001 - mapped below
            raise_mapped(exc, self._map(exc, key, conditional=conditional, listing=listing),
                         self.options.secret_values())

    def _map(self, exc: BaseException, key: str, *, conditional: bool,
             listing: bool = False) -> BaseException:
        """The package's exception for an obstore failure (:func:`map_obstore_error`)."""
        return map_obstore_error(
            exc, where=self.describe(key), service=self.service,
            container_word=self.container_word, container=self.container,
            endpoint=self._endpoint_name(), credential_hint=self.credential_hint,
            conditional=conditional, listing=listing)

    # -- the contract ----------------------------------------------------------------------

    def put_if_absent(self, key: str, data: BytesLike) -> None:
        import obstore  # lazy (module docstring)

        view = byte_view(data)
        self._call(key, lambda st, path: obstore.put(st, path, view, mode="create"),
                   conditional=True)

    def put(self, key: str, data: BytesLike) -> None:
        import obstore  # lazy (module docstring)

        view = byte_view(data)
        self._call(key, lambda st, path: obstore.put(st, path, view))

    def get(self, key: str) -> bytes:
        import obstore  # lazy (module docstring)

        return self._call(key, lambda st, path: bytes(obstore.get(st, path).bytes()))

    def head(self, key: str) -> int | None:
        import obstore  # lazy (module docstring)

        try:
            return int(self._call(key, lambda st, path: obstore.head(st, path)["size"]))
        except FileNotFoundError:
            return None

    def modified_ms(self, key: str) -> int | None:
        import obstore  # lazy (module docstring)

        try:
            stamp = self._call(key, lambda st, path: obstore.head(st, path)["last_modified"])
        except FileNotFoundError:
            return None
        return int(stamp.timestamp() * 1000)

    def version_tag(self, key: str) -> str | None:
        import obstore  # lazy (module docstring)

        try:
            meta = self._call(key, lambda st, path: obstore.head(st, path))
        except FileNotFoundError:
            return None
        return _tag(meta)

    def list_tagged(self, prefix: str) -> dict[str, str] | None:
        """One listing of the directory ``prefix``: keys and their :meth:`version_tag`."""
        return {key: _tag(meta) for key, meta in self._listing(prefix)}

    def list(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix``; a prefix that is not a whole directory
        (``wal/01``) lists its directory and keeps the matching names."""
        for key, _meta in self._listing(prefix):
            yield key

    def _listing(self, prefix: str) -> list[tuple[str, dict]]:
        """``(key, ObjectMeta)`` of every key under ``prefix``, from one listing (of the
        directory holding ``prefix`` when it is not a whole one)."""
        import obstore  # lazy (module docstring)

        if prefix and not prefix.endswith("/"):
            directory = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        else:
            directory = prefix
        base = self._key(directory).rstrip("/") or None
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0

        def run(client, _path):
            return [meta for batch in obstore.list(client, base) for meta in batch]

        return [(meta["path"][strip:], meta) for meta in self._call(directory, run, listing=True)
                if meta["path"].startswith(full)]

    def list_dirs(self, prefix: str) -> list[str]:
        import obstore  # lazy (module docstring)

        full = _dir_prefix(self._key(prefix))

        def run(client, _path):
            return obstore.list_with_delimiter(client, full or None)["common_prefixes"]

        names = {p[len(full):].strip("/") for p in self._call(prefix, run, listing=True)}
        return sorted(n for n in names if n)

    def delete(self, key: str) -> None:
        import obstore  # lazy (module docstring)

        try:
            self._call(key, lambda st, path: obstore.delete(st, path))
        except FileNotFoundError:
            pass

    def delete_many(self, keys: list[str]) -> None:
        import obstore  # lazy (module docstring)

        if len(keys) < 2:
            return super().delete_many(keys)
        try:  # one bulk request where the service has one; a missing key may fail it
            self._call(keys[0], lambda st, _path: obstore.delete(st, [self._key(k) for k in keys]))
        except FileNotFoundError:
            super().delete_many(keys)

    def check_bucket(self) -> None:
        """Fail fast with a clear error when the bucket/container is missing or creds are wrong."""
        self.list_dirs("")
