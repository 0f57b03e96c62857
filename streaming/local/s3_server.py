"""The local S3 API server: versitygw with its POSIX backend, serving one
bucket from a directory under the runtime directory.

versitygw was chosen over MinIO (a long source build) and s3proxy (its
filesystem backend rejects the checksummed multipart uploads that pyarrow's
AWS SDK sends by default, and lists multipart leftovers as objects): it is one
``go install``, real S3 semantics on plain files, conditional writes included.

Its root keys are the runtime's own (``keys``): generated on first start
into ``<runtime>/secrets/s3.keys``, readable by its owner only, unless the
settings give them.  A server that runs with other keys (an earlier
version's fixed, public ones) is stopped and started again with these: it
keeps its data and port.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import subprocess
import tempfile
from pathlib import Path

from streaming.adapters.spark.jars import COMPLETE, require_tool
from streaming.errors import ArtifactResolutionError
from streaming.local import processes
from streaming.local.processes import ServiceSpec
from streaming.local.services import Progress, RuntimeServices
from streaming.private_files import read_private, replace_into, write_private

__all__ = ["S3Starter", "build_versitygw", "keys", "server_spec"]

log = logging.getLogger(__name__)


def keys(services: RuntimeServices) -> tuple[str, str]:
    """The server's access key and secret key: the settings' when they give them, else the
    runtime's own, generated on first use (``<runtime>/secrets/s3.keys``, its owner's alone)."""
    settings = services.settings
    if settings.s3_access_key or settings.s3_secret_key:
        return settings.s3_access_key, settings.s3_secret_key
    path = services.dir / "secrets" / "s3.keys"
    if not path.exists():
        generated = {"access_key": f"spark-abs-{secrets.token_hex(6)}", "secret_key": secrets.token_urlsafe(30)}
        write_private(path, json.dumps(generated) + "\n")
    stored = json.loads(read_private(path, "the local S3 server's keys"))
    return stored["access_key"], stored["secret_key"]


def _fingerprint(access_key: str, secret_key: str) -> str:
    """What tells the keys a server was started with apart (not the keys)."""
    return hashlib.sha256(f"{len(access_key)}:{access_key}{secret_key}".encode()).hexdigest()


def server_spec(
    services: RuntimeServices, binary: Path | None = None, port: int = 0, root: tuple[str, str] = ("", "")
) -> ServiceSpec:
    """The server of the runtime ``services`` (``binary``, ``port`` and the ``root`` keys as ``up``
    starts it; the defaults find it)."""
    runtime_dir = services.dir
    binary = binary or Path("versitygw")
    data_dir = runtime_dir / "s3" / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    return ServiceSpec(
        name="s3",
        argv=[str(binary), "--port", f"127.0.0.1:{port}", "posix", str(data_dir)],
        env={"ROOT_ACCESS_KEY": root[0], "ROOT_SECRET_KEY": root[1]},
        log_path=runtime_dir / "logs" / "s3.out",
        pid_path=runtime_dir / "pids" / "s3.pid",
        marker=str(data_dir),
    )


def build_versitygw(version: str, cache_dir: Path, progress: Progress = log.info) -> Path:
    """The versitygw binary at ``version``, built with ``go install`` once."""
    target = cache_dir / "bin" / f"versitygw-{version}"
    binary = target / "versitygw"
    if (target / COMPLETE).exists() and binary.exists():
        return binary
    go = require_tool("go")
    progress(f"building the S3 API server versitygw {version} with `go install` (first time only, about 2-3 minutes)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".versitygw-") as tmp:
        env = dict(os.environ, GOBIN=tmp, CGO_ENABLED="0")
        cmd = [go, "install", f"github.com/versity/versitygw/cmd/versitygw@{version}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
        except subprocess.TimeoutExpired as exc:
            raise ArtifactResolutionError(
                "go install versitygw took over 20 minutes; is the Go module proxy reachable?"
            ) from exc
        built = Path(tmp) / "versitygw"
        if done.returncode != 0 or not built.exists():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise ArtifactResolutionError(f"go install versitygw@{version} failed (exit {done.returncode}):\n{tail}")
        target.mkdir(exist_ok=True)
        replace_into(built, binary)
        (target / COMPLETE).write_text(version + "\n")
    return binary


class S3Starter:
    """The S3 API server (versitygw): kept with its port when it runs, else
    started on the configured or a free port; ready once it listens."""

    def __init__(self, services: RuntimeServices, progress: Progress):
        self.services = services
        self._progress = progress

    def up(self, binary: Path, remembered: dict[str, int], taken: set[int]) -> int:
        settings = self.services.settings
        root = keys(self.services)
        started_with = self.services.dir / "s3" / "started-with"
        probe = server_spec(self.services, binary)
        if processes.running_pid(probe.pid_path, probe.marker) is not None and "s3" in remembered:
            try:
                same_keys = started_with.read_text().strip() == _fingerprint(*root)
            except OSError:
                same_keys = False
            if same_keys:
                return remembered["s3"]
            self._progress("restarting the S3 server with the runtime's own keys")
            processes.stop(probe.pid_path, probe.marker)
        port = self.services.choose_port("s3", settings.s3_port, remembered, taken, "the S3 server")
        spec = server_spec(self.services, binary, port, root)
        self._progress(f"starting S3 API server versitygw {settings.s3_server_version} on 127.0.0.1:{port}")
        started_with.write_text(_fingerprint(*root) + "\n")
        proc = processes.start(spec)
        took = processes.wait_ready(spec, proc, lambda: processes.port_open(port), settings.start_timeout_s)
        self._progress(f"S3 server ready after {took:.1f} s")
        return port
