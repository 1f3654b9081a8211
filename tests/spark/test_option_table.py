"""The option table: one declaration drives the check, the errors and docs/options.md
(which tests/test_readme.py checks)."""

from __future__ import annotations

import pytest

from memwal_datasource.errors import ConfigError
from memwal_datasource.spark.option_table import OPTIONS, READS, WRITES, options_for
from memwal_datasource.spark.options import ReadOptions, WriteOptions


def _parse(scope_options, options):
    return (WriteOptions.parse(options) if scope_options is WRITES
            else ReadOptions.parse(options))


@pytest.mark.parametrize("scopes", [WRITES, READS], ids=["write", "read"])
def test_every_declared_option_is_accepted_and_every_other_refused(tmp_path, scopes):
    path = str(tmp_path / "t.lance")
    for key in options_for(scopes):
        try:
            _parse(scopes, {"path": path, key: "x"})
        except ConfigError as exc:  # a bad value, never an unknown key
            assert "unknown" not in str(exc), (key, exc)
    with pytest.raises(ConfigError, match="unknown .* option 'no_such_option': see `memwal "
                       "options`"):
        _parse(scopes, {"path": path, "no_such_option": "1"})


@pytest.mark.parametrize("typed, meant", [
    ("enable_memtabel", "enable_memtable"), ("enablememtable", "enable_memtable"),
    ("primarykey", "primary_key"), ("max_wal_buffer_sise", "max_wal_buffer_size"),
    ("aws_endpoint", "storage.aws_endpoint"), ("txn_app_id", "txnAppId"),
])
def test_a_misspelt_option_suggests_the_close_one(tmp_path, typed, meant):
    with pytest.raises(ConfigError) as err:
        WriteOptions.parse({"path": str(tmp_path / "t"), typed: "x"})
    first = str(err.value).split("? ", 1)[0] + "?"
    assert first == f"unknown write option '{typed}': did you mean '{meant}'?"
    assert len(str(err.value)) < 200  # one suggestion, not the whole list


def test_an_option_of_the_other_scope_says_where_it_belongs(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown write option 'isolation' \(it is a read"):
        WriteOptions.parse({"path": str(tmp_path / "t"), "isolation": "read_committed"})


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind == "bool"],
                         ids=lambda o: o.name)
def test_every_boolean_takes_true_or_false_and_nothing_else(tmp_path, option):
    scopes = WRITES if set(option.scopes) & set(WRITES) else READS
    path = str(tmp_path / "t.lance")
    for good in ("true", "FALSE", " True "):
        _parse(scopes, {"path": path, option.key: good})
    for bad in ("yes", "1", "on", ""):
        with pytest.raises(ConfigError, match=f"option '{option.name}' must be true or false"):
            _parse(scopes, {"path": path, option.key: bad})
