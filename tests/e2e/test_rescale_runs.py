"""End to end on real Kafka, the S3 server and Spark: the money pipeline runs
with 2 tasks per stage, is rescaled while it runs to 3 tasks per stage and
then to 1 (each a restore from a recent checkpoint), and must commit
exactly the output of a run without failures, with money conserved in
every checkpoint, the rescaled ones too.  An unaligned run rescales from a
checkpoint that holds channel state on the internal topics (it waits,
boundedly, for one), and all of it is routed again by key.  The aligned run's
worker is remote (a `spark-abs worker` process the runner did not start):
each rescale pauses it, then it runs the new task counts in place."""

from __future__ import annotations

import time

import pyarrow.compute as pc
import pytest

from barriers.messages import ChannelId
from spark_abs_examples import money as money_example
from streaming.adapters.kafka.admin import end_offsets
from streaming.adapters.kafka.ranges import read_range
from streaming.adapters.objects import ensure_bucket
from streaming.adapters.serde import codec
from streaming.adapters.sinks.factory import sink_location
from streaming.adapters.sinks.object_store import read_committed_output
from streaming.api.config import KafkaAccess
from streaming.api.settings import JobSettings
from streaming.api.topics import dead_letter_topic
from streaming.engine.job.operations import run_until_caught_up
from streaming.engine.job.runner import RunOptions
from support import jobs

pytestmark = pytest.mark.integration

TO_THREE = {"legs": 3, "accounts": 3, "windows": 3}
TO_ONE = {"legs": 1, "accounts": 1, "windows": 1}
# unaligned: checkpoints looked at, at most, for one with channel state to rescale
SEEK_CHECKPOINTS = 10
# transfers per burst, and while an unaligned rescale waits for channel state (legs then has a backlog)
BURST, SEEK_BURST = 300, 1200


def _channel_state_rows(kafka: KafkaAccess, manifest, internal_topics) -> int:
    """The rows checkpoint ``manifest`` holds as channel state on the internal
    topics (what an upstream task sent before the barrier and its downstream
    task had not processed): what a rescale from it must route again.
    Barriers and watermarks carry no value and are not counted."""
    rows = 0
    for snapshot in manifest.tasks.values():
        for name, (start, end) in snapshot.in_flight.items():
            channel = ChannelId.parse(name)
            if channel.topic in internal_topics and end > start:
                records = read_range(kafka, channel, start, end)
                data = records.filter(pc.greater(pc.fill_null(pc.binary_length(records["value"]), 0), 0))
                rows += codec.decode_records(data, codec.ChannelReading.internal()).table.num_rows
    return rows


def _legs_written(kafka: KafkaAccess, pipeline) -> int:
    """Records written so far to the topic from the legs stage to the accounts stage."""
    topic = pipeline.topic_of("legs")
    return sum(end_offsets(kafka, topic, pipeline.internal_topics()[topic]).values())


@pytest.mark.parametrize(("mode", "remote"), [("aligned", True), ("unaligned", False)], ids=["aligned", "unaligned"])
def test_rescaled_two_to_three_to_one_tasks_per_stage_output_equals_a_failure_free_run(
    connection, unique_name, tmp_path, mode, remote
):
    ensure_bucket(connection)
    job = f"rescale-{unique_name[-8:]}"
    store = f"s3://{connection.s3_bucket}/{unique_name}"
    settings = JobSettings(store=store, mode=mode, interval_s=0.7, timeout_s=60, max_records_per_batch=200)
    pipeline_ref = "spark_abs_examples.money:pipeline?partitions=3"
    money_job = jobs.money_job(
        pipeline_ref,
        settings,
        connection,
        job,
        RunOptions(parallelism={"windows": 2}, remote=remote),  # two tasks in every stage
    )
    worker = jobs.RemoteWorkerProcess(job, pipeline_ref, "all", connection, tmp_path / "worker.log") if remote else None
    runner, money, lines, reader = money_job.runner, money_job.money, money_job.lines, money_job.store
    manifests, in_flight = [], []
    # a prefix is sent: `wanted` transfers, more while a rescale waits for a checkpoint with channel state
    wanted = 6000 if mode == "unaligned" else 2400
    transfers = money_example.make_transfers(wanted + 2 * SEEK_CHECKPOINTS * SEEK_BURST)
    topic, partitions = runner.pipeline.ingress[0].topic, 3
    kafka = connection.kafka
    # rescale after this many checkpoints (unaligned: from the first one then that holds channel state)
    steps = [(TO_THREE, 2), (TO_ONE, 4)]
    looked: list[int] = []  # checkpoints without channel state since the due rescale
    deadline = time.monotonic() + 300
    sent = 0
    try:
        runner.prepare()
        runner.start()
        assert {s.name: s.parallelism for s in runner.pipeline.stages} == {"legs": 2, "accounts": 2, "windows": 2}
        while (steps or sent < wanted) and time.monotonic() < deadline:
            seeking = mode == "unaligned" and bool(steps) and len(money) >= steps[0][1]
            written = _legs_written(kafka, runner.pipeline) if seeking else 0
            burst = transfers[sent : sent + (SEEK_BURST if seeking else BURST)]
            money_example.produce_transfers(kafka, topic, burst, partitions, end=False)
            sent += len(burst)
            # seeking: no barrier before legs works on the burst; its output before the barrier
            # is then what the accounts tasks have not processed yet, their channel state
            while seeking and _legs_written(kafka, runner.pipeline) == written and time.monotonic() < deadline:
                runner.step(trigger=False)
            seen = len(money)
            while len(money) == seen and time.monotonic() < deadline:
                runner.step()
            if not steps or len(money) < steps[0][1]:
                continue
            source = None
            if mode == "unaligned":
                internal = runner.pipeline.internal_topics()
                found = [
                    (m.checkpoint_id, _channel_state_rows(kafka, reader.read_manifest(m.checkpoint_id), internal))
                    for m in money[seen:]
                ]
                looked += [c for c, _ in found]
                with_state = [(c, rows) for c, rows in found if rows]
                if not with_state:
                    assert len(looked) < SEEK_CHECKPOINTS, (
                        f"none of checkpoints {looked} holds channel state on the internal topics to rescale\n"
                        + "\n".join(lines)
                    )
                    continue
                source, rows = with_state[-1]
                in_flight.append(rows)
                looked.clear()
            record = runner.rescale(steps.pop(0)[0], source)
            # the rescaled checkpoint, read before retention may remove it: money conserved too
            manifests.append(reader.read_manifest(record.checkpoint_id))
            money_job.count(record.checkpoint_id)
        assert not steps, f"rescales left undone after 300 s: {steps}; looked at {looked}\n" + "\n".join(lines)
        money_example.produce_transfers(kafka, topic, [], partitions, end=True)
        run_until_caught_up(runner, max(1.0, deadline - time.monotonic()))
    finally:
        runner.close()
        stopped = worker.stop() if worker else None
    log = "\n".join(lines)
    output = money_example.normalise(read_committed_output(sink_location(settings, job, connection)))

    rescales = [r for r in runner.restores if r.rescaled_from is not None]
    assert len(rescales) == 2, log
    assert [r.generation for r in runner.restores] == [1, 2], log
    assert {s.name: s.parallelism for s in runner.pipeline.stages} == TO_ONE
    assert sorted(manifests[0].tasks) == sorted(f"{s}-{i}" for s in TO_THREE for i in range(3))
    assert sorted(manifests[1].tasks) == ["accounts-0", "legs-0", "windows-0"]
    for record, manifest in zip(rescales, manifests):
        assert (manifest.checkpoint_id, manifest.metrics["rescaled_from"]) == (
            record.checkpoint_id,
            record.rescaled_from,
        )
    reader.close()
    if worker is not None:
        said = "\n".join(worker.lines())
        assert said.count("stopped: checkpoint") == 2 and "is being rescaled to" in said, said
        assert "tasks legs-0, legs-1, legs-2, accounts-0, accounts-1, accounts-2, windows-0" in said, said
        assert "tasks legs-0, accounts-0, windows-0 started from checkpoint" in said and stopped == 0, said
    assert all(m.total == 0 for m in money), money
    if mode == "unaligned":
        # each rescale started from a checkpoint with channel state, and routed all of it again
        assert [m.metrics["rerouted_rows"] for m in manifests] == in_flight, log
        assert sum(m.metrics["rerouted_rows"] for m in manifests) > 0, "no channel state was routed again\n" + log
    expected = money_example.expected_output(transfers[:sent])
    assert len(output) == len(expected), log
    assert output == expected
    assert sum(end_offsets(connection.kafka, dead_letter_topic(job), 1).values()) == 0
