"""The in-process store (``memory://name``) for fast unit tests."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator

from .base import BytesLike, ObjectStore, _dir_prefix, byte_view


def _etag(data: bytes) -> str:
    """S3's ETag of a single-part object without KMS: the MD5 of its bytes."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class MemoryStore(ObjectStore):
    """In-process store for fast unit tests; ``memory://name`` shares one dict."""

    _registry: dict[str, dict[str, bytes]] = {}
    _mtimes: dict[str, dict[str, int]] = {}  # ns
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

    def put_if_absent(self, key: str, data: BytesLike) -> str | None:
        data = bytes(byte_view(data))  # a private copy: the caller may reuse its buffer
        with self._lock:
            if key in self._data:
                raise FileExistsError(self.describe(key))
            self._data[key] = data
            self._times[key] = time.time_ns()
        return _etag(data)

    def list_after_etags(self, prefix: str, after: str) -> dict[str, str | None]:
        with self._lock:
            return {k: _etag(self._data[k]) for k in sorted(self._data)
                    if k.startswith(prefix) and k > after}

    def put(self, key: str, data: BytesLike) -> None:
        data = bytes(byte_view(data))
        with self._lock:
            self._data[key] = data
            self._times[key] = time.time_ns()

    def modified_ms(self, key: str) -> int | None:
        with self._lock:
            ns = self._times.get(key) if key in self._data else None
        return None if ns is None else ns // 1_000_000

    def version_tag(self, key: str) -> str | None:
        with self._lock:
            ns = self._times.get(key) if key in self._data else None
        return None if ns is None else f"ns:{ns}"

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
