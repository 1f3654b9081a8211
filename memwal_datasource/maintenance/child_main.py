"""The maintenance child process (``python -m memwal_datasource.maintenance.child_main``):
one pass per request, at the lowest CPU priority; see
:mod:`memwal_datasource.maintenance.child`."""

from __future__ import annotations

import logging
import os
import sys

from .child import NICE, _picklable, _recv, _send


def main() -> None:
    """The child: lowest priority, then one pass per request until stdin closes."""
    try:
        os.nice(NICE)
    except (AttributeError, OSError):
        pass
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    requests = sys.stdin.buffer
    # Imported after the nice value is set: on Linux it is per thread, and threads made
    # later (Lance's) inherit it.
    from ..table.view import TableView
    from .auto import maintain_once

    # The parent logs each pass's line through the application's handlers; Python's
    # last-resort handler must not print it a second time from here.
    logging.getLogger("memwal_datasource").addHandler(logging.NullHandler())

    while True:
        try:
            uri, storage, thresholds, label = _recv(requests)
        except EOFError:
            return
        result = maintain_once(TableView(uri, storage), thresholds, label=label)
        _send(answers, _picklable(result))


if __name__ == "__main__":
    main()
