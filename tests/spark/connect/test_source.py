"""Writes, reads and errors of the memwal format from a Spark Connect client (issue 45)."""

from __future__ import annotations

import pytest

from memwal_datasource import MemWalDataSource
from memwal_datasource.spark import partition_for_table
from tests.spark.connect.helpers import first_line, our_text

pytestmark = [pytest.mark.spark, pytest.mark.connect]


def test_register_from_the_client(connect_spark, tmp_path):
    """The interpreter check is the server's business: registering from a client works."""
    connect_spark.dataSource.register(MemWalDataSource)
    path = str(tmp_path / "t.lance")
    connect_spark.range(7).write.format("memwal").mode("append").save(path)
    assert connect_spark.read.format("memwal").load(path).count() == 7


def test_the_classic_interpreter_check_says_what_to_do_on_a_connect_session(connect_spark):
    from memwal_datasource.errors import ConfigError
    from memwal_datasource.spark.interpreter import check_python_workers

    check_python_workers()  # a Connect client: nothing to check here
    with pytest.raises(ConfigError, match=r"^Install memwal_datasource in the Spark Connect "
                                          r"server's Python workers' interpreter "):
        check_python_workers(connect_spark)


def test_primary_key_upserts(connect_spark, tmp_path):
    path = str(tmp_path / "users.lance")
    opts = {"primary_key": "id"}
    first = connect_spark.range(0, 100, 1, 3).selectExpr("id", "'old' AS v")
    (partition_for_table(first, path, create_options=opts)  # creates the table, client-side
     .write.format("memwal").mode("append").options(**opts).save(path))
    second = connect_spark.range(50, 150, 1, 3).selectExpr("id", "'new' AS v")
    (partition_for_table(second, path).write.format("memwal").mode("append").options(**opts)
     .save(path))
    rows = (connect_spark.read.format("memwal").option("view", "table").load(path)
            .select("id", "v").collect())
    assert sorted((r.id, r.v) for r in rows) == (
        [(i, "old") for i in range(50)] + [(i, "new") for i in range(50, 150)])


def test_a_failed_read_leads_with_our_sentence(connect_spark, tmp_path):
    """Defect 4: the client's message starts with our fix, not a Python traceback."""
    missing = str(tmp_path / "missing.lance")
    with pytest.raises(Exception) as caught:
        connect_spark.read.format("memwal").load(missing).count()
    assert our_text(caught.value) == (
        f"memwal_datasource.errors.ConfigError: no memwal table at {missing}: write to it first "
        f"(df.write.format('memwal').save('{missing}') creates it), or check the path")
    assert "Traceback" not in str(caught.value)
    # What is left after our sentence is the server's JVM stack, which the client shows
    # unless the session turns it off: then the whole message is our sentence and Spark's.
    connect_spark.conf.set("spark.sql.connect.serverStacktrace.enabled", "false")
    try:
        with pytest.raises(Exception) as caught:
            connect_spark.read.format("memwal").load(missing).count()
    finally:
        connect_spark.conf.unset("spark.sql.connect.serverStacktrace.enabled")
    assert len(str(caught.value)) < 2 * len(first_line(caught.value)), str(caught.value)


def test_a_failed_task_leads_with_our_sentence(connect_spark, tmp_path):
    df = connect_spark.range(10).selectExpr("IF(id = 3, NULL, id) AS id")
    with pytest.raises(Exception) as caught:
        (df.write.format("memwal").mode("append").option("primary_key", "id")
         .save(str(tmp_path / "t.lance")))
    text = str(caught.value)
    assert ("memwal_datasource.errors.ConfigError: Primary key column 'id' must not be null: "
            in text), text[:2000]
    assert "Traceback" not in text
