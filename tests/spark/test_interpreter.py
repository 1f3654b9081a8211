"""Spark's Python workers on an interpreter without this package: caught on the driver."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from memwal_datasource import MemWalDataSource
from memwal_datasource.errors import ConfigError
from memwal_datasource.spark import interpreter
from memwal_datasource.spark.interpreter import check_python_workers, worker_problem


def first_sentence(message: str) -> str:
    return message.split(": ", 1)[0].split(". ", 1)[0]


@pytest.fixture(autouse=True)
def fresh_probes():
    interpreter._checked.clear()
    yield
    interpreter._checked.clear()


@pytest.fixture
def bare_python(tmp_path):
    """An interpreter without site-packages: this Python, isolated (-I -S)."""
    path = tmp_path / "bare-python"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_this_interpreter_is_fine_without_a_probe(monkeypatch):
    monkeypatch.setattr(interpreter, "_probe", lambda exe: pytest.fail("probed"))
    assert worker_problem(sys.executable) is None


def test_an_interpreter_without_the_package_is_named(bare_python):
    problem = worker_problem(bare_python)
    assert problem is not None and "cannot import memwal_datasource" in problem


def test_a_missing_interpreter_is_named():
    assert "not an executable on the PATH" in worker_problem("no-such-python-3.99")


def test_an_archive_interpreter_only_executors_have_is_not_judged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # spark-submit --archives env.tar.gz#environment
    assert worker_problem("./environment/bin/python") is None


def test_unset_pyspark_python_names_the_fix(monkeypatch, bare_python):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    with pytest.raises(ConfigError) as err:
        check_python_workers(SimpleNamespace(pythonExec=bare_python))
    message = str(err.value)
    assert "\n" not in message
    assert first_sentence(message).startswith(f"Set PYSPARK_PYTHON={sys.executable} ")
    assert "before creating the SparkSession" in first_sentence(message)
    assert "spark.pyspark.python" in message
    assert "PYSPARK_PYTHON is unset" in message


def test_pyspark_python_set_after_the_session_started_is_named(monkeypatch, bare_python):
    # The context recorded the old interpreter; the environment says this one now.
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    with pytest.raises(ConfigError, match="set to .* after the SparkSession started"):
        check_python_workers(SimpleNamespace(pythonExec=bare_python))


def test_the_right_interpreter_passes(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    check_python_workers(SimpleNamespace(pythonExec=sys.executable))
    check_python_workers(SimpleNamespace(pythonExec=None))  # Spark Connect: nothing to check


@pytest.mark.spark
def test_register_refuses_a_session_whose_workers_lack_the_package(spark, bare_python):
    sc = spark.sparkContext
    recorded = sc.pythonExec
    jobs_before = sc.statusTracker().getJobIdsForGroup()
    sc.pythonExec = bare_python
    try:
        with pytest.raises(ConfigError, match="^Set PYSPARK_PYTHON="):
            spark.dataSource.register(MemWalDataSource)
    finally:
        sc.pythonExec = recorded
    assert sc.statusTracker().getJobIdsForGroup() == jobs_before
    assert os.environ.get("PYSPARK_PYTHON")  # the suite's own setting is untouched
    spark.dataSource.register(MemWalDataSource)  # the right interpreter: registers
