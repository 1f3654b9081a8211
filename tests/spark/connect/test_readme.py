"""The README's quick-start example, run by a thin Spark Connect client (issue 45).

The example as written, but for its session: ``SparkSession.builder.remote``
to the test server instead of a local master, in a fresh interpreter that
starts no JVM.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.test_readme import example_code

pytestmark = [pytest.mark.spark, pytest.mark.connect]

BUILDER = re.compile(r"SparkSession\.builder\b.*?\.getOrCreate\(\)", re.S)


@pytest.mark.timeout(360)
def test_the_quick_start_example_runs_over_spark_connect(connect_server, tmp_path):
    code = example_code()
    assert len(BUILDER.findall(code)) == 1, "the example should build one session"
    code = BUILDER.sub(f"SparkSession.builder.remote({connect_server.url!r}).getOrCreate()",
                       code)
    code += ("from pyspark import SparkContext\n"
             "print('thin client:', type(spark).__module__, "
             "SparkContext._active_spark_context is None)\n")
    env = {k: v for k, v in os.environ.items() if k not in (
        "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONNECT_MODE_ENABLED")}
    env["TMPDIR"] = str(tmp_path)  # the example's tempfile.mkdtemp() lands here
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if ":" in line]
    for want in ("appended: 1000", "pk rows: 1000", "after compact: 1000 tail: 0",
                 "streamed: 1000", "thin client: pyspark.sql.connect.session True"):
        assert want in lines, done.stdout
