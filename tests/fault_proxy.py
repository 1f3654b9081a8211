"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1 between S3 clients and the test S3 server.

Requests are relayed byte for byte (request line, headers in order and case, ``Host``
untouched so SigV4 signatures stay valid, bodies with ``Content-Length``, ``chunked`` or
``aws-chunked`` framing, ``Expect: 100-continue`` negotiated with the server) and responses
are streamed back unchanged. Client connections are kept alive; every request gets a fresh
upstream connection, so the proxy itself never retries or reuses a stale socket.

Rules (:class:`FaultRule`) pick requests by method, a regex on the decoded URL path
(``/bucket/key``), conditional-ness (a create-only PUT: ``If-None-Match: *`` for S3 and
Azure, ``x-goog-if-generation-match: 0`` for GCS), a hit budget and a seeded
probability, and apply one fault:

``drop_response``  forward (the write lands), read the reply, close the client connection
``error_after``    forward (the write lands), answer ``status`` with an S3 XML error instead
``error_before``   answer ``status`` without forwarding (nothing lands)
``reset_before``   close the client connection without forwarding (nothing lands)
``delay``          wait ``delay_s`` seconds, then forward
``hold``           block before forwarding until ``rule.release()``; ``rule.arrived`` is set
``hold_after``     forward (the write lands), block the reply until ``rule.release()``
"""

from __future__ import annotations

import http
import random
import re
import select
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

FAULTS = frozenset({"drop_response", "error_after", "error_before", "reset_before", "delay",
                    "hold", "hold_after"})
_S3_ERRORS = {500: ("InternalError", "We encountered an internal error. Please try again."),
              503: ("SlowDown", "Please reduce your request rate.")}
_MAX_LINE = 65536
_CONTINUE_WAIT_S = 1.0  # what botocore waits for "100 Continue" before sending the body

Write = Callable[[bytes], object]


@dataclass(eq=False)
class FaultRule:
    """Which requests to hit and how; matching fields left at ``None`` match anything.

    ``times`` caps how many requests the rule hits (``None``: all); ``hits`` counts them.
    ``arrived`` is set when the rule hits a request (for ``hold``/``hold_after``: once that
    request is being held); held requests continue after :meth:`release` (which stays set,
    so later hits pass straight through) or after ``hold_timeout_s``.
    """

    fault: str
    method: str | None = None
    key_pattern: str | None = None
    conditional: bool | None = None
    only_conditional: bool = False
    times: int | None = None
    probability: float = 1.0
    seed: int = 0
    status: int = 500
    delay_s: float = 0.0
    rst: bool = False  # close with a TCP RST (SO_LINGER 0) instead of a FIN
    hold_timeout_s: float = 60.0
    hits: int = field(default=0, init=False)
    arrived: threading.Event = field(default_factory=threading.Event, init=False)
    released: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; one of {sorted(FAULTS)}")
        if self.only_conditional:
            self.conditional = True
        self._regex = re.compile(self.key_pattern) if self.key_pattern else None
        self._rng = random.Random(self.seed)

    def release(self) -> None:
        """Let held requests (and any later ones) continue."""
        self.released.set()

    def _matches(self, rec: RequestRecord) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and self.method.upper() != rec.method:
            return False
        if self._regex is not None and not self._regex.search(rec.path):
            return False
        if self.conditional is not None and self.conditional != rec.conditional:
            return False
        return self.probability >= 1.0 or self._rng.random() < self.probability

    def _hold(self) -> None:
        self.arrived.set()
        self.released.wait(self.hold_timeout_s)


@dataclass
class RequestRecord:
    """One request the proxy saw, updated as it progresses."""

    method: str
    path: str  # URL-decoded path, ``/bucket/key``
    query: str
    conditional: bool  # a create-only precondition was sent (``If-None-Match: *`` or GCS's)
    headers: list[tuple[str, str]]
    conn: int  # client connection number (equal numbers: a kept-alive connection)
    fault: str | None = None
    forwarded: bool = False  # the whole request reached the server
    upstream_status: int | None = None  # what the server answered
    status: int | None = None  # what the client got (``None``: connection closed instead)
    started: float = 0.0  # time.monotonic() when its head was read
    finished: float | None = None  # ... when its reply was relayed (None: not relayed)

    def header(self, name: str) -> str | None:
        """The last value of header ``name`` (case-insensitive), or ``None``."""
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        return values[-1] if values else None


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.proxy._serve(self.request)


class FaultProxy:
    """The proxy; ``with FaultProxy(upstream_url) as p:`` or ``start()``/``stop()``."""

    def __init__(self, upstream: str, timeout: float = 60.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._log: list[RequestRecord] = []
        self._conns: set[socket.socket] = set()
        self._conn_seq = 0
        self._server: _Server | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>`` of the running proxy."""
        if self._server is None:
            raise RuntimeError("proxy not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        """Listen on an ephemeral port of 127.0.0.1 and serve in a daemon thread."""
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fault-proxy",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        """Release held requests, stop listening and close client connections."""
        server, self._server = self._server, None
        with self._lock:
            for rule in self._rules:
                rule.release()
            conns = list(self._conns)
        if server is not None:
            server.shutdown()
            server.server_close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_rule(self, rule: FaultRule | None = None, **kwargs: object) -> FaultRule:
        """Append a rule (or build one from ``kwargs``); the first matching rule applies."""
        rule = rule if rule is not None else FaultRule(**kwargs)  # type: ignore[arg-type]
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear_rules(self) -> None:
        """Remove (and release) every rule."""
        with self._lock:
            rules, self._rules = self._rules, []
        for rule in rules:
            rule.release()

    def records(self, method: str | None = None, key_pattern: str | None = None,
                forwarded: bool | None = None) -> list[RequestRecord]:
        """A snapshot of the requests seen so far, optionally filtered."""
        with self._lock:
            log = list(self._log)
        return [r for r in log if (method is None or r.method == method.upper())
                and (key_pattern is None or re.search(key_pattern, r.path))
                and (forwarded is None or r.forwarded == forwarded)]

    def round_trips(self, before: float | None = None) -> int:
        """Round trips in the requests recorded so far (that started before ``before``,
        a ``time.monotonic()`` reading, if given): the groups of requests that were in
        flight together (one that starts after every earlier one finished opens a new
        group). Requests without a relayed reply are left out."""
        with self._lock:
            spans = sorted((r.started, r.finished) for r in self._log if r.finished is not None
                           and (before is None or r.started < before))
        trips, end = 0, None
        for start, finish in spans:
            if end is None or start >= end:
                trips += 1
                end = finish
            else:
                end = max(end, finish)
        return trips

    def clear_records(self) -> None:
        """Forget the requests seen so far."""
        with self._lock:
            self._log.clear()

    # -- serving ---------------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.add(conn)
            self._conn_seq += 1
            conn_id = self._conn_seq
        conn.settimeout(self.timeout)
        _no_delay(conn)
        rfile = conn.makefile("rb")
        try:
            while (head := _read_head(rfile)) is not None:
                if not self._relay(conn, rfile, head, conn_id):
                    break
        except (OSError, ValueError):
            pass  # the client or the server went away mid-message
        finally:
            with self._lock:
                self._conns.discard(conn)
            rfile.close()
            conn.close()

    def _relay(self, conn: socket.socket, rfile: BinaryIO, head: bytes, conn_id: int) -> bool:
        """Handle one request; ``True`` if the client connection stays open."""
        method, target, version, headers = _parse_head(head)
        url = urlsplit(target)
        hdr = {k.lower(): v for k, v in headers}
        conditional = (hdr.get("if-none-match", "").strip() == "*"
                       or hdr.get("x-goog-if-generation-match", "").strip() == "0")
        rec = RequestRecord(method, unquote(url.path), url.query, conditional, headers, conn_id,
                            started=time.monotonic())
        with self._lock:
            rule = next((r for r in self._rules if r._matches(rec)), None)
            if rule is not None:
                rule.hits += 1
                rec.fault = rule.fault
            self._log.append(rec)
        fault = rec.fault
        if rule is not None and fault not in ("hold", "hold_after"):
            rule.arrived.set()
        expect = hdr.get("expect", "").lower() == "100-continue" and _has_body(hdr)
        keep = version == "HTTP/1.1" and "close" not in hdr.get("connection", "").lower()
        if rule is not None and fault == "reset_before":
            return _abort(conn, rule)
        if rule is not None and fault == "error_before":
            if not expect:  # with Expect the client holds the body back: refuse and close
                _copy_body(rfile, None, hdr)
            rec.status = rule.status
            conn.sendall(_error(rule.status, method, rec.path, close=expect or not keep))
            return keep and not expect
        if rule is not None and fault == "delay":
            time.sleep(rule.delay_s)
        if rule is not None and fault == "hold":
            rule._hold()
            if self._server is None:
                return False  # stopped while held: forward nothing
        with socket.create_connection(self.upstream, timeout=self.timeout) as up, \
                up.makefile("rb") as ufile:
            _no_delay(up)
            up.sendall(head)
            resp = _await_continue(up, ufile) if expect else None
            if resp is not None and _status(resp) == 100:
                conn.sendall(resp)  # the server wants the body: tell the client
                resp = None
            body_sent = resp is None
            if body_sent:
                _copy_body(rfile, up.sendall, hdr)
                rec.forwarded = True
            while resp is None or 100 <= _status(resp) < 200:
                if resp is not None and fault is None:
                    conn.sendall(resp)  # other interim responses pass through
                resp = _read_head(ufile)
                if resp is None:
                    raise ValueError("server closed without a response")
            status = rec.upstream_status = _status(resp)
            _, _, _, resp_headers = _parse_head(resp)
            rhdr = {k.lower(): v for k, v in resp_headers}
            has_body = method != "HEAD" and status not in (204, 304)
            keep = keep and body_sent and "close" not in rhdr.get("connection", "").lower()
            if fault in ("drop_response", "error_after", "hold_after") and rule is not None:
                body = bytearray()
                keep = (not has_body or _copy_body(ufile, body.extend, rhdr, True)) and keep
                if fault == "drop_response":
                    return _abort(conn, rule)
                if fault == "error_after":
                    rec.status = rule.status
                    conn.sendall(_error(rule.status, method, rec.path, close=not keep))
                    return keep
                rule._hold()
                rec.status = status
                conn.sendall(resp + body)
            else:
                rec.status = status  # recorded before the client can see it

                def relay(data) -> None:
                    # Finished as of the start of the reply's last write: the client cannot
                    # act on the reply before it, and a later mark would race the client's
                    # next request (the counts of round trips would see them overlap).
                    rec.finished = time.monotonic()
                    conn.sendall(data)

                relay(resp)
                keep = (not has_body or _copy_body(ufile, relay, rhdr, True)) and keep
            return keep


def _no_delay(sock: socket.socket) -> None:
    """Send each write at once: a head and its body go in separate writes, and Nagle's
    algorithm would hold the second until the first is acknowledged (a delayed ACK: ~40
    ms per message, which would make every relayed request look slow)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _read_head(rfile: BinaryIO) -> bytes | None:
    """The raw start line and headers up to the blank line; ``None`` on a clean EOF."""
    lines: list[bytes] = []
    while True:
        line = rfile.readline(_MAX_LINE)
        if not line:
            if lines:
                raise ValueError("connection closed inside a message head")
            return None
        if not lines and line in (b"\r\n", b"\n"):
            continue  # stray CRLF between messages
        if not line.endswith(b"\n") or len(lines) > 500:
            raise ValueError("message head too large")
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    """Split a request (method, target, version) or response (version, status, reason)."""
    start, *rest = head.decode("latin-1").split("\n")
    a, b, c = (start.rstrip("\r").split(" ", 2) + ["", ""])[:3]
    headers = []
    for line in rest:
        name, sep, value = line.rstrip("\r").partition(":")
        if sep:
            headers.append((name.strip(), value.strip()))
    return a, b, c, headers


def _status(head: bytes) -> int:
    return int(_parse_head(head)[1])


def _has_body(hdr: dict[str, str]) -> bool:
    return "chunked" in hdr.get("transfer-encoding", "").lower() or \
        int(hdr.get("content-length", "0") or 0) > 0


def _await_continue(up: socket.socket, ufile: BinaryIO) -> bytes | None:
    """The server's first response head, or ``None`` if it says nothing for a second."""
    ready, _, _ = select.select([up], [], [], _CONTINUE_WAIT_S)
    return _read_head(ufile) if ready else None


def _copy_body(rfile: BinaryIO, write: Write | None, hdr: dict[str, str],
               response: bool = False) -> bool:
    """Relay one message body as framed; ``False`` if it ended with the connection."""
    out = write or (lambda _b: None)
    if "chunked" in hdr.get("transfer-encoding", "").lower():
        while True:
            line = rfile.readline(_MAX_LINE)
            if not line.endswith(b"\n"):
                raise ValueError("bad chunk size line")
            out(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                break
            _copy_exact(rfile, out, size + 2)
        while (line := rfile.readline(_MAX_LINE)) not in (b"\r\n", b"\n"):  # trailers
            if not line:
                raise ValueError("connection closed inside trailers")
            out(line)
        out(line)
    elif "content-length" in hdr:
        _copy_exact(rfile, out, int(hdr["content-length"]))
    elif response:  # no framing: the body runs until the server closes
        while chunk := rfile.read1(_MAX_LINE):  # type: ignore[attr-defined]
            out(chunk)
        return False
    return True


def _copy_exact(rfile: BinaryIO, out: Write, n: int) -> None:
    while n > 0:
        chunk = rfile.read1(min(n, _MAX_LINE))  # type: ignore[attr-defined]
        if not chunk:
            raise ValueError("connection closed inside a body")
        out(chunk)
        n -= len(chunk)


def _abort(conn: socket.socket, rule: FaultRule) -> bool:
    """Make the caller close the client connection, with an RST if the rule asks."""
    if rule.rst:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return False


def _error(status: int, method: str, path: str, close: bool) -> bytes:
    """An S3-style XML error response."""
    code, message = _S3_ERRORS.get(status, ("InternalError", http.HTTPStatus(status).phrase))
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{escape(path)}</Resource><RequestId>fault-proxy</RequestId></Error>"
            ).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
            "Content-Type: application/xml\r\nx-amz-request-id: fault-proxy\r\n"
            f"Content-Length: {len(body)}\r\nConnection: {'close' if close else 'keep-alive'}"
            "\r\n\r\n").encode()
    return head if method == "HEAD" else head + body
