"""The local cluster's pieces without starting them: three KRaft nodes in one
voter set with replication factor 3 and min ISR 2, the Spark master and
workers as spark-class command lines, and the cluster's own home."""

from __future__ import annotations

from pathlib import Path

import pytest

from streaming.adapters.kafka.admin import replication
from streaming.api.config import LocalRuntimeSettings
from streaming.errors import ConfigError
from streaming.local import spark_cluster
from streaming.local.kafka_broker import Voter, broker_properties
from streaming.local.runtime import LocalRuntime


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


@pytest.mark.parametrize(("brokers", "expected"), [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (5, (3, 2))])
def test_a_replica_on_each_broker_up_to_three_and_writes_need_all_but_one(brokers, expected):
    assert replication(brokers) == expected


def test_three_nodes_share_one_voter_set_and_replicate_three_times():
    voters = [Voter(1, 9101), Voter(2, 9102), Voter(3, 9103)]
    node = _properties(broker_properties(Path("/data/kafka-2"), 9002, 9102, node_id=2, voters=voters))
    assert node["node.id"] == "2"
    assert node["controller.quorum.voters"] == "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    assert node["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
    ):
        assert node[key] == "3", key
    assert node["min.insync.replicas"] == node["transaction.state.log.min.isr"] == "2"
    alone = _properties(broker_properties(Path("/data/kafka"), 9002, 9102))
    assert alone["controller.quorum.voters"] == "1@127.0.0.1:9102"
    assert alone["offsets.topic.replication.factor"] == alone["min.insync.replicas"] == "1"


def test_the_cluster_lives_under_its_own_home_and_shares_the_cache(tmp_path):
    settings = LocalRuntimeSettings.cluster(tmp_path)
    assert settings.home == tmp_path / "cluster" and settings.cache_dir == tmp_path / "cache"
    assert (settings.kafka_nodes, settings.spark_workers, settings.is_cluster) == (3, 2, True)
    names = [spec.name for spec in LocalRuntime(settings).specs()]
    assert names == [
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "s3",
        "registry",
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
    ]
    assert [spec.name for spec in LocalRuntime(LocalRuntimeSettings(home=tmp_path)).specs()] == [
        "kafka",
        "s3",
        "registry",
    ]
    with pytest.raises(ConfigError, match="leave them 0 for a cluster"):
        LocalRuntimeSettings.cluster(tmp_path, kafka_port=9092)


def test_master_and_workers_are_spark_class_command_lines_told_apart_by_their_properties(tmp_path):
    master = spark_cluster.master_spec(tmp_path, 7077, 8080)
    worker = spark_cluster.worker_spec(tmp_path, 2, 7077, 8082)
    home = spark_cluster.spark_home()
    assert master.argv[:2] == [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master"]
    assert (home / "bin" / "spark-class").exists()
    assert "--port 7077 --webui-port 8080" in " ".join(master.argv)
    assert worker.argv[-1] == "spark://127.0.0.1:7077"
    assert f"--cores {spark_cluster.WORKER_CORES}" in " ".join(worker.argv)
    assert worker.marker in worker.argv and master.marker in master.argv and worker.marker != master.marker
    # found again without ports (down, status): the same pid file and marker
    again = spark_cluster.worker_spec(tmp_path, 2)
    assert (again.pid_path, again.marker) == (worker.pid_path, worker.marker)
    assert master.env["SPARK_HOME"] == str(home) and master.env["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_a_worker_group_on_a_standalone_master_leaves_cores_to_the_others():
    from streaming.adapters.spark.session import spark_conf
    from streaming.api.config import SparkSettings

    on_cluster = spark_conf(SparkSettings(master="spark://127.0.0.1:7077"), [Path("/jars/a.jar")])
    assert (on_cluster["spark.cores.max"], on_cluster["spark.executor.cores"]) == ("2", "1")
    assert on_cluster["spark.jars"] == "/jars/a.jar"  # the connector reaches the executors
    local = spark_conf(SparkSettings(master="local[2]"), [])
    assert "spark.cores.max" not in local and "spark.executor.memory" not in local


def test_live_workers_are_none_while_the_masters_page_is_not_served_yet():
    """The master's web port opens before its /json/ page answers: a 404 (or
    a refused connection) means none yet, so the start-up waits on."""
    import http.server
    import json
    import threading

    pages = {"/json/": None}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = pages.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        assert spark_cluster.alive_workers(port) == 0
        workers = [{"state": "ALIVE"}, {"state": "DEAD"}, {"state": "ALIVE"}]
        pages["/json/"] = json.dumps({"workers": workers}).encode()
        assert spark_cluster.alive_workers(port) == 2
    finally:
        server.shutdown()
        server.server_close()
    assert spark_cluster.alive_workers(port) == 0  # nothing listens any more


def test_a_cluster_id_never_reads_as_an_option(monkeypatch):
    import uuid

    from streaming.local import kafka_broker

    # the first draw encodes to "-" first (0xf8 >> 2 is 62, base64url's "-"), the second does not
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: next(draws))
    assert kafka_broker.cluster_id() == "AQEBAQEBAQEBAQEBAQEBAQ"


def test_the_cluster_and_its_drivers_share_a_secret_of_their_own_and_encrypt_their_rpc(tmp_path):
    """Every daemon's properties name the cluster's generated secret (the file and the
    properties its owner's alone, made once); a driver given the secret file authenticates
    and encrypts; no REST submissions, no kill links."""
    from streaming.adapters.spark.session import spark_conf
    from streaming.api.config import SparkSettings

    master = spark_cluster.master_spec(tmp_path, 7077, 8080)
    worker = spark_cluster.worker_spec(tmp_path, 1, 7077, 8081)
    secret_file = spark_cluster.secret_file(tmp_path)
    secret = secret_file.read_text().strip()
    assert len(secret) >= 40 and secret_file.stat().st_mode & 0o777 == 0o600
    for spec in (master, worker):
        path = Path(spec.marker)
        assert path.stat().st_mode & 0o777 == 0o600
        conf = dict(line.split(" ", 1) for line in path.read_text().splitlines() if not line.startswith("#"))
        assert conf == spark_cluster.daemon_conf(secret)
        assert conf["spark.authenticate"] == conf["spark.network.crypto.enabled"] == "true"
        assert conf["spark.master.rest.enabled"] == conf["spark.ui.killEnabled"] == "false"
    spark_cluster.master_spec(tmp_path, 7077, 8080)
    assert secret_file.read_text().strip() == secret  # kept
    driver = spark_conf(SparkSettings(master="spark://127.0.0.1:7077", secret_file=str(secret_file)), [])
    assert (driver["spark.authenticate"], driver["spark.network.crypto.enabled"]) == ("true", "true")
    assert driver["spark.authenticate.secret"] == secret
    assert "spark.authenticate" not in spark_conf(SparkSettings(master="spark://127.0.0.1:7077"), [])
