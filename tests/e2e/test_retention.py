"""Kafka retention under a running job, on the real runtime (one job run):
a slow stage behind a backlog takes unaligned checkpoints.  Before: the
channel state of a partition whose records are nearly as old as the topic
keeps them is copied into the checkpoint, with a warning, while the other
partition's stays a range.  At the restore: ``DeleteRecords`` removes the
start of a range the newest checkpoint kept; the restore names what is gone
(topic-partition, offset needed, earliest offset), refuses that checkpoint by
name, falls back to the older checkpoint that copied its channel state, and
the committed output is exactly that of a run without failures.  Then
retention past what every checkpoint needs: the restore stops, naming it,
rather than start from the beginning."""

from __future__ import annotations

import collections
import json
import time

import pyarrow.compute as pc
import pytest
from kafka import KafkaProducer

from barriers.messages import ChannelId, CheckpointOptions, InFlightFormat
from streaming.adapters.kafka.admin import create_topic, delete_records, earliest_offsets, end_offsets
from streaming.adapters.objects import open_store
from streaming.adapters.sinks.factory import sink_location
from streaming.adapters.sinks.object_store import read_committed_output
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.api.config import KafkaAccess
from streaming.api.settings import JobSettings
from streaming.engine.job.operations import run_until_caught_up
from streaming.engine.job.runner import JobRunner
from streaming.errors import OffsetsGoneError

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


def _produce(kafka: KafkaAccess, topic: str, partition: int, ids: range, *, timestamp_ms: int | None = None) -> None:
    producer = KafkaProducer(**kafka.client_options(), linger_ms=20)
    for i in ids:
        value = json.dumps({"id": i, "key": f"k{i % 7}"}).encode()
        producer.send(topic, value=value, partition=partition, timestamp_ms=timestamp_ms)
    producer.flush()
    producer.close()


def _until(runner: JobRunner, done, what: str, deadline: float) -> None:
    while not done():
        assert time.monotonic() < deadline, f"{what} did not happen in time"
        runner.step(trigger=False)


def _checkpoint(runner: JobRunner, options: CheckpointOptions, deadline: float) -> int:
    barrier = runner.coordinator.trigger(options)
    record = runner.coordinator.records[barrier.checkpoint_id]
    _until(runner, lambda: record.status != "pending", f"checkpoint {barrier.checkpoint_id}", deadline)
    assert record.status == "completed", record.reason
    return barrier.checkpoint_id


def test_a_range_retention_deleted_is_named_and_the_restore_falls_back(connection, tmp_path, unique_name):
    job = f"rt-{unique_name[-8:]}"
    kafka = connection.kafka
    # retention.ms an hour: far above what makes a task copy all its channel state (10 x (retain x interval + timeout))
    settings = JobSettings(
        store=f"file://{tmp_path}/store",
        mode="unaligned",
        interval_s=1,
        timeout_s=30,
        retain=5,
        max_records_per_batch=100,
    )
    runner = JobRunner("streaming.tools.compare.slow:slow_pipeline?ms_per_record=5", settings, connection, job=job)
    topic = runner.pipeline.ingress[0].topic
    p0, p1 = f"{topic}:0", f"{topic}:1"
    create_topic(kafka, topic, 2, config={"retention.ms": str(HOUR_MS)})
    runner.prepare()
    # partition 0's backlog is 59 minutes old (time retention may take it any moment), partition 1's is new
    _produce(kafka, topic, 0, range(0, 600), timestamp_ms=int(time.time() * 1000) - HOUR_MS + 60_000)
    _produce(kafka, topic, 1, range(100_000, 100_600))
    store = SnapshotStore(open_store(settings.store, connection), job, key=UNSIGNED)
    deadline = time.monotonic() + 240  # a bound for a stuck run (about 70 s on a quiet machine)
    try:
        runner.start()
        _until(runner, lambda: runner.coordinator.all_ready, "the task's start", deadline)
        # checkpoint 1 copies its channel state; checkpoint 2 keeps ranges, but for what retention may delete
        first = _checkpoint(runner, CheckpointOptions.unaligned(InFlightFormat.RECORDS), deadline)
        _produce(kafka, topic, 0, range(600, 900))
        _produce(kafka, topic, 1, range(100_600, 100_900))
        second = _checkpoint(runner, CheckpointOptions.unaligned(), deadline)
        older = store.read_manifest(first).tasks["slow-0"]
        newer = store.read_manifest(second).tasks["slow-0"]
        copied = sorted(p.name for p in newer.channel_parts)

        # before: only partition 0's range was at risk, copied with a warning; partition 1's stays a range
        assert sorted(newer.in_flight) == [p0, p1], newer.in_flight
        assert copied == [p0] and list(newer.metadata["retention_at_risk"]) == [p0], newer.metadata
        start0, end0 = newer.in_flight[p0]
        said = "".join(p.read_text() for p in runner.log_dir.glob("worker-*.log"))
        assert (
            f"slow-0: checkpoint {second}: {p0}: retention (retention.ms {HOUR_MS}) may delete offset {start0} "
            f"before a later checkpoint supersedes this one; copying its channel state [{start0}, {end0}) "
            "into the checkpoint"
        ) in said
        # the newer checkpoint's range on partition 1 starts before where the older one resumes it
        start1 = newer.in_flight[p1][0]
        assert start1 < older.positions[p1], (newer.in_flight, older.positions)

        # retention under the running job: partition 1's records up to and including that range's start
        delete_records(kafka, {ChannelId(topic, 1): start1 + 1})
        assert earliest_offsets(kafka, [ChannelId(topic, 1)]) == {ChannelId(topic, 1): start1 + 1}
        gone = (
            f"task slow-0 needs {p1} from offset {start1} (its channel state starts there), "
            f"Kafka's earliest offset is {start1 + 1}"
        )
        with pytest.raises(OffsetsGoneError, match=rf"checkpoint {second} cannot be restored: offsets gone: ") as named:
            runner.recovery.pick(second)
        assert gone in str(named.value)

        record = runner.restore("records deleted under the job")
        assert record.checkpoint_id == first
        assert [(c, len(p)) for c, p in record.skipped] == [(second, 1)] and gone in record.skipped[0][1][0]

        # checkpoints go on while the restored (copied) channel state is replayed, 5 ms a record:
        # the task is ready before it replays, and the rest of what it copied is the new checkpoint's
        _until(runner, lambda: runner.coordinator.all_ready, "the restored task's start", deadline)
        replaying = runner.coordinator.replaying["slow-0"]
        assert 0 < replaying <= sum(e - s for s, e in older.in_flight.values()), older.in_flight
        during = _checkpoint(runner, CheckpointOptions.unaligned(), deadline)
        assert not runner.coordinator.all_replayed, f"the replay of {replaying} records ended first"
        taken = store.read_manifest(during).tasks["slow-0"]
        # its channel state begins inside what the task was replaying, copied into it
        inside = [c for c, (start, _) in taken.in_flight.items() if start < older.in_flight[c][1]]
        assert inside and set(inside) <= {p.name for p in taken.channel_parts}, (taken.in_flight, older.in_flight)
        run_until_caught_up(runner, max(10.0, deadline - time.monotonic()))
        assert runner.coordinator.all_replayed

        # retention past what every checkpoint needs (one more record, then partition 1 up to its end):
        # the restore stops, naming it, and records no generation (no silent start from the beginning)
        _produce(kafka, topic, 1, range(100_900, 100_901))
        end = end_offsets(kafka, topic, 2)[1]
        delete_records(kafka, {ChannelId(topic, 1): end})
        generation = store.read_job().generation
        with pytest.raises(OffsetsGoneError, match=r"no checkpoint can be restored: checkpoints \d+(, \d+)* need"):
            runner.recovery.pick(None)
        assert store.read_job().generation == generation == 1
    finally:
        runner.close()
        store.close()

    output = read_committed_output(sink_location(settings, job, connection))
    ids = [*range(0, 900), *range(100_000, 100_900)]
    expected = collections.Counter(f"k{i % 7}" for i in ids)
    counts = output.group_by("key").aggregate([("n", "max")])
    assert dict(zip(counts["key"].to_pylist(), counts["n_max"].to_pylist())) == dict(expected)
    # each count committed once: no epoch of the checkpoint given up survived beside its replay
    pairs = list(zip(output["key"].to_pylist(), output["n"].to_pylist()))
    assert len(pairs) == len(set(pairs)), collections.Counter(pairs).most_common(3)
    assert pc.min(output["n"]).as_py() >= 1
