"""The README: its quick-start example runs as written, and its links resolve."""

from __future__ import annotations

import os
import re
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


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(slug)
    return out


DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    text = page.read_text()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.name}: {target} (no such file)"
        if anchor:
            assert anchor in _anchors(dest.read_text()), f"{page.name}: {target} (no anchor)"


def test_the_readme_links_every_page_under_docs():
    text = README.read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f"](docs/{page.name})" in text, page.name
