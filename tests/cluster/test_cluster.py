"""On the local cluster (three Kafka nodes, replication factor 3; a Spark
standalone master with two workers), started once for this module: the money
pipeline with two tasks per stage runs as two remote worker groups (`spark-abs
worker` processes the runner did not start, each a Spark application on the
master, joined through the control topic alone), loses a Spark worker, a
Kafka broker and one worker group's process (all SIGKILLed; a replacement
process takes the group over) while it runs, and still commits exactly the
output of a run without failures, with money conserved in every checkpoint.
When the runner stops, its last lease stops the remote workers' tasks."""

from __future__ import annotations

import json
import signal
import time
import urllib.request

import pytest
from kafka.admin import ConfigResource, ConfigResourceType

from streaming import testing
from streaming.adapters.kafka_admin import admin_client, create_topic, end_offsets
from streaming.adapters.kafka_io import dead_letter_topic_name
from streaming.adapters.objects import ensure_bucket
from streaming.adapters.sinks import read_committed_output, sink_location
from streaming.api.settings import JobSettings
from streaming.engine.operations import run_until_caught_up
from streaming.tools import demo

pytestmark = pytest.mark.integration


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


def test_money_pipeline_on_the_cluster_survives_a_spark_worker_a_broker_and_a_worker_group_killed(
    cluster, unique_name, tmp_path
):
    runtime, connection = cluster
    ensure_bucket(connection)
    job = f"cluster-{unique_name[-8:]}"
    store = f"s3://{connection.s3_bucket}/{unique_name}"
    settings = JobSettings(
        store=store, interval_s=1.0, timeout_s=90, max_records_per_batch=300, heartbeat_timeout_s=8.0
    )
    groups = {"ledger": ["legs-0", "legs-1", "accounts-0", "accounts-1"], "windows": ["windows-0", "windows-1"]}
    money_job = testing.money_job(
        "streaming.tools.demo:pipeline",
        settings,
        connection,
        job,
        parallelism={"windows": 2},  # two tasks a stage
        workers=groups,
        remote=True,  # the runner starts no worker: the test does, as another host would
    )
    runner, money, lines, reader = money_job.runner, money_job.money, money_job.lines, money_job.store
    transfers = demo.make_transfers(1800)
    topic = runner.pipeline.ingress[0].topic
    killed: list[str] = []
    workers = {g: testing.RemoteWorkerProcess(job, g, connection, tmp_path / f"{g}-1.log") for g in groups}
    replacement = None
    deadline = time.monotonic() + 360
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
            elif len(money) == 3 and len(killed) == 2:  # then a worker group's process; another takes over
                workers["windows"].kill()
                killed.append("windows")
                replacement = testing.RemoteWorkerProcess(job, "windows", connection, tmp_path / "windows-2.log")
        demo.produce_transfers(connection.kafka_bootstrap, topic, [], 2, end=True)
        run_until_caught_up(runner, max(1.0, deadline - time.monotonic()))
        applications = [a for a in _applications(runtime) if a["name"] == f"spark-abs-{job}"]
    finally:
        runner.close()  # its last lease tells the remote workers to stop their tasks
        everyone = [*workers.values(), *([replacement] if replacement else [])]
        alive = [w for w in everyone if w.process.poll() is None]
        told_until = time.monotonic() + 30
        while time.monotonic() < told_until and not all(w.said("the job runner stopped") for w in alive):
            time.sleep(0.5)
        told = sorted(w.log_path.name for w in everyone if w.said("stopped: the job runner stopped"))
        for w in everyone:  # all at once: each stops its Spark application
            w.terminate()
        stopped = {w.log_path.name: w.stop() for w in everyone}
        runtime.up()  # the killed worker and broker start again
    log = "\n".join(lines)
    worker_logs = "\n".join(f"--- {w.log_path.name}\n" + "\n".join(w.lines()) for w in everyone)
    print(log, worker_logs, sep="\n")  # what the job and its workers said of the losses (pytest -s shows it)
    assert killed == ["spark-worker-1", "kafka-2", "windows"], log
    assert applications and all(a["cores"] >= 1 for a in applications), applications
    # one restore, for the worker group that died: the broker and the Spark worker cost none
    reasons = [r.reason for r in runner.restores]
    assert len(reasons) == 1 and "worker group windows" in reasons[0], log
    assert replacement is not None and replacement.said("started from checkpoint"), worker_logs
    assert workers["ledger"].said("restored in place from checkpoint"), worker_logs
    assert told == ["ledger-1.log", "windows-2.log"], worker_logs
    assert stopped == {"ledger-1.log": 0, "windows-1.log": -signal.SIGKILL, "windows-2.log": 0}, worker_logs
    output = demo.normalise(read_committed_output(sink_location(settings, job, connection)))
    reader.close()
    assert money and all(m.total == 0 for m in money), money
    assert any(m.accounts > 0 for m in money)
    expected = demo.expected_output(transfers[:sent])
    assert len(output) == len(expected), log
    assert output == expected
    assert sum(end_offsets(connection.kafka_bootstrap, dead_letter_topic_name(job), 1).values()) == 0
