"""End to end on real Kafka, the S3 server and Spark: one job, checkpointed
once, restored into changed pipelines (docs/operations/changing-a-pipeline.md),
``streaming.testing.changing_pipeline``:

1. ``base`` (clean -> counts) runs and commits the counts of its events;
2. ``restore --dry-run`` says what each changed pipeline would do and
   changes nothing; a ``counts`` whose state schema changed is refused by
   the runner too, naming both schemas, and nothing is recorded;
3. ``added`` (clean -> seen -> counts) restores: ``seen`` starts empty (its
   state counts only the events after the checkpoint) and the counts go on;
4. ``base`` again: ``seen`` is removed, refused while its state may not be
   dropped, then allowed; ``counts`` takes its place on clean's topic.

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
from streaming.adapters.sinks import read_committed_output, sink_location
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.settings import JobSettings
from streaming.engine.operations import run_until_caught_up
from streaming.engine.runner import JobRunner
from streaming.engine.topology import AllowDropped
from streaming.errors import PipelineChangeError

pytestmark = pytest.mark.integration

KEYS = 5


def _reference(shape: str) -> str:
    return f"streaming.testing:changing_pipeline?shape={shape}"


def _produce(bootstrap: str, topic: str, ids: range) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
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


def test_one_checkpoint_restored_into_a_stage_added_removed_and_a_changed_state_schema(connection, unique_name):
    ensure_bucket(connection)
    job = f"change-{unique_name[-8:]}"
    store = f"s3://{connection.s3_bucket}/{unique_name}"
    settings = JobSettings(store=store, mode="aligned", interval_s=0.5, timeout_s=60)
    bootstrap, topic = connection.kafka_bootstrap, f"{job}.events"
    reader = SnapshotStore(open_store(store, connection), job)

    def runner(shape: str, **options) -> JobRunner:
        return JobRunner(_reference(shape), settings, connection, job=job, **options)

    def run(job_runner: JobRunner, ids: range):
        """Start (a fresh start, or a restore into the job's pipeline), feed ``ids``, stop once committed."""
        try:
            job_runner.start()
            _produce(bootstrap, topic, ids)
            return run_until_caught_up(job_runner, 90)
        finally:
            job_runner.close()

    def committed() -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in read_committed_output(sink_location(settings, job, connection)).to_pylist():
            counts[row["key"]] = max(counts.get(row["key"], 0), row["n"])  # counts only grow
        return counts

    def refused(shape: str, **options) -> str:
        job_runner = runner(shape, **options)
        try:
            with pytest.raises(PipelineChangeError) as err:
                job_runner.start()
        finally:
            job_runner.close()
        return str(err.value)

    # 1. the base pipeline, checkpointed
    base = run(runner("base"), range(0, 200))
    assert committed() == _expected(range(200))
    generations, checkpoints = reader.read_job().generation, reader.checkpoints()

    # 2. what restores into changed pipelines would do; the changed schema refused, nothing recorded
    added = _dry_run(store, job, "added")
    assert added.returncode == 0, added.stderr
    said = " ".join(added.stdout.split())
    assert "seen added 1 starts with empty state; reads clean where counts stood, with its channel state" in said, said
    assert f"counts inputs changed 1 reads seen from the beginning of spark-abs.{job}.seen.g" in said, said
    schema = _dry_run(store, job, "schema")
    assert schema.returncode == 2, schema.stdout + schema.stderr
    assert "counts state schema changed 1 REFUSED" in " ".join(schema.stdout.split()), schema.stdout
    message = refused("schema")
    assert f"checkpoint {base.checkpoint_id} stored state(key: string, n: int64)" in message, message
    assert "the new operator (KeyedAggregate) snapshots state(key, n, top)" in message, message
    assert "--allow-dropped-state counts" in schema.stderr and "--allow-dropped-state counts" in message
    assert (reader.read_job().generation, reader.checkpoints()) == (generations, checkpoints)

    # 3. a stage added between the two: it starts empty, the counts go on
    job_runner = runner("added")
    last = run(job_runner, range(200, 300))
    (restore,) = job_runner.restores
    assert restore.changed_from == base.checkpoint_id and restore.checkpoint_id > base.checkpoint_id
    changed = reader.read_manifest(restore.checkpoint_id)
    assert changed.metrics["kinds"] == ["changed"] and sorted(changed.tasks) == ["clean-0", "counts-0", "seen-0"]
    seen = reader.load_task(last.checkpoint_id, "seen-0").state["state"]
    assert pc.sum(seen["seen"]).as_py() == 100, seen.to_pylist()  # the events after the checkpoint, no earlier one
    assert committed() == _expected(range(300))

    # 4. the stage removed: refused while its state may not be dropped, then allowed
    message = refused("base")
    assert "stage seen (removed)" in message and "row(s) of state (table state)" in message, message
    assert "--allow-dropped-state seen" in message, message
    job_runner = runner("base", allow_dropped=AllowDropped.of(["seen"]))
    run(job_runner, range(300, 400))
    assert [r.changed_from for r in job_runner.restores] == [last.checkpoint_id]
    assert committed() == _expected(range(400))
    reader.close()
