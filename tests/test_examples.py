"""The examples keep working: the tour notebook is executed end to end.

The saved ``examples/tour.ipynb`` carries outputs for readers; the test never
trusts them. It clears them, runs the notebook's cells in a fresh kernel in a
temporary directory and checks what that run printed and plotted.
"""

from __future__ import annotations

import base64
import importlib.util
import re
from pathlib import Path

import nbformat

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_builder():
    """examples/build_tour.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("build_tour", EXAMPLES / "build_tour.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stdout_of(nb: nbformat.NotebookNode) -> str:
    """Everything the code cells printed to stdout, in order."""
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream" and o.name == "stdout")


def pngs_of(nb: nbformat.NotebookNode) -> list[bytes]:
    """Decoded image/png outputs, in order."""
    return [base64.b64decode(o.data["image/png"]) for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if "image/png" in o.get("data", {})]


def number_after(text: str, label: str) -> int:
    """The integer printed right after ``label`` (the test fails naming it if absent)."""
    found = re.search(re.escape(label) + r"\s*([0-9,]+)", text)
    assert found, f"the notebook printed no {label!r}; stdout was:\n{text}"
    return int(found.group(1).replace(",", ""))


def test_saved_tour_is_the_built_one_and_executed():
    """tour.ipynb holds build_tour.py's cells, saved with outputs and both plots."""
    saved = nbformat.read(EXAMPLES / "tour.ipynb", as_version=4)
    built = load_builder().build()
    assert [(c.cell_type, c.source) for c in saved.cells] == \
        [(c.cell_type, c.source) for c in built.cells], \
        "examples/tour.ipynb is stale: run python examples/build_tour.py"
    code = [c for c in saved.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "tour.ipynb was saved without executing it"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert len(pngs_of(saved)) == 2


def test_tour_notebook_runs(tmp_path):
    """A fresh run prints the counts each step promises, the CLI's view and two plots."""
    builder = load_builder()
    nb = nbformat.read(EXAMPLES / "tour.ipynb", as_version=4)
    for cell in nb.cells:  # never check the saved outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    builder.execute(nb, tmp_path)
    out = stdout_of(nb)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
                if o.output_type == "error"]

    # Batch writes: two 10,000-row appends; the keyed table keeps the newest row per key.
    assert number_after(out, "events, committed rows:") == 20_000
    assert number_after(out, "users, committed WAL-tail rows:") == 6_000
    assert number_after(out, "users, rows in the whole table:") == 5_000
    assert number_after(out, "users, renamed rows:") == 1_000

    # The orphan writer's 500 rows are in the log but not committed.
    assert number_after(out, "read_committed rows:") == 20_000
    assert number_after(out, "read_uncommitted rows:") == 20_500

    # Stream: the rerun on the same checkpoint adds nothing, the next append once.
    assert "rerun added rows: 0 records: 0" in out
    assert "the copy added rows: 5000 records: 1" in out

    # CLI: inspect and commits printed the table's shards and records, no error.
    assert "exit code" not in out
    inspect = out[out.index("$ memwal inspect"):out.index("$ memwal commits")]
    commits = out[out.index("$ memwal commits"):]
    assert "3 records (3 append)" in inspect
    assert "1 uncommitted entries in 1 shard(s)" in inspect
    shards = re.findall(r"^shard ([0-9a-f]{8}): +(\d+) committed, +(\d+) uncommitted$", out, re.M)
    assert len(shards) == 5, out
    for prefix, _committed, _uncommitted in shards:
        assert prefix in inspect, f"shard {prefix} missing from memwal inspect:\n{inspect}"
    assert sorted((int(c), int(u)) for _, c, u in shards) == [(0, 500)] + [(6_250, 0)] * 4
    assert re.findall(r"^(\d+) +append .* ([0-9,]+) +[0-9.]+ [KMG]?i?B *$", commits, re.M) == \
        [("1", "10,000"), ("2", "10,000"), ("3", "5,000")], commits

    # Plots: rows per shard and the commit timeline, as real PNGs.
    pngs = pngs_of(nb)
    assert len(pngs) == 2
    assert all(p.startswith(PNG_MAGIC) and len(p) > 5_000 for p in pngs)
    assert len(re.findall(r"^events_copy +commit #\d", out, re.M)) == 2

    # Compaction moves every committed row into the base table; the tail is empty.
    assert "before: base table rows 0 | tail rows 25000" in out
    assert "after:  base table rows 25000 | tail rows 0" in out
    assert number_after(out, "whole table (view=table):") == 25_000


def test_quickstart_ends_with_next_steps_and_no_secret():
    spec = importlib.util.spec_from_file_location("quickstart", EXAMPLES / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "print(next_steps(uri, storage))" in (EXAMPLES / "quickstart.py").read_text()
    text = module.next_steps("/tmp/demo.lance", {})
    for step in ("memwal inspect /tmp/demo.lance", "memwal compact /tmp/demo.lance",
                 "memwal tail /tmp/demo.lance <shard>", "README.md"):
        assert step in text, text
    s3 = module.next_steps("s3://b/t.lance", {"storage.aws_endpoint": "http://127.0.0.1:1",
                                              "storage.aws_secret_access_key": "SECRET-xyz"})
    assert "--storage aws_endpoint=http://127.0.0.1:1" in s3
    assert "SECRET-xyz" not in s3 and "AWS_SECRET_ACCESS_KEY" in s3
