"""docker/compose.yaml runs the same stack as the local cluster on real
services.  No Docker engine runs here (nor ``docker compose``), so this checks
what can be checked: the file parses, and its settings interpolate as compose
interpolates them (a parser of compose's ``$`` syntax, below), names every
service, its ``${NAME:-default}`` settings are the ones .env.example documents;
its defaults are safe: every port is published on 127.0.0.1 alone, no
credential has a value in the file, each is a ``${NAME:?message}`` that stops
compose with the message while it is not set, and Grafana asks every viewer
to log in; and the pipeline gets every setting the code
reads, with values that point at the services it defines; Prometheus
scrapes the ports the pipeline serves its metrics on and loads the alert
rules, which name metrics the code defines, pass ``promtool check rules``
and fire when promtool's unit tests (alerts_test.yml) say they must; and
Grafana's datasource and dashboard are provisioned, the dashboard's
queries naming metrics the code defines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from streaming.adapters.kafka.admin import replication
from streaming.api.config import CONNECTION_ENV_FIELDS, ENV, Connection, MetricsSettings
from streaming.engine import metrics
from streaming.engine.restore.service import RESTORE_CAUSES
from streaming.local.kafka_broker import Voter, broker_properties
from streaming.tools.ui.liveness import STALLED_S

DOCKER = Path(__file__).resolve().parents[2] / "docker"
ALERTS = DOCKER / "prometheus-alerts.yml"
# a metric's name in a query; not a label's (spark_abs_role="runner")
METRIC = re.compile(r"\bspark_abs_\w+\b(?!\s*(?:=|!=|=~|!~))")
SETTING = re.compile(r"\$\{([A-Z0-9_]+):-([^}]*)\}")
REQUIRED = re.compile(r"\$\{([A-Z0-9_]+):\?([^}]+)\}")
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
# what a name of an environment variable that holds a credential looks like
CREDENTIAL = re.compile(r"PASSWORD|SECRET|ACCESS_KEY|ROOT_USER|TOKEN|_USER$")
# the credentials compose must be given, and values for them in these tests
CREDENTIALS = {
    "SPARK_ABS_S3_ACCESS_KEY": "test-user",
    "SPARK_ABS_S3_SECRET_KEY": "test-secret-key",
    "GRAFANA_ADMIN_PASSWORD": "test-password",
    "SPARK_ABS_JOB_SECRET": "test-job-secret-of-more-than-32-characters",
}


def _example() -> dict[str, str]:
    lines = (DOCKER / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


class MissingSetting(Exception):
    """A ``${NAME:?message}`` (or ``${NAME?message}``) whose variable is not set: compose stops with the message."""


# compose's interpolation: $$, $NAME, ${NAME}, ${NAME:-default}, ${NAME-default},
# ${NAME:?message}, ${NAME?message}, ${NAME:+other}, ${NAME+other}
_TEMPLATE = re.compile(
    r"\$(?:(?P<escaped>\$)|(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
    r"|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}$]*))?\}|(?P<invalid>))"
)


def _interpolate(value: str, env: Mapping[str, str]) -> str:
    """``value`` as compose interpolates it from ``env``."""

    def one(match: re.Match) -> str:
        if match["escaped"]:
            return "$"
        if match["bare"]:
            return env.get(match["bare"], "")
        if match["invalid"] is not None:
            raise ValueError(f"invalid interpolation in {value!r} at {match.start()}")
        name, op, arg = match["name"], match["op"], match["arg"]
        given = env.get(name)
        unset = given is None or (op is not None and op.startswith(":") and given == "")
        if op in ("-", ":-"):
            return arg if unset else given
        if op in ("?", ":?"):
            if unset:
                raise MissingSetting(f"required variable {name} is missing a value: {arg}")
            return given
        if op in ("+", ":+"):
            return "" if unset else arg
        return given or ""

    return _TEMPLATE.sub(one, value)


def _resolved(node, env: Mapping[str, str]):
    if isinstance(node, dict):
        return {key: _resolved(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [_resolved(value, env) for value in node]
    return _interpolate(node, env) if isinstance(node, str) else node


def _raw() -> dict:
    """The compose file as YAML, not interpolated."""
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _compose(env: Mapping[str, str] | None = None) -> dict:
    """The compose file with its settings interpolated as compose does (the YAML
    first, then each string), from ``env``: by default a .env copied from
    the example, the credentials filled in."""
    return _resolved(_raw(), {**_example(), **CREDENTIALS} if env is None else env)


def test_compose_names_every_service():
    assert set(_compose()["services"]) == {
        *BROKERS,
        "s3",
        "s3-bucket",
        "schema-registry",
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
        "pipeline",
        "prometheus",
        "grafana",
    }


def test_every_setting_is_in_the_env_example_with_the_same_default():
    text = (DOCKER / "compose.yaml").read_text()
    used = dict(SETTING.findall(text))
    assert used == {name: value for name, value in _example().items() if name in used}
    required = {name for name, _ in REQUIRED.findall(text)}
    assert required == set(CREDENTIALS)
    assert {name: _example()[name] for name in required} == dict.fromkeys(required, "")  # to fill in, no default
    assert set(used) | required == set(_example()), "the example documents settings compose does not use"


def test_the_interpolation_parser_reads_composes_syntax():
    env = {"SET": "v", "EMPTY": ""}
    assert _interpolate("$$SET $SET ${SET} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${SET:+alt} ${UNSET}.", env) == (
        "$SET v v d d  alt ."
    )
    assert _interpolate("${SET:?say so}", env) == "v"
    with pytest.raises(MissingSetting, match="UNSET is missing a value: say so"):
        _interpolate("${UNSET:?say so}", env)
    with pytest.raises(MissingSetting, match="EMPTY"):
        _interpolate("${EMPTY:?say so}", env)
    assert _interpolate("${EMPTY?say so}", env) == ""
    with pytest.raises(ValueError, match="invalid interpolation"):
        _interpolate("a $ sign", env)


def test_every_port_is_published_on_loopback_alone():
    published = {}
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            assert isinstance(port, str) and re.fullmatch(r"127\.0\.0\.1:\d+:\d+", port), (name, port)
            published[name] = published.get(name, 0) + 1
    assert published == dict.fromkeys((*BROKERS, "schema-registry", "spark-master", "prometheus", "grafana"), 1) | {
        "s3": 2
    }


def test_no_credential_has_a_value_in_the_file_and_compose_stops_without_each():
    """Every variable a service gets that holds a credential is a
    ``${NAME:?message}`` (or an alias of one), and compose refuses to start
    while one is unset or empty (as .env.example leaves them), saying what to set."""
    credentials = {
        (name, key): value
        for name, service in _raw()["services"].items()
        for key, value in (service.get("environment") or {}).items()
        if CREDENTIAL.search(key)
    }
    assert len(credentials) >= 7
    for where, value in credentials.items():
        match = REQUIRED.fullmatch(str(value))
        assert match and match[1] in CREDENTIALS, where
        assert f"set {match[1]} in docker/.env" in match[2], where
    text = (DOCKER / "compose.yaml").read_text()
    assert [name for name, _ in SETTING.findall(text) if CREDENTIAL.search(name)] == []
    for literal in ("sparkabs-secret", ":-sparkabs}", "PASSWORD:-"):  # the defaults it had
        assert literal not in text
    for name in CREDENTIALS:
        for env in ({**_example(), **CREDENTIALS, name: ""}, {k: v for k, v in CREDENTIALS.items() if k != name}):
            with pytest.raises(MissingSetting, match=rf"{name} is missing a value: set {name} in docker/\.env"):
                _compose(env)
    assert _compose()["services"]["s3"]["environment"]["MINIO_ROOT_PASSWORD"] == "test-secret-key"


def test_grafana_asks_every_viewer_to_log_in():
    env = _compose()["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == CREDENTIALS["GRAFANA_ADMIN_PASSWORD"]


def test_the_pipeline_gets_every_connection_setting_and_they_parse():
    services = _compose()["services"]
    env = services["pipeline"]["environment"]
    assert {ENV[name] for name in CONNECTION_ENV_FIELDS} <= set(env)
    conn = Connection.from_env(env)
    assert conn is not None

    hosts = []
    for address in conn.kafka.servers.split(","):
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
    bucket = services["s3-bucket"]
    assert (bucket["environment"]["S3_USER"], bucket["environment"]["S3_PASSWORD"]) == (
        conn.s3_access_key,
        conn.s3_secret_key,
    )
    assert 'mc alias set store http://s3:9000 "$S3_USER" "$S3_PASSWORD"' in bucket["command"][0]

    registry = urlparse(conn.schema_registry)
    assert registry.hostname in services and registry.path == "/apis/ccompat/v7"
    assert registry.hostname in services["pipeline"]["depends_on"]

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


def _defined() -> set[str]:
    """The names of every sample the code's metrics have, as a query names them."""
    return {name for family in metrics.REGISTRY.collect() for name in _sample_names(family.name, family.type)}


def test_the_dashboard_queries_metrics_the_code_defines():
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "spark-abs.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) > 10
    named = {name for expr in exprs for name in METRIC.findall(expr)}
    assert named and sorted(named - _defined()) == []
    # every spark-abs metric has a place on it
    families = {f.name for f in metrics.REGISTRY.collect() if f.name.startswith("spark_abs_")}
    assert sorted(f for f in families if not any(n.startswith(f) for n in named)) == []
    uids = {t["datasource"]["uid"] for panel in dashboard["panels"] for t in panel.get("targets", [])}
    assert uids == {"prometheus"}
    (restores,) = [panel for panel in dashboard["panels"] if panel["title"] == "Restores"]
    assert [c for c in RESTORE_CAUSES if c not in restores["description"]] == []
    # no two panels on one place
    cells = [
        (panel["gridPos"]["x"] + dx, panel["gridPos"]["y"] + dy)
        for panel in dashboard["panels"]
        for dx in range(panel["gridPos"]["w"])
        for dy in range(panel["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells))


def _sample_names(name: str, kind: str) -> list[str]:
    """The names a metric family's samples go by in a query."""
    if kind == "counter":
        return [f"{name}_total"]
    if kind == "histogram":
        return [f"{name}_bucket", f"{name}_count", f"{name}_sum"]
    return [name]


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_prometheus_loads_the_alert_rules():
    prometheus = _compose()["services"]["prometheus"]
    config = yaml.safe_load(_mounted(prometheus)["/etc/prometheus/prometheus.yml"].read_text())
    (listed,) = config["rule_files"]
    assert _mounted(prometheus)[listed] == ALERTS


def test_the_alerts_name_metrics_and_causes_the_code_defines_and_tell_where_to_look():
    rules = {rule["alert"]: rule for rule in _rules()}
    assert {"SparkAbsCheckpointsStalled", "SparkAbsCheckpointsFailing"} <= set(rules)
    for name, rule in rules.items():
        named = set(METRIC.findall(rule["expr"]))
        assert named <= _defined(), (name, sorted(named - _defined()))
        for cause in re.findall(r'cause=~"([^"]*)"', rule["expr"]):
            assert set(cause.split("|")) <= set(RESTORE_CAUSES), (name, cause)
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert set(rule["annotations"]) == {"summary", "description"}, name
        assert "runner" in rule["annotations"]["description"], name  # its log, or whether it runs
    # the age the web UI calls a job stalled at is the alert's
    stalled = rules["SparkAbsCheckpointsStalled"]["expr"]
    assert re.fullmatch(r"time\(\) - spark_abs_last_checkpoint_completed_timestamp_seconds > (\d+)", stalled)
    assert float(stalled.rsplit(">", 1)[1]) == STALLED_S
    for name in ("SparkAbsCheckpointsStalled", "SparkAbsCheckpointsFailing"):
        assert "spark-abs ui" in rules[name]["annotations"]["description"], name
    assert "spark-abs checkpoints list" in rules["SparkAbsCheckpointsStalled"]["annotations"]["description"]


def _promtool(*args: str | Path) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "no promtool: `make test` installs it (Debian's prometheus package)"
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_alert_rules():
    checked = _promtool("check", "rules", ALERTS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in checked.stdout


def test_the_alerts_fire_when_promtools_unit_tests_say(tmp_path):
    """``promtool test rules`` on a copy of the rules without their
    annotations (it would compare them word for word; the test above reads them)."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(Path(__file__).with_name("alerts_test.yml"), tmp_path)
    tested = _promtool("test", "rules", tmp_path / "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
    tested_alerts = set(re.findall(r"alertname: (\w+)", (tmp_path / "alerts_test.yml").read_text()))
    assert tested_alerts == {rule["alert"] for rule in _rules()}  # every rule has a case
