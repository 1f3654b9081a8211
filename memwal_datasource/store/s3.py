"""S3 (``s3://bucket/prefix``, ``s3a://``): put-if-absent is ``PUT`` with
``If-None-Match: *``; the clients are built in :mod:`.s3_clients`.

obstore and botocore are imported inside the methods that use them, to keep them
lazy: importing the package must not start obstore (its runtime does not survive
``fork()``) nor pay for boto3.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from ..errors import StoreAuthError, StoreError, StoreNotFoundError, TransientStoreError
from ..options import S3Options, scrub_url
from . import s3_clients
from .base import (
    BytesLike,
    ObjectStore,
    _dir_prefix,
    byte_view,
    conditional_put_error,
    tag_of,
    unquoted,
)
from .obstore_backend import map_obstore_error, obstore_usable, raise_mapped, safe_cause


def _boto3_body(data: BytesLike, view: memoryview) -> bytes | bytearray:
    """boto3 wants bytes (or a file); other buffers are copied on this rare path."""
    return data if isinstance(data, (bytes, bytearray)) else view.tobytes()


class S3Store(ObjectStore):
    """S3; put-if-absent is ``PUT`` with ``If-None-Match: *``.

    The data path (conditional and plain PUTs, GETs, HEADs, listings of a whole
    directory, deletes) goes through obstore; listings of raw prefixes and the
    bucket check through boto3 (see
    :mod:`memwal_datasource.store.s3_clients` for why, and for forked processes,
    which use boto3 throughout). Both clients are built once per process and
    configuration, on first use.

    HTTP 412 means the key exists (:func:`~.base.conditional_put_outcome`). A
    conditional PUT is sent exactly once; any other failure (5xx, 409, a
    timeout, a lost response) is raised as
    :class:`TransientStoreError` because the object may or may not have
    landed, and the caller resolves it by reading the key back
    (:func:`put_resolved`). Reads, listings and deletes keep the clients'
    retries (``s3_max_attempts``).
    """

    remote = True  # every request is a round trip (read_both overlaps two)
    lists_after = True  # ListObjectsV2 start-after

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
        return "obstore" if obstore_usable() else "boto3"

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
            raise_mapped(exc, obstore_error(exc, where=self.describe(key), bucket=self.bucket,
                                            endpoint=self._endpoint_name(),
                                            conditional=conditional),
                         self.options.secret_values())

    def _raise(self, exc: Exception, key: str) -> None:
        """Raise the package's exception for a boto3 failure on ``key``."""
        from botocore.exceptions import BotoCoreError, ClientError  # lazy (module docstring)

        where = self.describe(key)
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(where) from None
            if code == "NoSuchBucket":
                raise StoreNotFoundError(
                    f"create the bucket first: bucket '{self.bucket}' does not exist at "
                    f"{self._endpoint_name()} (while accessing {where})"
                ) from None
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
                raise StoreAuthError(
                    f"check aws_access_key_id / aws_secret_access_key: S3 at "
                    f"{self._endpoint_name()} rejected the credentials for bucket "
                    f"'{self.bucket}' ({code}) while accessing {where}"
                ) from None
            cause = self._safe_cause(exc)  # only for the errors that keep it
            if status == 409 or code in ("ConditionalRequestConflict", "OperationAborted"):
                raise TransientStoreError(f"conflict writing {where}: {code}") from cause
            if status is not None and status >= 500 or code in ("SlowDown", "RequestTimeout"):
                raise TransientStoreError(f"S3 error on {where}: {code}") from cause
            raise StoreError(f"S3 error on {where}: {code} (HTTP {status})") from cause
        from botocore.exceptions import NoCredentialsError  # lazy (module docstring)

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
        return safe_cause(exc, self.options.secret_values())

    def _endpoint_name(self) -> str:
        endpoint = self.options.endpoint
        return scrub_url(endpoint) if endpoint else "the default AWS endpoint"

    def put_if_absent(self, key: str, data: BytesLike) -> str | None:
        view = byte_view(data)
        if obstore_usable():
            import obstore  # lazy (module docstring)

            done = self._obstore_call(
                key, lambda st, path: obstore.put(st, path, view, mode="create"),
                conditional=True)
            return unquoted(done.get("e_tag"))
        from botocore.exceptions import ClientError  # lazy (module docstring)

        try:
            done = s3_clients.boto3_client(self.options, conditional=True).put_object(
                Bucket=self.bucket, Key=self._key(key), Body=_boto3_body(data, view),
                IfNoneMatch="*")
            return unquoted(done.get("ETag"))
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            mapped = conditional_put_error(status, code, self.describe(key))
            if isinstance(mapped, FileExistsError):
                raise mapped from None
            if mapped is not None:
                raise mapped from self._safe_cause(exc)
            self._raise(exc, key)
        except Exception as exc:  # noqa: BLE001 - mapped to typed errors
            self._raise(exc, key)

    def put(self, key: str, data: BytesLike) -> None:
        view = byte_view(data)
        if obstore_usable():
            import obstore  # lazy (module docstring)

            self._obstore_call(key, lambda st, path: obstore.put(st, path, view))
            return
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key),
                                    Body=_boto3_body(data, view))
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, key)

    def get(self, key: str) -> bytes:
        if obstore_usable():
            import obstore  # lazy (module docstring)

            return self._obstore_call(
                key, lambda st, path: bytes(obstore.get(st, path).bytes()))
        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, key)
            raise  # unreachable; keeps type checkers honest

    def _head(self, key: str) -> tuple[int, int, str] | None:
        """(size, last-modified ms on the server's clock, ETag), or ``None`` if absent.
        (S3's Last-Modified header has seconds.)"""
        try:
            if obstore_usable():
                import obstore  # lazy (module docstring)

                meta = self._obstore_call(key, lambda st, path: obstore.head(st, path))
                size, stamp, etag = meta["size"], meta["last_modified"], meta.get("e_tag")
            else:
                meta = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
                size, stamp, etag = meta["ContentLength"], meta["LastModified"], meta.get("ETag")
            return int(size), int(stamp.timestamp() * 1000), str(etag)
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

    def version_tag(self, key: str) -> str | None:
        meta = self._head(key)
        return None if meta is None else tag_of(meta[2], meta[1] // 1000, meta[0])

    def list_tagged(self, prefix: str) -> dict[str, str] | None:
        """One listing of the directory ``prefix``: keys and their :meth:`version_tag`."""
        return {key: tag_of(*meta) for key, meta in self._listing(prefix)}

    def list(self, prefix: str) -> Iterator[str]:
        for key, _meta in self._listing(prefix):
            yield key

    def _listing(self, prefix: str) -> Iterator[tuple[str, tuple]]:
        """``(key, (ETag, last modified s, size))`` of every key under ``prefix``."""
        full = self._key(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        if prefix.endswith("/") and obstore_usable():
            # A whole directory (every listing on an append's path): obstore lists by path
            # segments, at a fraction of boto3's CPU per request.
            import obstore  # lazy (module docstring)

            metas = self._obstore_call(prefix, lambda st, path: [
                meta for batch in obstore.list(st, path.rstrip("/")) for meta in batch])
            yield from ((m["path"][strip:], (m.get("e_tag"), m["last_modified"].timestamp(),
                                             m["size"]))
                        for m in metas if m["path"].startswith(full))
            return
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    yield obj["Key"][strip:], (obj.get("ETag"), obj["LastModified"].timestamp(),
                                               obj["Size"])
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, prefix)

    def list_after(self, prefix: str, after: str) -> list[str]:
        return list(self.list_after_etags(prefix, after))

    def list_after_etags(self, prefix: str, after: str) -> dict[str, str | None]:
        full, offset = self._key(prefix), self._key(after)
        strip = len(self.prefix) + 1 if self.prefix else 0
        if prefix.endswith("/") and obstore_usable():
            import obstore  # lazy (module docstring)

            paths = self._obstore_call(prefix, lambda st, path: [
                (meta["path"], meta.get("e_tag"))
                for batch in obstore.list(st, path.rstrip("/"), offset=offset)
                for meta in batch])
        else:
            paths = []
            try:
                for page in self._client.get_paginator("list_objects_v2").paginate(
                        Bucket=self.bucket, Prefix=full, StartAfter=offset):
                    paths += [(obj["Key"], obj.get("ETag")) for obj in page.get("Contents", [])]
            except Exception as exc:  # noqa: BLE001
                self._raise(exc, prefix)
        return {p[strip:]: unquoted(etag) for p, etag in sorted(paths)
                if p.startswith(full) and p > offset}

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
        if obstore_usable():
            import obstore  # lazy (module docstring)

            try:
                self._obstore_call(key, lambda st, path: obstore.delete(st, path))
            except FileNotFoundError:
                pass  # as S3's DeleteObject: deleting a missing key is no error
            return
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001
            self._raise(exc, key)

    def delete_many(self, keys: list[str]) -> None:
        if len(keys) < 2 or not obstore_usable():
            return super().delete_many(keys)
        import obstore  # lazy (module docstring)

        # One DeleteObjects request; S3 reports no error for a missing key.
        self._obstore_call(keys[0], lambda st, _path: obstore.delete(
            st, [self._key(k) for k in keys]))

    def check_bucket(self) -> None:
        """Fail fast with a clear error when the bucket is missing or creds are wrong."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except Exception as exc:  # noqa: BLE001
            from botocore.exceptions import ClientError  # lazy (module docstring)

            if isinstance(exc, ClientError):
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code in ("404", "NoSuchBucket", "NotFound"):
                    raise StoreNotFoundError(
                        f"create the bucket first: bucket '{self.bucket}' does not exist at "
                        f"{self._endpoint_name()}"
                    ) from None
            self._raise(exc, "")


def obstore_error(exc: BaseException, *, where: str, bucket: str, endpoint: str,
                  conditional: bool = False) -> BaseException:
    """The package's exception for an obstore failure on S3 (the caller raises it):
    :func:`~.obstore_backend.map_obstore_error`, naming S3's credential options."""
    return map_obstore_error(exc, where=where, service="S3", container_word="bucket",
                             container=bucket, endpoint=endpoint,
                             credential_hint="aws_access_key_id / aws_secret_access_key",
                             conditional=conditional)
