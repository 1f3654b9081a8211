"""Storage option names and the shipped ``conf/*.properties`` files."""

from __future__ import annotations

from pathlib import Path

import pytest

from memwal_datasource.errors import ConfigError
from memwal_datasource.options import load_options

CONF = Path(__file__).resolve().parent.parent / "conf"


@pytest.mark.parametrize("name", ["local.properties", "s3.properties"])
def test_shipped_conf_files_load_and_parse_as_spark_options(name):
    from memwal_datasource.spark.options import WriteOptions

    opts = load_options(str(CONF / name), environ={"AWS_REGION": "eu-west-1"})
    assert opts["enable_memtable"] == "false"
    parsed = WriteOptions.parse({"path": "/tmp/t.lance", **opts})  # every key is known
    assert parsed.config.enable_memtable is False
    if name == "s3.properties":
        assert parsed.storage == {"aws_region": "eu-west-1"}


def test_placeholders_comments_and_errors(tmp_path):
    f = tmp_path / "x.properties"
    f.write_text("# comment\n! also\n\nstorage.aws_secret_access_key = ${SECRET}\n"
                 "writer_group: g1\n")
    assert load_options(str(f), environ={"SECRET": "s3cr3t"}) == {
        "storage.aws_secret_access_key": "s3cr3t", "writer_group": "g1"}
    with pytest.raises(ConfigError, match=r"x.properties line 4: environment variable "
                                          r"'SECRET' is not set"):
        load_options(str(f), environ={})
    f.write_text("just words\n")
    with pytest.raises(ConfigError, match="line 1: expected 'key=value'"):
        load_options(str(f), environ={})
