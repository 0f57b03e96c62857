"""On the local cluster (three Kafka nodes, replication factor 3; a Spark
standalone master with two workers), started once for this module: the money
pipeline with two tasks per stage runs as a Spark application on the master,
loses a Spark worker and a Kafka broker (both SIGKILLed) while it runs, and
still commits exactly the output of a run without failures, with money
conserved in every checkpoint."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest
from kafka.admin import ConfigResource, ConfigResourceType

from streaming import testing
from streaming.adapters.kafka_admin import admin_client, create_topic, end_offsets
from streaming.adapters.kafka_io import dead_letter_topic_name
from streaming.adapters.objects import ensure_bucket
from streaming.adapters.sinks import read_committed_output, sink_location
from streaming.api.config import Connection, LocalRuntimeSettings
from streaming.api.settings import JobSettings
from streaming.tools import demo

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(runtime_settings: LocalRuntimeSettings) -> Iterator[tuple[object, Connection]]:
    """The local cluster, brought up once; stopped at the end only if this module started it."""
    from streaming.local import LocalRuntime

    runtime = LocalRuntime(
        LocalRuntimeSettings.cluster(runtime_settings.home), progress=lambda m: print(f"[cluster] {m}", flush=True)
    )
    was_running = runtime.status().all_running
    connection = runtime.up()
    yield runtime, connection
    if not was_running:
        runtime.down()


def _applications(runtime) -> list[dict]:
    ports = json.loads((runtime.settings.runtime_dir / "ports.json").read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['spark_web']}/json/", timeout=5) as response:
        state = json.loads(response.read())
    return state["activeapps"] + state["completedapps"]


def test_topics_are_replicated_on_three_brokers(cluster, unique_name):
    _, connection = cluster
    create_topic(connection.kafka_bootstrap, unique_name, 2)
    admin = admin_client(connection.kafka_bootstrap)
    try:
        (described,) = admin.describe_topics([unique_name])
        resource = ConfigResource(ConfigResourceType.TOPIC, unique_name, configs=["min.insync.replicas"])
        configs = admin.describe_configs([resource])
    finally:
        admin.close()
    assert [len(p["replica_nodes"]) for p in described["partitions"]] == [3, 3]
    assert configs["topic"][unique_name]["min.insync.replicas"]["value"] == "2"


def test_money_pipeline_on_the_cluster_survives_a_spark_worker_and_a_broker_killed(cluster, unique_name):
    runtime, connection = cluster
    ensure_bucket(connection)
    job = f"cluster-{unique_name[-8:]}"
    store = f"s3://{connection.s3_bucket}/{unique_name}"
    settings = JobSettings(store=store, interval_s=1.0, timeout_s=90, max_records_per_batch=300)
    money_job = testing.money_job(
        "streaming.tools.demo:pipeline",
        settings,
        connection,
        job,
        parallelism={"windows": 2},  # two tasks a stage
    )
    runner, money, lines, reader = money_job.runner, money_job.money, money_job.lines, money_job.store
    transfers = demo.make_transfers(1800)
    topic = runner.pipeline.ingress[0].topic
    killed: list[str] = []
    deadline = time.monotonic() + 300
    sent = 0
    try:
        runner.prepare()
        runner.start()
        while sent < len(transfers) and time.monotonic() < deadline:
            demo.produce_transfers(connection.kafka_bootstrap, topic, transfers[sent : sent + 300], 2, end=False)
            sent += 300
            seen = len(money)
            while len(money) == seen and time.monotonic() < deadline:
                runner.step()
            if len(money) == 1 and not killed:  # the job runs: a Spark worker dies, then a broker
                assert runtime.stop_service("spark-worker-1", kill=True) is not None
                killed.append("spark-worker-1")
            elif len(money) == 2 and len(killed) == 1:
                assert runtime.stop_service("kafka-2", kill=True) is not None
                killed.append("kafka-2")
        demo.produce_transfers(connection.kafka_bootstrap, topic, [], 2, end=True)
        runner.run_until_caught_up(max(1.0, deadline - time.monotonic()))
        applications = [a for a in _applications(runtime) if a["name"] == f"spark-abs-{job}"]
    finally:
        runner.close()
        runtime.up()  # the killed worker and broker start again
    log = "\n".join(lines)
    print(log)  # what the job said of the losses (pytest -s shows it)
    assert killed == ["spark-worker-1", "kafka-2"], log
    assert applications and all(a["cores"] >= 1 for a in applications), applications
    output = demo.normalise(read_committed_output(sink_location(settings, job, connection)))
    reader.close()
    assert money and all(m.total == 0 for m in money), money
    assert any(m.accounts > 0 for m in money)
    expected = demo.expected_output(transfers[:sent])
    assert len(output) == len(expected), log
    assert output == expected
    assert sum(end_offsets(connection.kafka_bootstrap, dead_letter_topic_name(job), 1).values()) == 0
