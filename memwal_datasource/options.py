"""Storage option names, shared by pylance and our boto3 client.

We use the names Lance users already pass to ``lance.dataset(uri,
storage_options=...)`` so one mapping configures both the native writer and
our own S3 store. Unset values fall through to the standard AWS chain
(environment, config files, instance roles).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import ConfigError

AWS_ENDPOINT = "aws_endpoint"
AWS_REGION = "aws_region"
AWS_ACCESS_KEY_ID = "aws_access_key_id"
AWS_SECRET_ACCESS_KEY = "aws_secret_access_key"
AWS_SESSION_TOKEN = "aws_session_token"
ALLOW_HTTP = "allow_http"
AWS_VIRTUAL_HOSTED_STYLE_REQUEST = "aws_virtual_hosted_style_request"
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

SECRET_KEYS = frozenset({AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, "secret_access_key",
                         "session_token", "aws_token", "token"})
OUR_KEYS = frozenset({S3_MAX_ATTEMPTS, S3_CONNECT_TIMEOUT, S3_READ_TIMEOUT})


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
    """A copy safe to log: secret values replaced."""
    return {k: ("***" if k.lower() in SECRET_KEYS else v) for k, v in options.items()}


def parse_bool(name: str, value: str | bool) -> bool:
    """Parse a boolean option; the error names the option."""
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ConfigError(f"option '{name}' must be true or false, got '{value}'")


def _parse_number(name: str, value: str, kind: type, minimum: float) -> float:
    try:
        number = kind(value)
    except ValueError:
        raise ConfigError(f"option '{name}' must be a number, got '{value}'") from None
    if number < minimum:
        raise ConfigError(f"option '{name}' must be >= {minimum}, got '{value}'")
    return number


@dataclass(frozen=True)
class S3Options:
    """Parsed S3 settings for boto3. Secrets are kept out of ``repr``."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    path_style: bool = False
    max_attempts: int = 5
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    @classmethod
    def from_storage_options(cls, storage_options: Mapping[str, str] | None) -> S3Options:
        """Build from Lance-style storage options (see module docstring)."""
        opts = normalize(storage_options)
        endpoint = opts.get(AWS_ENDPOINT)
        if endpoint and endpoint.startswith("http://") and not parse_bool(
            ALLOW_HTTP, opts.get(ALLOW_HTTP, "false")
        ):
            raise ConfigError(
                f"storage option '{AWS_ENDPOINT}' is plain http ({endpoint}) but "
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
