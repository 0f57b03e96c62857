"""Bad input and a failing store on the real runtime: malformed records, an
Arrow batch on an ingress topic, JSON nested past the recursion limit and
forged barriers and copies of a real one appended to internal channels ahead
of their own become dead letters with their reason, a barrier of another
generation is ignored, an unreachable store declines checkpoints while the
job goes on, and a damaged checkpoint is skipped on restore (the runner says
why) in favour of the previous one, with the output still exact."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pyarrow as pa
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from barriers.headers import FORMAT_HEADER
from barriers.messages import Barrier, CancelBarrier, ChannelId, encode
from spark_abs_examples import money
from streaming.adapters.kafka.admin import job_key
from streaming.adapters.kafka.control.events import Ack, Committed, Complete, ControlEvent, Trigger
from streaming.adapters.kafka.control.transport import ControlTopic
from streaming.adapters.kafka.dead_letters import read_dead_letters
from streaming.adapters.objects import open_store
from streaming.adapters.serde.codec import ARROW_FORMAT, ARROW_ON_INGRESS, encode_batches
from streaming.adapters.sinks.factory import sink_location
from streaming.adapters.sinks.object_store import read_committed_output
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.api.settings import JobSettings
from streaming.api.topics import control_topic
from streaming.engine import metrics
from streaming.engine.job.operations import kill_worker, run_until_caught_up
from streaming.engine.job.runner import JobRunner
from streaming.errors import JobFailed

pytestmark = pytest.mark.integration


def _step_until(runner, condition, timeout_s: float, what: str, *, trigger: bool = True) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        runner.step(trigger=trigger)


def _stopped(runner, timeout_s: float, feed=lambda: None) -> str:
    """What the ``JobFailed`` says that stops ``runner``'s job within
    ``timeout_s``, started once its topics are made and ``feed`` wrote its input."""
    try:
        runner.prepare()
        feed()
        runner.start()
        with pytest.raises(JobFailed) as failed:
            _step_until(runner, lambda: False, timeout_s, "the job to stop")
    finally:
        runner.close()
    return str(failed.value)


def _dead_letter_records(connection, job: str) -> list:
    """The job's dead letters, each once: a letter a restore's replay sent again supersedes the first."""
    return read_dead_letters(connection.kafka, job, job_key(connection, job)).letters


def test_bad_records_a_failing_store_and_a_damaged_checkpoint(connection, unique_name, tmp_path, lines):
    job = f"bad-{unique_name[-8:]}"
    store_dir = tmp_path / "store"
    settings = JobSettings(store=f"file://{store_dir}", interval_s=0.7, timeout_s=60, max_records_per_batch=200)
    runner = JobRunner("spark_abs_examples.money:pipeline", settings, connection, job=job)
    topic, partitions = runner.pipeline.ingress[0].topic, runner.pipeline.ingress[0].partitions
    data = money.make_transfers(1800)
    internal = sorted({c for t in runner.pipeline.tasks() if t.stage == "accounts" for c in t.inputs})
    kafka = connection.kafka
    try:
        runner.prepare()
        money.produce_transfers(kafka, topic, data[:400], partitions, end=False)
        producer = KafkaProducer(**kafka.client_options())
        producer.send(topic, value=b"{not json", partition=0)
        producer.send(
            topic,
            value=json.dumps({"id": "x", "source": "a", "target": "b", "amount": "lots", "ts": 1}).encode(),
            partition=1,
        )
        # rows past the ingress schema, marked as a stage's Arrow batch: were they read, the output would be off
        forged = encode_batches(
            pa.table({"id": [10**9], "source": ["a"], "target": ["b"], "amount": [10**6], "ts": [1]})
        )
        producer.send(topic, value=forged[0], headers=[(FORMAT_HEADER, ARROW_FORMAT)], partition=1)
        producer.send(topic, value=b"[" * 100_000, partition=0)  # before: a RecursionError failed the task
        # a transfer between no accounts: each of its legs is given up on by the accounts stage and by
        # the windows stage after it, and each dead letter names this record and carries its value
        nowhere = json.dumps({"id": -1, "source": None, "target": None, "amount": 5, "ts": 1}).encode()
        sent_nowhere = producer.send(topic, value=nowhere, headers=[("trace", b"me")], partition=1).get(timeout=30)
        # another job's barrier, signed with its key; a barrier of this job's, of a generation to come
        elsewhere = job_key(connection, "someone-else").barriers
        foreign = encode(Barrier(1, job="someone-else"), key=elsewhere, channel=ChannelId(topic, 0))
        producer.send(topic, value=b"", headers=foreign, partition=0)
        key = job_key(connection, job).barriers
        ahead = encode(Barrier(99, generation=7, job=job), key=key, channel=ChannelId(topic, 1))
        producer.send(topic, value=b"", headers=ahead, partition=1)
        producer.flush()
        producer.close()
        runner.start()
        _step_until(runner, lambda: runner.coordinator.completed(), 240, "a first checkpoint")

        # a hostile writer, who can write to the job's topics but does not hold its key: a barrier far
        # ahead and a cancellation on the ingress, acks without a snapshot of the next checkpoints and
        # a complete of one to come on the control topic.  Before the job signed them, the barrier
        # alone stopped every checkpoint for good, the acks failed the checkpoints they named, the
        # complete made the sinks commit epochs of checkpoints that had not completed
        done = runner.coordinator.completed()[-1].checkpoint_id
        # mid-stream, a plain producer's records no schema expected: an amount of 5,000 digits, and two
        # transfers whose abs.wm and abs.gen are no numbers.  Before, each failed its task at every restore
        # (the ValueError of int(), ArrowInvalid once restored); read, the two transfers would change the output
        plain = KafkaProducer(**kafka.client_options())
        huge = b'{"id": 2000001, "source": "a", "target": "b", "amount": ' + b"9" * 5000 + b', "ts": 1}'
        unreadable = {
            name: json.dumps({"id": 2000002 + i, "source": "a", "target": "b", "amount": 7, "ts": 1}).encode()
            for i, name in enumerate(("abs.wm", "abs.gen"))
        }
        plain.send(topic, value=huge, partition=0)
        for name, value in unreadable.items():
            plain.send(topic, value=value, headers=[(name, b"zz")], partition=1)
        plain.flush()
        plain.close()
        hostile = KafkaProducer(**kafka.client_options())
        hostile.send(
            topic,
            value=b"",
            headers=encode(Barrier(done + 10_000, runner.generation, job=job), key=UNSIGNED),
            partition=0,
        )
        hostile.send(
            topic,
            value=b"",
            headers=encode(CancelBarrier(done + 1, runner.generation, "", job), key=UNSIGNED),
            partition=1,
        )
        victim = runner.pipeline.tasks()[-1].name
        for checkpoint_id in range(done + 1, done + 20):
            ack = Ack(checkpoint_id=checkpoint_id, task=victim, generation=runner.generation)
            hostile.send(control_topic(job), value=ack.encode(), partition=0)
        complete = Complete(checkpoint_id=done + 500, generation=runner.generation)
        hostile.send(control_topic(job), value=complete.encode(), partition=0)
        hostile.flush()
        hostile.close()

        # the store becomes unusable: checkpoints are declined, processing goes on
        checkpoints = store_dir / job / "checkpoints"
        moved = checkpoints.with_name("checkpoints.moved")
        checkpoints.rename(moved)
        checkpoints.write_text("not a directory")
        before = len(runner.coordinator.completed())

        def declined():
            return [r for r in runner.coordinator.records.values() if "snapshot store failed" in r.reason]

        _step_until(runner, declined, 60, "a checkpoint declined for the store")
        assert declined()[0].status == "aborted" and "not a directory" in declined()[0].reason.lower()
        money.produce_transfers(kafka, topic, data[400:800], partitions, end=False)
        checkpoints.unlink()
        moved.rename(checkpoints)
        _step_until(runner, lambda: len(runner.coordinator.completed()) >= before + 2, 120, "checkpoints again")

        # a writer without the job's key copies barrier m, from an ingress partition and from the trigger
        # event, onto every channel the accounts stage reads, ahead of the barrier the legs stage writes
        # there, with a backlog between.  Before barriers named their channel, each accounts task took
        # the copy and snapshotted there, and the restore of checkpoint m below skipped the backlog as
        # stale: 100 windows wrong.  From here to the restore, only the checkpoints triggered here
        def finished(checkpoint_id: int) -> bool:
            return checkpoint_id in [r.checkpoint_id for r in runner.coordinator.completed()]

        can_trigger = runner.coordinator.coordinator.can_trigger
        _step_until(runner, can_trigger, 60, "no checkpoint pending", trigger=False)
        money.produce_transfers(kafka, topic, data[800:1400], partitions, end=False)
        m = runner.coordinator.trigger().checkpoint_id
        at = ChannelId(topic, 0)
        copies = _copy_barrier_ahead(
            kafka, job, at, runner.coordinator.records[m].ingress_offsets[str(at)], m, internal
        )
        _step_until(runner, lambda: finished(m), 120, "checkpoint m", trigger=False)
        for channel in internal:  # the copy came first, legs' own barrier after records the copy would cut off
            (copy, before_copy), (real, before_real) = _barriers_on(kafka, channel, m)
            assert copy == copies[channel] and real > copy and before_real > before_copy, (channel, copy, real)
        _step_until(runner, can_trigger, 60, "no checkpoint pending", trigger=False)
        newest = runner.coordinator.trigger().checkpoint_id  # of nothing new: damaged below
        _step_until(runner, lambda: finished(newest), 120, "the checkpoint after m", trigger=False)

        # damage the newest complete checkpoint, then lose a worker: the restore skips it, and takes m
        reader = SnapshotStore(open_store(settings.store, connection), job, key=UNSIGNED)
        assert reader.completed()[-1] == newest
        part = next(Path(checkpoints, f"chk-{newest:08d}").glob("accounts-0/state/*.parquet"))
        raw = bytearray(part.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        part.write_bytes(bytes(raw))
        kill_worker(runner, "windows")
        _step_until(runner, lambda: runner.restores, 30, "the restore", trigger=False)
        restore = runner.restores[0]
        assert restore.checkpoint_id == m
        assert restore.skipped and restore.skipped[0][0] == newest
        assert any(f"checkpoint {newest} skipped" in line and "checksum" in line for line in lines), lines

        money.produce_transfers(kafka, topic, data[1400:], partitions, end=True)
        run_until_caught_up(runner, 240)
    finally:
        runner.close()
    output = money.normalise(read_committed_output(sink_location(settings, job, connection)))
    assert output == money.expected_output(data)
    records = _dead_letter_records(connection, job)
    traced = [r for r in records if r.value == nowhere]
    letters = [(dict(r.headers)["spark-abs-reason"].decode(), r.value) for r in records if r.value != nowhere]
    # both legs, in two stages after the one that read the record: its source, offset, value and headers
    assert sorted(dict(r.headers)["spark-abs-reason"].decode().split(":")[-1] for r in traced) == [" null_key"] * 4
    assert {dict(r.headers)["spark-abs-reason"].decode().split(":")[0] for r in traced} == {
        "ApplyLegs",
        "TumblingWindowAggregate",
    }
    for record in traced:
        headers = dict(record.headers)
        assert headers["spark-abs-source"] == f"{topic}:1".encode()
        assert int(headers["spark-abs-source-offset"]) == sent_nowhere.offset
        assert headers["trace"] == b"me"
        assert json.loads(headers["spark-abs-row"])["leg"] in ("debit", "credit")
        assert headers["spark-abs-read-from"].startswith(f"spark-abs.{job}.".encode())
    reasons = {value: reason for reason, value in letters if value}
    assert len(letters) == 10 + len(internal), letters
    assert "ValueError: Exceeds the limit (4300 digits)" in reasons[huge]
    for name, value in unreadable.items():
        assert (
            reasons[value] == f"header {name} is b'zz', not a whole number (decimal digits of a signed 64-bit integer)"
        )
    assert reasons[b"{not json"].startswith("value is not JSON")
    assert reasons[forged[0]] == ARROW_ON_INGRESS
    assert "nested deeper than Python's recursion limit" in reasons[b"[" * 100_000]
    assert [r for v, r in reasons.items() if b"lots" in v][0].startswith("value does not fit the schema")
    # the copies of barrier m: from the ingress partition, written for it; from the trigger, unsigned
    copied = [
        f"rejected control record: written for channel '{at}', read from {c}: a copy, not this channel's"
        if i % 2 == 0
        else "rejected control record: unsigned, but this job signs its barriers"
        for i, c in enumerate(internal)
    ]
    assert sorted(reason for reason, value in letters if not value) == sorted(
        [
            "rejected control record: signature does not match the job's key",
            "rejected control record: unsigned, but this job signs its barriers",
            "rejected control record: unsigned, but this job signs its barriers",
            *copied,
        ]
    )
    worker_logs = "".join(p.read_text(errors="replace") for p in runner.log_dir.glob("worker-*.log"))
    assert "of a generation this task has not reached" in worker_logs
    # the forged events were read, and not acted on: no sink committed through the forged complete
    unsigned = {"job_name": job, "reader": "runner", "reason": "unsigned"}
    assert metrics.REGISTRY.get_sample_value("spark_abs_control_rejected_total", unsigned) == 20
    assert "rejected: unsigned" in worker_logs and "every hundredth is logged from here on" in worker_logs
    control = ControlTopic(kafka, job, job_key(connection, job))
    committed = [e for e in control.wait_for(lambda e: False, 5) if isinstance(e, Committed)]
    control.close()
    assert committed and max(e.checkpoint_id for e in committed) < done + 500


def _copy_barrier_ahead(kafka, job: str, at: ChannelId, offset: int, checkpoint_id: int, onto) -> dict:
    """What a writer to the job's topics without its key can do with barrier
    ``checkpoint_id``: copy the record at ``offset`` of ingress channel ``at``
    onto half the channels ``onto``, and the barrier the trigger event on the
    control topic shows onto the other half, each copy appended at once (ahead
    of the barrier the upstream task writes there).  The offset of each copy."""
    reader = KafkaConsumer(**kafka.client_options(), enable_auto_commit=False)
    try:
        reader.assign([TopicPartition(at.topic, at.partition)])
        reader.seek(TopicPartition(at.topic, at.partition), offset)
        (ingress_copy,) = [r for rs in reader.poll(10_000, max_records=1).values() for r in rs]
        control = TopicPartition(control_topic(job), 0)
        reader.assign([control])
        reader.seek_to_beginning(control)
        shown = None
        deadline = time.monotonic() + 30
        while shown is None and time.monotonic() < deadline:
            for record in (r for rs in reader.poll(1000).values() for r in rs):
                event = ControlEvent.decode(record.value)
                if isinstance(event, Trigger) and event.checkpoint_id == checkpoint_id:
                    shown = event.barrier_headers()
        assert shown is not None, f"no trigger of checkpoint {checkpoint_id} on the control topic"
    finally:
        reader.close()
    writer = KafkaProducer(**kafka.client_options())
    sent = {
        channel: writer.send(
            channel.topic, value=b"", headers=ingress_copy.headers if i % 2 == 0 else shown, partition=channel.partition
        )
        for i, channel in enumerate(onto)
    }
    writer.flush()
    writer.close()
    return {channel: future.get(timeout=30).offset for channel, future in sent.items()}


def _barriers_on(kafka, channel: ChannelId, checkpoint_id: int) -> list[tuple[int, int]]:
    """(offset, data records before it) of every record of ``channel`` that carries barrier ``checkpoint_id``."""
    reader = KafkaConsumer(**kafka.client_options(), enable_auto_commit=False)
    tp = TopicPartition(channel.topic, channel.partition)
    try:
        reader.assign([tp])
        reader.seek_to_beginning(tp)
        end = reader.end_offsets([tp])[tp]
        found, data = [], 0
        while reader.position(tp) < end:
            for record in (r for rs in reader.poll(1000).values() for r in rs):
                headers = dict(record.headers)
                if (
                    headers.get("abs.kind") == b"barrier"
                    and headers.get("abs.checkpoint") == str(checkpoint_id).encode()
                ):
                    found.append((record.offset, data))
                elif "abs.kind" not in headers:
                    data += 1
        return found
    finally:
        reader.close()


def test_an_error_in_the_pipeline_stops_the_job_at_once_with_the_reason(connection, unique_name, tmp_path):
    """Spark code that fails on its input stops its worker with the error;
    the runner gives the job up at once, saying why, rather than restore it
    again and again into the same error."""
    settings = JobSettings(store=f"file://{tmp_path / 'store'}", interval_s=1.0, timeout_s=60)
    runner = JobRunner(
        "support.pipelines:bad_spark_pipeline", settings, connection, job=f"bad-spark-{unique_name[-8:]}"
    )
    said = _stopped(runner, 120)
    assert "stopped on an error in the pipeline, which no restore can fix" in said
    assert "stage clean: its Spark code failed on its input" in said and "nope" in said
    assert runner.restores == []


def test_a_failure_that_repeats_at_one_place_stops_the_job_and_a_restore_skips_its_records(
    connection, unique_name, tmp_path
):
    """A record the stage's code fails on without being its culprit (it
    asks for more memory than there is) fails its task at every restore: the
    runner stops the job after three, naming the task, the channel, the
    offsets and the command that restores past them; run so, the records
    go to the dead letters and the job ends with every other record's output."""
    job = f"pad-{unique_name[-8:]}"
    settings = JobSettings(store=f"file://{tmp_path / 'store'}", interval_s=1.0, timeout_s=60)
    runner = JobRunner("support.pipelines:padding_pipeline", settings, connection, job=job)
    topic = runner.pipeline.ingress[0].topic
    ids = [*range(1, 41), 2**62, *range(41, 81)]

    def feed() -> None:
        producer = KafkaProducer(**connection.kafka.client_options())
        for i in ids:
            producer.send(topic, value=json.dumps({"id": i, "key": f"k{i}"}).encode(), partition=0)
        producer.flush()
        producer.close()

    said = _stopped(runner, 300, feed)
    assert f"task pad-0 failed 3 times in a row on {topic}:0" in said and "MemoryError" in said, said
    assert len(runner.restores) == 2  # the third failure stops the job: no third restore
    restore, skip = re.search(r"--restore (\d+) --skip-records (\S+)", said).groups()
    first, last = (int(n) for n in skip.rpartition(":")[2].split("-"))
    assert first <= ids.index(2**62) <= last, said

    # restored past the records: they are dead letters, each once, and the job goes on
    skipping = dataclasses.replace(settings, skip_records=(skip,))
    runner = JobRunner("support.pipelines:padding_pipeline", skipping, connection, job=job)
    try:
        runner.start(restore=int(restore) or None)
        run_until_caught_up(runner, 240)
    finally:
        runner.close()
    output = read_committed_output(sink_location(settings, job, connection)).to_pylist()
    skipped = set(ids[first : last + 1])
    assert sorted(row["id"] for row in output) == sorted(set(ids) - skipped)
    assert all(row["key"] == f"k{row['id']}".ljust(row["id"], ".")[:12] for row in output)
    letters = _dead_letter_records(connection, job)
    assert sorted(json.loads(r.value)["id"] for r in letters) == sorted(skipped)
    assert {dict(r.headers)["spark-abs-reason"] for r in letters} == {
        f"skipped at a restore: {topic}:0 offsets {first}..{last} (--skip-records)".encode()
    }
