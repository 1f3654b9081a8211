"""Storage option names, shared by pylance and our boto3 client.

We use the names Lance users already pass to ``lance.dataset(uri,
storage_options=...)`` so one mapping configures both the native writer and
our own S3 store. Unset values fall through to the standard AWS chain
(environment, config files, instance roles).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from .errors import ConfigError

AWS_ENDPOINT = "aws_endpoint"
AWS_REGION = "aws_region"
AWS_ACCESS_KEY_ID = "aws_access_key_id"
AWS_SECRET_ACCESS_KEY = "aws_secret_access_key"
AWS_SESSION_TOKEN = "aws_session_token"
ALLOW_HTTP = "allow_http"
AWS_VIRTUAL_HOSTED_STYLE_REQUEST = "aws_virtual_hosted_style_request"
STORAGE_PREFIX = "storage."  # Spark's spelling of a storage option
# Ours (Lance ignores unknown keys we strip before handing options over).
S3_MAX_ATTEMPTS = "s3_max_attempts"
S3_CONNECT_TIMEOUT = "s3_connect_timeout_s"
S3_READ_TIMEOUT = "s3_read_timeout_s"

# Aliases Lance's object_store also accepts.
_ALIASES = {
    "endpoint": AWS_ENDPOINT,
    "aws_endpoint_url": AWS_ENDPOINT,
    "endpoint_url": AWS_ENDPOINT,
    "region": AWS_REGION,
    "access_key_id": AWS_ACCESS_KEY_ID,
    "secret_access_key": AWS_SECRET_ACCESS_KEY,
    "session_token": AWS_SESSION_TOKEN,
    "aws_token": AWS_SESSION_TOKEN,
    "token": AWS_SESSION_TOKEN,
    "aws_allow_http": ALLOW_HTTP,
    "virtual_hosted_style_request": AWS_VIRTUAL_HOSTED_STYLE_REQUEST,
}

OUR_KEYS = frozenset({S3_MAX_ATTEMPTS, S3_CONNECT_TIMEOUT, S3_READ_TIMEOUT})

# Every storage option name Lance (pylance 14, object_store 0.12 via obstore, and
# Lance's OpenDAL stores) accepts whose value is a credential, lower-case. Keys
# match case-insensitively, with or without Spark's ``storage.`` prefix, so the
# environment spellings (AWS_SECRET_ACCESS_KEY, ...) are covered too.
SECRET_KEYS = frozenset({
    # AWS (object_store's AmazonS3ConfigKey and its aliases)
    "aws_secret_access_key", "secret_access_key",
    "aws_session_token", "aws_token", "session_token", "token",
    "aws_sse_customer_key_base64", "sse_customer_key_base64",
    # Azure (AzureConfigKey)
    "azure_storage_account_key", "azure_storage_access_key", "azure_storage_master_key",
    "account_key", "access_key", "master_key",
    "azure_storage_client_secret", "azure_client_secret", "client_secret",
    "azure_storage_sas_key", "azure_storage_sas_token", "sas_key", "sas_token",
    "azure_storage_token", "bearer_token",
    "azure_encryption_key", "encryption_key",
    "azure_fabric_session_token", "fabric_session_token",
    # Google Cloud Storage (GoogleConfigKey, and Lance's static bearer token); the
    # application-credentials file path is treated as one too (the safe default)
    "google_service_account_key", "service_account_key",
    "google_application_credentials", "application_credentials",
    "google_bearer_token", "google_storage_token",
    # Lance's OpenDAL stores: Alibaba OSS, Volcengine TOS, Tencent COS; Hugging Face
    "oss_secret_access_key", "oss_security_token", "access_key_secret", "security_token",
    "tos_secret_access_key", "tos_security_token",
    "cos_secret_key", "secret_key",
    "hf_token",
    # Generic names people reach for (and LanceDB's)
    "password", "api_key",
})
# Key ids are identifiers, not secrets (AWS prints them in IAM policies), but they
# name the account and the principal and credential scanners flag them, so they
# are redacted too (the safe default); a message names the option to check instead.
ID_KEYS = frozenset({
    "aws_access_key_id", "access_key_id", "oss_access_key_id", "tos_access_key_id",
    "cos_secret_id", "azure_storage_client_id", "azure_client_id", "client_id",
})
# Names the pattern below catches whose values are flags, enums, ids or file paths.
NOT_SECRET_KEYS = frozenset({
    "aws_sse_bucket_key_enabled", "sse_bucket_key_enabled",
    "azure_credential_type", "credential_type",
    "azure_storage_authority_host", "azure_authority_host", "authority_host",
    "azure_storage_authority_id", "azure_authority_id", "authority_id",
    "aws_web_identity_token_file", "web_identity_token_file",
    "aws_container_authorization_token_file", "container_authorization_token_file",
    "azure_federated_token_file", "federated_token_file",
    "aws_skip_signature", "azure_skip_signature", "google_skip_signature", "skip_signature",
    "primary_key",
})
# Any other name that looks like a credential is one (the safe default): e.g.
# aws_sse_kms_key_id, aws_container_credentials_relative_uri, a custom *_password.
_SECRET_PART = re.compile(r"key|secret|token|passw|pwd|credential|auth")
_SECRET_WORD = frozenset({"sas", "sig", "signature"})
REDACTED = "***"
_S3_CREDENTIALS = ("access_key_id", "secret_access_key", "session_token")  # S3Options fields
# Free text is scrubbed of values at least this long: a shorter one (a test's "k")
# cannot be told from ordinary words, and real credentials are far longer.
MIN_SCRUB_LEN = 6
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):"
                       r"(?P<password>[^/@\s]*)@")
_QUERY_PARAM = re.compile(r"(?P<name>[?&;][^=&#\s]+)=(?P<value>[^&#\s]*)")


def is_secret(name: str) -> bool:
    """True if option ``name`` carries a credential (any case, ``storage.`` prefix or not)."""
    n = name.strip().lower()
    if n.startswith(STORAGE_PREFIX):
        n = n[len(STORAGE_PREFIX):]
    if n in SECRET_KEYS or n in ID_KEYS:
        return True
    if n in NOT_SECRET_KEYS:
        return False
    words = re.split(r"[^a-z0-9]+", n)
    return bool(_SECRET_PART.search(n)) or not _SECRET_WORD.isdisjoint(words)


def scrub_url(value: str) -> str:
    """``value`` with a URL password and credential-like query parameters masked."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", str(value))
    return _QUERY_PARAM.sub(
        lambda m: f"{m['name']}={REDACTED}" if is_secret(m["name"][1:]) else m.group(0), text)


def normalize(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """Lower-case keys and fold aliases into the canonical ``aws_*`` names."""
    out: dict[str, str] = {}
    for key, value in (storage_options or {}).items():
        k = key.lower()
        out[_ALIASES.get(k, k)] = str(value)
    return out


def lance_storage_options(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """The options to hand to pylance: canonical names, ours removed."""
    return {k: v for k, v in normalize(storage_options).items() if k not in OUR_KEYS}


def redact(options: Mapping[str, str]) -> dict[str, str]:
    """A copy safe to log: secret values replaced, URL passwords in the others masked."""
    return {k: (REDACTED if is_secret(k) else scrub_url(v)) for k, v in options.items()}


def secret_values(options: Mapping[str, str] | None) -> list[str]:
    """The credentials in ``options`` (values, URL passwords), longest first, for scrubbing."""
    found: set[str] = set()
    for k, v in (options or {}).items():
        v = str(v)
        if is_secret(k):
            found.add(v)
        for m in _USERINFO.finditer(v):
            found.add(m["password"])
        for m in _QUERY_PARAM.finditer(v):
            if is_secret(m["name"][1:]):
                found.add(m["value"])
    return sorted((s for s in found if len(s) >= MIN_SCRUB_LEN), key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (see :func:`secret_values`) and URL passwords masked."""
    for secret in secrets:
        if len(secret) >= MIN_SCRUB_LEN:
            text = text.replace(secret, REDACTED)
    return scrub_url(text)


def parse_bool(name: str, value: str | bool) -> bool:
    """Parse a boolean option; the error names the option."""
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ConfigError(f"option '{name}' must be true or false, got {_shown(name, value)}")


def _parse_number(name: str, value: str, kind: type, minimum: float) -> float:
    try:
        number = kind(value)
    except ValueError:
        raise ConfigError(f"option '{name}' must be a number, got {_shown(name, value)}") from None
    if number < minimum:
        raise ConfigError(f"option '{name}' must be >= {minimum}, got {_shown(name, value)}")
    return number


def _shown(name: str, value: object) -> str:
    """A bad value as an error message may quote it: never a credential's."""
    return "a value (hidden: a credential)" if is_secret(name) else f"'{scrub_url(str(value))}'"


@dataclass(frozen=True)
class S3Options:
    """Parsed S3 settings for both clients. ``repr`` shows which credentials are set, never them."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    path_style: bool = False
    max_attempts: int = 5
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _S3_CREDENTIALS and value is not None:
                shown.append(f"{f.name}='{REDACTED}'")
            elif isinstance(value, str):
                shown.append(f"{f.name}='{scrub_url(value)}'")
            else:
                shown.append(f"{f.name}={value!r}")
        return f"S3Options({', '.join(shown)})"

    __str__ = __repr__

    def secret_values(self) -> list[str]:
        """The credentials these options hold, for :func:`scrub` (endpoint password too)."""
        return secret_values({AWS_ACCESS_KEY_ID: self.access_key_id or "",
                              AWS_SECRET_ACCESS_KEY: self.secret_access_key or "",
                              AWS_SESSION_TOKEN: self.session_token or "",
                              AWS_ENDPOINT: self.endpoint or ""})

    @classmethod
    def from_storage_options(cls, storage_options: Mapping[str, str] | None) -> S3Options:
        """Build from Lance-style storage options (see module docstring)."""
        opts = normalize(storage_options)
        endpoint = opts.get(AWS_ENDPOINT)
        if endpoint and endpoint.startswith("http://") and not parse_bool(
            ALLOW_HTTP, opts.get(ALLOW_HTTP, "false")
        ):
            raise ConfigError(
                f"storage option '{AWS_ENDPOINT}' is plain http ({scrub_url(endpoint)}) but "
                f"'{ALLOW_HTTP}' is not true; set {ALLOW_HTTP}=true to allow it"
            )
        if AWS_VIRTUAL_HOSTED_STYLE_REQUEST in opts:
            path_style = not parse_bool(
                AWS_VIRTUAL_HOSTED_STYLE_REQUEST, opts[AWS_VIRTUAL_HOSTED_STYLE_REQUEST]
            )
        else:
            # Custom endpoints (MinIO, SeaweedFS, ...) almost always want path style.
            path_style = endpoint is not None
        return cls(
            endpoint=endpoint,
            region=opts.get(AWS_REGION),
            access_key_id=opts.get(AWS_ACCESS_KEY_ID),
            secret_access_key=opts.get(AWS_SECRET_ACCESS_KEY),
            session_token=opts.get(AWS_SESSION_TOKEN),
            path_style=path_style,
            max_attempts=int(
                _parse_number(S3_MAX_ATTEMPTS, opts.get(S3_MAX_ATTEMPTS, "5"), int, 1)
            ),
            connect_timeout_s=_parse_number(
                S3_CONNECT_TIMEOUT, opts.get(S3_CONNECT_TIMEOUT, "10"), float, 0.1
            ),
            read_timeout_s=_parse_number(
                S3_READ_TIMEOUT, opts.get(S3_READ_TIMEOUT, "60"), float, 0.1
            ),
        )


_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PAIR = re.compile(r"([^=:\s]+)\s*[=:]\s*(.*)$")


def load_options(path: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Read a ``.properties`` file of memwal options (see ``conf/``) into a dict.

    ``key=value`` (or ``key: value``) lines; ``#`` and ``!`` start comments;
    ``${NAME}`` is replaced by the environment variable ``NAME``. Use it as
    ``df.write.format("memwal").options(**load_options("conf/s3.properties"))``.
    An unset variable is an error naming the file, line and variable (never a value).
    """
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line[0] in "#!":
                continue
            pair = _PAIR.match(line)
            if pair is None:
                raise ConfigError(f"{path} line {number}: expected 'key=value'")
            key, value = pair.group(1), pair.group(2)

            def expand(m: re.Match, number: int = number) -> str:
                name = m.group(1)
                if name not in env:
                    raise ConfigError(f"{path} line {number}: environment variable '{name}' "
                                      "is not set")
                return env[name]

            out[key] = _PLACEHOLDER.sub(expand, value)
    return out
