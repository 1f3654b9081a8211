"""Azure Blob Storage: ``az://container/prefix`` and
``abfss://container@account.dfs.core.windows.net/prefix``.

put-if-absent is Put Blob with ``If-None-Match: *`` (obstore's ``mode="create"``).
Azure answers 409 ``BlobAlreadyExists`` (412 ``ConditionNotMet`` on some paths);
both mean the key exists. object_store before apache/arrow-rs-object-store#830
surfaced the 412 as ``PreconditionError`` instead of ``AlreadyExistsError``: the
mapping (:func:`~.base.conditional_put_outcome`, shared by every backend) looks at
the status and code, not the class, so both versions behave the same. Other 409s
(a lease, a container being deleted) are transient.

Storage options are ``object_store``'s ``azure_*`` keys, passed through
unchanged (pylance takes the same): ``azure_storage_account_name``,
``azure_storage_account_key``, ``azure_storage_sas_key``, ``azure_client_id`` /
``azure_client_secret`` / ``azure_tenant_id``, ``azure_storage_use_emulator``,
``azure_endpoint`` (a custom endpoint, e.g. Azurite's
``http://127.0.0.1:10000/devstoreaccount1``); plus ``allow_http`` and
``s3_max_attempts`` / ``s3_connect_timeout_s`` / ``s3_read_timeout_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import StoreError
from ..options import scrub_url
from .obstore_backend import ObstoreOptions, ObstoreStore

AZURE_SCHEMES = ("az", "abfss")
_OPTION_PREFIX = "azure_"
ACCOUNT_NAME = "azure_storage_account_name"
ENDPOINT = "azure_endpoint"


class AzureStore(ObstoreStore):
    """Azure Blob Storage through obstore's ``AzureStore``."""

    service = "Azure Blob Storage"
    container_word = "container"
    credential_hint = ("azure_storage_account_name / azure_storage_account_key (or "
                       "azure_storage_sas_key, or azure_client_id / azure_client_secret)")

    def __init__(self, container: str, prefix: str, options: ObstoreOptions, scheme: str = "az",
                 netloc: str | None = None):
        self.container = container
        self.prefix = prefix.strip("/")
        self.options = options
        root = f"{scheme}://{netloc or container}"
        self.uri = f"{root}/{self.prefix}" if self.prefix else root
        options.check_http(ENDPOINT)

    @classmethod
    def from_uri(cls, scheme: str, netloc: str, path: str,
                 storage_options: Mapping[str, str] | None) -> AzureStore:
        options = ObstoreOptions.from_storage_options(storage_options, _OPTION_PREFIX)
        if scheme == "abfss":
            # abfss://container@account.dfs.core.windows.net/path, as pylance takes it.
            if "@" not in netloc:
                raise StoreError(f"write the URI as abfss://container@account.dfs.core."
                                 f"windows.net/path: '{scrub_url(netloc)}' names no container")
            container, host = netloc.split("@", 1)
            if options.get(ACCOUNT_NAME) is None and host:
                options = ObstoreOptions(
                    config=tuple(sorted((*options.config, (ACCOUNT_NAME, host.split(".")[0])))),
                    allow_http=options.allow_http, max_attempts=options.max_attempts,
                    connect_timeout_s=options.connect_timeout_s,
                    read_timeout_s=options.read_timeout_s)
            return cls(container, path, options, scheme, netloc)
        if "@" in netloc:
            raise StoreError("write the URI as az://container/path: the container "
                             f"'{scrub_url(netloc.rsplit('@', 1)[1])}' has a user part")
        return cls(netloc, path, options)

    def _endpoint_name(self) -> str:
        endpoint = self.options.get(ENDPOINT)
        if endpoint:
            return scrub_url(endpoint)
        account = self.options.get(ACCOUNT_NAME)
        return f"account '{account}'" if account else "the default Azure endpoint"

    def _new_client(self, retry: dict[str, Any]) -> Any:
        from obstore.store import AzureStore as ObAzureStore  # lazy: obstore on first use

        return ObAzureStore(self.container, config=dict(self.options.config),
                            client_options=self.options.client_options(), retry_config=retry)
