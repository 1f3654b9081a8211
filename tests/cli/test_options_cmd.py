"""``memwal options``: the Spark option table as a terminal table, JSON and Markdown."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memwal_datasource.cli import EXIT_USAGE
from memwal_datasource.cli.options_cmd import SCOPE_ARGS
from memwal_datasource.spark.option_table import OPTIONS, READS, WRITES, markdown
from tests.cli.test_cli import invoke, one_line_error

COLUMNS = ("option", "value", "default", "scopes", "meaning")


def _scopes_cell(scopes: tuple[str, ...]) -> str:
    """How the table names a scope set (the footer spells out writes and reads)."""
    if set(scopes) == set(WRITES + READS):
        return "all"
    return {WRITES: "writes", READS: "reads"}.get(scopes, ", ".join(scopes))


def _column_text(output: str) -> dict[str, str]:
    """Each table column's text with all whitespace removed (wrapping and folding undone)."""
    lines = output.splitlines()
    header = lines[0]
    starts = [header.index(name) for name in COLUMNS]
    assert starts[0] == 0 and starts == sorted(starts), header
    assert set(lines[1]) == {"─"}, lines[1]
    body = lines[2:lines.index(next(line for line in lines if line.startswith("writes: ")))]
    ends = [*starts[1:], None]
    return {name: "".join("".join(line[lo:hi].split()) for line in body)
            for name, lo, hi in zip(COLUMNS, starts, ends, strict=True)}


def test_table_rows_are_the_option_table_rows():
    out = invoke("options")
    assert out.exit_code == 0, out.output
    got = _column_text(out.stdout)
    assert got == {
        "option": "".join(o.name for o in OPTIONS),
        "value": "".join("".join(o.kind.split()) for o in OPTIONS),
        "default": "".join(o.default or "-" for o in OPTIONS),
        "scopes": "".join(_scopes_cell(o.scopes).replace(" ", "") for o in OPTIONS),
        "meaning": "".join("".join(o.doc.split()) for o in OPTIONS),
    }
    assert "storage.<name>" in out.stdout


def test_table_fits_80_columns():
    out = invoke("options", columns=80)
    assert out.exit_code == 0, out.output
    widths = [len(line) for line in out.stdout.splitlines()]
    assert max(widths) <= 80, max(widths)
    assert "…" not in out.stdout


def test_json_names_every_option_with_its_fields():
    out = invoke("options", "--json")
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout)
    assert [row["name"] for row in body] == [o.name for o in OPTIONS]
    for row, option in zip(body, OPTIONS, strict=True):
        assert row == {"name": option.name, "kind": option.kind,
                       "default": option.default or None, "scopes": list(option.scopes),
                       "description": option.doc}


def test_markdown_is_the_readme_reference():
    out = invoke("options", "--markdown")
    assert out.exit_code == 0, out.output
    assert out.stdout == markdown() + "\n"


@pytest.mark.parametrize("arg", SCOPE_ARGS)
def test_scope_keeps_the_options_that_scope_accepts(arg):
    scope = arg.replace("-", " ")
    assert scope in WRITES + READS
    out = invoke("options", "--json", "--scope", arg.upper())
    assert out.exit_code == 0, out.output
    want = [o.name for o in OPTIONS if scope in o.scopes]
    assert want and len(want) < len(OPTIONS)
    assert [row["name"] for row in json.loads(out.stdout)] == want
    table = _column_text(invoke("options", "--scope", arg).stdout)
    assert table["option"] == "".join(want)


def test_help_names_every_scope():
    assert sorted(a.replace("-", " ") for a in SCOPE_ARGS) == sorted(WRITES + READS)
    text = " ".join(invoke("options", "--help").stdout.split())
    assert all(arg in text for arg in SCOPE_ARGS), text


def test_unknown_scope_is_a_usage_error_naming_the_scopes():
    out = invoke("options", "--scope", "writes")
    one_line_error(out, EXIT_USAGE, "unknown scope 'writes'", *SCOPE_ARGS)


@pytest.mark.parametrize("extra", [["--json"], ["--scope", "read"]])
def test_markdown_takes_no_other_output_option(extra):
    one_line_error(invoke("options", "--markdown", *extra), EXIT_USAGE, "--markdown")


def test_only_the_options_command_imports_the_option_table(tmp_path):
    """Other commands stay as fast to start as before: the option table is imported lazily,
    and (the spark package being lazy too) even the options command needs no pyspark."""
    code = f"""
import sys
from click.testing import CliRunner
from memwal_datasource.cli import main
for args in (["--help"], ["shards", {str(tmp_path)!r}], ["options", "--help"]):
    CliRunner().invoke(main, args)
    assert "pyspark" not in sys.modules, args
    assert "memwal_datasource.spark.option_table" not in sys.modules, args
CliRunner().invoke(main, ["options", "--json"])
print("memwal_datasource.spark.option_table" in sys.modules and "pyspark" not in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
