"""The object-store contract, the one reading of conditional-write answers, and
:func:`put_resolved`, the one place an ambiguous conditional write is resolved.

:class:`ObjectStore`'s docstrings are the contract every backend honours (it is
what makes WAL fencing safe); the backends live in sibling modules
(:mod:`.local`, :mod:`.memory`, :mod:`.s3`, :mod:`.gcs`, :mod:`.azure`) and are
chosen by URI scheme in :func:`memwal_datasource.store.open_store`.
Nothing here imports a backend or an SDK.
"""

from __future__ import annotations

import os
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent import futures
from enum import Enum
from typing import Any, TypeAlias, TypeVar

from ..errors import OutcomeUnknown, StoreError, TransientStoreError

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


def _dir_prefix(prefix: str) -> str:
    """``prefix`` as a directory prefix: ending in ``/`` unless it is the root (``""``)."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


class ObjectStore(ABC):
    """A flat key space rooted at a table URI; keys use ``/`` separators.

    Keys are relative to the root (:attr:`uri`). Every method may also raise
    :class:`~memwal_datasource.errors.StoreNotFoundError` (the bucket or container
    is missing), :class:`~memwal_datasource.errors.StoreAuthError` (credentials
    missing or refused), :class:`~memwal_datasource.errors.TransientStoreError`
    (the backend could not be reached or answered 5xx/408/409/429, after the
    client's own retries where a method keeps them) or
    :class:`~memwal_datasource.errors.StoreError` (any other refusal). Messages
    never quote a credential.
    """

    uri: str
    # A request is a network round trip worth overlapping with another (object stores);
    # local disk and memory answer faster than a thread hand-off (see read_both).
    remote: bool = False

    @abstractmethod
    def put_if_absent(self, key: str, data: BytesLike) -> str | None:
        """Create ``key`` holding ``data``, atomically, or fail: the fencing primitive.

        Returns once the object is durable: its ETag (unquoted) where the store's
        answer carries one (as :meth:`list_after_etags` shows it), else ``None``. No
        reader ever sees a partial object, and of N concurrent callers exactly one
        succeeds. Raises:

        * ``FileExistsError`` (message: :meth:`describe` of ``key``) when ``key``
          already exists: another writer's object, or this call's own earlier
          attempt whose acknowledgement was lost. Nothing was changed.
        * :class:`~memwal_datasource.errors.TransientStoreError` when the object
          may or may not have landed (a timeout, a lost response, 5xx, a 409
          conflict). The request is sent exactly once: an SDK retry of a lost
          write comes back "exists" and would pass for another writer's object.

        Callers that must know the outcome use :func:`put_resolved`. How each
        backend's answers map to these two is :func:`conditional_put_outcome`.
        """

    def put_if_absent_unsynced(self, key: str, data: BytesLike) -> str | None:
        """Like :meth:`put_if_absent`, but may leave the object durable only after
        :meth:`sync` (local disk skips the per-object fsyncs). Object stores and
        memory are durable at once, so this is ``put_if_absent`` there."""
        return self.put_if_absent(key, data)

    def sync(self, keys: list[str], *, data: bool = True,  # noqa: B027 - durable at once
             names: bool = True) -> None:
        """Make objects written with :meth:`put_if_absent_unsynced` durable: their
        ``data``, and their ``names`` (a caller may sync data first, names later).
        A no-op where writes are durable at once."""

    @abstractmethod
    def put(self, key: str, data: BytesLike) -> None:
        """Create or overwrite ``key`` (hints and clock probes only; never WAL
        entries, manifests or records, which use :meth:`put_if_absent`). Readers see
        the old object or the new one, never a mix. Need not be durable (a hint lost
        in a crash costs a probe). Keeps the client's retries."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Return the whole object's bytes; raise ``FileNotFoundError`` (message:
        :meth:`describe` of ``key``) if it is absent."""

    @abstractmethod
    def head(self, key: str) -> int | None:
        """Return the object's size in bytes, or ``None`` if absent (never raises
        ``FileNotFoundError``)."""

    def exists(self, key: str) -> bool:
        """True if ``key`` exists (:meth:`head` is not ``None``)."""
        return self.head(key) is not None

    @abstractmethod
    def list(self, prefix: str) -> Iterator[str]:
        """Yield every key under ``prefix`` (recursive), relative to the root, in no
        particular order; nothing (no error) for a prefix with no keys.

        ``prefix`` is ``""`` (everything) or a directory ending in ``/``, as every
        caller passes it. Keys of temporary files (local disk's dot-prefixed
        ``.name.tmp``) are never yielded.
        """

    # Whether :meth:`list_after` asks the service to start after a key (S3's
    # ``start-after``): one request however many keys sort below it.
    lists_after = False

    def list_after(self, prefix: str, after: str) -> list[str]:
        """Every key under the directory ``prefix`` sorting after ``after``, in one
        listing (as :meth:`list`: recursive, no temporary files, a snapshot no older
        than the call). Here: :meth:`list`, filtered; :attr:`lists_after` stores do
        it in the request."""
        return sorted(k for k in self.list(prefix) if k > after)

    def list_after_etags(self, prefix: str, after: str) -> dict[str, str | None]:
        """:meth:`list_after`, each key with its ETag (unquoted) where the listing
        carries one (``None`` elsewhere): the same one listing."""
        return dict.fromkeys(self.list_after(prefix, after))

    @abstractmethod
    def list_dirs(self, prefix: str) -> list[str]:
        """Sorted names (no ``/``) of the immediate sub-directories (common prefixes)
        of ``prefix`` (with or without a trailing ``/``); ``[]`` if there are none."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error. Only garbage collection
        deletes WAL files, under the rules of :mod:`memwal_datasource.maintenance.gc`."""

    def delete_many(self, keys: list[str]) -> None:
        """Remove every key of ``keys`` (missing ones are no error), in as few requests
        as the store allows (one bulk request on S3). Same rules as :meth:`delete`."""
        for key in keys:
            self.delete(key)

    def describe(self, key: str) -> str:
        """A human-readable location for ``key`` (``<uri>/<key>``), for messages."""
        return f"{self.uri.rstrip('/')}/{key}"

    @abstractmethod
    def modified_ms(self, key: str) -> int | None:
        """When ``key`` was last written, in ms since the epoch on the store's clock
        (the server's for object stores); ``None`` if absent."""

    def version_tag(self, key: str) -> str | None:
        """An opaque tag of the object now at ``key`` that differs for an object written
        there anew, even in the same second (the ETag and time on object stores);
        ``None`` if absent. Telling a table deleted and made anew at the same path."""
        ms = self.modified_ms(key)
        return None if ms is None else f"ms:{ms}"

    def list_tagged(self, prefix: str) -> dict[str, str] | None:
        """Every key under the directory ``prefix`` with its :meth:`version_tag`, from the
        one listing :meth:`list` makes (object stores list ETags, times and sizes);
        ``None`` where a listing carries no tags (then ask :meth:`version_tag`)."""
        return None

    def now_ms(self) -> int:
        """The store's clock now (ms): the modification time of a probe written now.

        Retention is judged on this one clock, whatever the clocks of the
        processes that wrote the objects being judged. Object stores overwrite
        :data:`CLOCK_KEY` to read it; local disk and memory read this host's clock.
        """
        self.put(CLOCK_KEY, b"{}")
        stamp = self.modified_ms(CLOCK_KEY)
        if stamp is None:
            raise StoreError(f"{self.describe(CLOCK_KEY)} vanished right after it was written")
        return stamp



def unquoted(etag: str | None) -> str | None:
    """An ETag without its quotes (Azure quotes a HEAD's, not a listing's; S3 quotes
    both)."""
    return None if etag is None else str(etag).strip(chr(34))


def tag_of(etag: str | None, modified_s: float, size: int) -> str:
    """An object store's :meth:`ObjectStore.version_tag`, from a HEAD's or a listing's
    metadata alike: the ETag unquoted (Azure quotes a HEAD's, not a listing's), the
    last-modified time in whole seconds (a listing may carry milliseconds, a HEAD has
    seconds), the size."""
    return f"{unquoted(etag) or ''}:{int(modified_s)}:{size}"


# -- conditional writes: one reading of every backend's answer -------------------------

class PutOutcome(Enum):
    """What a failed create-only PUT says about its key."""

    EXISTS = "exists"  # the key exists: someone's object (maybe ours, its reply lost)
    UNKNOWN = "unknown"  # a conflict: the object may or may not have landed


# Answers to a create-only PUT: S3 (If-None-Match: *), GCS (x-goog-if-generation-match: 0)
# and Azure (If-None-Match: *), through boto3 or obstore. No backend uses another's code.
EXISTS_STATUSES = frozenset({
    412,  # Precondition Failed: S3, GCS (conditionNotMet), Azure (ConditionNotMet)
    304,  # Not Modified: what object_store says some S3 servers answer If-None-Match with
})
EXISTS_CODES = frozenset({
    "PreconditionFailed",  # S3's 412
    "ConditionNotMet",  # Azure's 412
    "BlobAlreadyExists",  # Azure's 409 for an existing blob
})
# A 409 with any other code (S3: a conditional PUT racing another; Azure: a lease, a
# container being deleted) knows nothing about the key. obstore reports every 409 as
# AlreadyExistsError, so its class alone never means "exists".
UNKNOWN_STATUSES = frozenset({409})
UNKNOWN_CODES = frozenset({"ConditionalRequestConflict", "OperationAborted"})


def conditional_put_outcome(status: int | None, code: str = "", *,
                            precondition_failed: bool = False) -> PutOutcome | None:
    """What a create-only PUT's failure means, for every backend.

    ``status`` is the HTTP status (``None`` if the SDK's error did not carry one),
    ``code`` the service's error code (``""`` if none). ``precondition_failed``
    says the SDK's error class stands for a failed precondition (obstore's
    ``PreconditionError`` / ``NotModifiedError``); it is used only when no status
    can be read. ``None``: not an answer about the key (404, auth, 5xx,
    timeouts), for the backend's general error mapping.
    """
    if status in EXISTS_STATUSES or code in EXISTS_CODES or (
            status is None and precondition_failed):
        return PutOutcome.EXISTS
    if status in UNKNOWN_STATUSES or code in UNKNOWN_CODES:
        return PutOutcome.UNKNOWN
    return None


def conditional_put_error(status: int | None, code: str, where: str, *,
                          precondition_failed: bool = False) -> Exception | None:
    """The exception for a create-only PUT's failure at ``where`` (see
    :func:`conditional_put_outcome`): ``FileExistsError``, ``TransientStoreError``,
    or ``None`` for the backend's general mapping."""
    outcome = conditional_put_outcome(status, code, precondition_failed=precondition_failed)
    if outcome is PutOutcome.EXISTS:
        return FileExistsError(where)
    if outcome is PutOutcome.UNKNOWN:
        said = f"HTTP {status}" if status is not None else ""
        detail = f"{code} ({said})" if code and said and code != said else code or said
        return TransientStoreError(f"conflict writing {where}: {detail}")
    return None


# -- resolving a conditional write -------------------------------------------------------

MAX_BACKOFF_S = 5.0  # Lance's cap on the delay between retries of one write


def backoff_delay(failures: int, base_delay_ms: int) -> float:
    """Jittered exponential backoff in seconds, capped at :data:`MAX_BACKOFF_S`."""
    delay = min(MAX_BACKOFF_S, base_delay_ms * (2 ** min(failures - 1, 30)) / 1000.0)
    return delay * (0.5 + random.random() / 2)


def put_resolved(store: ObjectStore, key: str, data: BytesLike, *, retries: int,
                 base_delay_ms: int, what: str, sync: bool = True,
                 superseded_if_gone: bool = False, failed: list[int] | None = None,
                 etag: list[str | None] | None = None) -> bool:
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
    ``superseded_if_gone``: for keys that only a newer writer deletes (lease
    generations), a key deleted before it could be read back was superseded,
    whoever wrote it, so ``False`` (not ours to build on) instead of
    :class:`OutcomeUnknown`. ``failed``, when given, gets the number of attempts that
    failed before the answer (an attempt whose acknowledgement was lost may have landed
    even when ``False`` is returned, if a collector freed the key since). ``etag``,
    when given, gets what the successful PUT returned (``None`` after a read-back).
    """
    put = store.put_if_absent if sync else store.put_if_absent_unsynced
    failures = 0
    while True:
        if failed is not None:
            failed[:] = [failures]
        if etag is not None:
            etag[:] = [None]
        try:
            landed = put(key, data)
            if etag is not None:
                etag[:] = [landed]
            return True
        except FileExistsError:
            try:
                return same_bytes(store.get(key), data)
            except FileNotFoundError:
                if superseded_if_gone:
                    return False
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


A = TypeVar("A")
B = TypeVar("B")
_READS: futures.ThreadPoolExecutor | None = None
_READS_LOCK = threading.Lock()


def _reset_reads() -> None:
    global _READS
    _READS = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_reset_reads)


def read_both(store: ObjectStore, first: Callable[[], A], second: Callable[[], B]
              ) -> tuple[A, B]:
    """``(first(), second())``: two independent reads, at once on a remote store (one
    round trip instead of two), one after the other elsewhere. The caller must not
    depend on their order: either may see the store first. ``second``'s error wins
    only if ``first`` succeeded."""
    a, b = read_all(store, first, second)
    return a, b


def _read_pool() -> futures.ThreadPoolExecutor:
    global _READS
    with _READS_LOCK:
        if _READS is None:
            _READS = futures.ThreadPoolExecutor(8, thread_name_prefix="memwal-read")
        return _READS


def beside(store: ObjectStore, call: Callable[[], A]) -> futures.Future[A]:
    """``call()`` started now, to run beside what the caller does next on a remote
    store (its round trip overlaps the caller's), or run at once elsewhere (a local
    call costs less than a thread hand-off). The caller must take the result before
    it relies on it, and must accept ``call`` seen in any order with its own work."""
    if store.remote:
        return _read_pool().submit(call)
    done: futures.Future[A] = futures.Future()
    try:
        done.set_result(call())
    except Exception as exc:  # noqa: BLE001 - handed to whoever takes the result
        done.set_exception(exc)
    return done


def read_all(store: ObjectStore, *reads: Callable[[], Any]) -> list[Any]:
    """``[read() for read in reads]``, at once on a remote store, in order elsewhere.

    The reads must be independent and the caller must accept them seen in any order
    (each takes effect at one moment during the call). The first read runs in the
    calling thread; the first error raised, in argument order, is the one raised.
    """
    if not store.remote or len(reads) < 2:
        return [read() for read in reads]
    pool = _read_pool()
    later = [pool.submit(read) for read in reads[1:]]
    try:
        first = reads[0]()
    except BaseException:
        for f in later:
            f.cancel()
        raise
    return [first, *(f.result() for f in later)]
