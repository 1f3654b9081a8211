"""The read-only ``memwal`` CLI, on local disk, S3 and the GCS and Azure emulators."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest
from click.testing import CliRunner

from memwal_datasource.cli import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    human_size,
    main,
    short_ids,
)
from memwal_datasource.format.manifest_format import SHARD_SEALED
from memwal_datasource.log.commit import APPEND, CommitLog, CommittedRange, record_key
from memwal_datasource.shard.manifest import ManifestStore
from memwal_datasource.shard.wal import WalAppender
from memwal_datasource.store import open_store
from tests.helpers import later

SHARD = "6f1c1e1e-0000-4000-8000-0000000000aa"
OTHER = "6f1c1e1e-9999-4000-8000-0000000000bb"
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
SECRET = "TOPSECRET-cli-value-42"
LONG = "x" * 150


def batch(ids: list[int], names: list[str | None] | None = None) -> pa.RecordBatch:
    names = names if names is not None else [f"n{i}" for i in ids]
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array(names)], schema=SCHEMA)


@pytest.fixture
def table(location):
    """Entry 1 (3 rows, committed), a sentinel at 2 (epoch 2)."""
    uri, opts = location
    store = open_store(uri, opts)
    a = WalAppender.open(store, SHARD)
    a.append(SCHEMA, [batch([1, 2, 3])])
    WalAppender.open(store, SHARD)  # a second claim: epoch 2 and a sentinel at 2
    CommitLog(store).append(APPEND, [CommittedRange(SHARD, 1, 1, 1, 3, 1536)])
    args = [x for k, v in opts.items() for x in ("--storage", f"{k}={v}")]
    return uri, args, store


def invoke(*args: str, columns: int = 80):
    """Run the CLI as through a pipe (CliRunner's output is not a terminal)."""
    return CliRunner().invoke(main, list(args), env={"COLUMNS": str(columns)})


def one_line_error(out, code: int, *needles: str) -> None:
    """The command failed with ``code`` and one line on stderr, nothing on stdout."""
    assert out.exit_code == code, (out.exit_code, out.output)
    assert out.stdout == "", out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in out.output


def pk_table_with_commits(location, n: int, nbytes: int = 0):
    """A PK table whose shard holds ``n`` committed one-entry writes (ids 0..n-1)."""
    from memwal_datasource.table.view import create_table

    uri, opts = location
    create_table(uri, SCHEMA, primary_key=["id"], storage_options=opts)
    store = open_store(uri, opts)
    for i in range(n):
        app = WalAppender.open(store, SHARD)
        app.append(SCHEMA, [batch([i])])
        CommitLog(store).append(APPEND, [CommittedRange(SHARD, app.epoch, app.first_position,
                                                        app.last_position, 1, nbytes)])
    return uri, opts, store


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_cli_reads_without_writing(table):
    uri, args, store = table
    before = sorted(store.list(""))
    out = invoke("shards", uri, *args)
    assert out.exit_code == 0, out.output
    assert "6f1c1e1e" in out.output and "1..2" in out.output and "1.5 KiB" in out.output
    assert "ACTIVE" in out.output
    out = invoke("tail", uri, SHARD, *args)
    assert out.exit_code == 0, out.output
    assert "#1  epoch 1  3 rows" in out.output and "#2  epoch 2  fence sentinel" in out.output
    out = invoke("manifest", uri, SHARD, "--json", *args)
    assert json.loads(out.output)["writer_epoch"] == 2
    out = invoke("commits", uri, *args)
    assert out.exit_code == 0 and "append" in out.output
    out = invoke("inspect", uri, *args)
    assert out.exit_code == 0 and "1 records (1 append)" in out.output
    assert sorted(store.list("")) == before  # every command is read-only


@pytest.mark.parametrize("backend", ["local"])
def test_every_command_has_json_with_stable_keys(table):
    uri, args, store = table
    shards = json.loads(invoke("shards", uri, "--json").stdout)
    (info,) = shards["shards"]
    assert info["shard_id"] == SHARD and info["status"] == "ACTIVE"
    assert (info["wal_first"], info["wal_last"], info["committed_entries"],
            info["sentinel_entries"], info["uncommitted_entries"]) == (1, 2, 1, 1, 0)
    assert info["committed_bytes"] == 1536  # raw numbers, not "1.5 KiB"
    body = json.loads(invoke("manifest", uri, SHARD, "--json").stdout)
    assert body["status"] == "ACTIVE" and body["version"] == 3  # the close moved replay_after
    assert set(body) >= {"shard_id", "writer_epoch", "sstables", "shard_field_entries"}
    (rec,) = json.loads(invoke("commits", uri, "--json").stdout)["commits"]
    assert rec["sequence"] == 1 and rec["kind"] == "append" and rec["bytes"] == 1536
    assert isinstance(rec["created_ms"], int) and rec["created_ms"] > 0
    lines = invoke("tail", uri, SHARD, "--json").stdout.splitlines()
    entries = [json.loads(line) for line in lines]
    assert [(e["position"], e["sentinel"], e["rows"]) for e in entries] == [
        (1, False, 3), (2, True, 0)]
    assert entries[0]["sample"][0] == {"id": 1, "name": "n1"}
    summary = json.loads(invoke("inspect", uri, "--json").stdout)
    assert summary["totals"]["shards"] == 1 and summary["commits"]["last_sequence"] == 1
    assert summary["shards"][0]["shard_id"] == SHARD


@pytest.mark.parametrize("backend", ["local"])
def test_manifest_status_is_a_name_in_both_forms(table):
    uri, _, store = table
    ManifestStore(store, SHARD).commit_update(2, lambda m: setattr(m, "status", SHARD_SEALED))
    out = invoke("manifest", uri, SHARD)
    assert out.exit_code == 0, out.output
    assert re.search(r"status\s+SEALED", out.stdout), out.stdout
    assert json.loads(invoke("manifest", uri, SHARD, "--json").stdout)["status"] == "SEALED"
    assert "SEALED" in invoke("shards", uri).stdout


@pytest.mark.parametrize("backend", ["local"])
def test_tail_prints_a_readable_table(table):
    uri, _, store = table
    WalAppender.open(store, SHARD).append(SCHEMA, [batch([7, 8], [None, LONG])])
    out = invoke("tail", uri, SHARD, "--rows", "1")
    assert out.exit_code == 0, out.output
    assert re.search(r"^id\s+name", out.stdout, re.M), out.stdout
    assert re.search(r"^1\s+n1\s*$", out.stdout, re.M), out.stdout
    assert "{'id'" not in out.stdout and "(2 more rows" in out.stdout
    out = invoke("tail", uri, SHARD, "--from", "4", "--rows", "5")
    assert re.search(r"^7\s+null\s*$", out.stdout, re.M), out.stdout
    assert "".join(re.findall(r"x+", out.stdout)) == LONG  # folded, not cut


@pytest.mark.parametrize("backend", ["local"])
def test_tables_fit_80_columns_without_truncation(table):
    uri, _, store = table
    WalAppender.open(store, OTHER).append(SCHEMA, [batch([9], [LONG])])
    CommitLog(store).append(APPEND, [CommittedRange(OTHER, 1, 1, 1, 1, 5 * 2**20)],
                            query_id="0123456789abcdef", batch_id=12345)
    for cmd in (["shards", uri], ["commits", uri], ["inspect", uri],
                ["manifest", uri, SHARD], ["tail", uri, OTHER]):
        out = invoke(*cmd)
        assert out.exit_code == 0, out.output
        assert "…" not in out.stdout, out.stdout
        assert max(len(line) for line in out.stdout.splitlines()) <= 80, out.stdout
    shards = invoke("shards", uri).stdout
    # The two shards share 8 characters, so both are shown long enough to differ.
    assert re.findall(r"^(6f1c\S+)", shards, re.M) == ["6f1c1e1e-0", "6f1c1e1e-9"], shards
    commits = invoke("commits", uri).stdout
    assert "01234567#12345" in commits and "5.0 MiB" in commits
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", commits)


def test_short_ids_and_sizes():
    ids = ["6f1c1e1e-0000-aaaa", "6f1c1e1e-0001-bbbb", "0123456789"]
    assert short_ids(ids) == {"6f1c1e1e-0000-aaaa": "6f1c1e1e-0000",
                              "6f1c1e1e-0001-bbbb": "6f1c1e1e-0001", "0123456789": "0123456789"}
    assert short_ids(["abcdefghij", "zzzzzzzzzz"]) == {"abcdefghij": "abcdefgh",
                                                       "zzzzzzzzzz": "zzzzzzzz"}
    assert [human_size(n) for n in (0, 1023, 1536, int(1.2 * 2**20), 3 * 2**40)] == [
        "0 B", "1023 B", "1.5 KiB", "1.2 MiB", "3.0 TiB"]


@pytest.mark.parametrize("backend", ["local"])
def test_not_a_table_is_exit_3_with_one_line(table, tmp_path):
    uri, _, _ = table
    plain = tmp_path / "plain"
    plain.mkdir()
    (tmp_path / "file.txt").write_text("hi")
    for path in (str(tmp_path / "nonexistent" / "x.lance"), str(plain),
                 str(tmp_path / "file.txt")):
        for cmd in (["shards", path], ["commits", path], ["inspect", path],
                    ["tail", path, SHARD], ["manifest", path, SHARD]):
            one_line_error(invoke(*cmd), EXIT_NOT_FOUND, "not a memwal table"
                           if path == str(plain) else path)
    for cmd in ("tail", "manifest"):
        one_line_error(invoke(cmd, uri, OTHER), EXIT_NOT_FOUND, f"shard {OTHER} not found",
                       "memwal shards")
        one_line_error(invoke(cmd, uri, "abc"), EXIT_NOT_FOUND, "no shard starting with 'abc'")


@pytest.mark.parametrize("backend", ["local"])
def test_ordinary_mistakes_get_one_line_and_an_exit_code(table):
    uri, _, store = table
    one_line_error(invoke("manifest", uri, "not-a-uuid"), EXIT_USAGE, "'not-a-uuid' is not "
                   "a shard id")
    one_line_error(invoke("tail", uri, "zz!"), EXIT_USAGE, "is not a shard id")
    one_line_error(invoke("shards", uri, "--storage", "novalue"), EXIT_USAGE, "KEY=VALUE")
    one_line_error(invoke("shards", "hdfs://nn/t.lance"), EXIT_USAGE,
                   "unsupported storage scheme")
    one_line_error(invoke("shards", "s3:///t.lance"), EXIT_USAGE, "has no bucket")
    out = invoke("compact", uri)
    one_line_error(out, EXIT_ERROR, "no Lance table")
    assert ".rs:" not in out.stderr and "rust/" not in out.stderr  # pylance's source paths
    # A damaged commit record is a runtime error, named, in one line.
    store.put(record_key(2), b"{not json")
    one_line_error(invoke("commits", uri), EXIT_ERROR, "commit record", "is corrupt")
    one_line_error(invoke("inspect", uri, "--json"), EXIT_ERROR, "is corrupt")


def test_help_documents_exit_codes():
    out = invoke("--help")
    assert out.exit_code == 0
    assert "Exit codes:" in out.output
    for code in ("0  success", "1  runtime", "2  usage error", "3  not found"):
        assert code in out.output
    assert "Exit codes:" in invoke("inspect", "--help").output
    commands = out.output.split("Commands:")[1].split("Exit codes:")[0]
    assert "..." not in commands, commands  # no one-line summary cut short


@pytest.mark.parametrize("backend", ["local"])
def test_inspect_reports_commits_and_lag(table):
    uri, _, store = table
    a = WalAppender.open(store, SHARD)  # epoch 3: sentinel at 3, then an uncommitted entry
    a.append(SCHEMA, [batch([4, 5])])
    summary = json.loads(invoke("inspect", uri, "--json").stdout)
    t = summary["totals"]
    assert (t["shards"], t["min_epoch"], t["max_epoch"], t["wal_entries"]) == (1, 3, 3, 4)
    assert (t["committed_entries"], t["uncommitted_entries"], t["sentinel_entries"]) == (1, 1, 2)
    assert t["uncommitted_exact"] is True and t["committed_rows"] == 3
    assert t["committed_entries"] + t["uncommitted_entries"] + t["sentinel_entries"] == \
        t["wal_entries"]
    assert summary["commits"]["count"] == 1 and summary["commits"]["kinds"] == {"append": 1}
    assert summary["lance"] is None  # a MemWAL without a Lance dataset is still inspected
    out = invoke("inspect", uri)
    assert out.exit_code == 0, out.output
    assert "1 uncommitted entries in 1 shard(s)" in out.stdout
    assert re.search(r"^6f1c1e1e\s+ACTIVE\s+3\s+1\.\.4\s+1\s+1\s", out.stdout, re.M), out.stdout


@pytest.mark.parametrize("backend", ["local"])
def test_secrets_never_printed(table, tmp_path):
    uri, _, _ = table
    secret = ["--storage", f"aws_secret_access_key={SECRET}",
              "--storage", f"aws_session_token={SECRET}-token"]
    unreachable = ["--storage", "aws_endpoint=http://127.0.0.1:9", "--storage",
                   "allow_http=true", "--storage", "aws_access_key_id=k", "--storage",
                   "aws_region=us-east-1", "--storage", "s3_max_attempts=1",
                   "--storage", "s3_connect_timeout_s=1"]
    runs = [
        invoke("shards", uri, *secret),
        invoke("inspect", uri, "--json", *secret),
        invoke("compact", uri, *secret),
        invoke("shards", str(tmp_path / "missing"), *secret),
        invoke("shards", uri, "--storage", f"aws_secret_access_key:{SECRET}"),
        invoke("shards", "s3://bucket/t.lance", *secret, "--storage", "aws_endpoint=http://h:1"),
        invoke("commits", "s3://bucket/t.lance", *secret, *unreachable),
    ]
    assert runs[0].exit_code == 0 and runs[-1].exit_code == EXIT_ERROR, runs[-1].output
    assert "cannot reach S3" in runs[-1].stderr
    for out in runs:
        assert SECRET not in out.output, out.output


@pytest.mark.parametrize("backend", ["s3"])
def test_wrong_s3_prefix_or_bucket_is_exit_3(table):
    uri, args, _ = table
    wrong = uri.rsplit("/", 2)[0] + "/no-such-prefix/t.lance"
    one_line_error(invoke("shards", wrong, *args), EXIT_NOT_FOUND, "not a memwal table")
    one_line_error(invoke("commits", wrong, *args), EXIT_NOT_FOUND, "not a memwal table")
    one_line_error(invoke("shards", "s3://no-such-bucket-x/t.lance", *args), EXIT_NOT_FOUND,
                   "bucket 'no-such-bucket-x' does not exist")


@pytest.mark.parametrize("backend", ["local", "s3", "azure"])
def test_compact_dry_run_then_compacts_and_says_so(location):
    from memwal_datasource.table.view import read_table

    uri, opts, store = pk_table_with_commits(location, 3)
    args = [x for k, v in opts.items() for x in ("--storage", f"{k}={v}")]
    out = invoke("compact", uri, "--dry-run", *args)
    assert out.exit_code == 0 and "3 commit record(s) to compact (dry run" in out.stdout
    assert read_table(uri, opts).num_rows == 3 and not any(store.list("_memwal_compaction/"))
    out = invoke("compact", uri, "--max-records-per-round", "2", "--json", *args)
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout)
    assert [r["number"] for r in body["rounds"]] == [1, 2] and body["pending_records"] == 0
    import lance

    from memwal_datasource.options import lance_storage_options

    base = lance.dataset(uri, storage_options=lance_storage_options(opts)).to_table()
    assert sorted(base.column("id").to_pylist()) == [0, 1, 2]
    out = invoke("compact", uri, *args)
    assert out.exit_code == 0 and "0 commit record(s) to compact" in out.stdout


@pytest.mark.parametrize("backend", ["local"])
def test_compact_bounds_a_round_by_bytes(location):
    uri, _, _ = pk_table_with_commits(location, 3, nbytes=1000)
    for bound, planned in (("2000", 2), ("1", 3), ("100000", 1)):
        out = invoke("compact", uri, "--dry-run", "--max-bytes-per-round", bound, "--json")
        assert json.loads(out.stdout)["planned_rounds"] == planned, out.output
    out = invoke("compact", uri, "--max-bytes-per-round", "2000", "--json")
    assert out.exit_code == 0, out.output
    rounds = json.loads(out.stdout)["rounds"]
    assert [(r["after_seq"], r["upto_seq"]) for r in rounds] == [(0, 2), (2, 3)]
    out = invoke("compact", uri, "--max-bytes-per-round", "0")
    assert out.exit_code != 0 and "--max-bytes-per-round" in out.output


@pytest.mark.parametrize("backend", ["local"])
def test_gc_dry_run_lists_then_deletes(location, monkeypatch):
    from memwal_datasource.maintenance.compact import compact
    from memwal_datasource.store import LocalStore
    from memwal_datasource.table.view import TableView

    uri, opts, store = pk_table_with_commits(location, 2)
    compact(TableView(uri, opts))
    # Just compacted: even --retain-hours 0 keeps the minimum retention, and says so.
    out = invoke("gc", uri, "--retain-hours", "0")
    assert out.exit_code == 0, out.output
    assert "deleted 0 wal entries" in out.stdout
    assert "kept: commit records 1..2 were compacted less than the retention (30 s)" in \
        " ".join(out.stdout.split())
    real_now = LocalStore.now_ms
    monkeypatch.setattr(LocalStore, "now_ms", lambda self: real_now(self) + 7_200_000)
    out = invoke("gc", uri, "--retain-hours", "0", "--dry-run")
    assert out.exit_code == 0, out.output
    assert "would delete" in out.stdout and "wal entries" in out.stdout
    listed = [line.split()[-1] for line in out.stdout.splitlines() if "/wal/" in line]
    assert listed and all(store.exists(k) for k in listed)
    body = json.loads(invoke("gc", uri, "--retain-hours", "0", "--json").stdout)
    assert [e["key"] for e in body["wal_entries"]] == listed
    assert not any(store.exists(k) for k in listed)
    assert "would delete 0 wal entries" in invoke("gc", uri, "--retain-hours", "0",
                                                  "--dry-run").stdout


@pytest.mark.parametrize("backend", ["local"])
def test_cli_reads_a_table_after_compaction_and_garbage_collection(location):
    from memwal_datasource.maintenance.compact import compact
    from memwal_datasource.maintenance.gc import collect
    from memwal_datasource.table.view import TableView

    uri, opts, store = pk_table_with_commits(location, 3, nbytes=10)
    CommitLog(store).checkpoint()
    compact(TableView(uri, opts))
    collect(t := TableView(uri, opts), retain_seconds=0, clock=later(t))
    assert not store.exists(record_key(1))  # the oldest records are gone
    out = invoke("commits", uri)
    assert out.exit_code == 0, out.output
    assert "records 1..2 were garbage-collected" in out.stdout
    body = json.loads(invoke("commits", uri, "--json").stdout)
    assert body["collected_through"] == 2 and body["commits"][0]["sequence"] == 3
    assert [c["kind"] for c in body["commits"]] == ["append", "gc"]
    summary = json.loads(invoke("inspect", uri, "--json").stdout)
    assert summary["compaction"]["compacted_through"] == 3
    assert summary["commits"]["collected_through"] == 2
    assert summary["lance"]["rows"] == 3
    out = invoke("inspect", uri)
    assert out.exit_code == 0 and "records 1..3 in the base table" in out.stdout, out.output
    assert invoke("shards", uri).exit_code == 0


@pytest.mark.parametrize("backend", ["local"])
def test_compact_dry_run_plans_a_table_without_primary_key(location):
    import lance

    from memwal_datasource.table.view import create_table

    uri, opts = location
    create_table(uri, SCHEMA, storage_options=opts)
    store = open_store(uri, opts)
    for i in range(3):
        app = WalAppender.open(store, SHARD)
        app.append(SCHEMA, [batch([i, i])])
        CommitLog(store).append(APPEND, [CommittedRange(SHARD, app.epoch, app.first_position,
                                                        app.last_position, 2)])
    out = invoke("compact", uri, "--dry-run", "--max-records-per-round", "2", columns=200)
    assert out.exit_code == 0, out.output
    assert ("3 commit record(s) to compact (dry run: nothing changed): 6 rows in 2 round(s), "
            "appended (no primary key") in out.stdout
    body = json.loads(invoke("compact", uri, "--dry-run", "--json").stdout)
    assert (body["pending_rows"], body["planned_rounds"], body["primary_key"]) == (6, 1, [])
    assert lance.dataset(uri).version == 2 and not any(store.list("_memwal_compaction/"))
    out = invoke("compact", uri, "--max-records-per-round", "2", columns=200)
    assert out.exit_code == 0 and "2 round(s), 6 rows merged" in out.stdout, out.output
    assert sorted(lance.dataset(uri).to_table().column("id").to_pylist()) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("backend", ["local"])
def test_gc_losing_a_race_to_a_live_writer_skips_its_shard(location, monkeypatch):
    from memwal_datasource import hooks
    from memwal_datasource.maintenance.compact import compact
    from memwal_datasource.store import LocalStore
    from memwal_datasource.table.view import TableView

    uri, opts, store = pk_table_with_commits(location, 2)
    compact(TableView(uri, opts))
    real_now = LocalStore.now_ms
    monkeypatch.setattr(LocalStore, "now_ms", lambda self: real_now(self) + 7_200_000)
    before = sorted(k for k in store.list("") if "/wal/" in k)
    raced = []

    def live_writer_claims(shard, epoch, **_):  # right after gc's fence sentinel lands
        if not raced:
            raced.append(epoch)
            WalAppender.open(store, shard)  # a live writer reopens: a newer epoch

    remove = hooks.register("open.sentinel", live_writer_claims)
    try:
        out = invoke("gc", uri, "--retain-hours", "0")
    finally:
        remove()
    assert raced
    assert out.exit_code == 0, out.output
    assert "kept: 1 shard(s) are held by a live writer (collected on a later run)" in \
        " ".join(out.stdout.split())
    assert all(store.exists(k) for k in before)  # nothing of the raced shard collected
    out = invoke("gc", uri, "--retain-hours", "0")  # the re-run collects
    assert out.exit_code == 0, out.output
    assert any(not store.exists(k) for k in before)


@pytest.mark.parametrize("backend", ["local"])
def test_json_errors_are_json_objects(table, tmp_path):
    uri, _, store = table
    out = invoke("shards", str(tmp_path / "missing.lance"), "--json")
    assert out.exit_code == EXIT_NOT_FOUND and out.stdout == ""
    body = json.loads(out.stderr)
    assert body["exit_code"] == EXIT_NOT_FOUND and "no memwal table at" in body["error"]
    store.put(record_key(2), b"{not json")
    body = json.loads(invoke("commits", uri, "--json").stderr)
    assert body["exit_code"] == EXIT_ERROR and "is corrupt" in body["error"]
    # Without --json, the same error is the usual one line.
    assert invoke("commits", uri).stderr.startswith("Error: ")


@pytest.mark.parametrize("backend", ["local"])
def test_tail_starts_at_the_last_entries_unless_from_start(table):
    uri, _, store = table
    app = WalAppender.open(store, SHARD)  # epoch 3: a sentinel at 3, entries 4..15
    for i in range(12):
        app.append(SCHEMA, [batch([100 + i])])
    positions = [json.loads(line)["position"] for line in
                 invoke("tail", uri, SHARD, "--json").stdout.splitlines()]
    assert positions == list(range(6, 16))  # the last 10, like tail
    positions = [json.loads(line)["position"] for line in
                 invoke("tail", uri, SHARD, "--json", "-n", "3").stdout.splitlines()]
    assert positions == [13, 14, 15]
    positions = [json.loads(line)["position"] for line in
                 invoke("tail", uri, SHARD, "--json", "--from-start").stdout.splitlines()]
    assert positions == list(range(1, 16))
    one_line_error(invoke("tail", uri, SHARD, "--from", "2", "--from-start"), EXIT_USAGE,
                   "not both")


@pytest.mark.parametrize("backend", ["local"])
def test_manifest_shows_a_bucket_value_as_an_integer(location):
    from memwal_datasource.table import sharding
    uri, opts = location
    ds = sharding.create_table(uri, SCHEMA, ["id"], opts,
                               sharding.ShardingRequest(bucket_column="id", num_buckets=16))
    spec = sharding.table_sharding(ds)
    store = open_store(uri, opts)
    sharding.initialize_shard(store, spec, SHARD, 11)
    body = json.loads(invoke("manifest", uri, SHARD, "--json").stdout)
    (entry,) = body["shard_field_entries"]
    assert entry["value"] == 11 and entry["value_hex"] == "0b000000"
    out = invoke("manifest", uri, SHARD)
    assert re.search(rf"shard field {entry['field_id']}\s+11\s*$", out.stdout, re.M), out.stdout
    assert "0b000000" not in out.stdout


@pytest.mark.parametrize("backend", ["local"])
def test_gc_says_which_stream_holds_what_it_kept(location, monkeypatch):
    from memwal_datasource.log.holds import ReaderHold, ReaderHolds
    from memwal_datasource.maintenance.compact import compact
    from memwal_datasource.memwal_table import MemWalTable
    from memwal_datasource.store import LocalStore

    uri, opts, store = pk_table_with_commits(location, 3)
    compact(MemWalTable(uri, opts))
    ReaderHolds(store).put(ReaderHold("h-7", "q-orders", after_seq=1))
    real_now = LocalStore.now_ms  # past the minimum retention, inside the hold's TTL
    monkeypatch.setattr(LocalStore, "now_ms", lambda self: real_now(self) + 60_000)
    out = invoke("gc", uri, "--retain-hours", "0")
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "deleted 1 wal entries" in text
    assert "kept: commit records 2..3 are held by stream q-orders (hold h-7" in text
    body = json.loads(invoke("gc", uri, "--retain-hours", "0", "--json").stdout)
    assert "held by stream q-orders" in body["kept"]
