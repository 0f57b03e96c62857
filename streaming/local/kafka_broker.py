"""The local Kafka brokers: KRaft nodes (broker and controller in one JVM
each) started from the ``kafka_2.13`` jars, with their data, config and logs
under the runtime directory.  One node, ``kafka``, for the embedded runtime;
three, ``kafka-1`` to ``kafka-3``, for the local cluster, one static voter set
of all of them, with replication factor 3 and ``min.insync.replicas=2``, so
one broker can stop and every topic is still written and read."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.kafka.admin import replication
from streaming.api.config import KafkaAccess
from streaming.local.kafka_security import BrokerSecurity
from streaming.local.processes import ServiceSpec
from streaming.private_files import write_private

__all__ = [
    "Voter",
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
