"""The examples keep working: the notebook is executed end to end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_tour_notebook_runs(tmp_path):
    nb = nbformat.read(EXAMPLES / "tour.ipynb", as_version=4)
    env_python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    assert env_python  # the kernel is this interpreter (ipykernel's native python3 spec)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "streamed rows: 20000" in outputs
    assert "commit 2 append 10000 rows" in outputs
