"""Relative and session-local paths under Spark Connect (issue 45, defect 1).

A relative table path lands where Spark puts its own sources' relative paths
(the server JVM's working directory), never in the session's artifact
directory, which Spark deletes with the session; a path inside that directory
is refused; a client-side call refuses a relative path (the client's working
directory is not the server's).
"""

from __future__ import annotations

import os

import pytest

from memwal_datasource.errors import ConfigError
from memwal_datasource.spark import compact, partition_for_table
from tests.spark.connect.helpers import first_line, on_worker, our_text

pytestmark = [pytest.mark.spark, pytest.mark.connect]


def test_workers_run_in_the_session_artifact_directory_and_see_the_jvm_directory(
        connect_spark, connect_server):
    """The facts the path rule rests on, asked of a real worker of this session."""
    seen = on_worker(connect_spark, "{'cwd': os.getcwd(), 'uuid': os.environ.get("
                     "'SPARK_JOB_ARTIFACT_UUID'), 'jvm': __import__('memwal_datasource.spark"
                     ".connect', fromlist=['x']).jvm_working_dir()}")
    assert seen["uuid"] not in (None, "default")  # the session's (a classic one has default)
    assert os.path.basename(seen["cwd"]) == seen["uuid"]
    assert seen["cwd"] != str(connect_server.workdir)
    assert seen["jvm"] == str(connect_server.workdir)


def test_a_relative_table_path_lands_where_spark_puts_its_own_sources(
        connect_spark, new_connect_session, server_relative):
    name, where = server_relative(".lance")
    df = connect_spark.range(100).selectExpr("id", "cast(id as string) AS v")
    df.write.format("memwal").mode("append").save(name)
    df.write.parquet(name + ".parquet")  # Spark's own source, same session
    assert (where.parent / (name + ".parquet")).is_dir()
    assert (where / "_versions").is_dir()  # the table, beside Spark's parquet files
    artifacts = on_worker(connect_spark, "os.listdir('.')")
    assert name not in artifacts
    # The session's artifact directory goes with it: a new session reads the table.
    connect_spark_2 = new_connect_session()
    assert connect_spark_2.read.format("memwal").load(name).count() == 100
    assert connect_spark_2.read.format("memwal").load(str(where)).count() == 100


def test_a_table_inside_the_session_artifact_directory_is_refused(connect_spark):
    artifacts = on_worker(connect_spark, "os.getcwd()")
    target = os.path.join(artifacts, "t.lance")
    df = connect_spark.range(5).selectExpr("id")
    with pytest.raises(Exception) as caught:
        df.write.format("memwal").mode("append").save(target)
    assert our_text(caught.value).startswith(
        "memwal_datasource.errors.ConfigError: Use a location outside Spark's artifact directory "
        "for option 'path' "), first_line(caught.value)
    assert not os.path.exists(target)


def test_client_side_calls_refuse_a_relative_path(connect_spark):
    df = connect_spark.range(5).selectExpr("id")
    fix = "Use an absolute path or a URI for the path argument of "
    with pytest.raises(ConfigError) as caught:
        compact(connect_spark, "events.lance")
    assert str(caught.value).startswith(fix + "compact(), such as ")
    with pytest.raises(ConfigError) as caught:
        partition_for_table(df, "./events.lance", create_options={"primary_key": "id"})
    assert str(caught.value).startswith(fix + "partition_for_table(), such as ")
    assert not os.path.exists("events.lance")


# --- the rule where the JVM's directory cannot be read (no Connect server needed) ----------

@pytest.fixture
def connect_worker(monkeypatch, tmp_path):
    """This process posing as a Connect session's worker: in its artifact directory."""
    from memwal_datasource.spark import connect as session_paths

    session = "6f1c8e1e-3b1a-4a57-9d1b-2b8f8a7e0c11"
    here = tmp_path / "userFiles-x" / session
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    monkeypatch.setenv(session_paths.ARTIFACT_UUID_ENV, session)
    return here


def test_a_relative_path_is_refused_where_the_jvm_directory_is_unknown(connect_worker,
                                                                       monkeypatch):
    from memwal_datasource.spark import connect as session_paths
    from memwal_datasource.spark.options import WriteOptions
    from memwal_datasource.spark.source import checkpoint_query_id

    # As on a system without /proc (a real worker reads it: the first test above).
    monkeypatch.setattr(session_paths, "jvm_working_dir", lambda: None)
    with pytest.raises(ConfigError) as caught:
        WriteOptions.parse({"path": "events.lance"})
    assert str(caught.value).split(": ")[0] == (
        "Use an absolute path or a URI for option 'path' (the .save() / .load() argument), "
        "such as /data/events.lance, file:///data/events.lance or s3://bucket/events.lance")
    with pytest.raises(ConfigError, match=r"^Use an absolute path or a URI for option "
                                          r"'checkpointLocation', "):
        checkpoint_query_id("ck")
    # Absolute paths and URIs are taken as they are.
    assert WriteOptions.parse({"path": "/data/t.lance"}).path == "/data/t.lance"
    assert WriteOptions.parse({"path": "s3://b/t.lance"}).path == "s3://b/t.lance"
    assert not os.listdir(connect_worker)


def test_a_relative_path_resolves_against_the_jvm_directory(connect_worker, monkeypatch,
                                                            tmp_path):
    from memwal_datasource.spark import connect as session_paths
    from memwal_datasource.spark.options import ReadOptions
    from memwal_datasource.spark.source import checkpoint_query_id

    jvm = tmp_path / "jvm-cwd"
    monkeypatch.setattr(session_paths, "jvm_working_dir", lambda: str(jvm))
    assert ReadOptions.parse({"path": "a/../events.lance/"}).path == str(jvm / "events.lance")
    assert ReadOptions.parse({"path": "file:events.lance"}).path == str(jvm / "events.lance")
    assert checkpoint_query_id("ck") == checkpoint_query_id(str(jvm / "ck"))
    # The classic rule, in this process: its own working directory (the JVM's there).
    monkeypatch.delenv(session_paths.ARTIFACT_UUID_ENV)
    assert ReadOptions.parse({"path": "events.lance"}).path == str(connect_worker / "events.lance")
