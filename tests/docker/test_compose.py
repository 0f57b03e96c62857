"""docker/compose.yaml runs the same stack as the local cluster on real
services.  No Docker engine runs here, so this checks what can be checked:
the file parses, names every service, its ``${NAME:-default}`` settings are
the ones .env.example documents, and the pipeline gets every setting the code
reads, with values that point at the services it defines; Prometheus
scrapes the ports the pipeline serves its metrics on, and Grafana's
datasource and dashboard are provisioned, the dashboard's queries naming
metrics the code defines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlparse

import yaml

from streaming.adapters.kafka_admin import replication
from streaming.api.config import CONNECTION_ENV_FIELDS, ENV, Connection, MetricsSettings
from streaming.engine import metrics
from streaming.local.kafka_broker import Voter, broker_properties

DOCKER = Path(__file__).resolve().parents[2] / "docker"
SETTING = re.compile(r"\$\{([A-Z0-9_]+):-([^}]*)\}")
BROKERS = ("kafka-1", "kafka-2", "kafka-3")


def _example() -> dict[str, str]:
    lines = (DOCKER / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def _compose() -> dict:
    """The compose file with its settings resolved as compose would with no .env."""
    text = (DOCKER / "compose.yaml").read_text()
    return yaml.safe_load(SETTING.sub(lambda m: m.group(2), text))


def test_compose_names_every_service():
    assert set(_compose()["services"]) == {
        *BROKERS,
        "s3",
        "s3-bucket",
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
        "pipeline",
        "prometheus",
        "grafana",
    }


def test_every_setting_is_in_the_env_example_with_the_same_default():
    used = dict(SETTING.findall((DOCKER / "compose.yaml").read_text()))
    assert used == {name: value for name, value in _example().items() if name in used}
    assert set(used) == set(_example()), "the example documents settings compose does not use"


def test_the_pipeline_gets_every_connection_setting_and_they_parse():
    services = _compose()["services"]
    env = services["pipeline"]["environment"]
    assert {ENV[name] for name in CONNECTION_ENV_FIELDS} <= set(env)
    conn = Connection.from_env(env)
    assert conn is not None

    hosts = []
    for address in conn.kafka_bootstrap.split(","):
        host, port = address.split(":")
        assert f"PLAINTEXT://{host}:{port}" in services[host]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
        hosts.append(host)
    assert tuple(hosts) == BROKERS
    assert {f"kafka-{i}" for i in (1, 2, 3)} <= set(services["pipeline"]["depends_on"])

    s3 = urlparse(conn.s3_endpoint)
    assert s3.hostname in services
    minio_env = services[s3.hostname]["environment"]
    assert (conn.s3_access_key, conn.s3_secret_key) == (minio_env["MINIO_ROOT_USER"], minio_env["MINIO_ROOT_PASSWORD"])
    assert f"store/{conn.s3_bucket}" in " ".join(services["s3-bucket"]["command"])

    master = urlparse(conn.spark_master)
    assert master.scheme == "spark" and master.hostname == "spark-master"
    assert f"--port {master.port}" in " ".join(services["spark-master"]["command"])
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert conn.spark_master in " ".join(services[worker]["command"])


def test_the_brokers_have_the_settings_of_the_local_cluster():
    """Every setting of a local cluster node (replication factors, min ISR,
    the voter set) is set the same way in each compose broker."""
    voters = [Voter(i, 9093) for i in (1, 2, 3)]
    local = dict(
        line.split("=", 1)
        for line in broker_properties(Path("/d"), 1, 2, node_id=2, voters=voters).splitlines()
        if line
    )
    assert (local["default.replication.factor"], local["min.insync.replicas"]) == tuple(map(str, replication(3)))
    ids = set()
    for node, broker in enumerate(BROKERS, 1):
        env = _compose()["services"][broker]["environment"]
        for key in (
            "process.roles",
            "default.replication.factor",
            "min.insync.replicas",
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr",
            "share.coordinator.state.topic.replication.factor",
            "share.coordinator.state.topic.min.isr",
            "auto.create.topics.enable",
            "group.initial.rebalance.delay.ms",
            "controller.listener.names",
        ):
            assert str(env["KAFKA_" + key.upper().replace(".", "_")]) == local[key], (broker, key)
        assert env["KAFKA_NODE_ID"] == str(node)
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == ",".join(f"{i}@kafka-{i}:9093" for i in (1, 2, 3))
        ids.add(env["CLUSTER_ID"])
    assert len(ids) == 1


def test_the_image_installs_the_package_and_its_connector():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    for package in ("barriers", "operators", "streaming"):
        assert f"COPY {package} {package}" in dockerfile
    assert "openjdk-17" in dockerfile
    assert "spark-abs local fetch --only spark-connector" in dockerfile
    image = _compose()["services"]["pipeline"]["build"]
    assert (DOCKER / image["context"] / image["dockerfile"]).resolve().exists()


def _mounted(service: dict) -> dict[str, Path]:
    """Where each file or directory a service mounts from docker/ goes: target -> source."""
    mounts = {}
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = (DOCKER / source).resolve()
    return mounts


def test_prometheus_scrapes_the_ports_the_pipeline_serves_metrics_on():
    services = _compose()["services"]
    pipeline = services["pipeline"]
    served = MetricsSettings.from_env(pipeline["environment"])
    assert served.host == "0.0.0.0"  # reachable from the prometheus container
    config_file = _mounted(services["prometheus"])["/etc/prometheus/prometheus.yml"]
    assert config_file.is_file()
    (scrape,) = yaml.safe_load(config_file.read_text())["scrape_configs"]
    assert not scrape.get("honor_labels")  # the metrics name the spark-abs job `job_name`, not `job`
    targets = [t for group in scrape["static_configs"] for t in group["targets"]]
    host = pipeline["hostname"]
    assert targets[0] == f"{host}:{served.port}"
    assert targets[1:] == [f"{host}:{served.for_worker(i).port}" for i in range(3)]  # up to a worker per stage


def test_grafana_provisions_the_datasource_and_the_dashboard():
    services = _compose()["services"]
    mounts = _mounted(services["grafana"])
    provisioning, dashboards = mounts["/etc/grafana/provisioning"], mounts["/var/lib/grafana/dashboards"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert urlparse(datasource["url"]).hostname == "prometheus" and "prometheus" in services
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "spark-abs.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (dashboards / Path(home).name).is_file()


def test_the_dashboard_queries_metrics_the_code_defines():
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "spark-abs.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) > 10
    defined = {
        sample_name for family in metrics.REGISTRY.collect() for sample_name in _sample_names(family.name, family.type)
    }
    named = {name for expr in exprs for name in re.findall(r"spark_abs_\w+", expr)}
    assert named and sorted(named - defined) == []
    # every spark-abs metric has a place on it
    families = {f.name for f in metrics.REGISTRY.collect() if f.name.startswith("spark_abs_")}
    assert sorted(f for f in families if not any(n.startswith(f) for n in named)) == []
    uids = {t["datasource"]["uid"] for panel in dashboard["panels"] for t in panel.get("targets", [])}
    assert uids == {"prometheus"}


def _sample_names(name: str, kind: str) -> list[str]:
    """The names a metric family's samples go by in a query."""
    if kind == "counter":
        return [f"{name}_total"]
    if kind == "histogram":
        return [f"{name}_bucket", f"{name}_count", f"{name}_sum"]
    return [name]
