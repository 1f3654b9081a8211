"""Named points in the write protocol where tests pause or kill a process.

Production code calls :func:`point` at each step that matters for fencing
(after a claim, after tip discovery, after a sentinel, before and after a WAL
PUT, before a commit record). With nothing registered it costs one dict
lookup. Tests register callables with :func:`register` to pause a writer on an
``threading.Event`` (never a sleep), or set ``MEMWAL_KILL_AT=name[:n]`` in a
child process to have it ``SIGKILL`` itself on the n-th time it reaches
``name``.

Points (keyword arguments passed to hooks):

* ``claim.written`` (shard, epoch, version): a claim's manifest version landed.
* ``open.tip`` (shard, epoch, tip): the appender found the WAL tip.
* ``open.sentinel`` (shard, epoch, position): the fence sentinel landed.
* ``append.before`` / ``append.after`` (shard, epoch, position): around a WAL PUT.
* ``writer.closed`` (shard, epoch): a writer flushed everything at close.
* ``lease.proving`` (shard, generation, job_id, partition): an acquisition's put landed
  and its listing (the proof it holds the shard) starts; a task continuing a kept writer
  on an object store lists while it writes.
* ``native.advanced`` (shard, epoch, position): MemTable mode fenced a shard and moved
  its replay position to ``position``; pylance's writer opens next.
* ``commit.before`` / ``commit.after`` (sequence): around a commit record PUT.
* ``commit.stray`` (sequence): a commit record PUT filled a number gc had released;
  the commit deleted it and commits again.
* ``commit.intent`` (intent_id, job_id): a contended commit stored its intent and waits
  for a group record to hold it (or leads one).
* ``turn.written`` (shard, epoch, job_id, partition, attempt): a Spark task put the rows
  that waited for a shard (its turn on it), before closing its writer.
* ``rehome.refused`` (job_id, shards, round): a driver's commit was overtaken on
  ``shards``; it re-homes them next (:mod:`memwal_datasource.write.rehome`).
* ``rehome.written`` (shard, job_id, epoch, first, last): it wrote one shard's rows again
  at the tip, holding the shard's lease until its commit.
* ``hold.put`` (hold_id, after_seq): a stream wrote or refreshed its reader hold.
* ``gc.replan`` (sequence): gc plans again (a commit took its record's number, or a
  stream's hold appeared since the plan); ``gc.held`` (after_seq): after its record, gc
  keeps what a stream that held meanwhile planned.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

_hooks: dict[str, list[Callable[..., None]]] = {}
_lock = threading.Lock()
_counts: dict[str, int] = {}


def _kill_spec() -> tuple[str, int] | None:
    raw = os.environ.get("MEMWAL_KILL_AT")
    if not raw:
        return None
    name, _, nth = raw.partition(":")
    return name, int(nth or 1)


_KILL_AT = _kill_spec()


def point(name: str, **context: object) -> None:
    """Run the hooks registered at ``name`` (and the kill switch, if armed)."""
    if _KILL_AT is not None and _KILL_AT[0] == name:
        with _lock:
            _counts[name] = _counts.get(name, 0) + 1
            hit = _counts[name] == _KILL_AT[1]
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)
    callbacks = _hooks.get(name)
    if callbacks:
        for callback in list(callbacks):
            callback(**context)


def register(name: str, callback: Callable[..., None]) -> Callable[[], None]:
    """Call ``callback(**context)`` at ``name``; returns a function that unregisters it."""
    with _lock:
        _hooks.setdefault(name, []).append(callback)

    def remove() -> None:
        with _lock:
            if callback in _hooks.get(name, []):
                _hooks[name].remove(callback)

    return remove


def clear() -> None:
    """Remove every registered hook (tests call this between cases)."""
    with _lock:
        _hooks.clear()
