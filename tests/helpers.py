"""Small shared test helpers (no fixtures here)."""

from __future__ import annotations

import uuid
from collections import Counter

import pyarrow as pa

from memwal_datasource.errors import TransientStoreError
from memwal_datasource.shard.wal import WalTailer
from memwal_datasource.store import ObjectStore

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def make_batch(start: int, n: int, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    """Rows ``start .. start+n-1`` with a string column derived from the id."""
    return pa.record_batch(
        [pa.array(range(start, start + n), pa.int64()),
         pa.array([f"row-{i}" for i in range(start, start + n)])],
        schema=schema,
    )


def new_shard() -> str:
    return str(uuid.uuid4())


class DelegatingStore(ObjectStore):
    """Forwards every call to a real store; subclasses override what they inject."""

    def __init__(self, inner: ObjectStore):
        self.inner = inner
        self.uri = inner.uri

    def put_if_absent(self, key, data):
        self.inner.put_if_absent(key, data)

    def put(self, key, data):
        self.inner.put(key, data)

    def get(self, key):
        return self.inner.get(key)

    def head(self, key):
        return self.inner.head(key)

    def list(self, prefix):
        return self.inner.list(prefix)

    def list_dirs(self, prefix):
        return self.inner.list_dirs(prefix)

    def delete(self, key):
        self.inner.delete(key)

    def modified_ms(self, key):
        return self.inner.modified_ms(key)

    def version_tag(self, key):
        return self.inner.version_tag(key)

    def now_ms(self):
        return self.inner.now_ms()


class FlakyStore(DelegatingStore):
    """Wraps a real store; the next ``fail_puts`` put_if_absent calls on keys
    containing ``match`` fail (default: WAL entries).

    With ``land=True`` the failing call still writes the object first (the
    response was lost), which is the ambiguous case a writer must resolve.
    ``fail_gets`` makes the next reads of matching keys fail too.
    """

    def __init__(self, inner: ObjectStore, fail_puts: int = 0, land: bool = False,
                 match: str = "/wal/", fail_gets: int = 0):
        super().__init__(inner)
        self.fail_puts = fail_puts
        self.land = land
        self.match = match
        self.fail_gets = fail_gets
        self.put_calls = 0

    def put_if_absent(self, key, data):
        self.put_calls += 1
        if self.fail_puts > 0 and self.match in key:
            self.fail_puts -= 1
            if self.land:
                self.inner.put_if_absent(key, data)
            raise TransientStoreError(f"injected failure writing {key}")
        self.inner.put_if_absent(key, data)

    def get(self, key):
        if self.fail_gets > 0 and self.match in key:
            self.fail_gets -= 1
            raise TransientStoreError(f"injected failure reading {key}")
        return self.inner.get(key)


class RandomFaultStore(DelegatingStore):
    """Seeded random lost acknowledgements on WAL and manifest writes.

    With ``probability`` a conditional write fails: half the time after it
    landed (the response was lost), half the time before.
    """

    def __init__(self, inner: ObjectStore, seed: int, probability: float):
        super().__init__(inner)
        import random
        import threading

        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.probability = probability

    def put_if_absent(self, key, data):
        with self._lock:
            roll, land = self._rng.random(), self._rng.random() < 0.5
        if roll < self.probability and ("/wal/" in key or "/manifest/" in key):
            if land:
                self.inner.put_if_absent(key, data)
            raise TransientStoreError(f"injected {'lost response' if land else 'failure'}")
        self.inner.put_if_absent(key, data)


def wal_rows(store: ObjectStore, shard: str) -> list[int]:
    """Every id in the shard's WAL, in WAL order (sentinels skipped)."""
    out: list[int] = []
    for _pos, entry in WalTailer(store, shard).entries(1):
        for b in entry.batches:
            out.extend(b.column("id").to_pylist())
    return out


def wal_entries(store: ObjectStore, shard: str) -> list[tuple[int, int, int, bool]]:
    """(position, epoch, rows, is_sentinel) of every entry."""
    return [(p, e.writer_epoch, e.num_rows, e.is_sentinel)
            for p, e in WalTailer(store, shard).entries(1, include_sentinels=True)]


class HeldOpen:
    """Open a WAL appender in a thread and hold it right after its claim of ``epoch``.

    ``with HeldOpen(store, shard, epoch) as z:`` returns once the claim has landed
    and the opener is paused before finding the tip; leaving the block releases
    it and joins the thread; ``z.outcome`` is then the appender or the exception
    its open raised. Hooks, not sleeps: the pause is an Event.
    """

    def __init__(self, store: ObjectStore, shard: str, epoch: int):
        import threading

        self.store, self.shard, self.epoch = store, shard, epoch
        self.held, self.release = threading.Event(), threading.Event()
        self.outcome: object = None
        self._thread = threading.Thread(target=self._run)

    def _hold(self, shard, epoch, version):
        if shard == self.shard and epoch == self.epoch:
            self.held.set()
            assert self.release.wait(30)

    def _run(self):
        from memwal_datasource.shard.wal import WalAppender

        try:
            self.outcome = WalAppender.open(self.store, self.shard)
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            self.outcome = exc

    def __enter__(self) -> HeldOpen:
        from memwal_datasource import hooks

        self._remove = hooks.register("claim.written", self._hold)
        self._thread.start()
        assert self.held.wait(30), "the opener never reached its claim"
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self._thread.join(30)
        self._remove()


def later(table, hours: float = 2.0):
    """A gc clock ``hours`` ahead of the store's: stands for the retention having passed."""
    return lambda: table.store.now_ms() + int(hours * 3600 * 1000)


def committed_view(table) -> Counter:
    """Rows of the base table plus the committed WAL tail, read piece by piece.

    The base is read at the snapshot's version (the hidden row key dropped), the
    tail through ``committed_tail`` ranges and ``range_rows``; with a primary key
    the tail's newest row per key replaces (or, as a tombstone, deletes) the
    base's. A multiset of ``(id, v)``: a row read twice counts twice.
    """
    import pyarrow.compute as pc

    from memwal_datasource.format.table_schema import data_schema, primary_key_of
    from memwal_datasource.table.view import TOMBSTONE, last_per_key

    snap = table.snapshot()
    ds = table.dataset(snap.base_version)
    schema = data_schema(ds.schema)
    pk = primary_key_of(ds.schema)
    tail = table.range_rows(snap.tail, schema)
    if pk:
        tail = last_per_key(tail, pk)
    dead = set(tail.filter(tail.column(TOMBSTONE)).column("id").to_pylist()) if pk else set()
    live = tail.filter(pc.invert(tail.column(TOMBSTONE)))
    out: Counter = Counter()
    if not snap.base_hidden:
        replaced = set(live.column("id").to_pylist()) | dead if pk else set()
        out.update((r["id"], r["v"]) for r in ds.to_table(columns=["id", "v"]).to_pylist()
                   if r["id"] not in replaced)
    out.update((r["id"], r["v"]) for r in live.select(["id", "v"]).to_pylist())
    return out


def stream_reader(uri: str, opts: dict, start: str = "earliest"):
    """A new stream's reader (``MemWalStreamReader``, no Spark) over the table at ``uri``."""
    from memwal_datasource.format.table_schema import data_schema
    from memwal_datasource.spark.options import ReadOptions
    from memwal_datasource.spark.stream import MemWalStreamReader
    from memwal_datasource.table.view import TableView

    options = {"path": uri, "starting_commit": start,
               **{f"storage.{k}": v for k, v in opts.items()}}
    schema = data_schema(TableView(uri, opts).dataset().schema)
    return MemWalStreamReader(ReadOptions.parse(options), schema)


def stream_batch(reader, start: dict) -> tuple[list[tuple[int, str]], dict]:
    """One micro-batch of everything committed after offset ``start``: (rows, end offset)."""
    end = reader.latestOffset(start, None)
    rows = []
    for part in reader.partitions(start, end):
        for b in reader.read(part):
            rows.extend(zip(b.column("id").to_pylist(), b.column("v").to_pylist(), strict=True))
    return rows, end


def stream_rows(uri: str, opts: dict, start: str = "earliest") -> list[int]:
    """The ids a new stream serves in its first micro-batch (every record so far)."""
    reader = stream_reader(uri, opts, start)
    rows, _ = stream_batch(reader, reader.initialOffset())
    return [i for i, _ in rows]


def stall_record_puts(monkeypatch, store: ObjectStore, seconds: float = 40.0) -> list[str]:
    """Record PUTs through ``store``'s class take ``seconds`` on the commit log's clock:
    a stall inside the request, after the committer's last check (no real waiting; the
    collection a test runs meanwhile is what such a stall lets happen). Returns the
    keys stalled in."""
    import time
    import types

    from memwal_datasource.format.commit_format import COMMITS_DIR
    from memwal_datasource.log import commit

    ahead = [0.0]
    monkeypatch.setattr(commit, "time", types.SimpleNamespace(
        time=time.time, monotonic=lambda: time.monotonic() + ahead[0], sleep=time.sleep))
    real = type(store).put_if_absent
    stalled: list[str] = []

    def put_if_absent(self, key, data, *args, **kw):
        if key.startswith(COMMITS_DIR + "/0"):
            stalled.append(key)
            ahead[0] += seconds
        return real(self, key, data, *args, **kw)

    monkeypatch.setattr(type(store), "put_if_absent", put_if_absent)
    return stalled
