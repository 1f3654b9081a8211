"""The newest fold of each table's commit log this process and this host know.

A reader folds the commit records after the latest checkpoint. A process that
committed remembers its fold, so its next commit reads only the records
committed since (docs/protocol.md, "Committing at scale"). Spark commits each
job in whichever of the driver's Python workers is idle, so commits take turns
between workers and each one's own fold lags by what the others committed: on
S3 a commit made 13 requests instead of 4. So every process also leaves its
newest fold of a table in a file on this host, and a reader starts from the
newer of its own and the host's.

A fold from another process is trusted exactly as one's own: only while its
last record is still stored with the digest it folded
(``CommitLogReader._check_seed``); a table made again at the same place, or a
log collected past the fold, starts cold. The file is a cache: overwritten
in place with a CRC (no fsync), read best effort, and ignored when torn,
unreadable, of another format or package version, or in a directory this user
does not own alone. Only folds of remote stores are shared: on local disk a
commit reads the records it lacks for less than the file costs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import stat
import struct
import tempfile
import threading
import time
import zlib

from ..format.commit_format import CHECKPOINT_FORMAT, Checkpoint

log = logging.getLogger(__name__)

# Records 1..n folded, the newest checkpoint known, and record n's ETag when the store
# said it is the MD5 of the bytes folded (None: not known; a seed check then GETs n).
Fold = tuple[Checkpoint, Checkpoint | None, str | None]

HOST_FORMAT = 1
PRUNE_AFTER_S = 24 * 3600  # a host fold untouched this long is deleted by the next process
PRUNE_KEEP = 2048  # and beyond this many files, the oldest go

_FOLDS: dict[str, Fold] = {}
_SEEN: dict[str, tuple[int, int]] = {}  # uri: the host file's (length, CRC) last read or written
_LOCK = threading.Lock()
_host_dir: str | None = None
_host_checked = False
_pruned = False


@functools.cache
def _version() -> str:
    """What a fold file must say to be read: this package's version and formats."""
    try:
        package = importlib.metadata.version("memwal_datasource")
    except importlib.metadata.PackageNotFoundError:
        package = "unknown"
    return f"{package}/{CHECKPOINT_FORMAT}/{HOST_FORMAT}"


def _directory() -> str | None:
    """This user's fold directory (made 0700), or ``None`` if it is not ours alone."""
    global _host_dir, _host_checked
    if _host_checked:
        return _host_dir
    _host_checked = True
    path = os.path.join(tempfile.gettempdir(), f"memwal-folds-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
                or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            log.debug("not sharing commit-log folds: %s is not this user's alone", path)
            return None
    except OSError as exc:
        log.debug("not sharing commit-log folds: %s: %s", path, exc)
        return None
    _host_dir = path
    return path


def _file(uri: str, host: bool) -> str | None:
    if not host:
        return None
    d = _directory()
    return None if d is None else os.path.join(
        d, hashlib.sha256(uri.encode()).hexdigest()[:40] + ".json")


_HEADER = struct.Struct("<II")  # the body's length and CRC-32


def _read_host(uri: str, path: str) -> Fold | None:
    """The host's fold of ``uri`` if it changed since this process last looked.

    Writers overwrite the file in place (a rename costs 50 times more), so a read
    racing a write may see a torn file: the header's CRC turns that into a miss.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        head = os.pread(fd, _HEADER.size, 0)
        if len(head) < _HEADER.size:
            return None
        size, crc = _HEADER.unpack(head)
        if _SEEN.get(uri) == (size, crc):
            return None
        data = os.pread(fd, size, _HEADER.size)
        if len(data) != size or zlib.crc32(data) != crc:
            return None
        _SEEN[uri] = (size, crc)
        body = json.loads(data)
        if body.get("version") != _version() or body.get("uri") != uri:
            return None
        state = Checkpoint.from_dict(body["state"], path, int(body["state"]["sequence"]))
        ck = body.get("checkpoint")
        etag = body.get("etag")
        return state, (None if ck is None else
                       Checkpoint.from_dict(ck, path, int(ck["sequence"]))), (
                           etag if isinstance(etag, str) else None)
    except Exception as exc:  # noqa: BLE001 - a cache: anything unreadable is a miss
        log.debug("ignoring the host's commit-log fold %s: %s", path, exc)
        return None
    finally:
        os.close(fd)


def _write_host(uri: str, path: str, fold: Fold) -> None:
    state, ck, etag = fold
    body = json.dumps({"version": _version(), "uri": uri, "state": state.to_dict(),
                       "checkpoint": None if ck is None else ck.to_dict(),
                       "etag": etag}).encode()
    crc = zlib.crc32(body)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, _HEADER.pack(len(body), crc) + body, 0)
        finally:
            os.close(fd)
        _SEEN[uri] = (len(body), crc)  # our own write: nothing to read back
    except OSError as exc:
        log.debug("could not share the commit-log fold of %s: %s", uri, exc)
    _prune_once(os.path.dirname(path))


def _prune_once(directory: str) -> None:
    """Once per process: delete host folds untouched for a day, and the oldest beyond
    :data:`PRUNE_KEEP` (every table a host ever committed to leaves one)."""
    global _pruned
    if _pruned:
        return
    _pruned = True
    try:
        entries = []
        with os.scandir(directory) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    entries.append((e.stat(follow_symlinks=False).st_mtime, e.path))
        entries.sort(reverse=True)
        old = time.time() - PRUNE_AFTER_S
        for i, (mtime, path) in enumerate(entries):
            if i >= PRUNE_KEEP or mtime < old:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    except OSError as exc:
        log.debug("could not prune %s: %s", directory, exc)


def seed(uri: str, host: bool) -> Fold | None:
    """The newest fold of ``uri``'s log known to this process or (``host``) left on
    this host."""
    path = _file(uri, host)
    with _LOCK:
        mine = _FOLDS.get(uri)
        theirs = _read_host(uri, path) if path is not None else None
        if theirs is not None and (mine is None or theirs[0].sequence > mine[0].sequence):
            _FOLDS[uri] = mine = theirs
        return mine


def remember(uri: str, state: Checkpoint, ckpt: Checkpoint | None, host: bool,
             etag: str | None = None) -> None:
    """Keep ``state`` (a copy the caller no longer folds) as the newest fold of ``uri``,
    in this process and (``host``) for the others on this host; ``etag``: see
    :data:`Fold`."""
    path = _file(uri, host)
    with _LOCK:
        old = _FOLDS.get(uri)
        if old is not None and old[0].sequence > state.sequence:
            return
        _FOLDS[uri] = (state, ckpt, etag)
        if path is not None:
            _write_host(uri, path, _FOLDS[uri])


def forget(uri: str, fold: Fold, host: bool) -> None:
    """``fold`` proved stale (its last record is gone or another): no reader starts there."""
    path = _file(uri, host)
    with _LOCK:
        if _FOLDS.get(uri) is fold:
            del _FOLDS[uri]
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)  # at worst another process's newer fold: a cache miss
            _SEEN.pop(uri, None)


def forget_all() -> None:
    """Drop every fold, this process's and this host's (tests; a process that wants
    cold reads)."""
    with _LOCK:
        _FOLDS.clear()
        _SEEN.clear()
        d = _directory()
        if d is None:
            return
        with contextlib.suppress(OSError), os.scandir(d) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
