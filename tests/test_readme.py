"""The README: its quick-start example runs as written, it stays short and links every
page under docs/; docs/options.md quotes the option table. Links: test_docs_links.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN, END = "<!-- example:begin -->", "<!-- example:end -->"


def example_code() -> str:
    text = README.read_text()
    assert BEGIN in text and END in text, "README lost its example markers"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block.startswith("```python\n") and block.endswith("\n```"), block[:80]
    return block[len("```python\n"):-len("\n```")] + "\n"


def test_the_example_sets_the_interpreter_before_the_session():
    code = example_code()
    assert code.index('os.environ["PYSPARK_PYTHON"] = sys.executable') < code.index(
        "getOrCreate()")
    assert "register" not in code  # pyspark_memwal registers the format


@pytest.mark.spark
@pytest.mark.timeout(360)
def test_the_quick_start_example_runs_as_written(tmp_path):
    """Pasted into a fresh interpreter: no fixtures, no session, no register call."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["TMPDIR"] = str(tmp_path)  # the example's tempfile.mkdtemp() lands here
    done = subprocess.run([sys.executable, "-c", example_code()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if ":" in line]
    assert "appended: 1000" in lines, done.stdout
    assert "pk rows: 1000" in lines, done.stdout
    assert "after compact: 1000 tail: 0" in lines, done.stdout
    assert "streamed: 1000" in lines, done.stdout


OPTIONS_PAGE = ROOT / "docs" / "options.md"
OPTIONS_BEGIN, OPTIONS_END = "<!-- options:begin -->", "<!-- options:end -->"


def test_the_options_page_quotes_the_option_table():
    """docs/options.md carries the table `memwal options --markdown` prints, as it is now."""
    from memwal_datasource.spark.option_table import markdown

    text = OPTIONS_PAGE.read_text()
    assert OPTIONS_BEGIN in text and OPTIONS_END in text, "docs/options.md lost its markers"
    quoted = text.split(OPTIONS_BEGIN, 1)[1].split(OPTIONS_END, 1)[0].strip()
    assert quoted == markdown(), "docs/options.md's table differs: paste option_table.markdown()"


def test_the_readme_stays_short():
    assert len(README.read_text().splitlines()) <= 300


def test_the_readme_links_every_page_under_docs():
    text = README.read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f"](docs/{page.name})" in text, page.name
