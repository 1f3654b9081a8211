"""No credential shows anywhere: logs, errors, reprs, commit records, table files, the CLI.

Every storage option name Lance accepts for a credential (``options.SECRET_KEYS``
and the key ids in ``options.ID_KEYS``) and a few names only the rule catches
are tried in lower case, upper case (the environment spelling) and Spark's
``storage.`` form, each with a fresh random value that is then looked for
everywhere: captured logs at DEBUG, stdout/stderr, exception tracebacks and the
bytes of every file the table holds.
"""

from __future__ import annotations

import logging
import os
import traceback
import uuid

import pyarrow as pa
import pytest
from click.testing import CliRunner

from memwal_datasource.cli import EXIT_NOT_FOUND, EXIT_USAGE, main
from memwal_datasource.errors import ConfigError, StoreError
from memwal_datasource.log.commit import CommitLog
from memwal_datasource.options import (
    ID_KEYS,
    REDACTED,
    SECRET_KEYS,
    S3Options,
    is_secret,
    load_options,
    normalize,
    parse_bool,
    redact,
)
from memwal_datasource.spark.options import WriteOptions
from memwal_datasource.store import open_store

# Names no list holds that the rule still treats as credentials.
PATTERN_ONLY = ["aws_sse_kms_key_id", "aws_container_credentials_relative_uri",
                "aws_container_credentials_full_uri", "warehouse_password", "custom_api_token",
                "proxy_auth", "db_passwd"]
NAMES = sorted(SECRET_KEYS | ID_KEYS) + PATTERN_ONLY
# Settings that must stay readable in logs (the rule is not "hide everything").
VISIBLE = {"aws_endpoint": "http://127.0.0.1:9000", "aws_region": "eu-west-1",
           "allow_http": "true", "aws_virtual_hosted_style_request": "false",
           "s3_max_attempts": "3", "s3_connect_timeout_s": "2", "s3_read_timeout_s": "9",
           "aws_sse_bucket_key_enabled": "true", "aws_skip_signature": "false",
           "aws_server_side_encryption": "aws:kms", "azure_storage_account_name": "acct",
           "tenant_id": "t-1", "google_service_account": "/etc/gcs.json",
           "aws_web_identity_token_file": "/var/run/token", "aws_role_arn": "arn:aws:iam::1:role/r",
           "client_max_retries": "0", "connect_timeout": "5s", "proxy_url": "http://proxy:3128"}
# What the CLI (cli.py's --storage callback) registers to scrub from its messages today.
# Names an S3 table really reads: the S3 end-to-end test gives them real values.
S3_BOUND = {"aws_access_key_id", "access_key_id", "aws_secret_access_key", "secret_access_key",
            "aws_session_token", "aws_token", "session_token", "token",
            "aws_sse_customer_key_base64", "sse_customer_key_base64", "aws_sse_kms_key_id"}
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])


def spellings(name: str) -> list[str]:
    """The option as Lance's docs, the environment and Spark's storage. form spell it."""
    return [name, name.upper(), f"storage.{name}"]


def fresh_secret() -> str:
    return f"leak-{uuid.uuid4().hex}"


@pytest.fixture
def secret() -> str:
    """A value distinctive enough that finding it anywhere is a leak."""
    return fresh_secret()


def spark_schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType([StructField("id", LongType(), False), StructField("v", StringType())])


def rows(schema: pa.Schema, ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"v{i}" for i in ids])],
                           schema=schema)


def error_text(exc: BaseException) -> str:
    """Everything an exception shows: message, repr, and the traceback with its causes."""
    return f"{exc}\n{exc!r}\n" + "".join(traceback.format_exception(exc))


def files_holding(root, *values: str) -> list[str]:
    """Files under ``root`` whose bytes contain any of ``values``."""
    needles = [v.encode() for v in values]
    hits = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                data = f.read()
            if any(n in data for n in needles):
                hits.append(path)
    return hits


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "100"})


# --- the rule ------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_every_credential_name_is_redacted_in_every_spelling(name, secret):
    for spelling in spellings(name):
        assert is_secret(spelling), spelling
        shown = redact({spelling: secret, **VISIBLE})
        assert shown[spelling] == REDACTED and secret not in repr(shown), spelling
        assert {k: shown[k] for k in VISIBLE} == VISIBLE  # the rest stays readable
        assert secret not in repr(redact(normalize({spelling: secret})))
        spark_key = spelling if spelling.startswith("storage.") else f"storage.{spelling}"
        opts = WriteOptions.parse({"path": "/tmp/t.lance", spark_key: secret})
        assert secret in opts.storage.values()  # it did reach the storage options
        summary = opts.describe()
        assert secret not in summary and secret not in repr(opts)
        assert REDACTED in summary


@pytest.mark.parametrize("name", sorted(VISIBLE))
def test_plain_settings_are_not_treated_as_credentials(name):
    assert not is_secret(name) and not is_secret(f"storage.{name.upper()}")
    assert redact({name: VISIBLE[name]}) == {name: VISIBLE[name]}


def test_url_passwords_and_signed_query_parameters_are_masked(secret):
    endpoint = f"http://user:{secret}@127.0.0.1:9"
    proxy = f"http://proxy:3128/?sv=2024&sig={secret}&X-Amz-Security-Token={secret}x"
    shown = redact({"aws_endpoint": endpoint, "proxy_url": proxy})
    assert secret not in repr(shown)
    assert shown == {"aws_endpoint": "http://user:***@127.0.0.1:9",
                     "proxy_url": "http://proxy:3128/?sv=2024&sig=***&X-Amz-Security-Token=***"}
    with pytest.raises(ConfigError, match="plain http") as info:  # allow_http not set
        S3Options.from_storage_options({"aws_endpoint": endpoint})
    assert secret not in error_text(info.value)
    with pytest.raises(StoreError, match="carries credentials") as info:
        open_store(f"s3://AKIDEXAMPLE:{secret}@bucket/t.lance")
    assert secret not in error_text(info.value) and "AKIDEXAMPLE" not in str(info.value)


def test_unreachable_endpoint_with_a_password_fails_without_showing_it(secret):
    """The SDKs' own messages carry the request URL: the mapped error must not chain them."""
    store = open_store("s3://bucket/t.lance", {
        "aws_endpoint": f"http://user:{secret}@127.0.0.1:9", "allow_http": "true",
        "aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": f"{secret}-key",
        "aws_region": "us-east-1", "s3_max_attempts": "1", "s3_connect_timeout_s": "1"})
    for op in (lambda: store.get("k"), lambda: store.put_if_absent("k", b"x"),
               lambda: list(store.list(""))):
        with pytest.raises(StoreError, match=r"cannot reach S3 at http://user:\*\*\*@") as info:
            op()
        assert secret not in error_text(info.value)


# --- reprs and errors ----------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_s3_options_and_store_reprs_never_show_a_credential(name, secret):
    for spelling in spellings(name):
        raw = {spelling.removeprefix("storage."): secret, "aws_endpoint": "http://127.0.0.1:9",
               "allow_http": "true"}
        options = S3Options.from_storage_options(raw)
        store = open_store("s3://bucket/prefix/t.lance", raw)
        for text in (repr(options), str(options), repr(store), str(store), repr(vars(store))):
            assert secret not in text, text
        held = [f for f in ("access_key_id", "secret_access_key", "session_token")
                if getattr(options, f) == secret]
        for field in held:  # a credential S3 uses is there, shown as set
            assert f"{field}='{REDACTED}'" in repr(options)


@pytest.mark.parametrize("name", NAMES)
def test_config_errors_never_echo_a_credential(name, secret):
    """A bad option next to a credential, and a credential with a bad value."""
    storage = {f"storage.{name}": secret}
    failing = [
        lambda: WriteOptions.parse({"path": "/tmp/t.lance", **storage, "writer_group": "a/b"}),
        lambda: WriteOptions.parse({"path": "/tmp/t.lance", **storage, "no_such_option": "1"}),
        lambda: WriteOptions.parse({**storage}),  # no path
        lambda: S3Options.from_storage_options({name: secret, "s3_max_attempts": "zero"}),
        lambda: S3Options.from_storage_options({name: secret, "aws_endpoint": "http://h:1"}),
        lambda: open_store("hdfs://nn/t.lance", {name: secret}),
        lambda: open_store("az://c/t.lance", {name: secret, "azure_endpoint": "http://h:1"}),
        lambda: parse_bool(name, secret),  # a credential given where a flag was expected
    ]
    for call in failing:
        with pytest.raises((ConfigError, StoreError)) as info:
            call()
        assert secret not in error_text(info.value), str(info.value)


def test_properties_file_errors_never_echo_a_credential(tmp_path, secret):
    conf = tmp_path / "s3.properties"
    conf.write_text(f"storage.aws_secret_access_key = {secret}\n"
                    "storage.aws_session_token = ${MEMWAL_TEST_TOKEN}\n")
    unset = "line 2: environment variable 'MEMWAL_TEST_TOKEN' is not set"
    with pytest.raises(ConfigError, match=unset) as info:
        load_options(str(conf), environ={})
    assert secret not in error_text(info.value)
    loaded = load_options(str(conf), environ={"MEMWAL_TEST_TOKEN": f"{secret}-token"})
    assert loaded["storage.aws_secret_access_key"] == secret
    conf.write_text(f"storage.aws_secret_access_key {secret}\n")  # no separator
    with pytest.raises(ConfigError, match="line 1: expected 'key=value'") as info:
        load_options(str(conf), environ={})
    assert secret not in error_text(info.value)


# --- a whole write: summary log line, commit record, table files --------------------

@pytest.mark.parametrize("mode", ["false", "true"])  # enable_memtable
@pytest.mark.parametrize("name", NAMES)
def test_a_write_logs_commits_and_stores_no_credential(name, mode, secret, tmp_path, caplog,
                                                       capsys):
    """The driver and task path Spark runs (prepare, write_task, commit), called directly."""
    from memwal_datasource.spark.source import prepare_table
    from memwal_datasource.spark.writer import MemWalBatchWriter

    caplog.set_level(logging.DEBUG)
    uri = str(tmp_path / "t.lance")
    opts = WriteOptions.parse({"path": uri, "enable_memtable": mode, "primary_key": "id",
                               f"storage.{name.upper()}": secret})
    schema = prepare_table(opts, spark_schema())
    writer = MemWalBatchWriter(opts, schema, overwrite=False)
    writer.commit([writer.write(iter([rows(schema, [1, 2, 3])]))])
    record = CommitLog(open_store(uri, opts.storage)).read(1)
    assert sum(r.rows for r in record.ranges) == 3
    summary = [r.getMessage() for r in caplog.records if "memwal commit 1" in r.getMessage()]
    assert len(summary) == 1 and f": '{REDACTED}'" in summary[0], summary
    out = capsys.readouterr()
    for text in (caplog.text, out.out, out.err, repr(record), repr(writer.opts)):
        assert secret not in text
    assert files_holding(tmp_path, secret) == []


@pytest.mark.parametrize("mode", ["false", "true"])  # enable_memtable
def test_an_s3_write_and_its_errors_show_no_credential(mode, s3_table, caplog, capsys):
    """Real credentials under alias and upper-case names, every other credential name with a
    random value: none shows in logs, errors or any object of the table."""
    from memwal_datasource.spark.source import prepare_table
    from memwal_datasource.spark.writer import MemWalBatchWriter

    caplog.set_level(logging.DEBUG)
    uri, base = s3_table
    others = {n: fresh_secret() for n in NAMES if n not in S3_BOUND}
    options = {"path": uri, "enable_memtable": mode, "primary_key": "id",
               "storage.ENDPOINT": base["aws_endpoint"], "storage.ALLOW_HTTP": "true",
               "storage.REGION": base["aws_region"],
               "storage.ACCESS_KEY_ID": base["aws_access_key_id"],
               "storage.SECRET_ACCESS_KEY": base["aws_secret_access_key"],
               **{f"storage.{n}": v for n, v in others.items()}}
    secrets = [base["aws_secret_access_key"], *others.values()]
    opts = WriteOptions.parse(options)
    schema = prepare_table(opts, spark_schema())
    writer = MemWalBatchWriter(opts, schema, overwrite=False)
    writer.commit([writer.write(iter([rows(schema, [1, 2])]))])
    store = open_store(uri, opts.storage)
    assert CommitLog(store).read(1).ranges[0].rows == 2
    stored = [store.get(key) for key in store.list("")]
    assert stored and not [b for b in stored if any(s.encode() in b for s in secrets)]

    errors = []
    wrong = fresh_secret()
    for bad in ({**options, "storage.SECRET_ACCESS_KEY": wrong},  # rejected credentials
                {**options, "path": uri.replace("s3://", "s3://no-such-bucket-x/", 1)}):
        with pytest.raises(StoreError) as info:
            prepare_table(WriteOptions.parse(bad), spark_schema())
        errors.append(error_text(info.value))
    assert "rejected the credentials" in errors[0] and "does not exist" in errors[1]
    out = capsys.readouterr()
    ours = "\n".join(r.getMessage() for r in caplog.records
                     if r.name.startswith("memwal_datasource"))
    for text in (caplog.text, out.out, out.err, *errors):
        for value in (*secrets, wrong):
            assert value not in text
    assert base["aws_access_key_id"] not in ours and REDACTED in ours


# --- the CLI -------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_cli_error_paths_and_inspect_never_print_a_credential(name, secret, tmp_path):
    from memwal_datasource.table.view import create_table

    storage = ["--storage", f"{name}={secret}"]
    missing = invoke("shards", str(tmp_path / "missing"), *storage)
    config = invoke("commits", "s3://bucket/t.lance", *storage,
                    "--storage", "aws_endpoint=http://127.0.0.1:9")  # plain http, not allowed
    assert missing.exit_code == EXIT_NOT_FOUND and config.exit_code == EXIT_USAGE
    uri = str(tmp_path / "t.lance")
    create_table(uri, SCHEMA, ["id"], storage_options={name: secret})
    runs = [invoke("inspect", uri, "--json", *storage), invoke("commits", uri, *storage),
            invoke("shards", uri, *storage)]
    assert [r.exit_code for r in runs] == [0, 0, 0], runs[0].output
    for out in (missing, config, *runs):
        assert secret not in out.output
    assert files_holding(tmp_path, secret) == []


@pytest.mark.parametrize("name", NAMES)
def test_cli_scrubs_a_credential_that_a_message_would_quote(name, secret, tmp_path):
    """A message that happens to contain the value (here: the path) prints ``***`` instead."""
    out = invoke("shards", str(tmp_path / secret / "t.lance"), "--storage", f"{name}={secret}")
    assert out.exit_code == EXIT_NOT_FOUND and "no memwal table at" in out.stderr
    assert secret not in out.output and REDACTED in out.stderr


def test_a_spark_write_read_and_refused_write_show_no_credential(spark, tmp_path):
    """The real Spark path with every credential name at once: the table's files, the read
    and the error of a refused write hold none of the values."""
    from pyspark.errors import PySparkException
    from pyspark.sql.utils import AnalysisException

    from memwal_datasource.spark import partition_for_table

    uri = str(tmp_path / "t.lance")
    values = {f"storage.{n}": fresh_secret() for n in NAMES}
    df = spark.range(0, 20, numPartitions=2).selectExpr("id", "cast(id as string) as v")
    options = {"enable_memtable": "false", "primary_key": "id", **values}
    df = partition_for_table(df, uri, storage_options=values, create_options=options)
    df.write.format("memwal").mode("append").options(**options).save(uri)
    assert spark.read.format("memwal").options(**values).load(uri).count() == 20
    with pytest.raises((AnalysisException, PySparkException)) as info:
        df.write.format("memwal").mode("append").options(**options, writer_group="a/b").save(uri)
    assert "writer_group" in str(info.value)
    for value in values.values():
        assert value not in error_text(info.value)
    assert files_holding(tmp_path, *values.values()) == []
