"""What aligned and unaligned checkpoints cost under backpressure, on the
real runtime, judged by barrier positions and snapshot contents (never by
wall time): a slow stage with a backlog in front of the barrier, and skewed
channels where one partition is far behind the other."""

from __future__ import annotations

import json
import time

import pyarrow.compute as pc
import pytest
from kafka import KafkaProducer

from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.api.config import KafkaAccess
from streaming.api.settings import JobSettings
from streaming.engine.job.runner import JobRunner
from streaming.testing import LineCollector

pytestmark = pytest.mark.integration


def _produce(kafka: KafkaAccess, topic: str, partition: int, first: int, count: int) -> None:
    producer = KafkaProducer(**kafka.client_options(), linger_ms=20)
    for i in range(first, first + count):
        producer.send(topic, value=json.dumps({"id": i, "key": f"k{i % 7}"}).encode(), partition=partition)
    producer.flush()
    producer.close()


def _checkpoint(connection, tmp_path, job: str, mode: str, before: dict[int, int], after: dict[int, int]):
    """Start the slow job on a backlog (``before`` records per partition),
    trigger one checkpoint when its task runs, produce ``after`` more records
    per partition behind the barrier, and return the checkpoint's barrier
    offsets, the task's snapshot and how many records its state covers."""
    settings = JobSettings(store=f"file://{tmp_path}/store", mode=mode, interval_s=3600, max_records_per_batch=200)
    lines = LineCollector().attach().lines
    runner = JobRunner("streaming.tools.compare.slow:slow_pipeline", settings, connection, job=job)
    topic = runner.pipeline.ingress[0].topic
    try:
        runner.prepare()
        for partition, count in before.items():
            _produce(connection.kafka, topic, partition, partition * 100_000, count)
        runner.start()
        deadline = time.monotonic() + 180
        while not runner.coordinator.all_ready:
            assert time.monotonic() < deadline, "\n".join(lines)
            runner.step(trigger=False)
        barrier = runner.coordinator.trigger()
        for partition, count in after.items():
            _produce(connection.kafka, topic, partition, partition * 100_000 + 50_000, count)
        record = runner.coordinator.records[barrier.checkpoint_id]
        while record.status == "pending":
            assert time.monotonic() < deadline, "\n".join(lines)
            runner.step(trigger=False)
        assert record.status == "completed", record.reason
    finally:
        runner.close()
    store = SnapshotStore(open_store(settings.store, connection), job, key=UNSIGNED)
    manifest = store.read_manifest(barrier.checkpoint_id)
    loaded = store.load_task(barrier.checkpoint_id, "slow-0")
    covered = sum(pc.sum(t["n"]).as_py() or 0 for t in loaded.state.values() if "n" in t.column_names)
    metrics = manifest.metrics["tasks"]["slow-0"]
    store.close()
    return record.ingress_offsets, loaded.snapshot, covered, metrics


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_a_slow_stage_with_a_backlog(connection, tmp_path, unique_name, mode):
    job = f"bp-{unique_name[-8:]}"
    offsets, snapshot, covered, metrics = _checkpoint(
        connection, tmp_path, job, mode, before={0: 1500, 1: 1500}, after={}
    )
    topic = f"{job}.events"
    assert offsets == {f"{topic}:0": 1500, f"{topic}:1": 1500}
    # either way the checkpoint resumes each channel right after its barrier
    assert snapshot.positions == {f"{topic}:0": 1501, f"{topic}:1": 1501}
    if mode == "aligned":
        # the snapshot waited for the whole backlog: it covers every record before the barriers
        assert snapshot.in_flight == {} and covered == 3000
        assert metrics["kind"] == "aligned"
    else:
        # the announcement came first: the snapshot covers what was read by then, the rest is channel state
        starts = {c: r[0] for c, r in snapshot.in_flight.items()}
        assert {c: r[1] for c, r in snapshot.in_flight.items()} == offsets
        assert covered == sum(starts.values()) and covered < 1500
        assert metrics["kind"] == "unaligned" and metrics["in_flight_records_referenced"] == 3000 - covered


@pytest.mark.parametrize("mode", ["aligned", "unaligned", "at-least-once"])
def test_skewed_channels(connection, tmp_path, unique_name, mode):
    job = f"sk-{unique_name[-8:]}"
    offsets, snapshot, covered, metrics = _checkpoint(
        connection, tmp_path, job, mode, before={0: 3000, 1: 20}, after={1: 1000}
    )
    if mode == "aligned":
        # partition 1 delivered its barrier early; what came after it waited for partition 0
        assert metrics["held_bytes_max"] > 0 and covered == 3020
    elif mode == "unaligned":
        assert metrics["held_bytes_max"] == 0 and metrics["kind"] == "unaligned"
    else:
        # nothing waited: records after partition 1's barrier are in the snapshot, and a restore
        # resumes after that barrier, so they would be read twice (the mode's duplicates)
        assert metrics["held_bytes_max"] == 0 and metrics["kind"] == "at_least_once"  # stored by name
        assert covered > 3020 and snapshot.in_flight == {}
