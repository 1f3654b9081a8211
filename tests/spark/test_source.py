"""Bad input fails on the driver, before any task, and leaves the table untouched."""

from __future__ import annotations

import os

import pytest
from pyspark.sql.utils import AnalysisException

from memwal_datasource.errors import ConfigError
from memwal_datasource.spark.options import ReadOptions, WriteOptions
from memwal_datasource.store import open_store
from tests.spark.test_writer import frame, read, write


def snapshot(uri, opts) -> dict[str, int]:
    """Every object under the table with its size."""
    store = open_store(uri, {k[len("storage."):]: v for k, v in opts.items()})
    return {k: store.head(k) for k in store.list("")}


@pytest.fixture
def existing(spark, spark_location):
    uri, opts = spark_location
    write(frame(spark, 0, 20, 1), uri, opts, enable_memtable="false", primary_key="id")
    return uri, opts, snapshot(uri, opts)


def assert_refused(spark, uri, opts, df, match, **extra):
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(AnalysisException, match=match):
        write(df, uri, opts, **extra)
    # Failed in writer() on the driver: no Spark job ran.
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs_before


@pytest.mark.parametrize("backend", ["local", "s3"])
@pytest.mark.parametrize("extra, match", [
    ({"no_such_option": "1"}, "unknown write option 'no_such_option'"),
    ({"max_wal_buffer_size": "ten"}, "option 'max_wal_buffer_size' must be an integer"),
    ({"max_wal_flush_interval_ms": "-5"}, "'max_wal_flush_interval_ms' must be an integer in"),
    ({"enable_memtable": "maybe"}, "option 'enable_memtable' must be true or false"),
    ({"durable_write": "yes please"}, "option 'durable_write' must be true or false"),
    ({"enable_memtable": "true", "max_wal_persist_retries": "7"},
     "'max_wal_persist_retries' cannot be set with enable_memtable=true"),
    ({"primary_key": "other"}, "option 'primary_key' is \\['other'\\]"),
    ({"writer_group": "a/b"}, "option 'writer_group' must be"),
])
def test_bad_options_fail_before_tasks(spark, existing, extra, match):
    uri, opts, before = existing
    assert_refused(spark, uri, opts, frame(spark, 100, 10, 1), match, **extra)
    assert snapshot(uri, opts) == before


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_schema_mismatch_names_the_column(spark, existing):
    uri, opts, before = existing
    bad_type = spark.range(0, 5).selectExpr("id", "cast(id as int) as v")
    assert_refused(spark, uri, opts, bad_type, "column 'v' is int32 in the DataFrame but string")
    missing = spark.range(0, 5).selectExpr("id")
    assert_refused(spark, uri, opts, missing, "missing column\\(s\\) \\['v'\\]")
    extra = spark.range(0, 5).selectExpr("id", "'x' as v", "1 as w")
    assert_refused(spark, uri, opts, extra, "unexpected column\\(s\\) \\['w'\\]")
    assert snapshot(uri, opts) == before


@pytest.mark.parametrize("backend", ["local"])
def test_missing_primary_key_column_creates_nothing(spark, spark_location):
    uri, opts = spark_location
    assert_refused(spark, uri, opts, frame(spark, 0, 5, 1),
                   "option 'primary_key' names column\\(s\\) \\['nope'\\]", primary_key="nope")
    assert snapshot(uri, opts) == {}


@pytest.mark.parametrize("backend", ["local"])
def test_null_in_primary_key_fails_naming_column(spark, spark_location):
    uri, opts = spark_location
    write(frame(spark, 0, 5, 1), uri, opts, enable_memtable="false", primary_key="id")
    with_null = spark.range(0, 5).selectExpr("if(id = 3, null, id) as id", "'x' as v")
    with pytest.raises(Exception, match="Primary key column 'id' must not be null"):
        write(with_null, uri, opts, enable_memtable="false")
    assert read(spark, uri, opts).count() == 5


def test_unreachable_s3_endpoint_fails_before_tasks(spark, tmp_path):
    opts = {"storage.aws_endpoint": "http://127.0.0.1:9", "storage.allow_http": "true",
            "storage.aws_access_key_id": "k", "storage.aws_secret_access_key": "s",
            "storage.aws_region": "us-east-1", "storage.s3_max_attempts": "1",
            "storage.s3_connect_timeout_s": "1"}
    with pytest.raises(AnalysisException, match="cannot reach S3 at http://127.0.0.1:9"):
        write(frame(spark, 0, 5, 1), "s3://bucket/t.lance", opts)


def test_wrong_credentials_and_missing_bucket_fail_clearly(spark, s3_server, s3_table):
    uri, base = s3_table
    opts = {f"storage.{k}": v for k, v in base.items()}
    bad = dict(opts, **{"storage.aws_secret_access_key": "wrong-secret-value"})
    with pytest.raises(AnalysisException, match="rejected the credentials") as info:
        write(frame(spark, 0, 5, 1), uri, bad)
    assert "wrong-secret-value" not in str(info.value)
    with pytest.raises(AnalysisException, match="bucket 'nobucket' does not exist"):
        write(frame(spark, 0, 5, 1), "s3://nobucket/t.lance", opts)


def test_option_parsing_units():
    w = WriteOptions.parse({"path": "/x/t.lance", "writer_group": "g",
                            "storage.AWS_ENDPOINT": "http://h:1", "storage.secret_access_key": "s"})
    assert w.storage == {"aws_endpoint": "http://h:1", "aws_secret_access_key": "s"}
    assert "s" not in w.describe().split("aws_secret_access_key")[1][:8]
    assert w.shard_for(3) == w.shard_for(3) != w.shard_for(4)
    assert WriteOptions.parse({"path": "/x/t.lance", "writer_group": "h"}).shard_for(3) != \
        w.shard_for(3)
    with pytest.raises(ConfigError, match="option 'path' is required"):
        WriteOptions.parse({})
    # Relative local paths are resolved on the driver, once; URIs are left alone.
    import os

    assert WriteOptions.parse({"path": "rel/t.lance/"}).path == os.path.abspath("rel/t.lance")
    assert ReadOptions.parse({"path": "rel/t.lance"}).path == os.path.abspath("rel/t.lance")
    assert WriteOptions.parse({"path": "s3://b/t.lance/"}).path == "s3://b/t.lance"
    # Tasks flush at close before reporting, so per-put durability is opt-in.
    assert w.config.durable_write is False
    explicit = WriteOptions.parse({"path": "/x/t.lance", "durable_write": "true"})
    assert explicit.config.durable_write is True
    # A WAL-only task queues two WAL entries' worth, not Lance's 1 GiB; explicit wins.
    wal = WriteOptions.parse({"path": "p", "enable_memtable": "false",
                              "max_wal_buffer_size": str(4 << 20)})
    assert wal.config.max_unflushed_memtable_bytes == 8 << 20
    assert WriteOptions.parse({"path": "p", "enable_memtable": "false",
                               "max_unflushed_memtable_bytes": str(1 << 30)}
                              ).config.max_unflushed_memtable_bytes == 1 << 30
    assert WriteOptions.parse({"path": "p"}).config.max_unflushed_memtable_bytes == 1 << 30
    r = ReadOptions.parse({"path": "p", "starting_positions": '{"%s": 3}' % ("0" * 32)})
    assert list(r.starting.values()) == [3]
    for bad, match in [({"isolation": "dirty"}, "option 'isolation' must be one of"),
                       ({"starting_positions": "[1]"}, "option 'starting_positions' must be"),
                       ({"ending_positions": '{"x": 1}'}, "option 'ending_positions' must be"),
                       ({"shards": "not-a-uuid"}, "option 'shards' must list shard UUIDs"),
                       ({"max_entries_per_partition": "0"}, "'max_entries_per_partition' must"),
                       ({"metadata_columns": "2"}, "option 'metadata_columns' must be true")]:
        with pytest.raises(ConfigError, match=match):
            ReadOptions.parse({"path": "p", **bad})


def test_stream_start_option_parsing():
    from datetime import datetime

    from memwal_datasource.spark.options import StreamStart

    def start(**options):
        return ReadOptions.parse({"path": "p", **options}).stream_start

    noon_utc = 1769860800000  # 2026-01-31T12:00:00Z
    assert start() is None
    assert start(starting_commit="LATEST") == StreamStart("latest")
    assert start(starting_commit="earliest") == StreamStart("earliest")
    assert start(starting_commit="12") == StreamStart("commit", 12)
    assert start(starting_commit="2026-01-31T12:00:00Z") == StreamStart("timestamp", noon_utc)
    assert start(starting_commit="2026-01-31T13:00:00+01:00") == \
        StreamStart("timestamp", noon_utc)
    local_noon = int(datetime(2026, 1, 31, 12).timestamp() * 1000)
    assert start(starting_commit="2026-01-31T12:00:00") == StreamStart("timestamp", local_noon)
    assert start(starting_timestamp=str(noon_utc)) == StreamStart("timestamp", noon_utc)
    assert start(starting_timestamp="2026-01-31T12:00:00z") == StreamStart("timestamp", noon_utc)
    for bad, match in [({"starting_commit": "0"}, "'starting_commit' must be a commit sequence "
                                                  "number >= 1"),
                       ({"starting_commit": "-3"}, "'starting_commit' must be 'earliest'"),
                       ({"starting_commit": "soon"}, "'starting_commit' must be 'earliest'"),
                       ({"starting_timestamp": "yesterday"},
                        "'starting_timestamp' must be epoch milliseconds or an ISO-8601"),
                       ({"starting_commit": "1", "starting_timestamp": "5"},
                        "set one of options 'starting_commit' and 'starting_timestamp'")]:
        with pytest.raises(ConfigError, match=match):
            ReadOptions.parse({"path": "p", **bad})


def our_message(exc: BaseException) -> str:
    """Our error's message out of the Java/Python traceback Spark wraps it in."""
    import re

    found = re.findall(r"memwal_datasource\.errors\.\w+: (.*)", str(exc))
    assert found, str(exc)[-2000:]
    return found[-1]


def first_sentence(message: str) -> str:
    return message.split(": ", 1)[0].split(". ", 1)[0]


@pytest.mark.parametrize("written, read_as", [("uri", "path"), ("path", "uri")])
def test_a_path_with_a_space_is_one_table(spark, tmp_path, written, read_as):
    table = tmp_path / "a b" / "t.lance"
    as_ = {"uri": table.as_uri(), "path": str(table)}  # file:///.../a%20b/t.lance
    write(frame(spark, 0, 30, 2), as_[written], {})
    write(frame(spark, 30, 30, 2), as_[read_as], {})
    assert sorted(r.id for r in read(spark, as_[read_as], {}).collect()) == list(range(60))
    assert sorted(r.id for r in read(spark, as_[written], {}).collect()) == list(range(60))
    assert sorted(os.listdir(tmp_path)) == ["a b"]  # no second 'a%20b' directory
    assert sorted(os.listdir(tmp_path / "a b")) == ["t.lance"]


def test_saving_into_a_directory_that_is_not_a_lance_table_is_refused(spark, tmp_path):
    target = tmp_path / "events"
    frame(spark, 0, 10, 1).write.parquet(str(target))
    before = sorted(os.listdir(target))
    with pytest.raises(AnalysisException) as err:
        write(frame(spark, 0, 10, 1), str(target), {})
    message = our_message(err.value)
    assert first_sentence(message) == ("Save to an empty or new path, or to an existing Lance "
                                       "table")
    assert f"{target} is not empty and is not a Lance table" in message
    assert sorted(os.listdir(target)) == before


def test_reading_a_missing_table_names_the_absolute_path(spark, tmp_path):
    with pytest.raises(AnalysisException) as err:
        spark.read.format("memwal").load(str(tmp_path / "missing.lance")).collect()
    message = our_message(err.value)
    # Lance's own message drops the leading '/'; ours keeps the path as given.
    assert message.startswith(f"no memwal table at {tmp_path}/missing.lance: write to it first")
    assert str(tmp_path).startswith("/")
    assert "rust/" not in message and ".rs:" not in str(err.value).split("memwal_datasource")[-1]


def test_reading_a_plain_lance_table_says_it_has_no_memwal(spark, tmp_path):
    import lance
    import pyarrow as pa

    uri = str(tmp_path / "plain.lance")
    lance.write_dataset(pa.table({"id": pa.array([1, 2], pa.int64())}), uri)
    with pytest.raises(AnalysisException) as err:
        spark.read.format("memwal").load(uri).collect()
    message = our_message(err.value)
    assert first_sentence(message).startswith("Read it with option view=table")
    assert "write to it once through df.write.format('memwal')" in first_sentence(message)
    assert f"the Lance table at {uri} has no MemWAL" in message
    assert sorted(r.id for r in spark.read.format("memwal").option("view", "table")
                  .load(uri).collect()) == [1, 2]


def test_reading_with_a_wrong_secret_says_the_credentials_were_rejected(spark, s3_table):
    uri, base = s3_table
    opts = {f"storage.{k}": v for k, v in base.items()}
    write(frame(spark, 0, 5, 1), uri, opts)
    bad = dict(opts, **{"storage.aws_secret_access_key": "wrong-secret-value"})
    with pytest.raises(AnalysisException) as err:
        read(spark, uri, bad).collect()
    assert "rejected the credentials" in our_message(err.value)
    assert "no memwal table" not in str(err.value)
    assert "wrong-secret-value" not in str(err.value)


def test_a_date_primary_key_is_refused_naming_the_supported_types(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    df = spark.sql("select date_add(date'2024-01-01', cast(id as int)) as d, id as v "
                   "from range(3)")
    with pytest.raises(AnalysisException) as err:
        write(df, uri, {}, primary_key="d")
    message = our_message(err.value)
    assert first_sentence(message).startswith(
        "Cast primary key column 'd' to a supported key type (integer, boolean, string or "
        "binary)")
    assert "option 'primary_key'" in message and "rust/" not in message
    assert not os.path.exists(uri)


@pytest.mark.parametrize("memtable", ["true", "false"])
def test_a_null_primary_key_names_the_column(spark, tmp_path, memtable):
    uri = str(tmp_path / "t.lance")
    df = spark.sql("select if(id = 3, null, id) as id, cast(id as string) as v from range(6)")
    with pytest.raises(Exception) as err:
        write(df.coalesce(1), uri, {}, primary_key="id", enable_memtable=memtable)
    message = our_message(err.value)
    assert first_sentence(message) == "Primary key column 'id' must not be null"
    assert "drop or fill those rows" in message
    assert read(spark, uri, {}).count() == 0  # nothing committed


def test_native_source_locations_are_stripped_from_errors():
    from memwal_datasource.errors import Fenced
    from memwal_datasource.spark.source import without_native_paths

    native = ("Invalid user input: Primary key column 'd' has unsupported type Date32, "
              "/home/runner/work/lance/lance/rust/lance/src/dataset/mem_wal/scanner/exec/pk.rs"
              ":72:24, /home/runner/work/lance/lance/rust/lance-table/src/io/commit.rs:653:26")

    @without_native_paths
    def fails(exc):
        raise exc

    with pytest.raises(OSError) as err:
        fails(OSError(native))
    assert str(err.value) == "Invalid user input: Primary key column 'd' has unsupported type " \
                             "Date32"
    with pytest.raises(Fenced) as err:  # our own types keep their type and fields
        fails(Fenced("s", 1, 2, native))
    assert ".rs:" not in str(err.value) and err.value.stored_epoch == 2
