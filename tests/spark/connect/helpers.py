"""What the Connect tests share: asking the server's Python workers, reading an error."""

from __future__ import annotations

import json
import re

# Spark's prefix before the text a Python data source's planner raised.
DATA_SOURCE_ERROR = re.compile(r"^\[PYTHON_DATA_SOURCE_ERROR\] Failed to [^:]+: ")


def on_worker(spark, probe: str) -> dict:
    """``probe`` evaluated (a Python expression) in one of the session's server-side
    Python workers, with ``os`` imported; its JSON-able result."""

    def run(batches):
        import os  # noqa: F401 - the probe's namespace

        import pyarrow as pa

        for _ in batches:
            yield pa.record_batch([pa.array([json.dumps(eval(probe))])], names=["out"])

    return json.loads(spark.range(1).mapInArrow(run, "out string").collect()[0].out)


def first_line(exc: BaseException) -> str:
    """The error's first line: what a user reads first."""
    return str(exc).splitlines()[0]


def our_text(exc: BaseException) -> str:
    """The first line with Spark's data-source prefix removed."""
    return DATA_SOURCE_ERROR.sub("", first_line(exc))
