"""``spark-abs local up | down | status``: the embedded runtime that demos and
tests run on.  ``up`` is idempotent (what runs is kept, what does not is
started), ``down`` stops by pid only what ``up`` started, and the connection
details go to one JSON file that ``Connection.load()`` reads.

The schema registry is started on demand: ``up(registry=True)`` (``local up
--registry``, or ``spark-abs run`` of a pipeline that reads or writes Avro
through a registry) builds it the first time and starts it; a plain ``up``
keeps one that runs (or restarts one the connection file names) and
otherwise neither builds nor starts it, so the connection names no registry.

``--cluster`` (``LocalRuntimeSettings.cluster()``) is the same on a larger
scale, under a home of its own: three Kafka nodes (replication factor 3,
``min.insync.replicas=2``) and a Spark standalone master with two workers,
whose ``spark://`` URL the connection names, so every job's worker groups
run as applications on it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyspark

from streaming.adapters.kafka.acls import Grant
from streaming.adapters.objects import ensure_bucket
from streaming.adapters.spark import jars
from streaming.api.config import Connection, LocalRuntimeSettings
from streaming.api.job_key import kept_secret
from streaming.api.pipeline import Pipeline
from streaming.errors import ConfigError, RuntimeNotRunningError
from streaming.local import artifacts, kafka_broker, processes, s3_server, schema_registry, spark_cluster
from streaming.local.artifacts import FETCHABLE, ON_DEMAND
from streaming.local.kafka_broker import KafkaStarter
from streaming.local.kafka_security import JOB_USER
from streaming.local.s3_server import S3Starter
from streaming.local.schema_registry import RegistryStarter, api_url
from streaming.local.services import Progress, RuntimeServices
from streaming.local.spark_cluster import SparkStarter
from streaming.private_files import write_private

__all__ = ["LocalRuntime", "RuntimeStatus", "ServiceStatus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    name: str
    pid: int | None
    address: str
    listening: bool
    log: Path
    # a service started on demand that nothing asked for yet: why it does not run ("not built",
    # "not started"); "" for one the runtime runs
    off: str = ""

    @property
    def running(self) -> bool:
        return self.pid is not None and self.listening

    @property
    def state(self) -> str:
        if self.running:
            return "running"
        if self.pid:
            return "starting?"
        return self.off or "stopped"


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    services: tuple[ServiceStatus, ...]
    connection_file: Path
    connection: Connection | None
    start_command: str = "spark-abs local up"

    @property
    def all_running(self) -> bool:
        """Every service of the runtime runs (one on demand that nothing asked for is not missed)."""
        return bool(self.services) and all(s.running or s.off for s in self.services)

    def render(self) -> str:
        rows = [("service", "state", "pid", "address", "log")]
        for s in self.services:
            rows.append((s.name, s.state, str(s.pid or "-"), s.address, str(s.log)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        for s in self.services:
            if s.off and not s.pid:
                lines.append(
                    f"{s.name}: started on demand, for a job whose pipeline uses it "
                    f"(`{self.start_command} --registry` starts it now)"
                )
        if self.connection is not None:
            lines.append(f"connection file: {self.connection_file}")
        else:
            lines.append(f"not started: run `{self.start_command}`")
        return "\n".join(lines)


class LocalRuntime:
    """The local Kafka broker and S3 server (on a cluster, Kafka nodes and a
    Spark standalone cluster), the schema registry on demand, and the
    connector jars for Spark: fetched, brought up, stopped and reported on.
    The runtime's home and ports are ``services`` (``RuntimeServices``); each
    service's module makes its spec and starts it (``kafka_broker.KafkaStarter``,
    ``s3_server.S3Starter``, ``schema_registry.RegistryStarter``,
    ``spark_cluster.SparkStarter``)."""

    def __init__(self, settings: LocalRuntimeSettings | None = None, progress: Progress = log.info):
        self.settings = settings or LocalRuntimeSettings()
        self._progress = progress
        self._dir = self.settings.runtime_dir
        self.services = RuntimeServices(self.settings)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # the runtime's own: its connection file and secrets name credentials
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._dir.chmod(0o700)
        with open(self._dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- up / down / status -------------------------------------------------

    def fetch(self, only: Sequence[str] = FETCHABLE) -> dict[str, list[Path]]:
        """Resolve (once, into the cache) the artifacts named in ``only`` (``artifacts.fetch``)."""
        return artifacts.fetch(self.settings, only, self._progress)

    def specs(self) -> list[processes.ServiceSpec]:
        """Every service, as ``down``, ``status`` and ``stop_service`` find them."""
        return [
            *kafka_broker.node_specs(self.services),
            s3_server.server_spec(self.services),
            schema_registry.server_spec(self.services),
            *spark_cluster.specs(self.services),
        ]

    def up(self, registry: bool = False) -> Connection:
        """Start whatever is not running yet and return the connection details.
        ``registry``: the schema registry too (built the first time, a Maven
        build of minutes); without it, one that runs is kept and one the
        connection file names is started again, else none is (the
        connection names no registry)."""
        started = time.monotonic()
        s = self.settings
        if s.spark_version != pyspark.__version__:
            raise ConfigError(
                f"spark_version {s.spark_version} differs from the installed pyspark "
                f"{pyspark.__version__}; the Kafka connector must match pyspark exactly"
            )
        java = jars.require_tool("java")
        # the registry when asked for, or when the runtime had it (restarted after an outage)
        registry = registry or bool(self._recorded_registry())
        fetched = self.fetch([a for a in FETCHABLE if registry or a not in ON_DEMAND])
        binary = fetched["s3-server"][0]
        with self._locked():
            self.services.stop_unrecorded(self.specs(), self._progress)
            ports = self.services.load_ports()
            kafka_ports = KafkaStarter(self.services, self._progress).up(java, ports)
            s3_port = S3Starter(self.services, self._progress).up(binary, ports, set(kafka_ports.values()))
            taken = {*kafka_ports.values(), s3_port}
            registries = RegistryStarter(self.services, self._progress)
            if registry:
                registry_port: int | None = registries.up(java, fetched["schema-registry"][0], ports, taken)
            else:  # one that runs (another `up` asked for it) is kept
                registry_port = registries.running(ports)
            if registry_port is not None:
                taken.add(registry_port)
            spark_ports = SparkStarter(self.services, self._progress).up(ports, taken)
            ports = {
                **kafka_ports,
                "s3": s3_port,
                **({} if registry_port is None else {"registry": registry_port}),
                **spark_ports,
            }
            self.services.ports_file.write_text(json.dumps(ports))
            servers = ",".join(f"127.0.0.1:{ports[n]}" for n in self.services.kafka_names())
            s3_keys = s3_server.keys(self.services)
            connection = Connection(
                kafka=self.services.kafka_access(servers, JOB_USER),
                s3_endpoint=f"http://127.0.0.1:{ports['s3']}",
                s3_access_key=s3_keys[0],
                s3_secret_key=s3_keys[1],
                s3_bucket=s.s3_bucket,
                spark_master=f"spark://127.0.0.1:{ports['spark']}" if spark_ports else "local[2]",
                spark_secret_file=str(spark_cluster.secret_file(self._dir)) if spark_ports else "",
                schema_registry="" if registry_port is None else api_url(registry_port),
                schema_registry_user="" if registry_port is None else schema_registry.USER,
                schema_registry_password_file=""
                if registry_port is None
                else str(schema_registry.password_file(self._dir)),
                job_secret_file=str(self._job_secret()),
            )
            ensure_bucket(connection)
            self._write_connection(connection, ports)
        self._progress(
            f"local {'cluster' if s.is_cluster else 'runtime'} up in {time.monotonic() - started:.1f} s: "
            f"kafka {connection.kafka}{' (SASL_SSL, ACLs on)' if s.is_secure else ''}, s3 {connection.s3_endpoint} "
            f"(bucket {connection.s3_bucket}), "
            + (
                f"schema registry {connection.schema_registry}"
                if connection.schema_registry
                else "schema registry not started (on demand)"
            )
            + (f", spark {connection.spark_master}" if spark_ports else "")
        )
        return connection

    def _recorded(self) -> Connection | None:
        """The connection the connection file holds (None: none, or unreadable)."""
        try:
            return Connection.from_dict(json.loads(self.settings.connection_file.read_text())["connection"])
        except (OSError, ValueError, KeyError, ConfigError):
            return None

    def _recorded_registry(self) -> str:
        """The schema registry the connection file names ("" when none: not asked for since the last ``down``)."""
        recorded = self._recorded()
        return recorded.schema_registry if recorded is not None else ""

    def _job_secret(self) -> Path:
        """The file of the runtime's job secret: generated on first start (readable by its owner only),
        then kept; checked."""
        kept_secret(self.settings.job_secret_file)
        return self.settings.job_secret_file

    def _write_connection(self, connection: Connection, ports: dict[str, int]) -> None:
        """The connection file, its owner's alone (it names credentials)."""
        write_private(
            self.settings.connection_file,
            json.dumps(
                {
                    "connection": connection.to_dict(),
                    "ports": ports,
                    "logs": str(self._dir / "logs"),
                    "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
                indent=2,
            )
            + "\n",
        )

    def down(self, purge: bool = False) -> list[str]:
        """Stop the services ``up`` started (by pid file, checked against their
        command line).  ``purge`` also deletes their data and logs (not the cache).
        Returns a line per service saying what happened."""
        report = []
        with self._locked():
            spark = spark_cluster.specs(self.services)
            # every Kafka node at once (one by one, each would hand its leaderships to the next), then the rest
            nodes = kafka_broker.node_specs(self.services)
            with ThreadPoolExecutor(len(nodes)) as pool:
                stopped = list(pool.map(lambda spec: processes.stop(spec.pid_path, spec.marker), nodes))
            for spec in [
                s3_server.server_spec(self.services),
                schema_registry.server_spec(self.services),
                *reversed(spark),
            ]:  # Spark workers before their master
                nodes.append(spec)
                stopped.append(processes.stop(spec.pid_path, spec.marker))
            for spec, pid in zip(nodes, stopped):
                report.append(f"{spec.name}: stopped pid {pid}" if pid else f"{spec.name}: was not running")
            self.settings.connection_file.unlink(missing_ok=True)
            if purge:
                for sub in (*self.services.kafka_names(), "s3", "registry", "spark", "logs", "pids", "secrets"):
                    shutil.rmtree(self._dir / sub, ignore_errors=True)
                self.services.ports_file.unlink(missing_ok=True)
                report.append(f"purged data and logs under {self._dir}")
        return report

    def grant(self, pipeline: Pipeline) -> list[Grant]:
        """On the secured runtime, grant its job user the ACLs ``pipeline``'s job needs and nothing
        more (``BrokerSecurity.grant_job``, as ``admin``); the grants made."""
        security = self.services.kafka_security()
        recorded = self._recorded()
        if security is None:
            raise ConfigError("only the secured runtime (`spark-abs local up --secure`) has ACLs to grant")
        if recorded is None:
            raise RuntimeNotRunningError("the secured runtime is not up: run `spark-abs local up --secure`")
        return security.grant_job(recorded.kafka.servers, pipeline)

    def stop_service(self, name: str, *, kill: bool = False) -> int | None:
        """Stop one service (``kafka``, ``s3`` or ``registry``; on a cluster ``kafka-1``,
        ``spark-worker-2``, ...), keeping its data and port (an outage, as a
        drill makes one); ``up`` starts it again where it was.  ``kill``:
        SIGKILL at once, as a crash.  Returns the pid stopped, or None when it
        was not running."""
        specs = {spec.name: spec for spec in self.specs()}
        if name not in specs:
            raise ConfigError(f"no local service called {name!r}; choose from {', '.join(specs)}")
        spec = specs[name]
        with self._locked():
            if kill:
                return processes.kill(spec.pid_path, spec.marker)
            return processes.stop(spec.pid_path, spec.marker)

    def status(self) -> RuntimeStatus:
        ports = self.services.load_ports()
        connection = self._recorded()
        registry_spec = schema_registry.server_spec(self.services)
        services = []
        for spec in self.specs():
            port = ports.get(self.services.port_names(spec.name)[0])
            pid = processes.running_pid(spec.pid_path, spec.marker)
            off = ""
            if spec.name == registry_spec.name and pid is None and not (connection and connection.schema_registry):
                # on demand, and nothing asked for it since the last `down`: not a service that is missing
                built = schema_registry.built(self.settings.schema_registry_version, self.settings.cache_dir)
                off, port = ("not started" if built else "not built"), None
            services.append(
                ServiceStatus(
                    name=spec.name,
                    pid=pid,
                    address=f"127.0.0.1:{port}" if port else "-",
                    listening=processes.port_open(port) if port else False,
                    log=spec.log_path,
                    off=off,
                )
            )
        start = "spark-abs local up" + (
            " --cluster" if self.settings.is_cluster else " --secure" if self.settings.is_secure else ""
        )
        return RuntimeStatus(tuple(services), self.settings.connection_file, connection, start)
