"""Local disk: a plain path or ``file://`` URI.

put-if-absent is a temp file, fsync, ``os.link`` (which fails if the name
exists), fsync of the directory: atomic, and durable across power loss.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from .base import BytesLike, ObjectStore, byte_view


def _fsync_path(path: str) -> None:
    """fsync a file or a directory (its names)."""
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
            _fsync_path(os.path.dirname(path))

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
            _fsync_path(directory)

    def put(self, key: str, data: BytesLike) -> None:
        # Hints and clock probes only: atomic (replace) but not synced. A hint a power
        # cut loses or truncates is ignored, and readers probe past it.
        path = self._path(key)
        os.replace(self._write_temp(path, data, fsync=False), path)

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

    def version_tag(self, key: str) -> str | None:
        try:
            st = os.stat(self._path(key))
        except FileNotFoundError:
            return None
        return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"

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
