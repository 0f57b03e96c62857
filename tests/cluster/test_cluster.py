"""On the local cluster (three Kafka nodes, replication factor 3; a Spark
standalone master with two workers): a topic has a replica on each node, and
writes need two of them in sync; the Spark master takes no application
without the cluster's secret.  A job on the cluster, losing a Kafka node,
a Spark worker, its remote worker group's member (with and without a
standby) and its runner, is test_cluster_drill.py's (``spark-abs drill
--cluster``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from kafka.admin import ConfigResource, ConfigResourceType

from streaming.adapters.kafka.admin import admin_client, create_topic

pytestmark = pytest.mark.integration


def test_topics_are_replicated_on_three_brokers(cluster, unique_name):
    _, connection = cluster
    create_topic(connection.kafka, unique_name, 2)
    admin = admin_client(connection.kafka)
    try:
        (described,) = admin.describe_topics([unique_name])
        resource = ConfigResource(ConfigResourceType.TOPIC, unique_name, configs=["min.insync.replicas"])
        configs = admin.describe_configs([resource])
    finally:
        admin.close()
    assert [len(p["replica_nodes"]) for p in described["partitions"]] == [3, 3]
    assert configs["topic"][unique_name]["min.insync.replicas"]["value"] == "2"


_MEMBER = """
import sys
from streaming.adapters.spark.session import spark_session
from streaming.api.config import Connection, LocalRuntimeSettings
connection = Connection.load(LocalRuntimeSettings.cluster())
spark = spark_session(connection.spark_settings(app_name="member"), LocalRuntimeSettings.cluster())
assert spark.range(10).count() == 10
print("ran", flush=True)
sys.stdin.read()
"""


def test_a_driver_with_the_secret_runs_and_no_command_line_of_the_machine_shows_the_secret(cluster, runtime_settings):
    """pyspark puts every option it is given on the command line of the JVM it launches, which
    any user of the machine reads: the secret is set in the running JVM instead."""
    _, connection = cluster
    secret = Path(connection.spark_secret_file).read_text().strip()
    env = {"SPARK_ABS_HOME": str(runtime_settings.home), "PATH": "/usr/bin:/bin", "HOME": str(runtime_settings.home)}
    member = subprocess.Popen(
        [sys.executable, "-c", _MEMBER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert member.stdout is not None and member.stdout.readline().strip() == "ran"
        lines = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
        assert any("spark-submit" in line or "SparkSubmit" in line for line in lines)  # the driver's JVM is there
        assert not [line for line in lines if secret in line]
    finally:
        member.kill()
        member.wait(10)


_STRANGER = """
from streaming.adapters.spark.session import spark_session
from streaming.api.config import Connection, LocalRuntimeSettings
connection = Connection.load(LocalRuntimeSettings.cluster())
spark_session(connection.spark_settings(app_name="stranger", secret_file=""), LocalRuntimeSettings.cluster())
"""


def test_the_spark_master_refuses_an_application_without_the_clusters_secret(cluster, runtime_settings):
    """Another user of the machine reaches the master's port, but not the secret file: its
    driver's registration is refused (Spark's SASL handshake), and no application of its
    runs; every job of this suite is the counterpart, a driver with the secret."""
    _, connection = cluster
    assert connection.spark_secret_file
    env = {"SPARK_ABS_HOME": str(runtime_settings.home), "PATH": "/usr/bin:/bin", "HOME": str(runtime_settings.home)}
    stranger = subprocess.Popen(
        [sys.executable, "-c", _STRANGER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    said: list[str] = []
    try:
        assert stranger.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("Expected SaslMessage" in line for line in said):
            line = stranger.stdout.readline()
            if not line:
                break
            said.append(line)
    finally:
        stranger.kill()
        stranger.wait(10)
    assert any("Failed to connect to master" in line for line in said), "".join(said[-30:])
    assert any("Expected SaslMessage" in line for line in said), "".join(said[-30:])
    master = urlparse(connection.spark_master)
    ports = json.loads(cluster[0].services.ports_file.read_text())
    assert master.port == ports["spark"]
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['spark_web']}/json/", timeout=10) as page:
        state = json.loads(page.read())
    names = [app["name"] for app in state.get("activeapps", []) + state.get("completedapps", [])]
    assert "stranger" not in names
