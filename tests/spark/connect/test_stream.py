"""A memwal stream copy over Spark Connect, restarted from a new session (issue 45, defect 2).

One stream on one relative ``checkpointLocation``: Spark resolves it in the
server JVM's working directory, the same for every session; the sink's
identity (its query id) must come from that same place, not from the
session's artifact directory its Python workers run in. Otherwise a
micro-batch Spark replays after a restart in a new session is not recognised
as committed, and its rows land twice.
"""

from __future__ import annotations

import pytest

from memwal_datasource import MemWalTable
from memwal_datasource.spark.source import checkpoint_query_id

pytestmark = [pytest.mark.spark, pytest.mark.connect]

ROWS_PER_JOB = 10


def append(spark, path: str, first: int) -> None:
    """One job, one commit record: ids first .. first + ROWS_PER_JOB - 1."""
    (spark.range(first, first + ROWS_PER_JOB, 1, 1).selectExpr("id", "cast(id as string) AS v")
     .write.format("memwal").mode("append").save(path))


def copy(spark, src: str, dst: str, checkpoint: str) -> None:
    """The stream copy, one source commit record per micro-batch, until caught up."""
    (spark.readStream.format("memwal").option("max_rows_per_trigger", str(ROWS_PER_JOB))
     .load(src).writeStream.format("memwal").option("checkpointLocation", checkpoint)
     .trigger(availableNow=True).start(dst).awaitTermination(300))


def test_stream_restarted_in_a_new_session_commits_every_batch_once(
        new_connect_session, server_relative, tmp_path):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "dst.lance")
    checkpoint, where = server_relative("-ck")  # relative: in the server's working directory
    first = new_connect_session()
    for job in range(2):
        append(first, src, job * ROWS_PER_JOB)
    copy(first, src, dst, checkpoint)
    commits = where / "commits"
    assert sorted(p.name for p in commits.iterdir() if p.name.isdigit()) == ["0", "1"]
    # As if the query died after the sink committed batch 1 but before Spark recorded it:
    # Spark replays batch 1 on restart, and the sink must know it committed it.
    (commits / "1").unlink()
    (commits / ".1.crc").unlink(missing_ok=True)
    first.stop()  # the session and its artifact directory go

    second = new_connect_session()
    append(second, src, 2 * ROWS_PER_JOB)
    copy(second, src, dst, checkpoint)

    ids = sorted(r.id for r in second.read.format("memwal").load(dst).select("id").collect())
    assert ids == list(range(3 * ROWS_PER_JOB))  # every row once: no batch committed twice
    records = [h for h in MemWalTable.open(dst).history() if h["batch_id"] is not None]
    assert sorted(h["batch_id"] for h in records) == [0, 1, 2]
    # One query id, derived from where Spark keeps the checkpoint.
    assert {h["query_id"] for h in records} == {checkpoint_query_id(str(where))}
