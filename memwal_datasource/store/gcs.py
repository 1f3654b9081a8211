"""Google Cloud Storage: ``gs://bucket/prefix``.

put-if-absent is an object PUT with ``x-goog-if-generation-match: 0`` (obstore's
``mode="create"``); GCS answers 412 when the object exists
(:func:`~.base.conditional_put_outcome`). Storage options are
``object_store``'s ``google_*`` keys, passed through unchanged, so the same
mapping configures pylance: ``google_service_account`` (path to a service-account
JSON file; its ``gcs_base_url`` field points a client at an emulator),
``google_service_account_key`` (the JSON itself), ``google_application_credentials``,
``google_bearer_token``, ``google_skip_signature``; plus ``allow_http`` and
``s3_max_attempts`` / ``s3_connect_timeout_s`` / ``s3_read_timeout_s``.

GCS accepts about one write per second to one object name: nothing rewritten per
commit may sit on a writer's acknowledgement path (WAL entries, manifests and
commit records are each written once, at a fresh name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .obstore_backend import ObstoreOptions, ObstoreStore

GCS_SCHEMES = ("gs",)
_OPTION_PREFIX = "google_"


class GCSStore(ObstoreStore):
    """Google Cloud Storage through obstore's ``GCSStore`` (XML API)."""

    service = "GCS"
    container_word = "bucket"
    credential_hint = ("google_service_account / google_service_account_key / "
                       "google_application_credentials")

    def __init__(self, bucket: str, prefix: str, options: ObstoreOptions):
        self.container = bucket
        self.prefix = prefix.strip("/")
        self.options = options
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"

    @classmethod
    def from_uri(cls, bucket: str, path: str,
                 storage_options: Mapping[str, str] | None) -> GCSStore:
        return cls(bucket, path, ObstoreOptions.from_storage_options(storage_options,
                                                                     _OPTION_PREFIX))

    def _new_client(self, retry: dict[str, Any]) -> Any:
        from obstore.store import GCSStore as ObGCSStore  # lazy: obstore on first use

        return ObGCSStore(self.container, config=dict(self.options.config),
                          client_options=self.options.client_options(), retry_config=retry)
