"""The stage task's processing core, fed hand-made micro-batches in the
shape ``ChannelQuery`` hands over, with its I/O recorded: alignment holds a
channel's records, snapshots and barriers go out in the right order, older
generations are skipped, malformed input becomes dead letters."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from task_cases import HEADER_TYPE, RecordedIO, batch, make_task

from barriers.lineage import Lineage
from barriers.messages import UNSIGNED, Barrier, CancelBarrier, ChannelId, CheckpointOptions
from operators import Chain, KeyedAggregate, count, filter_rows, map_batches, sum_
from operators.windows import TumblingWindowAggregate
from streaming.adapters.kafka.control.events import ControlKind, Trigger, announced_barrier
from streaming.adapters.serde import codec
from streaming.adapters.serde.records import BATCH_BEGAN, stamped
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.engine.task.stage_task import StageTask, TaskOptions, TaskStart
from streaming.engine.task.watermarks import watermark_headers
from streaming.errors import ConfigError, TaskError

SCHEMA = pa.schema([("account", pa.string()), ("amount", pa.int64())])


def counting_pipeline(parallelism=1, sink_stage=False):
    stages = [
        Stage(
            "count",
            ("in",),
            lambda: KeyedAggregate("account", {"n": count(), "total": sum_("amount")}),
            key="account",
            sink=Sink() if sink_stage else None,
        )
    ]
    if not sink_stage:
        stages.append(
            Stage(
                "out",
                ("count",),
                lambda: KeyedAggregate("account", {"n": count()}),
                parallelism=parallelism,
                sink=Sink(),
            )
        )
    return Pipeline("job", (Ingress("in", 2, SCHEMA),), tuple(stages))


A, B = ChannelId("in", 0), ChannelId("in", 1)


def test_aligned_barrier_holds_the_early_channel_and_forwards_after_the_snapshot():
    task, io = make_task(counting_pipeline())
    task.process_batch(
        batch(
            ("in", 0, 0, {"account": "x", "amount": 1}),
            ("in", 0, 1, Barrier(1, job="job")),
            ("in", 0, 2, {"account": "x", "amount": 10}),
            ("in", 1, 0, {"account": "y", "amount": 2}),
        )
    )
    assert task.handler.blocked == {A}
    assert [r[1] for r in io.sent] == [{"account": "x", "n": 1, "total": 1}, {"account": "y", "n": 1, "total": 2}]
    assert task.held_bytes > 0
    task.process_batch(batch(("in", 1, 1, Barrier(1, job="job"))))
    task.wait_for_uploads()
    state, positions, in_flight, metadata = io.snapshots[1]
    totals = dict(zip(state["state"]["account"].to_pylist(), state["state"]["total"].to_pylist()))
    assert totals == {"x": 1, "y": 2}  # the held record (10) is after the barrier
    assert positions == {"in:0": 2, "in:1": 2} and in_flight == {} and metadata["kind"] == "aligned"
    barrier_at = io.log.index(("barrier", ("spark-abs.job.count:0",)))
    assert io.log[barrier_at - 1] == ("send", "spark-abs.job.count:0")  # output before the barrier
    assert io.sent[-1][1] == {"account": "x", "n": 2, "total": 11}  # released after it
    assert io.log.index(("send", "spark-abs.job.count:0"), barrier_at) > barrier_at
    kinds = [e.kind for e in io.events]
    assert kinds == ["announce", "ack"]
    assert io.events[0].offsets == {"spark-abs.job.count:0": 100}


def test_output_carries_the_generation_and_routes_by_key():
    task, io = make_task(counting_pipeline(parallelism=3), start=TaskStart(generation=4))
    task.process_batch(batch(*[("in", 0, i, {"account": f"a{i}", "amount": i}) for i in range(12)]))
    assert {headers["abs.gen"] for _, _, headers in io.sent} == {b"4"}
    by_channel = {}
    for channel, row, _ in io.sent:
        by_channel.setdefault(row["account"], set()).add(channel)
    assert all(len(channels) == 1 for channels in by_channel.values())
    assert len({c for channels in by_channel.values() for c in channels}) > 1


def test_records_of_an_older_generation_on_internal_topics_are_skipped():
    pipeline = counting_pipeline()
    channel = ChannelId("spark-abs.job.count", 0)
    # generation 2 restored a checkpoint whose barrier on the channel is at 4; the range [3, 4) is channel state
    lineage = Lineage().after_restore(2, {channel: 5})
    task, io = make_task(
        pipeline,
        "out-0",
        start=TaskStart(generation=2, checkpoint_id=3, positions={channel: 3}, lineage=lineage),
        sink=True,
    )
    topic = "spark-abs.job.count"
    task.process_batch(
        batch(
            (topic, 0, 3, {"account": "y"}, 1),  # older, but before the barrier: replayed
            (topic, 0, 5, {"account": "x"}, 1),
            (topic, 0, 6, Barrier(4, 1, job="job")),
            (topic, 0, 7, {"account": "x"}, 2),
            (topic, 0, 8, Barrier(4, 2, job="job")),
        )
    )
    assert task.counters["skipped_older_generation"] == 1
    assert task.counters["ignored_stale_generation"] == 1
    task.wait_for_uploads()
    assert sorted(io.staged[4].to_pylist(), key=str) == [{"account": "x", "n": 1}, {"account": "y", "n": 1}]


def test_malformed_records_and_forged_barriers_become_dead_letters_with_reasons():
    task, io = make_task(counting_pipeline())
    forged = Barrier(1, job="another-job")
    task.process_batch(
        batch(
            ("in", 0, 0, b"{oops"),
            ("in", 0, 1, {"account": "x", "amount": "many"}),
            ("in", 0, 2, forged),
            ("in", 0, 3, {"account": "x", "amount": 3}),
        )
    )
    reasons = [r for _, _, r in io.dead]
    assert len(reasons) == 3
    assert "not JSON" in reasons[0] and "does not fit the schema" in reasons[1]
    assert "rejected control record: belongs to job 'another-job'" in reasons[2]
    assert io.sent[-1][1]["total"] == 3
    assert task.handler.pending == () and task.handler.position(A) == 4


def test_a_dead_letter_names_its_generation_and_the_newest_snapshot_its_task_took():
    # what a restore to that snapshot or an older one reads again, and so sends again
    task, io = make_task(counting_pipeline(), start=TaskStart(generation=2, checkpoint_id=5))
    task.process_batch(
        batch(
            ("in", 0, 0, b"{oops"),
            ("in", 0, 1, Barrier(6, 2, job="job")),
            ("in", 1, 0, b"{while aligning"),  # before barrier 6 on its channel: in checkpoint 6
            ("in", 1, 1, Barrier(6, 2, job="job")),
            ("in", 0, 2, b"{after"),
        )
    )
    notes = [
        (letter["notes"]["spark-abs-generation"], letter["notes"]["spark-abs-after-checkpoint"])
        for letter in io.letters
    ]
    assert notes == [(b"2", b"5"), (b"2", b"5"), (b"2", b"6")]
    fresh, io = make_task(counting_pipeline())
    fresh.process_batch(batch(("in", 0, 0, b"{oops")))
    assert io.letters[0]["notes"] == {"spark-abs-generation": b"0", "spark-abs-after-checkpoint": b"0"}


def test_records_a_plain_producer_can_write_are_dead_letters_and_the_task_goes_on():
    """What one malformed record from any producer did to a job (a task
    failing on every restore): an amount of 5,000 digits, ``abs.wm: zz`` and
    ``abs.gen: zz``.  Each is one dead letter naming why; the records around
    them are counted; a task of a later generation decides the same."""
    for generation in (0, 2):
        task, io = make_task(counting_pipeline(), start=TaskStart(generation=generation))
        task.process_batch(
            batch(
                ("in", 0, 0, {"account": "x", "amount": 1}),
                ("in", 0, 1, b'{"account": "x", "amount": ' + b"9" * 5000 + b"}"),
                ("in", 0, 2, {"account": "x", "amount": 2}, 0, {"abs.wm": b"zz"}),
                ("in", 0, 3, {"account": "x", "amount": 4}, "zz"),
                ("in", 0, 4, {"account": "x", "amount": 8}),
            )
        )
        reasons = {offset: reason for _, offset, reason in io.dead}
        assert sorted(reasons) == [1, 2, 3], generation
        assert "ValueError: Exceeds the limit (4300 digits)" in reasons[1]
        assert reasons[2].startswith("header abs.wm is b'zz', not a whole number")
        assert reasons[3].startswith("header abs.gen is b'zz', not a whole number")
        assert io.sent[-1][1]["total"] == 9 and task.handler.position(A) == 5
        assert task.counters["dead_letters"] == 3


def test_an_ingress_channel_takes_no_arrow_batch_and_an_internal_one_rejects_a_bad_batch_alone():
    """The task reads a channel as the pipeline declares it: on ingress topic
    ``in`` a record marked ``abs.fmt: arrow`` is a dead letter, not rows; on
    the internal topic from ``count`` a batch over the cap, or of columns that
    conflict with the others', is a dead letter alone."""
    arrow = {"abs.fmt": b"arrow"}
    forged = codec.encode_batches(pa.table({"account": ["x"], "amount": [10**9]}))[0]
    task, io = make_task(counting_pipeline())
    task.process_batch(batch(("in", 0, 0, forged, 0, arrow), ("in", 0, 1, {"account": "x", "amount": 3})))
    assert io.dead == [("in:0", 0, codec.ARROW_ON_INGRESS)] and io.sent[-1][1]["total"] == 3

    internal = counting_pipeline().topic_of("count")
    good = codec.encode_batches(pa.table({"account": ["x", "y"], "n": [1, 1]}))[0]
    conflicting = codec.encode_batches(pa.table({"account": ["x"], "n": ["one"]}))[0]
    large = codec.encode_batches(pa.table({"account": ["z"] * 100_000, "n": [1] * 100_000}))[0]
    task, io = make_task(counting_pipeline(), name="out-0", sink=True, max_decoded_bytes=1 << 20)
    task.process_batch(batch(*((internal, 0, i, v, 0, arrow) for i, v in enumerate([good, conflicting, large, good]))))
    reasons = {offset: reason for _, offset, reason in io.dead}
    assert sorted(reasons) == [1, 2] and "do not fit the other records' columns" in reasons[1]
    assert f"over the cap of {1 << 20}" in reasons[2]
    assert task.counters["records"] == 4
    assert sorted(pa.concat_tables(task.output.epoch_rows).to_pylist(), key=str) == [
        {"account": "x", "n": 2},
        {"account": "y", "n": 2},
    ]


def test_a_retried_batch_is_not_processed_twice():
    task, io = make_task(counting_pipeline())
    records = batch(("in", 0, 0, {"account": "x", "amount": 1}), ("in", 0, 1, {"account": "x", "amount": 1}))
    task.process_batch(records)
    task.process_batch(records)
    assert task.counters["records"] == 2


def test_sink_epochs_close_at_the_snapshot_and_an_aborted_epoch_moves_to_the_next():
    task, io = make_task(counting_pipeline(sink_stage=True), sink=True)
    task.process_batch(
        batch(
            ("in", 0, 0, {"account": "x", "amount": 1}),
            ("in", 0, 1, Barrier(1, job="job")),
            ("in", 1, 0, {"account": "y", "amount": 2}),
            ("in", 1, 1, CancelBarrier(1, job="job", reason="test")),
        )
    )
    task.process_batch(batch(("in", 0, 2, Barrier(2, job="job")), ("in", 1, 2, Barrier(2, job="job"))))
    task.wait_for_uploads()
    assert 1 not in io.staged
    assert sorted(io.staged[2]["account"].to_pylist()) == ["x", "y"]
    assert [e.kind for e in io.events] == ["decline", "ack"]


def test_windows_close_on_the_minimum_watermark_over_channels():
    def windows():
        return TumblingWindowAggregate("account", "ts", 100, {"amount": sum_("amount")})

    schema = pa.schema([("account", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])
    pipeline = Pipeline(
        "job", (Ingress("in", 2, schema, event_time="ts"),), (Stage("w", ("in",), windows, sink=Sink()),)
    )
    task, io = make_task(pipeline, "w-0", sink=True)
    task.process_batch(
        batch(
            ("in", 0, 0, {"account": "x", "amount": 1, "ts": 10}),
            ("in", 0, 1, {"account": "x", "amount": 2, "ts": 250}),
        )
    )
    assert task.output.epoch_rows == []  # channel 1 has not spoken: no window may close
    task.process_batch(batch(("in", 1, 0, {"account": "x", "amount": 5, "ts": 120})))
    closed = [row for table in task.output.epoch_rows for row in table.to_pylist()]
    assert [(r["window_start"], r["amount"]) for r in closed] == [(0, 1)]


def test_watermarks_travel_downstream_in_headers_and_watermark_records():
    schema = pa.schema([("account", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])

    def windows():
        return TumblingWindowAggregate("account", "ts", 100, {"amount": sum_("amount")})

    pipeline = Pipeline(
        "job",
        (Ingress("in", 1, schema, event_time="ts"),),
        (
            Stage("pass", ("in",), lambda: filter_rows(lambda t: pc.greater(t["amount"], -1))),
            Stage("out", ("pass",), windows, sink=Sink()),
        ),
    )
    task, io = make_task(pipeline, "pass-0")
    task.process_batch(
        batch(
            ("in", 0, 0, {"account": "x", "amount": 1, "ts": 10}), ("in", 0, 1, {"account": "x", "amount": 2, "ts": 20})
        )
    )
    task.process_batch(batch(("in", 0, 2, {"account": "x", "amount": 4, "ts": 130})))
    marks = [headers.get("abs.wm") for _, _, headers in io.sent]
    assert marks == [None, None, b"20"]  # never newer than the record it rides on
    out = ChannelId("spark-abs.job.pass", 0)
    assert io.watermarks == [(out, 20), (out, 130)]  # once per batch, when it moved

    downstream, down_io = make_task(pipeline, "out-0", sink=True)
    topic = "spark-abs.job.pass"
    rows = [(topic, 0, i, value, 0, headers) for i, (_, value, headers) in enumerate(io.records)]
    downstream.process_batch(batch(*rows))
    assert downstream.watermark == 20 and downstream.output.epoch_rows == []
    downstream.process_batch(batch((topic, 0, 3, {"account": "x"}, 0)))
    assert [r for _, _, r in down_io.dead] == ["TumblingWindowAggregate: input has no column 'ts' (columns: account)"]
    end = batch((topic, 0, 4, b""))
    end = end.set_column(
        end.schema.get_field_index("headers"),
        "headers",
        pa.array([[{"key": k, "value": v} for k, v in watermark_headers(10**6, 0)]], HEADER_TYPE),
    )
    downstream.process_batch(end)
    closed = [(r["window_start"], r["amount"]) for t in downstream.output.epoch_rows for r in t.to_pylist()]
    assert closed == [(0, 3), (100, 4)]


def test_copied_channel_state_is_replayed_before_anything_the_query_reads():
    pipeline = counting_pipeline(sink_stage=True)
    copied = batch(("in", 0, 3, {"account": "x", "amount": 5}), ("in", 0, 4, {"account": "x", "amount": 6}))
    task, io = make_task(
        pipeline, sink=True, start=TaskStart(generation=1, checkpoint_id=2, positions={A: 3, B: 0}, replay={A: copied})
    )
    # handed over once the task runs, so that it can be ready (and checkpoint) first
    assert task.replay_records == 2 and task.handler.position(A) == 3
    task.process_batch(batch(("in", 0, 6, {"account": "x", "amount": 7})))  # the query resumes after the barrier
    assert task.counters["replayed_in_flight"] == 2 and task.handler.position(A) == 7
    rows = [r for t in task.output.epoch_rows for r in t.to_pylist()]
    assert rows[-1] == {"account": "x", "n": 3, "total": 18}
    assert [e.records for e in io.events if e.kind is ControlKind.REPLAYED] == [2]


def test_copied_channel_state_is_replayed_on_the_tasks_thread_without_a_batch():
    pipeline = counting_pipeline(sink_stage=True)
    copied = batch(*[("in", 0, o, {"account": "x", "amount": 1}) for o in range(3, 9)])
    start = TaskStart(generation=1, checkpoint_id=2, positions={A: 3, B: 0}, replay={A: copied})
    task, io = make_task(pipeline, sink=True, start=start, replay_run_records=4)
    assert task.replay_run()  # one run of 4
    assert task.handler.position(A) == 7 and not [e for e in io.events if e.kind is ControlKind.REPLAYED]
    task.start_replay()  # the rest, on a thread of the task's own (the worker starts it once the task is ready)
    task.wait_for_replay()
    assert task.handler.position(A) == 9 and [e.records for e in io.events if e.kind is ControlKind.REPLAYED] == [6]
    assert not task.replay_run() and task.replay_error is None


def test_a_replay_that_failed_stops_the_task():
    pipeline = counting_pipeline(sink_stage=True)
    copied = batch(*[("in", 0, o, {"account": "x", "amount": 1}) for o in range(3, 9)])
    start = TaskStart(generation=1, checkpoint_id=2, positions={A: 3, B: 0}, replay={A: copied})
    task, io = make_task(pipeline, sink=True, start=start)
    task.io.prepare = lambda table: (_ for _ in ()).throw(ConfigError("the stage's Spark code failed"))
    task.start_replay()
    task.wait_for_replay()
    assert isinstance(task.replay_error, ConfigError)  # the worker stops on it (a pipeline error)
    with pytest.raises(TaskError, match="the replay of its channel state failed"):
        task.process_batch(batch(("in", 0, 10, {"account": "x", "amount": 1})))


def test_a_checkpoint_completes_during_the_replay_of_copied_channel_state_and_restores_exactly():
    """Restored from checkpoint 2 with channel state [3, 10) of in:0 copied
    (its barrier at 10), the task has replayed two records when unaligned
    checkpoint 3 is announced (its barrier at 20): the snapshot is taken and
    acknowledged at once, its channel state the five copied records not yet
    processed and then Kafka's [11, 20), from where the query resumes.  A restore from it gives what the
    run without that restore gives."""
    pipeline = counting_pipeline()
    copied = batch(*[("in", 0, o, {"account": "x", "amount": o}) for o in range(3, 10)])
    kafka = {o: ("in", 0, o, {"account": "x", "amount": o}) for o in range(11, 20)}
    kafka[10] = ("in", 0, 10, Barrier(2, job="job", options=CheckpointOptions.unaligned()))
    reads = []

    def read_range(channel, start, end):
        reads.append((str(channel), start, end))
        return batch(*[kafka[o] for o in range(start, end)])

    start = TaskStart(generation=1, checkpoint_id=2, positions={A: 3, B: 0}, replay={A: copied}, resume={A: 11})
    task, io = make_task(pipeline, start=start, replay_run_records=2)
    task.io.read_range = read_range
    assert task.replay_run()  # offsets 3 and 4
    barrier = Barrier(3, generation=1, job="job", options=CheckpointOptions.unaligned())
    announced = {"in:0": 20, "in:1": 0}
    task.on_control(Trigger(checkpoint_id=3, generation=1, barrier=announced_barrier(barrier), offsets=announced))
    task.tick()  # the announcement: the snapshot
    task.start_replay()  # the rest of the replay
    task.wait_for_uploads()
    task.wait_for_replay()
    assert [e.checkpoint_id for e in io.events if e.kind is ControlKind.ACK] == [3]
    assert [e.records for e in io.events if e.kind is ControlKind.REPLAYED] == [7]
    state, positions, in_flight, _ = io.snapshots[3]
    assert state["state"]["total"].to_pylist() == [3 + 4]
    assert in_flight == {"in:0": (5, 20)} and positions == {"in:0": 21, "in:1": 1}
    assert reads == [("in:0", 11, 20)]  # the copied records came from memory: Kafka may have lost them
    assert io.copied["in:0"]["offset"].to_pylist() == [*range(5, 10), *range(11, 20)]

    # the run goes on: the query's records and barrier 3
    task.process_batch(batch(*[kafka[o] for o in range(11, 20)], ("in", 0, 20, barrier)))
    unbroken = [r for _, r, _ in io.sent][-1]
    assert unbroken == {"account": "x", "n": 16, "total": sum(range(3, 10)) + sum(range(11, 20))}

    # a restore from checkpoint 3 replays what it copied, with the same result
    restored = TaskStart(
        generation=2,
        checkpoint_id=3,
        positions={A: 5, B: 0},
        state=state,
        replay={A: io.copied["in:0"]},
        resume={A: 21},
    )
    again, again_io = make_task(pipeline, start=restored)
    again.start_replay()
    again.wait_for_replay()
    assert again.handler.position(A) == 20 and [r for _, r, _ in again_io.sent][-1] == unbroken


def test_a_restored_task_says_when_its_channel_state_ranges_are_replayed():
    pipeline = counting_pipeline(sink_stage=True)
    start = TaskStart(generation=1, checkpoint_id=2, positions={A: 3, B: 0}, replay_until={A: 6, B: 0})
    task, io = make_task(pipeline, sink=True, start=start)
    assert task.replay_records == 3  # in:0 [3, 6); in:1 has nothing to replay
    task.process_batch(batch(*[("in", 0, i, {"account": "x", "amount": 1}) for i in (3, 4)]))
    assert not [e for e in io.events if e.kind is ControlKind.REPLAYED]
    task.process_batch(batch(("in", 0, 5, {"account": "x", "amount": 1}), ("in", 0, 6, {"account": "x", "amount": 1})))
    replayed = [e for e in io.events if e.kind is ControlKind.REPLAYED]
    assert len(replayed) == 1 and replayed[0].records == 3 and replayed[0].checkpoint_id == 2
    task.process_batch(batch(("in", 0, 7, {"account": "x", "amount": 1})))
    assert len([e for e in io.events if e.kind is ControlKind.REPLAYED]) == 1


def test_a_channel_state_range_that_ends_in_barriers_is_replayed_when_they_are_read():
    # under backpressure two barriers can follow each other with no data between them
    pipeline = counting_pipeline(sink_stage=True)
    start = TaskStart(generation=1, checkpoint_id=2, positions={A: 3, B: 0}, replay_until={A: 5})
    task, io = make_task(pipeline, sink=True, start=start)
    old_barrier = Barrier(1, generation=0, job="job")
    task.process_batch(batch(("in", 0, 3, {"account": "x", "amount": 1}), ("in", 0, 4, old_barrier)))
    assert [e.records for e in io.events if e.kind is ControlKind.REPLAYED] == [2]


def test_an_announcement_during_a_large_batch_is_taken_between_its_segments():
    """An unaligned checkpoint announced while a micro-batch is being processed
    starts after the segment in hand, not after the whole batch: the snapshot
    holds the first segment's records and the rest of the batch is channel state."""
    task, io = make_task(counting_pipeline(), max_segment_records=100)
    barrier = Barrier(1, job="job", options=CheckpointOptions.unaligned())
    event = Trigger(
        checkpoint_id=1,
        generation=0,
        barrier=announced_barrier(barrier),
        offsets={"in:0": 1000, "in:1": 0},
    )
    sent_before = []

    def announce_once(*args):
        if not sent_before:
            # the control topic's thread, while the processing thread holds the task
            thread = threading.Thread(target=task.on_control, args=(event,))
            thread.start()
            thread.join()
            assert task.handler.pending == ()  # queued: the segment in hand finishes first
        sent_before.append(args)

    recorded_send = io.io().send
    task.io.send = lambda *args: (announce_once(*args), recorded_send(*args))
    task.process_batch(batch(*[("in", 0, i, {"account": "x", "amount": 1}) for i in range(300)]))
    task.wait_for_uploads()
    state, positions, in_flight, metadata = io.snapshots[1]
    assert state["state"]["total"].to_pylist() == [100]  # one segment of 100 records, then the snapshot
    # records [100, 1000) of in:0 are channel state; the task resumes after the barrier
    assert in_flight == {"in:0": (100, 1000)} and positions == {"in:0": 1001, "in:1": 1}
    assert task.handler.position(A) == 300  # the batch went on after the snapshot


def test_a_slow_operator_gets_runs_of_its_time_budget_so_an_announcement_waits_one_run():
    """With a 40 ms budget and an operator that takes 10 ms per record (on the
    task's clock), a task learns the cost on its first run and takes runs of
    4 records after it: an unaligned checkpoint announced during a run starts
    when that run ends, and the rest of the batch is channel state."""
    now = [0.0]
    runs = []

    def slow(table):
        runs.append(table.num_rows)
        now[0] += 0.010 * table.num_rows
        if len(runs) == 3:  # the control topic's thread announces a checkpoint during the third run
            thread = threading.Thread(target=task.on_control, args=(event,))
            thread.start()
            thread.join()
        return table

    pipeline = Pipeline(
        "job",
        (Ingress("in", 2, SCHEMA),),
        (
            Stage(
                "count",
                ("in",),
                lambda: Chain(map_batches(slow, name="slow"), KeyedAggregate("account", {"total": sum_("amount")})),
                key="account",
                sink=Sink(),
            ),
        ),
    )
    task, io = make_task(pipeline, sink=True, segment_ms=40, clock=lambda: now[0])
    barrier = Barrier(1, job="job", options=CheckpointOptions.unaligned())
    event = Trigger(
        checkpoint_id=1, generation=0, barrier=announced_barrier(barrier), offsets={"in:0": 2000, "in:1": 0}
    )
    task.process_batch(batch(*[("in", 0, i, {"account": "x", "amount": 1}) for i in range(1020)]))
    task.wait_for_uploads()
    assert runs[:6] == [16, 4, 4, 4, 4, 4]  # the first run before anything was measured, then 40 ms each
    assert sum(runs) == 1020 and max(runs[1:]) <= 8  # (a run of twice the size now and then, to learn from)
    state, positions, in_flight, _ = io.snapshots[1]
    assert state["1.state"]["total"].to_pylist() == [24]  # the run in hand when it was announced, then the snapshot
    assert in_flight == {"in:0": (24, 2000)}


def test_held_records_past_the_memory_budget_are_read_back_from_kafka_when_released():
    recorded = RecordedIO()
    held = batch(*[("in", 0, i, {"account": "x", "amount": 1}) for i in range(1, 400)])
    reads = []

    def read_range(channel, start, end):
        reads.append((str(channel), start, end))
        offsets = held["offset"]
        return held.filter(pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))

    io = recorded.io()
    io.read_range = read_range
    budget = int(held.slice(0, 50).nbytes * 2.5)  # two runs of 50 records fit
    task = StageTask(
        counting_pipeline(),
        counting_pipeline().task("count-0"),
        io,
        options=TaskOptions(max_segment_records=50, held_memory_bytes=budget, job_key=UNSIGNED),
    )
    task.recover()
    task.process_batch(batch(("in", 0, 0, Barrier(1, job="job"))))
    task.process_batch(held)  # all of in:0 is held: channel in:1 has not passed barrier 1
    assert task.handler.blocked == {A} and task.held_bytes > budget
    in_memory = [s.first_offset for s in task.gate.queue(A) if not s.spilled]
    assert in_memory == [1, 51] and task.counters["spilled_segments"] == 6
    task.process_batch(batch(("in", 1, 0, Barrier(1, job="job"))))  # aligned: in:0 released
    assert task.handler.blocked == frozenset() and task.handler.position(A) == 400
    assert reads[0] == ("in:0", 101, 151) and reads[-1] == ("in:0", 351, 400)  # the newest runs were let go
    assert task.counters["read_back_segments"] == len(reads)
    totals = [r[1]["total"] for r in recorded.sent]
    assert totals[-1] == 399  # every held record counted once, in order


@pytest.mark.parametrize("failing", ["staging", "channel state copy"])
def test_a_sink_epoch_whose_upload_failed_is_staged_with_the_next_one(failing, monkeypatch):
    """Whatever fails in checkpoint 1's upload, before its epoch is staged (the
    staging itself; the copy of its channel state from Kafka, which comes
    first), its output goes with epoch 2 instead of being lost."""
    task, io = make_task(counting_pipeline(sink_stage=True), sink=True)
    failures = iter([OSError("the store is down")])

    def stage(epoch, table):
        if epoch == 1 and failing == "staging":
            raise next(failures)
        io.staged[epoch] = table

    copy = task.controller.uploader._copy_in_flight

    def copy_in_flight(checkpoint, at_risk, *more):
        if checkpoint.checkpoint_id == 1 and failing == "channel state copy":
            raise next(failures)
        return copy(checkpoint, at_risk, *more)

    monkeypatch.setattr(task.controller.uploader, "_copy_in_flight", copy_in_flight)
    io_stage = task.io.stage_epoch
    task.io.stage_epoch = stage
    try:
        task.process_batch(
            batch(
                ("in", 0, 0, {"account": "x", "amount": 1}),
                ("in", 1, 0, {"account": "y", "amount": 2}),
                ("in", 0, 1, Barrier(1, job="job")),
                ("in", 1, 1, Barrier(1, job="job")),
            )
        )
        task.wait_for_uploads()
        assert io.staged == {} and [e.kind for e in io.events] == ["decline"]
        assert "the store is down" in io.events[0].detail
        task.process_batch(
            batch(
                ("in", 0, 2, {"account": "z", "amount": 3}),
                ("in", 0, 3, Barrier(2, job="job")),
                ("in", 1, 2, Barrier(2, job="job")),
            )
        )
        task.wait_for_uploads()
    finally:
        task.io.stage_epoch = io_stage
    # epoch 1's output (x, y) went with epoch 2's (z): checkpoint 2 cannot complete without it
    assert sorted(io.staged[2]["account"].to_pylist()) == ["x", "y", "z"]
    assert [e.kind for e in io.events] == ["decline", "ack"]


def test_a_checkpoint_records_the_path_of_its_first_barrier_through_the_task():
    """Seconds from the trigger: the first barrier appended to its channel
    (its Kafka timestamp), the Spark micro-batch carrying it began, the task
    received that batch, the barrier forwarded, the ack sent."""
    task, io = make_task(counting_pipeline())
    trigger_ms = int(time.time() * 1000) - 10_000
    trigger = trigger_ms / 1000
    barrier = Barrier(1, job="job", timestamp_ms=trigger_ms)
    first = batch(("in", 0, 0, {"account": "x", "amount": 1}), ("in", 0, 1, barrier))
    appended = dt.datetime.fromtimestamp(trigger + 0.5, dt.UTC).replace(tzinfo=None)  # Kafka's: UTC, no zone
    first = first.set_column(6, "timestamp", pa.array([None, appended], pa.timestamp("ms")))
    task.process_batch(stamped(first, BATCH_BEGAN, trigger + 1.25))
    task.process_batch(batch(("in", 1, 0, barrier)))  # the second barrier: not its path
    task.wait_for_uploads()
    metadata = io.snapshots[1][3]
    assert metadata["appended_s"] == 0.5 and metadata["batch_began_s"] == 1.25
    # handed and forwarded just now, in that order, about ten seconds after the trigger
    assert 10.0 <= metadata["handed_s"] <= metadata["forwarded_s"] < 20
    ack = next(e for e in io.events if e.kind is ControlKind.ACK)
    assert metadata["forwarded_s"] <= ack.metrics.barrier_path["acked"] < 20
