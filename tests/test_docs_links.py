"""Every relative link in README.md and docs/*.md resolves: the file, and the #anchor.

Anchors follow GitHub's heading ids: the heading's text (inline code, emphasis and
links reduced to their text) in lower case, every character that is not a letter,
digit, space, ``-`` or ``_`` dropped, spaces turned into ``-``; a repeated id gets
``-1``, ``-2``, ... in order. ``<a id="...">`` / ``<a name="...">`` count too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.I)  # http:, mailto:, //host


def prose_lines(markdown: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fence = [], None
    for line in markdown.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] \
                and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):]:
            fence = None
        elif fence is None:
            out.append(line)
    return out


def github_slug(heading: str) -> str:
    """GitHub's id for a heading's text (before de-duplication)."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)                      # inline HTML tags
    text = text.lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every anchor a link into this page may name."""
    seen: dict[str, int] = {}
    out = set()
    lines = prose_lines(markdown)
    for line in lines:
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(HTML_ANCHOR.findall("\n".join(lines)))
    return out


def links(markdown: str) -> list[str]:
    """Every link target in prose (inline and reference-style), code spans left out."""
    prose = "\n".join(INLINE_CODE.sub("", line) for line in prose_lines(markdown))
    return LINK.findall(prose) + REFERENCE.findall(prose)


def broken_links(page: Path) -> list[str]:
    """The page's relative links whose file or anchor does not exist."""
    problems = []
    for target in links(page.read_text()):
        if EXTERNAL.match(target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            problems.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and dest.is_file() \
                and anchor not in anchors(dest.read_text()):
            problems.append(f"{target} (no such anchor)")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert broken_links(page) == [], page.relative_to(ROOT).as_posix()


def test_the_pages_have_links_to_check():
    """The checker reads links at all (a regex that matched nothing would pass above)."""
    assert len(links((ROOT / "README.md").read_text())) >= 10


@pytest.mark.parametrize("heading, slug", [
    ("Quick start", "quick-start"),
    ("Primary-key writes: `partition_for_table`", "primary-key-writes-partition_for_table"),
    ("Clouds: GCS and Azure", "clouds-gcs-and-azure"),
    ("Committing at scale: one sequence, group commit",
     "committing-at-scale-one-sequence-group-commit"),
    ("What `inspect` counts", "what-inspect-counts"),
    ("Modes: `enable_memtable`, and writer options", "modes-enable_memtable-and-writer-options"),
    ("A [linked](x.md) heading", "a-linked-heading"),
])
def test_github_slugs(heading, slug):
    assert github_slug(heading) == slug


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Set-up, step 2\n\n## Notes\n\n"
                                       "## Notes\n\n<a id=\"custom\"></a>\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Local part\n\n"
        "[ok file](other.md) [ok anchor](other.md#set-up-step-2) [ok](#local-part)\n"
        "[ok duplicate](other.md#notes-1) [ok html](other.md#custom) "
        "[ok external](https://example.com/missing.md) [`ok code`](other.md)\n"
        "[bad file](missing.md) [bad anchor](other.md#setup-step-2)\n"
        "[bad local](#nowhere) [bad duplicate](other.md#notes-2)\n"
        "`[not a link](ignored.md)`\n\n"
        "```\n[in a fence](ignored.md)\n```\n\n"
        "[ref]: gone.md\n")
    assert broken_links(page) == [
        "missing.md (no such file)", "other.md#setup-step-2 (no such anchor)",
        "#nowhere (no such anchor)", "other.md#notes-2 (no such anchor)",
        "gone.md (no such file)"]
