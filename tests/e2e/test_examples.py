"""The example pipelines (``examples/``) end to end on real Kafka, the S3
server and Spark: all of them in one job, in aligned mode with full
snapshots and in unaligned mode with incremental ones (and keyed-state rows
spilled past a small memory budget), with the worker
killed mid-run (SIGKILL) and the job restored (from a checkpoint of state
changes linked to a base, when incremental), then killed again in the
commit phase (a checkpoint complete, its sinks' epochs staged and not
committed: the restore commits them); each one's
committed output (Kafka topics, and the clickstream's Delta table read by
Spark's Delta reader) must equal its reference, computed independently in batch
by Spark SQL from the same ingress topics, each row once, with nothing sent to the dead
letters (no row late, none lost)."""

from __future__ import annotations

import threading
import time

import pytest

import spark_abs_examples as examples
from spark_abs_examples import check
from streaming.adapters.kafka.admin import end_offsets
from streaming.adapters.objects import ensure_bucket
from streaming.api.config import KafkaAccess
from streaming.api.settings import JobSettings
from streaming.api.topics import dead_letter_topic
from streaming.engine import faults
from streaming.engine.job.operations import run_until_caught_up
from streaming.engine.job.runner import JobRunner, RunOptions

pytestmark = pytest.mark.integration

MODES = {
    "aligned": {},
    # and keyed-state rows past 16 kB spill to mapped files
    "unaligned-incremental": {"mode": "unaligned", "state_snapshots": "incremental", "state_memory_bytes": 16 << 10},
}
# armed once a checkpoint is complete: the worker dies halfway through this task's next micro-batch
# (the worker runs every task, the Spark SQL stage in front of this one too); the restored
# generation dies when a checkpoint completes, before this Delta sink task commits its epoch
KILLED = "enriched-orders-1"
KILLED_IN_COMMIT = "user-sessions-0"


def _feed(kafka: KafkaAccess, records: list, chunk: int, pause_s: float) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka.client_options(), acks="all", linger_ms=20)
    try:
        for start in range(0, len(records), chunk):
            for topic, partition, value in records[start : start + chunk]:
                producer.send(topic, value=value, partition=partition)
            producer.flush(60)
            time.sleep(pause_s)
    finally:
        producer.close()


@pytest.mark.parametrize("mode", list(MODES))
def test_every_example_survives_a_kill_and_gives_its_spark_sql_reference(
    registry_connection, spark, unique_name, mode, lines, tmp_path
):
    ensure_bucket(registry_connection)
    job = f"ex-{unique_name[-8:]}"
    kafka = registry_connection.kafka
    settings = JobSettings(
        store=f"s3://{registry_connection.s3_bucket}/{unique_name}",
        interval_s=1.0,
        timeout_s=60,
        max_records_per_batch=2_000,
        **MODES[mode],
    )
    fault_file = tmp_path / "faults"
    runner = JobRunner(
        "spark_abs_examples:combined",
        settings,
        registry_connection,
        job=job,
        options=RunOptions(worker_env={faults.FILE_ENV: str(fault_file)}),
    )
    records = examples.combined_records(job)
    deadline = time.monotonic() + 300
    # the input comes as producers send it, a chunk every half second, while the job runs and dies
    feed = threading.Thread(target=_feed, args=(kafka, records, 250, 0.4), daemon=True)
    windows = f"{job}.country-totals"
    try:
        runner.prepare()
        feed.start()
        runner.start()
        # a few checkpoints first: incremental, the one restored holds changes on the first one's base
        while sum(1 for r in runner.checkpoints() if r.completed_at) < 3 and time.monotonic() < deadline:
            runner.step()
        faults.arm(str(fault_file), [f"{KILLED}:mid_batch:*:0", f"{KILLED_IN_COMMIT}:before_sink_commit:*:1"])
        while not runner.restores and time.monotonic() < deadline:
            runner.step()
        # what the first restore read (retention may delete it before the end)
        first = runner.restores[0].checkpoint_id if runner.restores else None
        restored = runner.store.read_manifest(first) if first is not None else None
        while len(runner.restores) < 2 and time.monotonic() < deadline:
            runner.step()
        # before any input ends, windows close: the quiet orders partition and the table hold nothing back
        while check.committed(registry_connection, runner.job, windows).empty and time.monotonic() < deadline:
            for _ in range(20):
                runner.step()
        early = len(check.committed(registry_connection, runner.job, windows))
        feed.join(max(1.0, deadline - time.monotonic()))
        check.produce(kafka, [], end=runner.pipeline)
        run_until_caught_up(runner, max(1.0, deadline - time.monotonic()))
    finally:
        runner.close()
    log = "\n".join(lines[-40:])
    assert early > 0, f"no window was committed before the end of the input\n{log}"
    restores = [(r.generation, r.checkpoint_id > 0) for r in runner.restores]
    assert restores == [(1, True), (2, True)], f"{runner.restores}\n{log}"
    if "incremental" in mode:
        assert restored is not None
        kinds = {task: snapshot.state_kind for task, snapshot in restored.tasks.items()}
        assert "changes" in kinds.values(), f"the restore read no chain: {kinds}"
        last = [r for r in runner.checkpoints() if r.completed_at][-1].checkpoint_id
        spilled = [t.metadata.get("state_spilled_bytes") or 0 for t in runner.store.read_manifest(last).tasks.values()]
        assert max(spilled) > 0, f"no keyed-state rows were spilled past the budget: {spilled}"
    dead = sum(end_offsets(kafka, dead_letter_topic(job), 1).values())
    assert dead == 0, f"{dead} dead letters (late or malformed rows)\n{log}"
    for name in examples.NAMES:
        module = examples.example(name)
        pipeline = module.pipeline(job)
        expected = check.reference(spark, pipeline, module.REFERENCE, kafka)
        output = check.output(spark, pipeline, settings.store, registry_connection)
        assert len(expected) > 10, f"{name}: a reference of {len(expected)} rows proves little"
        assert check.differences(output, expected, module.KEYS) == [], name
