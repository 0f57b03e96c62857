"""The local schema registry: Apicurio Registry, whose Confluent-compatible
API (``/apis/ccompat/v7``) serves Avro schemas by id to the jobs' ingress
and Kafka sinks (``streaming.adapters.serde.schema_registry``).

Apicurio was chosen as the registry Maven Central serves (Confluent's own and
Karapace are on none of the registries this runtime installs from).  It
listens on loopback only and keeps its schemas in an H2 database file under the
runtime directory (an id stays the same schema across restarts: records in
Kafka name it).  It asks for no credentials: any process of this machine
may register schemas in it, so a secured deployment runs a registry of its
own that does.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from streaming.local.processes import ServiceSpec

__all__ = ["server_spec", "data_dir_of", "api_url", "ready"]

API_PATH = "/apis/ccompat/v7"


def server_spec(java: str, runner: Path, runtime_dir: Path, port: int) -> ServiceSpec:
    data_dir = data_dir_of(runtime_dir)
    return ServiceSpec(
        name="registry",
        argv=[
            java,
            "-Xmx256m",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={port}",
            f"-Dquarkus.datasource.jdbc.url=jdbc:h2:file:{data_dir}/registry;DB_CLOSE_ON_EXIT=FALSE",
            "-jar",
            str(runner),
        ],
        log_path=runtime_dir / "logs" / "registry.out",
        pid_path=runtime_dir / "pids" / "registry.pid",
        marker=str(data_dir),
    )


def data_dir_of(runtime_dir: Path) -> Path:
    """Where the registry keeps its schemas (made when it starts)."""
    return runtime_dir / "registry" / "data"


def api_url(port: int) -> str:
    """The Confluent-compatible API of the registry on ``port``."""
    return f"http://127.0.0.1:{port}{API_PATH}"


def ready(port: int) -> bool:
    """Whether the registry on ``port`` says it is ready."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
