"""Exit codes and one-line errors: every failure is one scrubbed line and a code."""

from __future__ import annotations

import json
import os
import sys

import click

from ..errors import (
    ConfigError,
    MemWalError,
    StoreAuthError,
    StoreNotFoundError,
    UnsupportedStoreError,
    without_native_locations,
)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_RETRY = 4
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_ERROR: "runtime or storage error (store unreachable, credentials, damaged file)",
    EXIT_USAGE: "usage error (bad argument, option, shard id or URI)",
    EXIT_NOT_FOUND: "not found: no memwal table at the path, or no such shard",
    EXIT_RETRY: "lost a harmless race with a live writer: run the command again",
}
# Where ``--storage`` leaves the secret values that no message may show.
SECRETS_KEY = "memwal.secrets"
# Set (in the context's shared meta) when a command was given ``--json``.
JSON_KEY = "memwal.json"
EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())


class CliError(click.ClickException):
    """A one-line error with its exit code (see :data:`EXIT_CODES`)."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR):
        super().__init__(" ".join(_scrub(without_native_locations(message)).split()))
        self.exit_code = exit_code
        ctx = click.get_current_context(silent=True)
        self.as_json = bool(ctx is not None and ctx.meta.get(JSON_KEY))

    def show(self, file=None) -> None:
        """One line on stderr: ``Error: ...``, or with ``--json`` a JSON object."""
        if not self.as_json:
            super().show(file)
            return
        click.echo(json.dumps({"error": self.format_message(), "exit_code": self.exit_code,
                               "meaning": EXIT_CODES.get(self.exit_code, "")}),
                   file=file, err=file is None)


def _scrub(text: str) -> str:
    """``text`` with every secret given via ``--storage`` replaced by ``***``."""
    ctx = click.get_current_context(silent=True)
    secrets = ctx.meta.get(SECRETS_KEY, ()) if ctx is not None else ()
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _translate(exc: Exception) -> CliError:
    """Map an exception to a one-line :class:`CliError` with its exit code."""
    if isinstance(exc, (ConfigError, UnsupportedStoreError)):
        return CliError(str(exc), EXIT_USAGE)
    if isinstance(exc, (StoreNotFoundError, FileNotFoundError)):
        return CliError(f"not found: {exc}", EXIT_NOT_FOUND)
    if isinstance(exc, StoreAuthError):
        return CliError(str(exc))
    if isinstance(exc, (MemWalError, OSError)):
        return CliError(f"{exc}; check the path, --storage options and that the store is "
                        "reachable")
    return CliError(f"internal error ({type(exc).__name__}: {exc}); set MEMWAL_DEBUG=1 for a "
                    "traceback and report it")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


class CliGroup(click.Group):
    """Turns every error a command raises into one line and a documented exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CliError as exc:
            exc.as_json = exc.as_json or bool(ctx.meta.get(JSON_KEY))
            raise
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            _silence_stdout()  # the reader (e.g. `| head`) has seen enough
            ctx.exit(EXIT_OK)
        except Exception as exc:  # noqa: BLE001 - every error becomes one line
            if os.environ.get("MEMWAL_DEBUG"):
                raise
            error = _translate(exc)
            error.as_json = bool(ctx.meta.get(JSON_KEY))
            raise error from None
