"""``spark-abs local up | down | status``: the embedded runtime that demos and
tests run on.  ``up`` is idempotent (what runs is kept, what does not is
started), ``down`` stops by pid only what ``up`` started, and the connection
details go to one JSON file that ``Connection.load()`` reads.

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
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyspark

from streaming.adapters import jars
from streaming.adapters.objects import ensure_bucket
from streaming.api.config import Connection, LocalRuntimeSettings
from streaming.errors import ConfigError, ServiceStartError
from streaming.local import artifacts, kafka_broker, processes, s3_server, spark_cluster
from streaming.local.artifacts import FETCHABLE

__all__ = ["LocalRuntime", "RuntimeStatus", "ServiceStatus"]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    name: str
    pid: int | None
    address: str
    listening: bool
    log: Path

    @property
    def running(self) -> bool:
        return self.pid is not None and self.listening


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    services: tuple[ServiceStatus, ...]
    connection_file: Path
    connection: Connection | None
    start_command: str = "spark-abs local up"

    @property
    def all_running(self) -> bool:
        return bool(self.services) and all(s.running for s in self.services)

    def render(self) -> str:
        rows = [("service", "state", "pid", "address", "log")]
        for s in self.services:
            state = "running" if s.running else ("starting?" if s.pid else "stopped")
            rows.append((s.name, state, str(s.pid or "-"), s.address, str(s.log)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        if self.connection is not None:
            lines.append(f"connection file: {self.connection_file}")
        else:
            lines.append(f"not started: run `{self.start_command}`")
        return "\n".join(lines)


class LocalRuntime:
    """The local Kafka broker and S3 server, and the connector jars for Spark."""

    def __init__(self, settings: LocalRuntimeSettings | None = None, progress: Progress = log.info):
        self.settings = settings or LocalRuntimeSettings()
        self._progress = progress
        self._dir = self.settings.runtime_dir

    # -- paths -------------------------------------------------------------

    @property
    def _ports_file(self) -> Path:
        return self._dir / "ports.json"

    def _kafka_names(self) -> list[str]:
        """``kafka`` alone, or ``kafka-1`` .. ``kafka-N``."""
        n = self.settings.kafka_nodes
        return ["kafka"] if n == 1 else [f"kafka-{i}" for i in range(1, n + 1)]

    def _kafka_spec(self, java: str = "java", name: str = "kafka") -> processes.ServiceSpec:
        return kafka_broker.broker_spec(java, self._kafka_jars_dir(), self._dir, self.settings.kafka_heap, name)

    def _spark_specs(self, ports: dict[str, int] | None = None) -> list[processes.ServiceSpec]:
        """The master and workers (with ``ports``, as they start; without, to find them)."""
        if not self.settings.spark_workers:
            return []
        ports = ports or {}
        specs = [spark_cluster.master_spec(self._dir, ports.get("spark", 0), ports.get("spark_web", 0))]
        for i in range(1, self.settings.spark_workers + 1):
            specs.append(
                spark_cluster.worker_spec(self._dir, i, ports.get("spark", 0), ports.get(f"spark-worker-{i}_web", 0))
            )
        return specs

    def _specs(self) -> list[processes.ServiceSpec]:
        """Every service, as ``down``, ``status`` and ``stop_service`` find them."""
        return [*(self._kafka_spec(name=n) for n in self._kafka_names()), self._s3_spec(), *self._spark_specs()]

    def _s3_spec(self, binary: Path | None = None, port: int = 0) -> processes.ServiceSpec:
        binary = binary or Path("versitygw")
        s = self.settings
        return s3_server.server_spec(binary, self._dir, port, s.s3_access_key, s.s3_secret_key)

    def _kafka_jars_dir(self) -> Path:
        return self.settings.cache_dir / "jars" / f"kafka-{self.settings.kafka_version}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._dir.mkdir(parents=True, exist_ok=True)
        with open(self._dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- ports -------------------------------------------------------------

    def _load_ports(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self._ports_file.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _choose_port(self, name: str, configured: int, remembered: dict[str, int], taken: set[int], what: str) -> int:
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

    # -- up / down / status -------------------------------------------------

    def fetch(self, only: Sequence[str] = FETCHABLE) -> dict[str, list[Path]]:
        """Resolve (once, into the cache) the artifacts named in ``only``:
        ``kafka`` jars, the ``s3-server`` binary, the ``spark-connector`` jars."""
        unknown = sorted(set(only) - set(FETCHABLE))
        if unknown:
            raise ConfigError(f"cannot fetch {', '.join(unknown)}; choose from {', '.join(FETCHABLE)}")
        s = self.settings
        fetched: dict[str, list[Path]] = {}
        if "kafka" in only:
            fetched["kafka"] = jars.resolve_jars(
                f"kafka-{s.kafka_version}",
                artifacts.kafka_broker_artifacts(s.kafka_version),
                s.cache_dir,
                self._progress,
            )
        if "s3-server" in only:
            fetched["s3-server"] = [artifacts.build_versitygw(s.s3_server_version, s.cache_dir, self._progress)]
        if "spark-connector" in only:
            fetched["spark-connector"] = jars.connector_jars(
                s.spark_version, s.cache_dir, Path(pyspark.__file__).parent / "jars", self._progress
            )
        return fetched

    def up(self) -> Connection:
        """Start whatever is not running yet and return the connection details."""
        started = time.monotonic()
        s = self.settings
        if s.spark_version != pyspark.__version__:
            raise ConfigError(
                f"spark_version {s.spark_version} differs from the installed pyspark "
                f"{pyspark.__version__}; the Kafka connector must match pyspark exactly"
            )
        java = jars.require_tool("java")
        binary = self.fetch()["s3-server"][0]
        with self._locked():
            ports = self._load_ports()
            kafka_ports = self._up_kafka(java, ports)
            s3_port = self._up_s3(binary, ports, set(kafka_ports.values()))
            spark_ports = self._up_spark(ports, {*kafka_ports.values(), s3_port})
            ports = {**kafka_ports, "s3": s3_port, **spark_ports}
            self._ports_file.write_text(json.dumps(ports))
            connection = Connection(
                kafka_bootstrap=",".join(f"127.0.0.1:{ports[n]}" for n in self._kafka_names()),
                s3_endpoint=f"http://127.0.0.1:{ports['s3']}",
                s3_access_key=s.s3_access_key,
                s3_secret_key=s.s3_secret_key,
                s3_bucket=s.s3_bucket,
                spark_master=f"spark://127.0.0.1:{ports['spark']}" if spark_ports else "local[2]",
            )
            ensure_bucket(connection)
            self._write_connection(connection, ports)
        self._progress(
            f"local {'cluster' if s.is_cluster else 'runtime'} up in {time.monotonic() - started:.1f} s: "
            f"kafka {connection.kafka_bootstrap}, s3 {connection.s3_endpoint} "
            f"(bucket {connection.s3_bucket})" + (f", spark {connection.spark_master}" if spark_ports else "")
        )
        return connection

    def _up_kafka(self, java: str, remembered: dict[str, int]) -> dict[str, int]:
        names = self._kafka_names()
        specs = {n: self._kafka_spec(java, n) for n in names}
        running = {n for n, spec in specs.items() if processes.running_pid(spec.pid_path, spec.marker) is not None}
        ports: dict[str, int] = {}
        if running == set(names) and all(n in remembered and f"{n}_controller" in remembered for n in names):
            return {k: remembered[k] for n in names for k in (n, f"{n}_controller")}
        taken: set[int] = set()
        for name in names:
            if name in running and name in remembered:  # a node that runs keeps its ports
                ports[name], ports[f"{name}_controller"] = remembered[name], remembered[f"{name}_controller"]
                taken |= {ports[name], ports[f"{name}_controller"]}
        single = len(names) == 1
        for name in names:
            if name in ports:
                continue
            what = "the Kafka broker" if single else f"Kafka node {name}"
            configured = self.settings.kafka_port if single else 0
            ports[name] = self._choose_port(name, configured, remembered, taken, what)
            taken.add(ports[name])
            configured = self.settings.kafka_controller_port if single else 0
            key = f"{name}_controller"
            ports[key] = self._choose_port(key, configured, remembered, taken, f"the controller of {what}")
            taken.add(ports[key])
        voters = [kafka_broker.Voter(i, ports[f"{n}_controller"]) for i, n in enumerate(names, 1)] if not single else []
        cid = self._cluster_id(names) if not single else None
        started: list[tuple[str, processes.ServiceSpec, object]] = []
        for node_id, name in enumerate(names, 1):
            if name in running:
                continue
            config, log4j = kafka_broker.write_config(
                self._dir, ports[name], ports[f"{name}_controller"], name=name, node_id=node_id, voters=voters
            )
            if not kafka_broker.is_formatted(self._dir, name):
                cmd = kafka_broker.format_command(java, self._kafka_jars_dir(), config, log4j, self._dir / "logs", cid)
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                if done.returncode != 0:
                    raise ServiceStartError(f"formatting the data dir of {name} failed:\n{done.stdout}{done.stderr}")
            self._progress(f"starting Kafka {self.settings.kafka_version} (KRaft) {name} on 127.0.0.1:{ports[name]}")
            started.append((name, specs[name], processes.start(specs[name])))
        bootstrap = ",".join(f"127.0.0.1:{ports[n]}" for n in names)
        for name, spec, proc in started:
            took = processes.wait_ready(
                spec,
                proc,
                lambda n=name: processes.port_open(ports[n]) and kafka_broker.brokers_up(bootstrap) >= len(names),
                self.settings.start_timeout_s,
                extra_logs=[self._dir / "logs" / f"{name}.log"],
            )
            self._progress(f"Kafka {name} ready after {took:.1f} s")
        return ports

    def _cluster_id(self, names: list[str]) -> str:
        """The id the formatted nodes have (a node formatted again must match), else a new one."""
        for name in names:
            meta = self._dir / name / "data" / "meta.properties"
            if meta.exists():
                for line in meta.read_text().splitlines():
                    if line.startswith("cluster.id="):
                        return line.split("=", 1)[1].strip()
        return kafka_broker.cluster_id()

    def _up_spark(self, remembered: dict[str, int], taken: set[int]) -> dict[str, int]:
        """The master, then the workers; ready once the master lists every worker ALIVE."""
        workers = self.settings.spark_workers
        if not workers:
            return {}
        names = ["spark", "spark_web", *(f"spark-worker-{i}_web" for i in range(1, workers + 1))]
        probe = self._spark_specs()
        master_running = processes.running_pid(probe[0].pid_path, probe[0].marker) is not None
        ports: dict[str, int] = {}
        for name in names:
            keep = master_running and name in ("spark", "spark_web") and name in remembered
            ports[name] = remembered[name] if keep else self._choose_port(name, 0, remembered, taken, f"Spark {name}")
            taken.add(ports[name])
        specs = self._spark_specs(ports)
        for spec in specs:
            if processes.running_pid(spec.pid_path, spec.marker) is not None:
                continue
            self._progress(f"starting {spec.name}")
            proc = processes.start(spec)
            if spec.name == "spark-master":
                processes.wait_ready(
                    spec, proc, lambda: processes.port_open(ports["spark_web"]), self.settings.start_timeout_s
                )
        deadline = time.monotonic() + self.settings.start_timeout_s
        while spark_cluster.alive_workers(ports["spark_web"]) < workers:
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {spec.log_path}:\n{processes.tail(spec.log_path, 8)}" for spec in specs[1:])
                raise ServiceStartError(
                    f"the Spark master at 127.0.0.1:{ports['spark']} lists fewer than {workers} live workers after "
                    f"{self.settings.start_timeout_s:.0f} s; the workers' logs end:\n{logs}"
                )
            time.sleep(0.5)
        self._progress(f"Spark master spark://127.0.0.1:{ports['spark']} with {workers} workers ready")
        return ports

    def _up_s3(self, binary: Path, remembered: dict[str, int], taken: set[int]) -> int:
        probe = self._s3_spec(binary)
        if processes.running_pid(probe.pid_path, probe.marker) is not None and "s3" in remembered:
            return remembered["s3"]
        port = self._choose_port("s3", self.settings.s3_port, remembered, taken, "the S3 server")
        spec = self._s3_spec(binary, port)
        self._progress(f"starting S3 API server versitygw {self.settings.s3_server_version} on 127.0.0.1:{port}")
        proc = processes.start(spec)
        took = processes.wait_ready(spec, proc, lambda: processes.port_open(port), self.settings.start_timeout_s)
        self._progress(f"S3 server ready after {took:.1f} s")
        return port

    def _write_connection(self, connection: Connection, ports: dict[str, int]) -> None:
        path = self.settings.connection_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "connection": connection.to_dict(),
                    "ports": ports,
                    "logs": str(self._dir / "logs"),
                    "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
                indent=2,
            )
            + "\n"
        )
        tmp.replace(path)

    def down(self, purge: bool = False) -> list[str]:
        """Stop the services ``up`` started (by pid file, checked against their
        command line).  ``purge`` also deletes their data and logs (not the cache).
        Returns a line per service saying what happened."""
        report = []
        with self._locked():
            spark = self._spark_specs()
            # every Kafka node at once (one by one, each would hand its leaderships to the next), then the rest
            nodes = [self._kafka_spec(name=n) for n in self._kafka_names()]
            with ThreadPoolExecutor(len(nodes)) as pool:
                stopped = list(pool.map(lambda spec: processes.stop(spec.pid_path, spec.marker), nodes))
            for spec in [self._s3_spec(), *reversed(spark)]:  # Spark workers before their master
                nodes.append(spec)
                stopped.append(processes.stop(spec.pid_path, spec.marker))
            for spec, pid in zip(nodes, stopped):
                report.append(f"{spec.name}: stopped pid {pid}" if pid else f"{spec.name}: was not running")
            self.settings.connection_file.unlink(missing_ok=True)
            if purge:
                for sub in (*self._kafka_names(), "s3", "spark", "logs", "pids"):
                    shutil.rmtree(self._dir / sub, ignore_errors=True)
                self._ports_file.unlink(missing_ok=True)
                report.append(f"purged data and logs under {self._dir}")
        return report

    def stop_service(self, name: str, *, kill: bool = False) -> int | None:
        """Stop one service (``kafka`` or ``s3``; on a cluster ``kafka-1``,
        ``spark-worker-2``, ...), keeping its data and port (an outage, as a
        drill makes one); ``up`` starts it again where it was.  ``kill``:
        SIGKILL at once, as a crash.  Returns the pid stopped, or None when it
        was not running."""
        specs = {spec.name: spec for spec in self._specs()}
        if name not in specs:
            raise ConfigError(f"no local service called {name!r}; choose from {', '.join(specs)}")
        spec = specs[name]
        with self._locked():
            if kill:
                return processes.kill(spec.pid_path, spec.marker)
            return processes.stop(spec.pid_path, spec.marker)

    def status(self) -> RuntimeStatus:
        ports = self._load_ports()
        try:
            connection = Connection.from_dict(json.loads(self.settings.connection_file.read_text())["connection"])
        except (OSError, ValueError, KeyError, ConfigError):
            connection = None
        services = []
        for spec in self._specs():
            port_name = {"spark-master": "spark"}.get(spec.name, spec.name)
            port = ports.get(port_name) or ports.get(f"{port_name}_web")
            services.append(
                ServiceStatus(
                    name=spec.name,
                    pid=processes.running_pid(spec.pid_path, spec.marker),
                    address=f"127.0.0.1:{port}" if port else "-",
                    listening=bool(port) and processes.port_open(port),
                    log=spec.log_path,
                )
            )
        start = "spark-abs local up --cluster" if self.settings.is_cluster else "spark-abs local up"
        return RuntimeStatus(tuple(services), self.settings.connection_file, connection, start)
