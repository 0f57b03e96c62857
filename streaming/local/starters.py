"""Starting the local runtime's processes, one class per service: each
keeps what runs (and its ports), starts what does not and waits until it is
ready.  ``LocalRuntime.up`` runs them in order: Kafka, S3, the schema
registry (when asked for, or when it runs already), Spark."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from streaming.errors import ServiceStartError
from streaming.local import kafka_broker, processes, schema_registry, spark_cluster
from streaming.local.services import RuntimeServices
from streaming.waits import poll_until

__all__ = ["KafkaStarter", "S3Starter", "RegistryStarter", "SparkStarter"]

Progress = Callable[[str], None]


class KafkaStarter:
    """The Kafka node or nodes (KRaft, one voter set): a node that runs keeps
    its ports; one that does not gets a port, its data dir formatted (with
    the cluster id the others have) and is started; ready once every node
    is a broker of the cluster."""

    def __init__(self, services: RuntimeServices, progress: Progress):
        self.services = services
        self._progress = progress

    def up(self, java: str, remembered: dict[str, int]) -> dict[str, int]:
        names = self.services.kafka_names()
        specs = {n: self.services.kafka_spec(java, n) for n in names}
        running = {n for n, spec in specs.items() if processes.running_pid(spec.pid_path, spec.marker) is not None}
        if running == set(names) and all(n in remembered and f"{n}_controller" in remembered for n in names):
            return {k: remembered[k] for n in names for k in (n, f"{n}_controller")}
        ports = self._ports(names, running, remembered)
        self._start(java, names, specs, running, ports)
        return ports

    def _ports(self, names: list[str], running: set[str], remembered: dict[str, int]) -> dict[str, int]:
        """Each node's broker and controller port: kept where it runs, else chosen."""
        ports: dict[str, int] = {}
        taken: set[int] = set()
        for name in names:
            if name in running and name in remembered:  # a node that runs keeps its ports
                ports[name], ports[f"{name}_controller"] = remembered[name], remembered[f"{name}_controller"]
                taken |= {ports[name], ports[f"{name}_controller"]}
        single = len(names) == 1
        settings = self.services.settings
        for name in names:
            if name in ports:
                continue
            what = "the Kafka broker" if single else f"Kafka node {name}"
            configured = settings.kafka_port if single else 0
            ports[name] = self.services.choose_port(name, configured, remembered, taken, what)
            taken.add(ports[name])
            configured = settings.kafka_controller_port if single else 0
            key = f"{name}_controller"
            ports[key] = self.services.choose_port(key, configured, remembered, taken, f"the controller of {what}")
            taken.add(ports[key])
        return ports

    def _start(
        self,
        java: str,
        names: list[str],
        specs: dict[str, processes.ServiceSpec],
        running: set[str],
        ports: dict[str, int],
    ) -> None:
        """Format (when new) and start each node that does not run, then wait for them."""
        single = len(names) == 1
        home, settings = self.services.dir, self.services.settings
        voters = [kafka_broker.Voter(i, ports[f"{n}_controller"]) for i, n in enumerate(names, 1)] if not single else []
        cid = self._cluster_id(names) if not single else None
        security = self.services.kafka_security()
        started: list[tuple[str, processes.ServiceSpec, subprocess.Popen[bytes]]] = []
        for node_id, name in enumerate(names, 1):
            if name in running:
                continue
            config, log4j = kafka_broker.write_config(
                home,
                ports[name],
                ports[f"{name}_controller"],
                name=name,
                node_id=node_id,
                voters=voters,
                security=security,
            )
            if not kafka_broker.is_formatted(home, name):
                cmd = kafka_broker.format_command(
                    java, self.services.kafka_jars_dir(), config, log4j, home / "logs", cid, security
                )
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                finally:
                    (config.parent / kafka_broker.FORMAT_ARGS).unlink(missing_ok=True)
                if done.returncode != 0:
                    raise ServiceStartError(f"formatting the data dir of {name} failed:\n{done.stdout}{done.stderr}")
            self._progress(f"starting Kafka {settings.kafka_version} (KRaft) {name} on 127.0.0.1:{ports[name]}")
            started.append((name, specs[name], processes.start(specs[name])))
        kafka = self.services.kafka_access(",".join(f"127.0.0.1:{ports[n]}" for n in names))
        for name, spec, proc in started:

            def ready(n: str = name) -> bool:
                return processes.port_open(ports[n]) and kafka_broker.brokers_up(kafka) >= len(names)

            took = processes.wait_ready(
                spec,
                proc,
                ready,
                settings.start_timeout_s,
                extra_logs=[home / "logs" / f"{name}.log"],
            )
            self._progress(f"Kafka {name} ready after {took:.1f} s")
        if security is not None and started:
            security.grant_job_user(kafka.servers)

    def _cluster_id(self, names: list[str]) -> str:
        """The id the formatted nodes have (a node formatted again must match), else a new one."""
        for name in names:
            meta = self.services.dir / name / "data" / "meta.properties"
            if meta.exists():
                for line in meta.read_text().splitlines():
                    if line.startswith("cluster.id="):
                        return line.split("=", 1)[1].strip()
        return kafka_broker.cluster_id()


class SparkStarter:
    """The Spark standalone master, then its workers (a cluster only); ready
    once the master lists every worker ALIVE."""

    def __init__(self, services: RuntimeServices, progress: Progress):
        self.services = services
        self._progress = progress

    def up(self, remembered: dict[str, int], taken: set[int]) -> dict[str, int]:
        """The master, then the workers; ready once the master lists every worker ALIVE."""
        settings = self.services.settings
        workers = settings.spark_workers
        if not workers:
            return {}
        names = ["spark", "spark_web", *(f"spark-worker-{i}_web" for i in range(1, workers + 1))]
        probe = self.services.spark_specs()
        master_running = processes.running_pid(probe[0].pid_path, probe[0].marker) is not None
        ports: dict[str, int] = {}
        for name in names:
            keep = master_running and name in ("spark", "spark_web") and name in remembered
            ports[name] = (
                remembered[name] if keep else self.services.choose_port(name, 0, remembered, taken, f"Spark {name}")
            )
            taken.add(ports[name])
        specs = self.services.spark_specs(ports)
        for spec in specs:
            if processes.running_pid(spec.pid_path, spec.marker) is not None:
                continue
            self._progress(f"starting {spec.name}")
            proc = processes.start(spec)
            if spec.name == "spark-master":
                processes.wait_ready(
                    spec, proc, lambda: processes.port_open(ports["spark_web"]), settings.start_timeout_s
                )

        def too_few(message: str) -> ServiceStartError:
            logs = "\n".join(f"--- {spec.log_path}:\n{processes.tail(spec.log_path, 8)}" for spec in specs[1:])
            return ServiceStartError(
                f"the Spark master at 127.0.0.1:{ports['spark']} lists fewer than {workers} live workers after "
                f"{settings.start_timeout_s:.0f} s; the workers' logs end:\n{logs}"
            )

        poll_until(
            lambda: spark_cluster.alive_workers(ports["spark_web"]) >= workers,
            settings.start_timeout_s,
            f"{workers} live Spark workers",
            bound="start_timeout_s",
            every_s=0.5,
            error=too_few,
        )
        self._progress(f"Spark master spark://127.0.0.1:{ports['spark']} with {workers} workers ready")
        return ports


class S3Starter:
    """The S3 API server (versitygw): kept with its port when it runs, else
    started on the configured or a free port; ready once it listens."""

    def __init__(self, services: RuntimeServices, progress: Progress):
        self.services = services
        self._progress = progress

    def up(self, binary: Path, remembered: dict[str, int], taken: set[int]) -> int:
        settings = self.services.settings
        probe = self.services.s3_spec(binary)
        if processes.running_pid(probe.pid_path, probe.marker) is not None and "s3" in remembered:
            return remembered["s3"]
        port = self.services.choose_port("s3", settings.s3_port, remembered, taken, "the S3 server")
        spec = self.services.s3_spec(binary, port)
        self._progress(f"starting S3 API server versitygw {settings.s3_server_version} on 127.0.0.1:{port}")
        proc = processes.start(spec)
        took = processes.wait_ready(spec, proc, lambda: processes.port_open(port), settings.start_timeout_s)
        self._progress(f"S3 server ready after {took:.1f} s")
        return port


class RegistryStarter:
    """The schema registry (Apicurio): kept with its port when it runs, else
    started on the configured or a free port; ready once its health check
    says so.  Only ``up`` starts it; ``running`` finds one that runs."""

    def __init__(self, services: RuntimeServices, progress: Progress):
        self.services = services
        self._progress = progress

    def running(self, remembered: dict[str, int]) -> int | None:
        """The port of the registry when it runs on the port on record, else None."""
        probe = self.services.registry_spec()
        if processes.running_pid(probe.pid_path, probe.marker) is not None and "registry" in remembered:
            return remembered["registry"]
        return None

    def up(self, java: str, runner: Path, remembered: dict[str, int], taken: set[int]) -> int:
        settings = self.services.settings
        kept = self.running(remembered)
        if kept is not None:
            return kept
        port = self.services.choose_port("registry", settings.registry_port, remembered, taken, "the schema registry")
        spec = self.services.registry_spec(java, runner, port)
        schema_registry.data_dir_of(self.services.dir).mkdir(parents=True, exist_ok=True)
        self._progress(f"starting the schema registry Apicurio {settings.schema_registry_version} on 127.0.0.1:{port}")
        proc = processes.start(spec)
        took = processes.wait_ready(spec, proc, lambda: schema_registry.ready(port), settings.start_timeout_s)
        self._progress(f"schema registry ready after {took:.1f} s")
        return port
