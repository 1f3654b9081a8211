"""Process-wide S3 clients for :class:`memwal_datasource.store.s3.S3Store`.

Two clients, each built once per process and configuration:

* **obstore** (the Rust ``object_store`` crate pylance itself uses) carries
  the data path: conditional PUTs of WAL entries, manifests and records, plain
  PUTs of hints, GETs and HEADs: its per-request CPU was 2-8x lower than
  boto3's when measured side by side. The store used for
  conditional PUTs has ``max_retries=0``: a conditional PUT whose response
  was lost must never be re-sent by the SDK (the re-send comes back 412 and
  looks like another writer's object); :func:`~.base.put_resolved` retries and
  resolves it by reading back.
* **boto3** keeps listings of raw string prefixes and ``Delimiter`` listings
  (``object_store`` lists by whole path segments; listings of a whole
  directory and deletes go through obstore) and the bucket check (typed error
  codes), and is the data path in a process forked from one that already used
  obstore.

obstore runs its requests on one global tokio runtime whose worker threads do
not survive ``fork()``: a forked child that touches obstore, through any
store, old or new, hangs. Spark's Python workers fork from a daemon that never
runs our code, so they get obstore; a process forked from one that did (our
kill tests, ``multiprocessing`` with fork) uses boto3 instead
(:func:`~.obstore_backend.obstore_usable`). Nothing here touches obstore or
boto3 at import time (both are imported inside the functions that build clients,
to keep them lazy), and clients are cached per pid; a parent's clients are kept
referenced, never dropped, in the child (dropping a Rust client there could
block on the dead runtime as well).
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

from ..errors import StoreError
from ..options import S3Options, scrub, scrub_url
from .obstore_backend import note_obstore_use

_LOCK = threading.Lock()
_BOTO3: dict[tuple[int, S3Options, bool], Any] = {}
_OBSTORES: dict[tuple[int, S3Options, str, bool], Any] = {}


def boto3_client(options: S3Options, conditional: bool) -> Any:
    """One boto3 client per process, configuration and purpose (clients are thread-safe).

    The ``conditional`` client makes exactly one HTTP attempt per call
    (``total_max_attempts=1``), for the same reason obstore's has no retries.
    """
    key = (os.getpid(), options, conditional)
    client = _BOTO3.get(key)
    if client is not None:
        return client
    with _LOCK:
        client = _BOTO3.get(key)
        if client is not None:
            return client
        import boto3  # lazy (module docstring)
        from botocore.config import Config

        retries = ({"total_max_attempts": 1, "mode": "standard"} if conditional
                   else {"max_attempts": options.max_attempts, "mode": "standard"})
        config = Config(
            retries=retries,
            s3={"addressing_style": "path" if options.path_style else "auto"},
            connect_timeout=options.connect_timeout_s,
            read_timeout=options.read_timeout_s,
            max_pool_connections=32,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        try:
            # Credentials left as None fall through to the standard AWS chain.
            client = boto3.session.Session().client(
                "s3",
                endpoint_url=options.endpoint,
                region_name=options.region,
                aws_access_key_id=options.access_key_id,
                aws_secret_access_key=options.secret_access_key,
                aws_session_token=options.session_token,
                config=config,
            )
        except Exception as exc:  # noqa: BLE001 - a configuration error, credentials scrubbed
            raise StoreError(f"cannot configure the S3 client for endpoint "
                             f"{scrub_url(options.endpoint or 'the default AWS endpoint')}: "
                             f"{type(exc).__name__}: {_first_line(exc, options)}") from None
        _BOTO3[key] = client
        return client


def obstore_config(options: S3Options) -> tuple[dict[str, str], dict[str, Any]]:
    """``(config, client_options)`` for obstore's ``S3Store`` from parsed options.

    Uses the same ``aws_*`` names pylance hands to ``object_store``, so both
    clients read one mapping the same way.
    """
    config: dict[str, str] = {
        "aws_virtual_hosted_style_request": "false" if options.path_style else "true"}
    for name, value in (("aws_endpoint", options.endpoint), ("aws_region", options.region),
                        ("aws_access_key_id", options.access_key_id),
                        ("aws_secret_access_key", options.secret_access_key),
                        ("aws_session_token", options.session_token)):
        if value:
            config[name] = value
    client_options: dict[str, Any] = {
        # S3Options already refused plain http unless allow_http was set.
        "allow_http": bool(options.endpoint and options.endpoint.startswith("http://")),
        "connect_timeout": timedelta(seconds=options.connect_timeout_s),
        # A bound on the whole request, so a stalled server is a timeout, not a hang.
        "timeout": timedelta(seconds=options.read_timeout_s),
    }
    return config, client_options


def obstore_store(options: S3Options, bucket: str, conditional: bool) -> Any:
    """The obstore ``S3Store`` for ``bucket`` in this process (built once).

    ``conditional`` stores never retry; the others retry like boto3's
    standard mode (``s3_max_attempts``). Call only when
    :func:`~.obstore_backend.obstore_usable`.
    """
    key = (os.getpid(), options, bucket, conditional)
    store = _OBSTORES.get(key)
    if store is None:
        with _LOCK:
            store = _OBSTORES.get(key)
            if store is None:
                store = _OBSTORES[key] = _new_obstore(options, bucket, conditional)
    note_obstore_use()  # its runtime starts with this process's first call
    return store


def _new_obstore(options: S3Options, bucket: str, conditional: bool) -> Any:
    from obstore.store import S3Store as ObS3Store  # lazy (module docstring)

    config, client_options = obstore_config(options)
    retry = {"max_retries": 0 if conditional else max(0, options.max_attempts - 1)}
    provider = None
    if not options.access_key_id:
        # object_store alone reads only env vars and instance metadata; boto3's chain
        # also reads profiles and config files, as the boto3 client always did.
        provider = _boto3_credentials()
    try:
        return ObS3Store(bucket, config=config, client_options=client_options,
                         retry_config=retry, credential_provider=provider)
    except Exception as exc:  # noqa: BLE001 - a configuration error, credentials scrubbed
        raise StoreError(f"cannot configure the S3 client for bucket '{bucket}': "
                         f"{type(exc).__name__}: {_first_line(exc, options)}") from None


def _boto3_credentials() -> Any:
    import boto3  # lazy (module docstring)
    from obstore.auth.boto3 import Boto3CredentialProvider

    session = boto3.session.Session()
    if session.get_credentials() is None:
        return None  # let object_store try its own chain; a failure names the bucket
    return Boto3CredentialProvider(session)


def _first_line(exc: BaseException, options: S3Options) -> str:
    """The start of an SDK's message, without any credential it may quote."""
    return scrub(str(exc), options.secret_values()).split("\n", 1)[0][:300]
