"""Object stores with the one primitive fencing needs: put-if-absent.

The contract every backend honours is :class:`~.base.ObjectStore` (its docstrings):
``put_if_absent`` creates a key atomically or raises ``FileExistsError``, ``get``
returns the whole object or raises ``FileNotFoundError``, ``put`` overwrites
hints and probes, ``modified_ms`` / ``now_ms`` read the store's own clock,
``list`` / ``list_dirs`` / ``delete`` / ``exists`` / ``describe``.
:func:`put_resolved` is the one place an ambiguous conditional write is resolved.

This module chooses a backend by URI scheme (:func:`open_store`): a local path or
``file://`` URI (:mod:`.local`), ``s3://bucket/prefix`` (:mod:`.s3`),
``gs://bucket/prefix`` (:mod:`.gcs`), ``az://container/prefix`` or
``abfss://container@account.dfs.core.windows.net/prefix`` (:mod:`.azure`) and
``memory://name`` (:mod:`.memory`). Any other scheme is refused, because a
backend without conditional writes cannot fence writers.

Imports inside the package point one way: this module -> backends -> :mod:`.base`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import unquote, urlparse

from ..errors import StoreError, UnsupportedStoreError
from ..options import S3Options, scrub_url
from .azure import AzureStore
from .base import (
    CLOCK_KEY,
    MAX_BACKOFF_S,
    BytesLike,
    ObjectStore,
    PutOutcome,
    backoff_delay,
    beside,
    byte_view,
    conditional_put_error,
    conditional_put_outcome,
    put_resolved,
    read_all,
    read_both,
    same_bytes,
)
from .gcs import GCSStore
from .local import LocalStore
from .memory import MemoryStore
from .obstore_backend import ObstoreOptions, ObstoreStore
from .s3 import S3Store

__all__ = [
    "CLOCK_KEY",
    "MAX_BACKOFF_S",
    "SUPPORTED_SCHEMES",
    "AzureStore",
    "BytesLike",
    "GCSStore",
    "LocalStore",
    "MemoryStore",
    "ObjectStore",
    "ObstoreOptions",
    "ObstoreStore",
    "PutOutcome",
    "S3Store",
    "backoff_delay",
    "beside",
    "byte_view",
    "conditional_put_error",
    "conditional_put_outcome",
    "local_path",
    "open_store",
    "put_resolved",
    "read_all",
    "read_both",
    "same_bytes",
]

SUPPORTED_SCHEMES = ("", "file", "s3", "s3a", "gs", "az", "abfss", "memory")


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
            if "@" in parsed.netloc:
                raise StoreError("give credentials as storage options (google_service_account"
                                 "...), not in the URI: the gs:// URI has a user part")
            return GCSStore.from_uri(parsed.netloc, parsed.path, storage_options)
        return AzureStore.from_uri(scheme, parsed.netloc, parsed.path, storage_options)
    raise UnsupportedStoreError(
        f"unsupported storage scheme '{scheme}://' in '{scrub_url(uri)}': the MemWAL needs "
        "conditional writes (put-if-absent) for writer fencing, and this package supports "
        "only local paths, file://, s3://, gs://, az://, abfss:// and memory://"
    )
