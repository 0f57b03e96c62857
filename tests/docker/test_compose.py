"""docker/compose.yaml runs the same stack as the local runtime on real
services.  No Docker engine runs here, so this checks what can be checked: the
file parses, names every service, and gives the pipeline every setting the
code reads, with values that point at the services it defines."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import yaml

from streaming.api.config import CONNECTION_ENV_FIELDS, ENV, Connection
from streaming.local.kafka_broker import broker_properties

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_names_every_service():
    assert set(_compose()["services"]) == {"kafka", "s3", "s3-bucket", "spark-master", "spark-worker", "pipeline"}


def test_the_pipeline_gets_every_connection_setting_and_they_parse():
    services = _compose()["services"]
    env = services["pipeline"]["environment"]
    assert {ENV[name] for name in CONNECTION_ENV_FIELDS} <= set(env)
    conn = Connection.from_env(env)
    assert conn is not None

    host, port = conn.kafka_bootstrap.split(":")
    assert (
        host in services and f"PLAINTEXT://{host}:{port}" in services[host]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    )

    s3 = urlparse(conn.s3_endpoint)
    assert s3.hostname in services
    minio_env = services[s3.hostname]["environment"]
    assert (conn.s3_access_key, conn.s3_secret_key) == (minio_env["MINIO_ROOT_USER"], minio_env["MINIO_ROOT_PASSWORD"])
    assert f"store/{conn.s3_bucket}" in " ".join(services["s3-bucket"]["command"])

    master = urlparse(conn.spark_master)
    assert master.scheme == "spark" and master.hostname == "spark-master"
    assert f"--port {master.port}" in " ".join(services["spark-master"]["command"])
    assert conn.spark_master in " ".join(services["spark-worker"]["command"])


def test_the_broker_has_the_settings_of_the_local_one():
    """Every single-node setting of the local broker (replication factors and
    the like) is set the same way in the compose broker."""
    local = dict(line.split("=", 1) for line in broker_properties(Path("/d"), 1, 2).splitlines() if line)
    compose_env = _compose()["services"]["kafka"]["environment"]
    for key in (
        "process.roles",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
        "auto.create.topics.enable",
        "group.initial.rebalance.delay.ms",
        "controller.listener.names",
    ):
        env_name = "KAFKA_" + key.upper().replace(".", "_")
        assert str(compose_env[env_name]) == local[key], key


def test_the_image_installs_the_package_and_its_connector():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    for package in ("barriers", "operators", "streaming"):
        assert f"COPY {package} {package}" in dockerfile
    assert "openjdk-17" in dockerfile
    assert "spark-abs local fetch --only spark-connector" in dockerfile
    image = _compose()["services"]["pipeline"]["build"]
    assert (DOCKER / image["context"] / image["dockerfile"]).resolve().exists()
