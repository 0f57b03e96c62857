"""Event time as the stage task follows it (streaming.engine.task.watermarks):
windows close on the minimum over the task's event-time inputs however rows
of several upstream tasks are cut into batches, inputs without event time
hold nothing back, idle partitions stop holding it back (and say so
downstream), the ingress declares its out-of-orderness, a producer ends a
partition's input."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from task_cases import HEADER_TYPE, batch, make_task

from barriers.messages import Barrier, ChannelId
from operators import Chain, LatestValueJoin, TumblingWindowAggregate, count, filter_rows, sum_
from streaming import end_input
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.engine.task.stage_task import TaskStart
from streaming.engine.task.watermarks import MAX_WATERMARK, EventTimeInput, WatermarkTracker, watermark_headers

ORDERS = pa.schema([("account", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def windows() -> TumblingWindowAggregate:
    return TumblingWindowAggregate("account", "ts", 100, {"n": count(), "amount": sum_("amount")})


def closed(task) -> list[tuple]:
    return [(r["account"], r["window_start"], r["n"]) for t in task.output.epoch_rows for r in t.to_pylist()]


def two_stage(upstream_tasks: int = 2, **ingress) -> Pipeline:
    keep = lambda: filter_rows(lambda t: pc.greater(t["amount"], -1))  # noqa: E731
    return Pipeline(
        "job",
        (Ingress("in", 2, ORDERS, event_time="ts", **ingress),),
        (
            Stage("pass", ("in",), keep, parallelism=upstream_tasks, key="account"),
            Stage("w", ("pass",), windows, sink=Sink()),
        ),
    )


def forward(io, topic: str, partition: int, first_offset: int = 0, skip: int = 0):
    """What an upstream task sent (its records and watermark records, from
    the ``skip``-th on), as records of ``partition`` of ``topic``."""
    sent = io.stream[skip:]
    return batch(
        *[(topic, partition, first_offset + i, value, 0, dict(headers)) for i, (_, value, headers) in enumerate(sent)]
    )


def test_a_window_after_two_tasks_takes_their_rows_in_any_order_of_batches():
    pipeline = two_stage()
    fast, fast_io = make_task(pipeline, "pass-0")
    slow, slow_io = make_task(pipeline, "pass-1")
    # partition 0 (task pass-0) is far ahead of partition 1 (task pass-1); both in event-time order
    fast.process_batch(batch(*[("in", 0, i, {"account": "a", "amount": 1, "ts": i * 50}) for i in range(8)]))
    slow.process_batch(batch(*[("in", 1, i, {"account": "a", "amount": 10, "ts": i * 50}) for i in range(2)]))
    down, down_io = make_task(pipeline, "w-0", sink=True)
    topic = "spark-abs.job.pass"
    down.process_batch(forward(fast_io, topic, 0))
    assert closed(down) == []  # pass-1 has not spoken: nothing closes
    sent = len(slow_io.stream)
    down.process_batch(forward(slow_io, topic, 1))
    slow.process_batch(batch(*[("in", 1, i, {"account": "a", "amount": 10, "ts": i * 50}) for i in range(2, 8)]))
    down.process_batch(forward(slow_io, topic, 1, sent, skip=sent))
    assert down_io.dead == []  # nothing is late
    # windows close on the slower task's watermark (300), each once, with both tasks' rows
    assert closed(down) == [("a", 0, 4), ("a", 100, 4), ("a", 200, 4)]
    sums = [r["amount"] for t in down.output.epoch_rows for r in t.to_pylist()]
    assert sums == [22, 22, 22]


def test_a_table_input_holds_no_window_back():
    customers = pa.schema([("account", pa.string()), ("country", pa.string())])
    enrich = lambda: Chain(  # noqa: E731
        LatestValueJoin("account", left="orders", right="customers"),
        TumblingWindowAggregate("country", "ts", 100, {"n": count()}),
    )
    pipeline = Pipeline(
        "job",
        (Ingress("orders", 1, ORDERS, event_time="ts"), Ingress("customers", 1, customers)),
        (Stage("enrich", ("orders", "customers"), enrich, sink=Sink()),),
    )
    task, io = make_task(pipeline, "enrich-0", sink=True)
    task.process_batch(batch(("customers", 0, 0, {"account": "a", "country": "fr"})))
    task.process_batch(batch(*[("orders", 0, i, {"account": "a", "amount": 1, "ts": i * 40}) for i in range(6)]))
    rows = [(r["country"], r["window_start"], r["n"]) for t in task.output.epoch_rows for r in t.to_pylist()]
    assert rows == [("fr", 0, 3), ("fr", 100, 2)]
    assert task.watermark == 200


def test_out_of_orderness_is_declared_on_the_ingress():
    pipeline = Pipeline(
        "job",
        (Ingress("in", 1, ORDERS, event_time="ts", max_out_of_orderness=60),),
        (Stage("w", ("in",), windows, sink=Sink()),),
    )
    task, io = make_task(pipeline, "w-0", sink=True)
    task.process_batch(batch(("in", 0, 0, {"account": "a", "amount": 1, "ts": 150})))
    assert task.watermark == 90
    task.process_batch(batch(("in", 0, 1, {"account": "a", "amount": 1, "ts": 95})))  # 55 behind: on time
    task.process_batch(batch(("in", 0, 2, {"account": "a", "amount": 1, "ts": 170})))
    assert closed(task) == [("a", 0, 1)] and io.dead == []
    task.process_batch(batch(("in", 0, 3, {"account": "a", "amount": 1, "ts": 20})))  # 150 behind: late
    assert [reason for _, _, reason in io.dead] == ["TumblingWindowAggregate: late"]


def test_an_idle_partition_stops_holding_event_time_back_and_takes_part_again():
    clock = Clock()
    pipeline = Pipeline(
        "job",
        (Ingress("in", 2, ORDERS, event_time="ts", idle_timeout=1_000),),
        (Stage("w", ("in",), windows, sink=Sink()),),
    )
    task, _ = make_task(pipeline, "w-0", sink=True, clock=clock)
    clock.now = 0.5
    task.process_batch(batch(*[("in", 0, i, {"account": "a", "amount": 1, "ts": i * 50}) for i in range(5)]))
    clock.now = 0.9
    task.process_batch(batch(("in", 0, 5, {"account": "a", "amount": 1, "ts": 210})))
    assert closed(task) == [] and task.watermark is None  # partition 1 may still speak
    clock.now = 1.0
    # a batch comes without partition 1's records, a second after the task started: it is idle
    task.process_batch(batch(("in", 0, 6, {"account": "a", "amount": 1, "ts": 220})))
    assert task.watermark == 220 and closed(task) == [("a", 0, 2), ("a", 100, 2)]
    task.process_batch(batch(("in", 1, 0, {"account": "b", "amount": 1, "ts": 230})))  # it speaks again
    task.process_batch(batch(*[("in", 0, i, {"account": "a", "amount": 1, "ts": i * 50}) for i in range(7, 11)]))
    assert task.watermark == 230  # held by partition 1 again
    clock.now = 5.0
    task.tick()
    assert task.watermark == 230  # the clock alone makes nothing idle: a slow batch is not silence
    task.process_batch(batch(("in", 0, 11, {"account": "a", "amount": 1, "ts": 550})))
    assert task.watermark == 550  # this batch came without partition 1's records: idle again


def test_a_partition_left_behind_by_event_time_is_idle_and_a_pause_of_every_partition_makes_none_idle():
    clock = Clock()  # never moves: idle_after_event_time reads no clock
    pipeline = Pipeline(
        "job",
        (Ingress("in", 2, ORDERS, event_time="ts", idle_after_event_time=100),),
        (Stage("w", ("in",), windows, sink=Sink()),),
    )
    task, _ = make_task(pipeline, "w-0", sink=True, clock=clock)
    row = lambda p, o, ts: ("in", p, o, {"account": "a", "amount": 1, "ts": ts})  # noqa: E731
    task.process_batch(batch(row(0, 0, 0), row(1, 0, 10)))
    task.process_batch(batch(row(0, 1, 60)))
    task.process_batch(batch(row(0, 2, 90)))
    assert task.watermark == 10  # partition 1 is 80 behind: it may still speak
    # every partition pauses (its producers cannot write): batches of barriers only make nothing idle
    for n in range(3):
        task.process_batch(
            batch(("in", 0, 3 + n, Barrier(n + 1, job="job")), ("in", 1, 1 + n, Barrier(n + 1, job="job")))
        )
    assert task.watermark == 10 and closed(task) == []
    # partition 0 moves on 100 past where it was when partition 1 last spoke: partition 1 is idle
    task.process_batch(batch(row(0, 6, 120)))
    assert task.watermark == 120 and closed(task) == [("a", 0, 4)]
    task.process_batch(batch(row(1, 4, 130)))  # it speaks again and holds event time back
    task.process_batch(batch(row(0, 7, 200)))  # 80 past where it was when partition 1 spoke
    assert task.watermark == 130


def _left_behind_pipeline() -> Pipeline:
    return Pipeline(
        "job",
        (Ingress("in", 2, ORDERS, event_time="ts", idle_after_event_time=100),),
        (Stage("w", ("in",), windows, sink=Sink()),),
    )


def test_after_a_restore_a_partition_that_never_spoke_counts_from_the_restored_watermarks():
    inputs = {ChannelId("in", p): EventTimeInput("ts", idle_after_ms=3_000) for p in (0, 2)}
    # restored: partition 0 had reached 10 s; every record after it comes in the first batch (a restore that
    # found them all waiting)
    tracker = WatermarkTracker(inputs, {ChannelId("in", 0): 10_000}, clock=Clock())
    tracker.batch([ChannelId("in", 0)])
    tracker.observe_event_time(ChannelId("in", 0), 22_000)
    assert tracker.update(inputs) == 22_000 and tracker.idle(ChannelId("in", 2))
    # less than that on from the restored watermark: partition 2 may still speak
    held = WatermarkTracker(inputs, {ChannelId("in", 0): 10_000}, clock=Clock())
    held.batch([ChannelId("in", 0)])
    held.observe_event_time(ChannelId("in", 0), 12_000)
    assert held.update(inputs) is None and not held.idle(ChannelId("in", 2))


def test_a_partition_that_never_spoke_holds_nothing_back_once_the_others_input_ended():
    task, _ = make_task(_left_behind_pipeline(), "w-0", sink=True, clock=Clock())
    task.process_batch(batch(("in", 0, 0, {"account": "a", "amount": 1, "ts": 20})))  # its first and only batch
    assert task.watermark is None
    end_input_record = batch(("in", 0, 1, b""))
    end_input_record = end_input_record.set_column(
        end_input_record.schema.get_field_index("headers"),
        "headers",
        pa.array([[{"key": k, "value": v} for k, v in watermark_headers(MAX_WATERMARK)]], HEADER_TYPE),
    )
    task.process_batch(end_input_record)
    assert task.watermark == MAX_WATERMARK and closed(task) == [("a", 0, 1)]
    # restored with that input ended: the same at once
    start = TaskStart(
        generation=1,
        checkpoint_id=1,
        positions={ChannelId("in", 0): 2, ChannelId("in", 1): 0},
        watermarks={ChannelId("in", 0): MAX_WATERMARK},
    )
    restored, _ = make_task(_left_behind_pipeline(), "w-0", sink=True, clock=Clock(), start=start)
    restored.process_batch(batch(("in", 0, 2, Barrier(2, job="job"))))
    assert restored.watermark == MAX_WATERMARK


def test_a_replay_of_copied_channel_state_leaves_no_partition_behind_before_its_own_records():
    a, b = ChannelId("in", 0), ChannelId("in", 1)
    row = lambda p, o, ts: ("in", p, o, {"account": "a", "amount": 1, "ts": ts})  # noqa: E731
    # restored at 0 on both; the copied records of partition 0 go 500 on before partition 1's are handed over
    start = TaskStart(
        generation=1,
        checkpoint_id=1,
        positions={a: 0, b: 0},
        watermarks={a: 0, b: 0},
        replay={a: batch(*[row(0, o, 100 * o) for o in range(6)]), b: batch(row(1, 0, 50))},
    )
    task, _ = make_task(_left_behind_pipeline(), "w-0", sink=True, clock=Clock(), start=start)
    while task.replay_run():
        pass
    assert not task.watermarks.idle(b) and task.watermark == 50
    assert closed(task) == []  # partition 1's record at 50 was on time for window 0


def test_records_after_a_pause_of_every_producer_are_not_late_with_idleness_by_event_time():
    clock = Clock()
    by_clock, _ = make_task(two_stage(upstream_tasks=1, idle_timeout=1_000), "pass-0", clock=clock)
    by_event_time, _ = make_task(two_stage(upstream_tasks=1, idle_after_event_time=1_000), "pass-0", clock=clock)
    before = batch(
        ("in", 0, 0, {"account": "a", "amount": 1, "ts": 0}), ("in", 1, 0, {"account": "b", "amount": 1, "ts": 0})
    )
    pause = batch(("in", 0, 1, Barrier(1, job="job")), ("in", 1, 1, Barrier(1, job="job")))
    for task in (by_clock, by_event_time):
        task.process_batch(before)
    clock.now = 5.0  # the producers paused for 5 s; a batch of barriers comes
    for task in (by_clock, by_event_time):
        task.process_batch(pause)
    assert by_clock.watermarks.idle(ChannelId("in", 0))  # the trade idle_timeout makes
    assert not any(by_event_time.watermarks.idle(ChannelId("in", p)) for p in (0, 1))


def test_a_task_whose_inputs_are_all_idle_says_so_and_holds_nothing_back_downstream():
    clock = Clock()
    pipeline = two_stage(idle_timeout=500)
    busy, busy_io = make_task(pipeline, "pass-0", clock=clock)
    quiet, quiet_io = make_task(pipeline, "pass-1", clock=clock)  # partition 1 never gets a record
    busy.process_batch(batch(*[("in", 0, i, {"account": "a", "amount": 1, "ts": i * 50}) for i in range(5)]))
    clock.now = 1.0
    busy.process_batch(batch(("in", 0, 5, {"account": "a", "amount": 1, "ts": 250})))
    quiet.tick()
    assert quiet_io.idle == []  # no batch has come without its records yet
    quiet.process_batch(batch(("in", 1, 0, Barrier(1, job="job"))))  # a barrier is not a record
    assert quiet_io.idle == [(ChannelId("spark-abs.job.pass", 1), None)] and busy_io.idle == []
    down, _ = make_task(pipeline, "w-0", sink=True, clock=clock)
    topic = "spark-abs.job.pass"
    down.process_batch(pa.concat_tables([forward(busy_io, topic, 0), forward(quiet_io, topic, 1)]))
    assert down.watermark == 250
    assert closed(down) == [("a", 0, 2), ("a", 100, 2)]


def test_end_of_input_closes_every_window():
    class Producer:
        def __init__(self) -> None:
            self.sent = []

        def send(self, topic, *, value, headers, partition):
            self.sent.append((topic, partition, value, headers))

    producer = Producer()
    end_input(producer, "in", 2)
    assert [(t, p, v) for t, p, v, _ in producer.sent] == [("in", 0, b""), ("in", 1, b"")]
    pipeline = Pipeline(
        "job", (Ingress("in", 2, ORDERS, event_time="ts"),), (Stage("w", ("in",), windows, sink=Sink()),)
    )
    task, _ = make_task(pipeline, "w-0", sink=True)
    task.process_batch(
        batch(
            ("in", 0, 0, {"account": "a", "amount": 1, "ts": 10}),
            ("in", 1, 0, {"account": "b", "amount": 1, "ts": 999}),
        )
    )
    assert closed(task) == []
    ends = [batch(("in", p, 1, b"", 0, dict(headers))) for _, p, _, headers in producer.sent]
    task.process_batch(pa.concat_tables(ends))
    assert task.watermark == MAX_WATERMARK
    assert closed(task) == [("a", 0, 1), ("b", 900, 1)]


def test_a_join_holds_the_watermark_it_passes_on_at_its_earliest_buffered_row():
    customers = pa.schema([("account", pa.string()), ("country", pa.string())])
    join = lambda: LatestValueJoin("account", left="orders", right="customers", time_column="ts")  # noqa: E731
    pipeline = Pipeline(
        "job",
        (Ingress("orders", 1, ORDERS, event_time="ts"), Ingress("customers", 1, customers)),
        (
            Stage("enrich", ("orders", "customers"), join, key="country"),
            Stage("w", ("enrich",), lambda: TumblingWindowAggregate("country", "ts", 100, {"n": count()}), sink=Sink()),
        ),
    )
    task, io = make_task(pipeline, "enrich-0")
    task.process_batch(batch(*[("orders", 0, i, {"account": "a", "amount": 1, "ts": 40 + i * 50}) for i in range(6)]))
    assert task.watermark == 290 and task.downstream_watermark == 40  # a's orders wait for their customer
    assert io.watermarks == [(ChannelId("spark-abs.job.enrich", 0), 40)]
    task.process_batch(batch(("customers", 0, 0, {"account": "a", "country": "fr"})))
    assert task.downstream_watermark == 290
    assert [h.get("abs.wm") for _, _, h in io.sent] == [b"40"] * 6  # released with the watermark they were held at
    assert io.watermarks[-1] == (ChannelId("spark-abs.job.enrich", 0), 290)
    # downstream, none of them is late
    down, down_io = make_task(pipeline, "w-0", sink=True)
    down.process_batch(forward(io, "spark-abs.job.enrich", 0))
    assert down_io.dead == [] and closed_by_country(down) == [("fr", 0, 2), ("fr", 100, 2)]


def closed_by_country(task) -> list[tuple]:
    return [(r["country"], r["window_start"], r["n"]) for t in task.output.epoch_rows for r in t.to_pylist()]
