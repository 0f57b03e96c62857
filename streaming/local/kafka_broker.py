"""The local Kafka broker: one KRaft node (broker and controller in one JVM)
started from the ``kafka_2.13`` jars, with its data, config and logs under the
runtime directory."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

from kafka import KafkaAdminClient

from streaming.local.processes import ServiceSpec

__all__ = [
    "broker_properties",
    "broker_ready",
    "broker_spec",
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


def broker_properties(data_dir: Path, port: int, controller_port: int) -> str:
    """server.properties of a single combined KRaft node on loopback."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            # A static voter set, so the ports may change between starts.
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"log.dirs={data_dir}",
            "num.partitions=1",
            "auto.create.topics.enable=false",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
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


def format_command(java: str, jars_dir: Path, config: Path, log4j_xml: Path, logs_dir: Path) -> list[str]:
    """``kafka.tools.StorageTool format`` for a fresh data dir (static quorum)."""
    cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return _java_argv(java, jars_dir, log4j_xml, "256m", logs_dir) + [
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cid,
        "-c",
        str(config),
        "--ignore-formatted",
    ]


def broker_spec(java: str, jars_dir: Path, runtime_dir: Path, heap: str) -> ServiceSpec:
    kafka_dir = runtime_dir / "kafka"
    return ServiceSpec(
        name="kafka",
        argv=_java_argv(java, jars_dir, kafka_dir / "log4j2.xml", heap, runtime_dir / "logs")
        + ["kafka.Kafka", str(kafka_dir / "server.properties")],
        log_path=runtime_dir / "logs" / "kafka.out",
        pid_path=runtime_dir / "pids" / "kafka.pid",
        marker=str(kafka_dir / "server.properties"),
    )


def write_config(runtime_dir: Path, port: int, controller_port: int) -> tuple[Path, Path]:
    """Write server.properties and log4j2.xml; return their paths."""
    kafka_dir = runtime_dir / "kafka"
    data_dir = kafka_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    config = kafka_dir / "server.properties"
    config.write_text(broker_properties(data_dir, port, controller_port))
    log4j = kafka_dir / "log4j2.xml"
    log4j.write_text(LOG4J2_XML.format(log=runtime_dir / "logs" / "kafka.log"))
    return config, log4j


def is_formatted(runtime_dir: Path) -> bool:
    return (runtime_dir / "kafka" / "data" / "meta.properties").exists()


def broker_ready(bootstrap: str) -> bool:
    """The broker answers metadata requests."""
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=3000,
        bootstrap_timeout_ms=3000,
        client_id="spark-abs-local-probe",
    )
    try:
        admin.describe_cluster()
        return True
    finally:
        admin.close()
