"""The Kafka sink end to end: a runner stopped before its first checkpoint
(the next one restores from the beginning, as generation 1: what generation
0 wrote is stale), windows committed in Kafka transactions, a worker killed
after the first checkpoint, and read_committed readers see every window
exactly once.  A fresh start under the same job name with another store is
refused: Kafka holds the job's earlier run."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from streaming.adapters.kafka_admin import end_offsets
from streaming.api.settings import JobSettings
from streaming.engine.operations import kill_worker, run_until_caught_up
from streaming.engine.runner import JobRunner
from streaming.errors import ConfigError
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


def test_kafka_sink_is_exactly_once_across_a_restore(connection, unique_name, tmp_path, lines):
    job = f"ks-{unique_name[-8:]}"
    settings = JobSettings(store=f"file://{tmp_path}/store", interval_s=0.7, max_records_per_batch=200)

    def job_runner(settings: JobSettings) -> JobRunner:
        return JobRunner(
            "streaming.tools.demo:kafka_pipeline",
            settings,
            connection,
            job=job,
            workers={"all": [t.name for t in demo.kafka_pipeline(job).tasks()]},
        )

    bootstrap = connection.kafka_bootstrap
    runner = job_runner(dataclasses.replace(settings, interval_s=3600))
    topic, partitions = runner.pipeline.ingress[0].topic, runner.pipeline.ingress[0].partitions
    data = demo.make_transfers(1000)
    try:
        runner.prepare()
        demo.produce_transfers(bootstrap, topic, data[:500], partitions, end=False)
        runner.start()
        # generation 0 writes records to every internal topic, then its runner stops before any checkpoint
        deadline = time.monotonic() + 180
        internal = runner.pipeline.internal_topics()
        while not all(sum(end_offsets(bootstrap, t, n).values()) for t, n in internal.items()):
            assert time.monotonic() < deadline, "\n".join(lines)
            runner.step()
    finally:
        runner.close()
    with pytest.raises(ConfigError, match=f"Kafka holds an earlier run of this job .* store file://{tmp_path}/other"):
        job_runner(dataclasses.replace(settings, store=f"file://{tmp_path}/other")).start()

    runner = job_runner(settings)
    try:
        runner.start()
        assert "restoring generation 1 from the beginning (no complete checkpoint) (restart)" in lines
        deadline = time.monotonic() + 180
        while not any(r.committed for r in runner.coordinator.completed()):
            assert time.monotonic() < deadline, "\n".join(lines)
            runner.step()
        kill_worker(runner, "all")
        demo.produce_transfers(bootstrap, topic, data[500:], partitions, end=True)
        run_until_caught_up(runner, 240)
    finally:
        runner.close()
    assert [r.generation for r in runner.restores] == [1, 2]
    rows = _committed(connection.kafka_bootstrap, f"{job}.windows")
    assert demo.normalise_rows(rows) == demo.expected_output(data)
