"""The Kafka sink end to end: windows committed in Kafka transactions, a
worker killed after the first checkpoint, and read_committed readers see
every window exactly once."""

from __future__ import annotations

import json
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from streaming.api.settings import JobSettings
from streaming.engine.runner import JobRunner
from streaming.tools import demo

pytestmark = pytest.mark.integration


def _committed(bootstrap: str, topic: str) -> list[dict]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    rows = [json.loads(r.value) for r in consumer]
    consumer.close()
    return rows


def test_kafka_sink_is_exactly_once_across_a_restore(connection, unique_name, tmp_path):
    job = f"ks-{unique_name[-8:]}"
    settings = JobSettings(store=f"file://{tmp_path}/store", interval_s=0.7, max_records_per_batch=200)
    lines: list[str] = []
    runner = JobRunner(
        "streaming.tools.demo:kafka_pipeline",
        settings,
        connection,
        job=job,
        say=lines.append,
        workers={"all": [t.name for t in demo.kafka_pipeline(job).tasks()]},
    )
    topic, partitions = runner.pipeline.ingress[0].topic, runner.pipeline.ingress[0].partitions
    data = demo.make_transfers(1000)
    try:
        runner.prepare()
        demo.produce_transfers(connection.kafka_bootstrap, topic, data[:500], partitions, end=False)
        runner.start()
        deadline = time.monotonic() + 180
        while not any(r.committed for r in runner.coordinator.completed()):
            assert time.monotonic() < deadline, "\n".join(lines)
            runner.step()
        runner.kill_worker("all")
        demo.produce_transfers(connection.kafka_bootstrap, topic, data[500:], partitions, end=True)
        runner.run_until_caught_up(240)
    finally:
        runner.close()
    assert len(runner.restores) == 1
    rows = _committed(connection.kafka_bootstrap, f"{job}.windows")
    assert demo.normalise_rows(rows) == demo.expected_output(data)
