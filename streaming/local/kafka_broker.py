"""The local Kafka brokers: KRaft nodes (broker and controller in one JVM
each) started from the ``kafka_2.13`` jars, with their data, config and logs
under the runtime directory.  One node, ``kafka``, for the embedded runtime;
three, ``kafka-1`` to ``kafka-3``, for the local cluster, one static voter set
of all of them, with replication factor 3 and ``min.insync.replicas=2``, so
one broker can stop and every topic is still written and read."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.kafka.admin import replication
from streaming.adapters.spark.jars import Artifact
from streaming.api.config import KafkaAccess
from streaming.errors import ServiceStartError
from streaming.local import processes
from streaming.local.kafka_security import BrokerSecurity
from streaming.local.processes import ServiceSpec
from streaming.local.services import Progress, RuntimeServices
from streaming.private_files import write_private

__all__ = [
    "KafkaStarter",
    "Voter",
    "broker_artifacts",
    "node_spec",
    "node_specs",
    "broker_properties",
    "brokers_up",
    "broker_spec",
    "cluster_id",
    "format_command",
    "is_formatted",
    "write_config",
]

LOG4J2_XML = """<Configuration status="WARN">
  <Appenders>
    <RollingFile name="file" fileName="{log}" filePattern="{log}.%i">
      <PatternLayout pattern="%d{{ISO8601}} %p [%c{{1}}] %m%n"/>
      <Policies><SizeBasedTriggeringPolicy size="20 MB"/></Policies>
      <DefaultRolloverStrategy max="2"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="warn"/>
    <Root level="info"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


@dataclass(frozen=True, slots=True)
class Voter:
    """One node of the static controller quorum."""

    node_id: int
    controller_port: int


def broker_properties(
    data_dir: Path,
    port: int,
    controller_port: int,
    *,
    node_id: int = 1,
    voters: Sequence[Voter] = (),
    security: BrokerSecurity | None = None,
) -> str:
    """server.properties of a combined KRaft node on loopback: alone, or one
    of ``voters`` (which must include it); with ``security``, its listeners
    secured and ACLs on (``kafka_security``)."""
    voters = tuple(voters) or (Voter(node_id, controller_port),)
    factor, min_isr = replication(len(voters))
    quorum = ",".join(f"{v.node_id}@127.0.0.1:{v.controller_port}" for v in voters)
    listeners = (
        security.listener_properties(port, controller_port)
        if security is not None
        else [
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        ]
    )
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node_id}",
            *listeners,
            # A static voter set, so the ports may change between starts.
            f"controller.quorum.voters={quorum}",
            f"log.dirs={data_dir}",
            "num.partitions=1",
            "auto.create.topics.enable=false",
            f"default.replication.factor={factor}",
            f"min.insync.replicas={min_isr}",
            f"offsets.topic.replication.factor={factor}",
            "offsets.topic.num.partitions=4",
            f"transaction.state.log.replication.factor={factor}",
            f"transaction.state.log.min.isr={min_isr}",
            "transaction.state.log.num.partitions=4",
            f"share.coordinator.state.topic.replication.factor={factor}",
            f"share.coordinator.state.topic.min.isr={min_isr}",
            "group.initial.rebalance.delay.ms=0",
            # Tests create and drop many small topics.
            "log.segment.bytes=16777216",
            "delete.topic.enable=true",
            "",
        ]
    )


def _java_argv(java: str, classpath: Path, log4j_xml: Path, heap: str, logs_dir: Path) -> list[str]:
    return [
        java,
        f"-Xmx{heap}",
        f"-Xms{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j_xml}",
        f"-Dkafka.logs.dir={logs_dir}",
        "-cp",
        f"{classpath}/*",
    ]


def cluster_id() -> str:
    """A new KRaft cluster id (every node of one cluster is formatted with the same).  Never one
    that starts with ``-``, which the format command would read as an option (Kafka's own
    ``Uuid.randomUuid`` draws again for the same reason)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def format_command(
    java: str,
    jars_dir: Path,
    config: Path,
    log4j_xml: Path,
    logs_dir: Path,
    cid: str | None = None,
    security: BrokerSecurity | None = None,
) -> list[str]:
    """``kafka.tools.StorageTool format`` for a fresh data dir (static quorum);
    with ``security``, its SCRAM users added.  Their salted passwords would
    let anyone who sees them log in, and a command line is visible to every
    user of the host (``ps``): with ``security`` the tool and its arguments
    are in an argument file beside ``config`` that only its owner can read
    (``java @file``; ``FORMAT_ARGS``), which the caller deletes after the run."""
    cid = cid or cluster_id()
    command = ["kafka.tools.StorageTool", "format", "-t", cid, "-c", str(config), "--ignore-formatted"]
    java_argv = _java_argv(java, jars_dir, log4j_xml, "256m", logs_dir)
    if security is None:
        return java_argv + command
    argfile = config.parent / FORMAT_ARGS
    write_private(argfile, "\n".join(_quoted(a) for a in command + security.scram_arguments()) + "\n")
    return java_argv + [f"@{argfile}"]


# the argument file of a secured node's format command (its SCRAM users' salted passwords)
FORMAT_ARGS = "format.args"


def _quoted(argument: str) -> str:
    """``argument`` as a java launcher's argument file reads it back whole."""
    return '"' + argument.replace("\\", "\\\\").replace('"', '\\"') + '"'


def broker_spec(java: str, jars_dir: Path, runtime_dir: Path, heap: str, name: str = "kafka") -> ServiceSpec:
    """Node ``name``: its directory ``<runtime>/<name>``, its log ``<runtime>/logs/<name>.out``."""
    kafka_dir = runtime_dir / name
    return ServiceSpec(
        name=name,
        argv=_java_argv(java, jars_dir, kafka_dir / "log4j2.xml", heap, runtime_dir / "logs")
        + ["kafka.Kafka", str(kafka_dir / "server.properties")],
        log_path=runtime_dir / "logs" / f"{name}.out",
        pid_path=runtime_dir / "pids" / f"{name}.pid",
        marker=str(kafka_dir / "server.properties"),
    )


def write_config(
    runtime_dir: Path,
    port: int,
    controller_port: int,
    *,
    name: str = "kafka",
    node_id: int = 1,
    voters: Sequence[Voter] = (),
    security: BrokerSecurity | None = None,
) -> tuple[Path, Path]:
    """Write node ``name``'s server.properties (its owner's alone: it may hold
    the admin's password) and log4j2.xml; return their paths."""
    kafka_dir = runtime_dir / name
    data_dir = kafka_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    config = kafka_dir / "server.properties"
    write_private(
        config, broker_properties(data_dir, port, controller_port, node_id=node_id, voters=voters, security=security)
    )
    log4j = kafka_dir / "log4j2.xml"
    log4j.write_text(LOG4J2_XML.format(log=runtime_dir / "logs" / f"{name}.log"))
    return config, log4j


def is_formatted(runtime_dir: Path, name: str = "kafka") -> bool:
    return (runtime_dir / name / "data" / "meta.properties").exists()


def brokers_up(kafka: KafkaAccess) -> int:
    """How many brokers the cluster reports (0 when none answers yet)."""
    admin = kafka_clients.admin(kafka, 3.0, client_id="spark-abs-local-probe")
    try:
        return len(admin.describe_cluster().get("brokers", []))
    finally:
        admin.close()


def broker_artifacts(version: str) -> tuple[Artifact, ...]:
    """The broker and a log4j2 binding (the Maven artifact brings only slf4j-api)."""
    return (
        Artifact("org.apache.kafka", "kafka_2.13", version),
        Artifact("org.slf4j", "slf4j-api", "2.0.16"),
        Artifact("org.apache.logging.log4j", "log4j-slf4j2-impl", "2.24.3"),
        Artifact("org.apache.logging.log4j", "log4j-core", "2.24.3"),
    )


def node_spec(services: RuntimeServices, java: str = "java", name: str = "kafka") -> ServiceSpec:
    """Node ``name`` of the runtime ``services`` (``java`` as ``up`` starts it; the default finds it)."""
    return broker_spec(java, services.kafka_jars_dir(), services.dir, services.settings.kafka_heap, name)


def node_specs(services: RuntimeServices) -> list[ServiceSpec]:
    """Every Kafka node of the runtime, as ``down`` and ``status`` find them."""
    return [node_spec(services, name=n) for n in services.kafka_names()]


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
        specs = {n: node_spec(self.services, java, n) for n in names}
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
        voters = [Voter(i, ports[f"{n}_controller"]) for i, n in enumerate(names, 1)] if not single else []
        cid = self._cluster_id(names) if not single else None
        security = self.services.kafka_security()
        started: list[tuple[str, processes.ServiceSpec, subprocess.Popen[bytes]]] = []
        for node_id, name in enumerate(names, 1):
            if name in running:
                continue
            config, log4j = write_config(
                home,
                ports[name],
                ports[f"{name}_controller"],
                name=name,
                node_id=node_id,
                voters=voters,
                security=security,
            )
            if not is_formatted(home, name):
                cmd = format_command(java, self.services.kafka_jars_dir(), config, log4j, home / "logs", cid, security)
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                finally:
                    (config.parent / FORMAT_ARGS).unlink(missing_ok=True)
                if done.returncode != 0:
                    raise ServiceStartError(f"formatting the data dir of {name} failed:\n{done.stdout}{done.stderr}")
            self._progress(f"starting Kafka {settings.kafka_version} (KRaft) {name} on 127.0.0.1:{ports[name]}")
            started.append((name, specs[name], processes.start(specs[name])))
        kafka = self.services.kafka_access(",".join(f"127.0.0.1:{ports[n]}" for n in names))
        for name, spec, proc in started:

            def ready(n: str = name) -> bool:
                return processes.port_open(ports[n]) and brokers_up(kafka) >= len(names)

            took = processes.wait_ready(
                spec,
                proc,
                ready,
                settings.start_timeout_s,
                extra_logs=[home / "logs" / f"{name}.log"],
            )
            self._progress(f"Kafka {name} ready after {took:.1f} s")
        if security is not None and started:
            security.revoke_wildcards(kafka.servers)

    def _cluster_id(self, names: list[str]) -> str:
        """The id the formatted nodes have (a node formatted again must match), else a new one."""
        for name in names:
            meta = self.services.dir / name / "data" / "meta.properties"
            if meta.exists():
                for line in meta.read_text().splitlines():
                    if line.startswith("cluster.id="):
                        return line.split("=", 1)[1].strip()
        return cluster_id()
