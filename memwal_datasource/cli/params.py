"""What every command takes: ``--storage``, ``--json``, a table PATH and a SHARD id."""

from __future__ import annotations

import os
import re
import uuid

import click

from ..errors import ConfigError, StoreError
from ..format.memwal import MEM_WAL_DIR
from ..log.commit import COMMITS_DIR
from ..options import secret_values
from ..shard.manifest import list_shards
from ..store import LocalStore, ObjectStore, open_store
from .errors import EXIT_NOT_FOUND, EXIT_USAGE, JSON_KEY, SECRETS_KEY, CliError

# What makes a directory a memwal table: a Lance dataset, or a MemWAL of ours.
TABLE_MARKERS = ("_versions", MEM_WAL_DIR, COMMITS_DIR)


def _storage(ctx: click.Context, _param: click.Parameter,
             pairs: tuple[str, ...]) -> dict[str, str]:
    """Parse ``--storage`` pairs; remember secret values so no output shows them."""
    out: dict[str, str] = {}
    for i, pair in enumerate(pairs, 1):
        if "=" not in pair:
            # The argument itself is not echoed: it may be a mistyped secret.
            raise CliError(f"--storage #{i} is not KEY=VALUE (e.g. "
                           "aws_endpoint=http://127.0.0.1:9000)", EXIT_USAGE)
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    secrets = secret_values(out)
    ctx.meta[SECRETS_KEY] = [*ctx.meta.get(SECRETS_KEY, []), *secrets]
    return out


storage_opt = click.option("--storage", "-s", multiple=True, metavar="KEY=VALUE",
                           callback=_storage,
                           help="storage option (Lance names, e.g. aws_endpoint=http://...)")
def _json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """Remember ``--json`` so an error is printed as a JSON object too."""
    if value:
        ctx.meta[JSON_KEY] = True
    return value


json_opt = click.option("--json", "as_json", is_flag=True, callback=_json, is_eager=True,
                        help="machine-readable JSON (stable keys, raw numbers; errors are "
                             "one JSON object on stderr)")


def open_table(uri: str, storage: dict[str, str]) -> ObjectStore:
    """The store of the memwal table at ``uri``, or a one-line error saying what is wrong.

    A memwal table is a directory holding a Lance dataset (``_versions/``) or a
    MemWAL (``_mem_wal/`` or ``_memwal_commits/``).
    """
    try:
        store = open_store(uri, storage)
    except (ConfigError, StoreError) as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    hint = "give the table's root directory (the one holding _versions/ or _mem_wal/)"
    if isinstance(store, LocalStore):
        if not os.path.exists(store.root):
            raise CliError(f"no memwal table at {uri}: the path does not exist; {hint}",
                           EXIT_NOT_FOUND)
        if not os.path.isdir(store.root):
            raise CliError(f"{uri} is a file, not a memwal table; {hint}", EXIT_NOT_FOUND)
    found = set(store.list_dirs(""))
    if not found & set(TABLE_MARKERS):
        markers = ", ".join(f"{m}/" for m in TABLE_MARKERS)
        raise CliError(f"{uri} is not a memwal table (no {markers} under it); {hint}",
                       EXIT_NOT_FOUND)
    return store


def resolve_shard(store: ObjectStore, uri: str, text: str) -> str:
    """The full id of shard ``text`` (a UUID, or a unique prefix as tables print it)."""
    want = text.strip().lower()
    listing = f"`memwal shards {uri}` lists the shards"
    try:
        full: str | None = str(uuid.UUID(want))
    except ValueError:
        full = None
        if not re.fullmatch(r"[0-9a-f-]{1,36}", want):
            raise CliError(f"'{text}' is not a shard id: give a shard UUID or its first "
                           f"characters; {listing}", EXIT_USAGE) from None
    shards = list_shards(store)
    if full is not None:
        if full not in shards:
            raise CliError(f"shard {full} not found in {uri}; {listing}", EXIT_NOT_FOUND)
        return full
    matches = [s for s in shards if s.startswith(want)]
    if not matches:
        raise CliError(f"no shard starting with '{want}' in {uri}; {listing}", EXIT_NOT_FOUND)
    if len(matches) > 1:
        raise CliError(f"'{want}' matches {len(matches)} shards in {uri}; give more "
                       "characters of the id", EXIT_USAGE)
    return matches[0]
