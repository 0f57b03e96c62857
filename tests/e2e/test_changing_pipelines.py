"""End to end on real Kafka, the S3 server and Spark: one job, checkpointed
once, restored into changed pipelines (docs/operations/changing-a-pipeline.md),
``spark_abs_examples.changing.pipeline``, in two runs:

1. ``added`` (clean -> seen -> counts) runs and commits the counts of its events;
2. ``restore --dry-run`` says what restoring ``replaced`` (clean -> audit ->
   counts: seen removed, audit added) would do, and refuses it; the runner
   refuses a ``counts`` whose state schema changed, naming both schemas,
   and ``replaced`` while seen's state may not be dropped; nothing is recorded;
3. ``replaced`` restores with seen's state allowed to go: audit starts
   empty (its state counts only the events after the checkpoint), takes
   seen's place on clean's topic, and the counts go on.

After each run the counts committed are every event's, once: an edge taken
over at the wrong offset, or a kept stage's state lost, shows there."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pyarrow.compute as pc
import pytest
from kafka import KafkaProducer

from streaming.adapters.objects import ensure_bucket, open_store
from streaming.adapters.sinks.factory import sink_location
from streaming.adapters.sinks.object_store import read_committed_output
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.api.config import KafkaAccess
from streaming.api.settings import JobSettings
from streaming.engine.job.operations import run_until_caught_up
from streaming.engine.job.runner import JobRunner, RunOptions
from streaming.engine.restore.changes import AllowDropped
from streaming.errors import PipelineChangeError

pytestmark = pytest.mark.integration

KEYS = 5


def _reference(shape: str) -> str:
    return f"spark_abs_examples.changing:pipeline?shape={shape}"


def _produce(kafka: KafkaAccess, topic: str, ids: range) -> None:
    producer = KafkaProducer(**kafka.client_options(), acks="all", linger_ms=20)
    try:
        for i in ids:
            producer.send(topic, value=json.dumps({"id": i, "key": f"k{i % KEYS}"}).encode(), partition=0)
        producer.flush(60)
    finally:
        producer.close()


def _expected(ids: range) -> dict[str, int]:
    return dict(Counter(f"k{i % KEYS}" for i in ids))


def _dry_run(store: str, job: str, shape: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "streaming.tools.cli", "restore", "--dry-run", "--store", store, "--job", job]
    return subprocess.run([*command, "--pipeline", _reference(shape)], capture_output=True, text=True, timeout=120)


def test_one_checkpoint_restored_into_a_stage_replaced_and_a_changed_state_schema(connection, unique_name):
    ensure_bucket(connection)
    job = f"change-{unique_name[-8:]}"
    store = f"s3://{connection.s3_bucket}/{unique_name}"
    settings = JobSettings(store=store, mode="aligned", interval_s=0.5, timeout_s=60)
    kafka, topic = connection.kafka, f"{job}.events"
    reader = SnapshotStore(open_store(store, connection), job, key=UNSIGNED)

    def runner(shape: str, options: RunOptions | None = None) -> JobRunner:
        return JobRunner(_reference(shape), settings, connection, job=job, options=options)

    def run(job_runner: JobRunner, ids: range):
        """Start (a fresh start, or a restore into the job's pipeline), feed ``ids``, stop once committed."""
        try:
            job_runner.start()
            _produce(kafka, topic, ids)
            return run_until_caught_up(job_runner, 90)
        finally:
            job_runner.close()

    def committed() -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in read_committed_output(sink_location(settings, job, connection)).to_pylist():
            counts[row["key"]] = max(counts.get(row["key"], 0), row["n"])  # counts only grow
        return counts

    def refused(shape: str, options: RunOptions | None = None) -> str:
        job_runner = runner(shape, options)
        try:
            with pytest.raises(PipelineChangeError) as err:
                job_runner.start()
        finally:
            job_runner.close()
        return str(err.value)

    # 1. a pipeline with a stage between clean and counts, checkpointed
    base = run(runner("added"), range(0, 200))
    assert committed() == _expected(range(200))
    generations, checkpoints = reader.read_job().generation, reader.checkpoints()

    # 2. what restoring into changed pipelines would do, and the refusals; nothing recorded
    dry = _dry_run(store, job, "replaced")
    assert dry.returncode == 2, dry.stdout + dry.stderr
    said = " ".join(dry.stdout.split())
    assert "audit added 1 starts with empty state; reads clean where seen stood, with its channel state" in said, said
    assert f"counts inputs changed 1 reads audit from the beginning of spark-abs.{job}.audit.g" in said, said
    assert "seen removed - REFUSED: checkpoint" in said and "--allow-dropped-state seen" in dry.stderr, said
    message = refused("schema")
    assert f"checkpoint {base.checkpoint_id} stored state(key: string, n: int64)" in message, message
    assert "the new operator (KeyedAggregate) snapshots state(key, n, top)" in message, message
    assert "--allow-dropped-state counts" in message, message
    message = refused("replaced")
    assert "stage seen (removed)" in message and "row(s) of state (table state)" in message, message
    assert "--allow-dropped-state seen" in message and "counts" not in message, message
    assert (reader.read_job().generation, reader.checkpoints()) == (generations, checkpoints)

    # 3. seen's state allowed to go: audit, added in its place, starts empty; the counts go on
    job_runner = runner("replaced", RunOptions(allow_dropped=AllowDropped.of(["seen"])))
    last = run(job_runner, range(200, 300))
    (restore,) = job_runner.restores
    assert restore.changed_from == base.checkpoint_id and restore.checkpoint_id > base.checkpoint_id
    changed = reader.read_manifest(restore.checkpoint_id)
    assert changed.metrics["kinds"] == ["changed"] and sorted(changed.tasks) == ["audit-0", "clean-0", "counts-0"]
    audit = reader.load_task(last.checkpoint_id, "audit-0").state["state"]
    assert pc.sum(audit["seen"]).as_py() == 100, audit.to_pylist()  # the events after the checkpoint, no earlier one
    assert committed() == _expected(range(300))
    reader.close()
