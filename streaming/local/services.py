"""The home of the local runtime's services: its directory and settings, the
Kafka nodes' names and access, and the ports ``up`` chose (``ports.json``).
Each service's own module (``kafka_broker``, ``s3_server``,
``schema_registry``, ``spark_cluster``) makes its ``ServiceSpec`` (pid file,
marker, log) from it and starts it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from streaming.api.config import KafkaAccess, LocalRuntimeSettings
from streaming.local import processes
from streaming.local.kafka_security import BrokerSecurity

__all__ = ["Progress", "RuntimeServices"]

Progress = Callable[[str], None]


class RuntimeServices:
    """The services of one runtime home (``settings.runtime_dir``) and their
    ports: one Kafka node or several, the S3 server, the schema registry, on
    a cluster the Spark master and workers."""

    def __init__(self, settings: LocalRuntimeSettings):
        self.settings = settings
        self.dir = settings.runtime_dir

    # -- paths -------------------------------------------------------------

    @property
    def ports_file(self) -> Path:
        return self.dir / "ports.json"

    def kafka_names(self) -> list[str]:
        """``kafka`` alone, or ``kafka-1`` .. ``kafka-N``."""
        n = self.settings.kafka_nodes
        return ["kafka"] if n == 1 else [f"kafka-{i}" for i in range(1, n + 1)]

    def kafka_security(self) -> BrokerSecurity | None:
        """The secrets of a secured broker (made on first use), else None."""
        return BrokerSecurity.prepare(self.dir) if self.settings.is_secure else None

    def kafka_access(self, servers: str, user: str = "admin") -> KafkaAccess:
        """How ``user`` (of a secured broker; the runtime's probes are ``admin``) reaches ``servers``."""
        security = self.kafka_security()
        return KafkaAccess(servers) if security is None else security.access(servers, user)

    def kafka_jars_dir(self) -> Path:
        return self.settings.cache_dir / "jars" / f"kafka-{self.settings.kafka_version}"

    # -- ports -------------------------------------------------------------

    def load_ports(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self.ports_file.read_text()).items()}
        except (OSError, ValueError, AttributeError, TypeError):  # none, unreadable, or not {name: port}
            return {}

    def port_names(self, service: str) -> list[str]:
        """The ``ports.json`` entries a service listens on (a Kafka node its
        broker and controller ports, the master its own and its web UI's)."""
        if service.startswith("kafka"):
            return [service, f"{service}_controller"]
        if service == "spark-master":
            return ["spark", "spark_web"]
        if service.startswith("spark-worker-"):
            return [f"{service}_web"]
        return [service]

    def stop_unrecorded(self, specs: Sequence[processes.ServiceSpec], progress: Progress) -> list[str]:
        """Stop each of ``specs`` that runs on a port ``ports.json`` does not
        hold (a start interrupted before it wrote them): nothing could reach
        it, and ``up`` starts it again on ports it records."""
        remembered = self.load_ports()
        stopped = []
        for spec in specs:
            if processes.running_pid(spec.pid_path, spec.marker) is None:
                continue
            if all(name in remembered for name in self.port_names(spec.name)):
                continue
            progress(f"{spec.name} runs on ports not on record (a start interrupted): stopping it to start it again")
            processes.stop(spec.pid_path, spec.marker)
            stopped.append(spec.name)
        return stopped

    def choose_port(self, name: str, configured: int, remembered: dict[str, int], taken: set[int], what: str) -> int:
        if configured:
            processes.ensure_port_free(configured, what)
            return configured
        previous = remembered.get(name)
        if previous and previous not in taken and processes.port_is_free(previous):
            return previous
        while True:
            port = processes.free_port()
            if port not in taken:
                return port
