"""A task's data path (``streaming.engine.task.processing.RecordProcessor``),
driven directly, segment by segment: records that decode go through the
operator and what it returns is sent on; records that do not, and records
the operator refuses, become dead letters with their reason; each row
reaches the operator with the record it came from (or without it, for an
operator of one's own); the watermark a segment's output carries, the
operator told when event time moves (and held back by what it buffers),
what goes downstream; a micro-batch the stage's Spark code prepared; the
records counted.

The pipeline, its task specs, the quarantine, the output, the watermark
tracker and the metrics are real; the I/O is ``task_cases.RecordedIO`` and
the operators are small recording fakes (or a built-in one where it
matters that it is built in)."""

from __future__ import annotations

import collections
import json
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from task_cases import RecordedIO, batch

from barriers.messages import ChannelId
from operators import DeadLetters, InputSchemaError
from operators.aggregations import max_, sum_
from operators.base import Chain
from operators.dead_letters import ORIGIN, ORIGIN_TYPE
from operators.keyed import KeyedAggregate
from operators.stateless import FilterRows, Passthrough, map_batches
from streaming.adapters.serde import codec
from streaming.adapters.serde.records import (
    BATCH_COLUMNS,
    EVENT_TIME,
    PART,
    PARTIAL,
    REASON,
    RECORD_SCHEMA,
    RECORDS,
    ROW,
    Part,
)
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.engine import metrics
from streaming.engine.metrics import TaskMetrics
from streaming.engine.task.output import TaskOutput
from streaming.engine.task.processing import RecordProcessor
from streaming.engine.task.quarantine import Quarantine
from streaming.engine.task.record_errors import RecordErrors
from streaming.engine.task.watermarks import WatermarkTracker, event_time_inputs
from streaming.errors import RecordErrorsStop

ORDERS = pa.schema([("account", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])
IN0, IN1 = ChannelId("in", 0), ChannelId("in", 1)
ARROW = {"abs.fmt": b"arrow"}


# ---- operators


class Recording:
    """An operator of one's own: keeps every batch it is given and returns
    it; refuses every batch with ``InputSchemaError(refuse)`` when given;
    gives up on rows whose account is null (reason ``null_key``)."""

    def __init__(self, refuse: str | None = None):
        self.batches: list[pa.Table] = []
        self.refuse = refuse
        self.dead_letters = DeadLetters()

    def process(self, batch: pa.Table) -> pa.Table:
        self.batches.append(batch)
        if self.refuse is not None:
            raise InputSchemaError(self.refuse)
        if "account" in batch.column_names:
            self.dead_letters.add(batch.filter(pc.is_null(batch["account"])), "null_key", type(self).__name__)
            batch = batch.filter(pc.is_valid(batch["account"]))
        return batch

    def snapshot(self) -> dict[str, pa.Table]:
        return {}

    def restore(self, state) -> None:
        pass

    def rows(self) -> list[dict]:
        return [row for table in self.batches for row in table.to_pylist()]


class KeepsOrigin(Recording):
    """An operator of one's own that says it takes rows with their origin."""

    keeps_origin = True


class Joining(Recording):
    """A multi-input operator: keeps the mapping of input name to rows it is given."""

    inputs = ("orders", "customers")

    def __init__(self):
        super().__init__()
        self.calls: list[dict[str, list[dict]]] = []

    def process(self, batches) -> pa.Table:
        self.calls.append({name: table.to_pylist() for name, table in batches.items()})
        return pa.concat_tables(list(batches.values()), promote_options="permissive")


class Windowing(Recording):
    """A watermark-aware operator: buffers its rows, releases on
    ``on_watermark`` those at or before it (giving up on rows of
    ``late_account``), and holds the watermark it passes on at ``hold``."""

    def __init__(self, hold: int | None = None, late_account: str | None = None):
        super().__init__()
        self.buffered: list[dict] = []
        self.watermarks: list[int] = []
        self.hold = hold
        self.holds_asked = 0
        self.late_account = late_account

    def process(self, batch: pa.Table) -> pa.Table:
        self.batches.append(batch)
        self.buffered += batch.to_pylist()
        return batch.slice(0, 0)

    def on_watermark(self, watermark: int) -> pa.Table:
        self.watermarks.append(watermark)
        due = [r for r in self.buffered if r["ts"] <= watermark]
        self.buffered = [r for r in self.buffered if r["ts"] > watermark]
        late = [r for r in due if r["account"] == self.late_account]
        if late:
            self.dead_letters.add(pa.Table.from_pylist(late, ORDERS), "late", "Windowing")
        return pa.Table.from_pylist([r for r in due if r["account"] != self.late_account], ORDERS)

    def watermark_hold(self) -> int | None:
        self.holds_asked += 1
        return self.hold


class Merging(Recording):
    """An operator that merges the partial aggregates Spark computed."""

    def __init__(self):
        super().__init__()
        self.partials: list[list[dict]] = []

    def merge_partials(self, partials: pa.Table) -> pa.Table:
        self.partials.append(partials.to_pylist())
        return pa.table({"account": partials["account"], "n": pc.multiply(partials["n"], 10)})


# ---- pipelines and the processor


def job() -> str:
    """A job name of its own, so the metrics' series start at zero."""
    return f"proc-{uuid.uuid4().hex[:8]}"


def ingress_pipeline(*, downstream=True, partitions=1, **ingress) -> Pipeline:
    """``in`` (ORDERS) -> ``s`` (-> ``down``, a sink; or ``s`` the sink)."""
    if downstream:
        stages = (
            Stage("s", ("in",), Passthrough, key="account"),
            Stage("down", ("s",), Passthrough, parallelism=2, sink=Sink()),
        )
    else:
        stages = (Stage("s", ("in",), Passthrough, sink=Sink()),)
    return Pipeline(job(), (Ingress("in", partitions, ORDERS, **ingress),), stages)


def internal_pipeline() -> Pipeline:
    """``in`` -> ``a`` -> ``b`` (a sink): task ``b-0`` reads ``a``'s topic."""
    stages = (Stage("a", ("in",), Passthrough), Stage("b", ("a",), Passthrough, sink=Sink()))
    return Pipeline(job(), (Ingress("in", 1, ORDERS),), stages)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_processor(pipeline, name, operator, *, open_inputs=None, max_decoded_bytes=1 << 20, clock=None):
    """Task ``name``'s processor through ``operator``, on recorded I/O;
    ``open_inputs``: what the handler says is open (default: every input)."""
    spec = pipeline.task(name)
    recorded = RecordedIO()
    io = recorded.io()
    counters: collections.Counter = collections.Counter()
    task_metrics = TaskMetrics(pipeline.job, spec.name, spec.inputs, spec.outputs)
    processor = RecordProcessor(
        pipeline,
        spec,
        operator,
        max_decoded_bytes=max_decoded_bytes,
        quarantine=Quarantine(
            spec.name,
            io,
            counters,
            task_metrics,
            generation=0,
            after_checkpoint=lambda: 0,
            ingress_topics={i.topic: i.partitions for i in pipeline.ingress},
        ),
        output=TaskOutput(pipeline, spec, io, 0, counters, task_metrics),
        watermarks=WatermarkTracker(event_time_inputs(pipeline, spec), {}, clock=clock or Clock()),
        counters=counters,
        metrics=task_metrics,
        open_inputs=open_inputs or (lambda: set(spec.inputs)),
    )
    return processor, recorded


def sample(pipeline: Pipeline, name: str, task: str, **labels) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, {"job_name": pipeline.job, "task": task, **labels})


def arrow_record(table: pa.Table) -> bytes:
    [value] = codec.encode_batches(table)
    return value


def origins(table: pa.Table) -> list[tuple[str, int, int]]:
    return [(o["topic"], o["partition"], o["offset"]) for o in table[ORIGIN].to_pylist()]


def order(account, amount, ts=0) -> dict:
    return {"account": account, "amount": amount, "ts": ts}


# ---- records through the operator


def test_records_that_decode_go_through_the_operator_and_its_output_is_sent_on():
    pipeline = ingress_pipeline()
    operator = Recording()
    processor, io = make_processor(pipeline, "s-0", operator)
    processor.process(IN0, batch(("in", 0, 3, order("x", 1)), ("in", 0, 4, order("y", 2))))
    assert operator.rows() == [order("x", 1), order("y", 2)]  # an operator of one's own: no origin column
    sent = sorted((str(channel), row["account"], row["amount"]) for channel, row, _ in io.sent)
    topic = pipeline.topic_of("s")
    assert {channel for channel, _, _ in sent} <= {f"{topic}:0", f"{topic}:1"}
    assert [(account, amount) for _, account, amount in sent] == [("x", 1), ("y", 2)]
    assert processor.counters["output_rows"] == 2 and io.dead == []


def test_a_sink_stage_keeps_the_operators_output_for_its_epoch():
    processor, io = make_processor(ingress_pipeline(downstream=False), "s-0", Recording())
    processor.process(IN0, batch(("in", 0, 0, order("x", 1))))
    assert [t.to_pylist() for t in processor.output.epoch_rows] == [[order("x", 1)]]
    assert io.stream == []  # nothing sent: a sink has no output channel


def test_records_that_cannot_be_decoded_become_dead_letters_and_the_others_go_on():
    pipeline = ingress_pipeline()
    operator = Recording()
    processor, io = make_processor(pipeline, "s-0", operator)
    processor.process(
        IN0,
        batch(
            ("in", 0, 10, b"{oops"),
            ("in", 0, 11, order("x", 1)),
            ("in", 0, 12, {"account": "x", "amount": "many", "ts": 0}),
            ("in", 0, 13, order("y", 2)),
        ),
    )
    assert [offset for _, offset, _ in io.dead] == [10, 12]
    assert {channel for channel, _, _ in io.dead} == {"in:0"}
    assert io.dead[0][2].startswith("value is not JSON")
    assert "does not fit the schema" in io.dead[1][2]
    assert io.letters[0]["value"] == b"{oops"  # the record as it came
    assert operator.rows() == [order("x", 1), order("y", 2)]
    assert processor.counters["dead_letters"] == 2 and processor.counters["records"] == 4
    assert sample(pipeline, "spark_abs_dead_letters_total", "s-0", reason="malformed") == 2


def test_a_segment_of_which_no_record_decodes_never_reaches_the_operator():
    operator = Recording()
    processor, io = make_processor(ingress_pipeline(), "s-0", operator)
    processor.process(IN0, batch(("in", 0, 0, b"[1, 2]"), ("in", 0, 1, b"nope")))
    assert operator.batches == [] and io.sent == []
    assert [offset for _, offset, _ in io.dead] == [0, 1]
    assert io.dead[0][2] == "value is JSON list, not an object" and io.dead[1][2].startswith("value is not JSON")
    assert processor.counters["records"] == 2 and processor.counters["dead_letters"] == 2


def test_an_arrow_batch_is_refused_on_an_ingress_channel_and_read_within_the_cap_on_an_internal_one():
    ingress, io = make_processor(ingress_pipeline(), "s-0", Recording())
    ingress.process(IN0, batch(("in", 0, 0, arrow_record(pa.table({"account": ["x"]})), 0, ARROW)))
    assert io.dead == [("in:0", 0, codec.ARROW_ON_INGRESS)]

    pipeline = internal_pipeline()
    topic = pipeline.topic_of("a")
    operator = Recording()
    internal, io = make_processor(pipeline, "b-0", operator, max_decoded_bytes=1 << 16)
    small = arrow_record(pa.table({"account": ["x", "y"], "amount": [1, 2]}))
    large = arrow_record(pa.table({"account": [f"k{n}" for n in range(50_000)], "amount": range(50_000)}))
    internal.process(ChannelId(topic, 0), batch((topic, 0, 0, small, 0, ARROW), (topic, 0, 1, large, 0, ARROW)))
    [(channel, offset, reason)] = io.dead
    assert (channel, offset) == (f"{topic}:0", 1) and f"over the cap of {1 << 16}" in reason
    assert [(r["account"], r["amount"]) for r in operator.rows()] == [("x", 1), ("y", 2)]


def test_a_multi_input_operator_gets_the_rows_under_the_name_of_their_input():
    customers = pa.schema([("account", pa.string()), ("country", pa.string())])
    pipeline = Pipeline(
        job(),
        (Ingress("orders", 1, ORDERS), Ingress("customers", 1, customers)),
        (Stage("enrich", ("orders", "customers"), Passthrough, sink=Sink()),),
    )
    operator = Joining()
    processor, _ = make_processor(pipeline, "enrich-0", operator)
    processor.process(ChannelId("customers", 0), batch(("customers", 0, 0, {"account": "x", "country": "fr"})))
    processor.process(ChannelId("orders", 0), batch(("orders", 0, 0, order("x", 5))))
    assert operator.calls == [{"customers": [{"account": "x", "country": "fr"}]}, {"orders": [order("x", 5)]}]


# ---- the record each row came from


def test_a_built_in_operator_gets_each_row_with_the_ingress_record_it_was_read_from():
    pipeline = ingress_pipeline(partitions=2)
    processor, io = make_processor(pipeline, "s-0", Passthrough())  # built in: it keeps the origin
    processor.process(IN1, batch(("in", 1, 20, order("x", 1)), ("in", 1, 21, order("y", 2))))
    # a rejected record leaves no row: the others keep their own offsets
    processor.process(IN1, batch(("in", 1, 30, order("x", 3)), ("in", 1, 31, b"{oops"), ("in", 1, 32, order("y", 4))))
    # downstream reads them in Python: the origin goes on with the rows
    sent = sorted(
        (row[ORIGIN]["offset"], row[ORIGIN]["topic"], row[ORIGIN]["partition"], row["amount"]) for _, row, _ in io.sent
    )
    assert sent == [(20, "in", 1, 1), (21, "in", 1, 2), (30, "in", 1, 3), (32, "in", 1, 4)]


def test_an_ingress_records_own_field_named_like_the_origin_is_replaced_by_the_origin():
    schema = pa.schema([("account", pa.string()), (ORIGIN, pa.string())])
    pipeline = Pipeline(job(), (Ingress("in", 1, schema),), (Stage("s", ("in",), Passthrough, sink=Sink()),))
    operator = KeepsOrigin()
    processor, _ = make_processor(pipeline, "s-0", operator)
    processor.process(IN0, batch(("in", 0, 5, {"account": "x", ORIGIN: "forged"})))
    [table] = operator.batches
    assert table.schema.field(ORIGIN).type == ORIGIN_TYPE and origins(table) == [("in", 0, 5)]


def test_rows_of_an_earlier_stage_keep_the_ingress_records_they_carry():
    pipeline = internal_pipeline()
    topic = pipeline.topic_of("a")
    carried = pa.array([{"topic": "in", "partition": 0, "offset": o} for o in (40, 41)], ORIGIN_TYPE)
    rows = pa.table({"account": ["x", "y"], ORIGIN: carried})
    operator = KeepsOrigin()
    processor, _ = make_processor(pipeline, "b-0", operator)
    processor.process(ChannelId(topic, 0), batch((topic, 0, 7, arrow_record(rows), 0, ARROW)))
    assert origins(operator.batches[0]) == [("in", 0, 40), ("in", 0, 41)]


def test_rows_of_an_earlier_stage_without_an_origin_name_the_stage_to_stage_record_they_were_read_from():
    pipeline = internal_pipeline()
    topic = pipeline.topic_of("a")
    with_origin = pa.table(
        {"account": ["x"], ORIGIN: pa.array([{"topic": "in", "partition": 0, "offset": 40}], ORIGIN_TYPE)}
    )
    aggregated = pa.table({"account": ["y", "z"]})  # an aggregate's rows name no ingress record
    operator = KeepsOrigin()
    processor, _ = make_processor(pipeline, "b-0", operator)
    processor.process(
        ChannelId(topic, 0),
        batch((topic, 0, 7, arrow_record(with_origin), 0, ARROW), (topic, 0, 8, arrow_record(aggregated), 0, ARROW)),
    )
    [table] = operator.batches
    assert table["account"].to_pylist() == ["x", "y", "z"]
    assert origins(table) == [("in", 0, 40), (topic, 0, 8), (topic, 0, 8)]  # two rows of one record share it


def test_an_operator_of_ones_own_gets_the_rows_without_the_origin_an_earlier_stage_sent():
    pipeline = internal_pipeline()
    topic = pipeline.topic_of("a")
    rows = pa.table({"account": ["x"], ORIGIN: pa.array([{"topic": "in", "partition": 0, "offset": 40}], ORIGIN_TYPE)})
    operator = Recording()
    processor, _ = make_processor(pipeline, "b-0", operator)
    processor.process(ChannelId(topic, 0), batch((topic, 0, 7, arrow_record(rows), 0, ARROW)))
    assert operator.batches[0].column_names == ["account"]


# ---- dead letters of the operator


def test_records_the_operator_refuses_are_dead_letters_one_per_record_with_its_reason():
    pipeline = internal_pipeline()
    topic = pipeline.topic_of("a")
    operator = Recording(refuse="no column 'amount'")
    processor, io = make_processor(pipeline, "b-0", operator)
    two_rows = arrow_record(pa.table({"account": ["x", "y"]}))
    one_row = arrow_record(pa.table({"account": ["z"]}))
    processor.process(
        ChannelId(topic, 0),
        batch((topic, 0, 3, two_rows, 0, ARROW), (topic, 0, 4, b"junk", 0, ARROW), (topic, 0, 5, one_row, 0, ARROW)),
    )
    assert len(operator.batches) == 1 and operator.batches[0].num_rows == 3
    unreadable, *refused = io.dead
    assert unreadable[1] == 4 and unreadable[2].startswith("value is not a readable Arrow IPC stream")
    # one dead letter per Arrow record, not per row
    assert refused == [(f"{topic}:0", 3, "no column 'amount'"), (f"{topic}:0", 5, "no column 'amount'")]
    assert io.sent == [] and processor.output.epoch_rows == []
    assert sample(pipeline, "spark_abs_dead_letters_total", "b-0", reason="refused") == 2
    assert sample(pipeline, "spark_abs_dead_letters_total", "b-0", reason="malformed") == 1
    assert processor.counters["dead_letters"] == 3 and processor.counters["records"] == 3


def test_rows_the_operator_gave_up_on_are_sent_as_the_ingress_records_just_read():
    pipeline = ingress_pipeline()
    operator = KeepsOrigin()
    processor, io = make_processor(pipeline, "s-0", operator)  # RecordedIO reads nothing back: none needed
    processor.process(IN0, batch(("in", 0, 8, order("x", 1)), ("in", 0, 9, {"account": None, "amount": 2, "ts": 0})))
    [letter] = io.letters
    assert (letter["channel"], letter["offset"], letter["reason"]) == ("in:0", 9, "KeepsOrigin: null_key")
    assert json.loads(letter["value"]) == {"account": None, "amount": 2, "ts": 0}  # the record as it came
    assert [row["account"] for _, row, _ in io.sent] == ["x"]
    assert sample(pipeline, "spark_abs_dead_letters_total", "s-0", reason="given_up") == 1


# ---- rows the operator raises on


def raises_at(amount: int):
    """A step of one's own after an aggregate: raises when the largest amount of a key is ``amount``
    (a record of that amount makes it raise, whatever batch it comes in: no larger one comes)."""

    def check(rows: pa.Table) -> pa.Table:
        if pc.any(pc.equal(rows["top"], amount)).as_py():
            raise ValueError(f"an amount of {amount}")
        return rows

    return map_batches(check, "check")


def totals() -> KeyedAggregate:
    return KeyedAggregate("account", {"total": sum_("amount"), "top": max_("amount")})


def test_a_record_the_operator_raises_on_is_a_dead_letter_and_the_rest_goes_on_as_if_it_was_not_there():
    pipeline = ingress_pipeline()
    operator = Chain(totals(), raises_at(13))  # the aggregate's state changes before the check raises
    processor, io = make_processor(pipeline, "s-0", operator)
    amounts = [("x", 5), ("y", 1), ("x", 13), ("y", 2), ("x", 1), ("y", 13), ("x", 7)]
    processor.process(IN0, batch(*(("in", 0, offset, order(a, n)) for offset, (a, n) in enumerate(amounts))))
    assert [(channel, offset) for channel, offset, _ in io.dead] == [("in:0", 2), ("in:0", 5)]
    assert {reason for _, _, reason in io.dead} == {"stage s raised ValueError: an amount of 13"}
    assert json.loads(io.letters[0]["value"]) == order("x", 13)  # the record as it came
    state = operator.snapshot()["0.state"]
    assert sorted(state.to_pylist(), key=str) == [
        {"account": "x", "total": 13, "top": 7},
        {"account": "y", "total": 3, "top": 2},
    ]
    last = {row["account"]: row["total"] for _, row, _ in io.sent}
    assert last == {"x": 13, "y": 3}
    assert sample(pipeline, "spark_abs_dead_letters_total", "s-0", reason="raised") == 2
    assert processor.errors.isolated == 2 and processor.errors.rolled_back


def test_what_is_set_aside_does_not_depend_on_how_the_records_were_cut():
    pipeline = ingress_pipeline()
    amounts = [("x", 5), ("y", 1), ("x", 13), ("y", 2), ("x", 1), ("y", 13), ("x", 13), ("y", 4)]
    records = [("in", 0, offset, order(a, n)) for offset, (a, n) in enumerate(amounts)]
    found = set()
    for cut in range(1, len(records) + 1):
        operator = Chain(totals(), raises_at(13))
        processor, io = make_processor(pipeline, "s-0", operator)
        for start in range(0, len(records), cut):
            processor.process(IN0, batch(*records[start : start + cut]))
        state = operator.snapshot()["0.state"]
        found.add((tuple(offset for _, offset, _ in io.dead), tuple(map(str, sorted(state.to_pylist(), key=str)))))
    assert found == {((2, 5, 6), ("{'account': 'x', 'total': 6, 'top': 5}", "{'account': 'y', 'total': 7, 'top': 4}"))}


def test_rows_of_an_earlier_stage_the_operator_raises_on_are_sent_as_the_ingress_records_they_name():
    pipeline = internal_pipeline()
    topic = pipeline.topic_of("a")
    operator = Chain(Chain(FilterRows(pc.field("amount") >= 0), totals()), raises_at(13))
    processor, io = make_processor(pipeline, "b-0", operator)
    rows = pa.table({"account": ["x", "y"], "amount": [13, 1]}).append_column(
        ORIGIN,
        pa.array(
            [{"topic": "in", "partition": 0, "offset": 40}, {"topic": "in", "partition": 0, "offset": 41}], ORIGIN_TYPE
        ),
    )
    processor.process(ChannelId(topic, 0), batch((topic, 0, 7, arrow_record(rows), 0, ARROW)))
    [letter] = io.letters
    # RecordedIO reads nothing back: the row goes with the ingress record it names, saying why not read
    assert (letter["channel"], letter["offset"]) == ("in:0", 40)
    assert json.loads(letter["headers"]["spark-abs-row"]) == {"account": "x", "amount": 13}
    assert letter["reason"] == "stage b raised ValueError: an amount of 13"
    assert [row["total"] for _, row, _ in io.sent] == [] and operator.snapshot()["0.1.state"]["total"].to_pylist() == [
        1
    ]


def test_rows_of_prepared_code_the_operator_raises_on_name_the_records_they_came_from():
    pipeline = ingress_pipeline()
    operator = Chain(totals(), raises_at(13))
    processor, io = make_processor(pipeline, "s-0", operator)
    processor.process(
        IN0,
        prepared(
            (Part.ROW, 0, {"account": "x", "amount": 13}),
            (Part.ROW, 1, {"account": "y", "amount": 2}),
            (Part.MARKER, 1, (2, None)),
        ),
    )
    assert io.dead == [("in:0", 0, "stage s raised ValueError: an amount of 13")]
    assert [row["account"] for _, row, _ in io.sent] == ["y"] and processor.counters["records"] == 2


def test_a_record_set_aside_does_not_move_event_time():
    pipeline = ingress_pipeline(event_time="ts")
    operator = Chain(totals(), raises_at(13))
    processor, io = make_processor(pipeline, "s-0", operator)
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=1_000)), ("in", 0, 1, order("y", 13, ts=999_000))))
    assert [offset for _, offset, _ in io.dead] == [1]
    assert processor.watermarks.current == 1_000  # not 999_000: the record set aside was never there


def test_a_run_of_more_records_raising_than_the_brake_lets_through_stops_the_job_without_searching_them_all():
    pipeline = ingress_pipeline()
    processor, io = make_processor(pipeline, "s-0", Chain(totals(), raises_at(13)))
    processor.errors = RecordErrors("s-0", max_records=3, max_share=1.0)
    with pytest.raises(RecordErrorsStop) as stopped:
        processor.process(IN0, batch(*(("in", 0, offset, order(f"a{offset}", 13)) for offset in range(50))))
    said = str(stopped.value)
    assert "stopped at row 4, 4 set aside" in said  # not at the 50th
    assert "row 0: ValueError: an amount of 13" in said and "more than max_isolated_records (3)" in said
    assert io.dead == []  # the job stops: it is restored with a fix, or a higher bound, and sets them aside then


def test_an_error_of_the_operator_no_record_causes_fails_the_segment():
    class OutOfMemory(Recording):
        def process(self, batch):
            raise MemoryError("no room")

    processor, io = make_processor(ingress_pipeline(), "s-0", OutOfMemory())
    with pytest.raises(MemoryError):
        processor.process(IN0, batch(("in", 0, 0, order("x", 1))))
    assert io.dead == []


# ---- event time


def test_a_segments_output_carries_the_watermark_from_before_the_segment():
    pipeline = ingress_pipeline(event_time="ts")
    processor, io = make_processor(pipeline, "s-0", Recording())
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=100))))
    assert processor.watermarks.current == 100
    processor.process(IN0, batch(("in", 0, 1, order("x", 2, ts=250))))
    assert [(row["ts"], headers.get("abs.wm")) for _, row, headers in io.sent] == [(100, None), (250, b"100")]
    assert processor.downstream_watermark == 250


def test_when_the_watermark_moves_the_operator_is_told_and_what_it_releases_is_sent_on():
    pipeline = ingress_pipeline(event_time="ts")
    operator = Windowing(late_account="late")
    processor, io = make_processor(pipeline, "s-0", operator)
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=50)), ("in", 0, 1, order("late", 2, ts=60))))
    processor.process(IN0, batch(("in", 0, 2, order("x", 3, ts=120))))
    processor.process(IN0, batch(("in", 0, 3, order("y", 4, ts=90))))  # behind: the watermark stays
    assert operator.watermarks == [60, 120]
    # released on 60: (x, 50), sent with the watermark that released it; the late row a dead letter
    assert [(row["account"], row["ts"], headers["abs.wm"]) for _, row, headers in io.sent] == [
        ("x", 50, b"60"),
        ("x", 120, b"120"),
    ]
    assert io.dead == [("in:0", -1, "Windowing: late")]  # without an origin: the row itself
    assert json.loads(io.letters[0]["value"]) == order("late", 2, ts=60)


def test_the_watermark_told_downstream_is_held_back_by_what_the_operator_buffers():
    pipeline = ingress_pipeline(event_time="ts")
    operator = Windowing(hold=70)
    processor, io = make_processor(pipeline, "s-0", operator)
    assert processor.downstream_watermark is None and operator.holds_asked == 0  # no watermark: no hold asked
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=40)), ("in", 0, 1, order("x", 1, ts=200))))
    assert processor.watermarks.current == 200 and processor.downstream_watermark == 70
    assert [headers["abs.wm"] for _, _, headers in io.sent] == [b"70", b"70"]  # released at 200, held at 70
    operator.hold = None
    assert processor.downstream_watermark == 200
    operator.hold = 900  # a hold past the watermark holds nothing back
    assert processor.downstream_watermark == 200


def test_the_watermark_follows_the_open_inputs_and_every_input_once_none_is_open():
    pipeline = ingress_pipeline(event_time="ts", partitions=2)
    open_inputs = {IN0}
    processor, _ = make_processor(pipeline, "s-0", Recording(), open_inputs=lambda: set(open_inputs))
    assert set(processor.inputs) == {IN0}
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=100))))
    assert processor.watermarks.current == 100  # partition 1 is not open: it holds nothing back
    open_inputs.clear()
    assert set(processor.inputs) == {IN0, IN1}
    processor.process(IN0, batch(("in", 0, 1, order("x", 1, ts=300))))
    assert processor.watermarks.current == 100  # every input again: partition 1 has none yet


def test_the_watermark_is_forwarded_to_every_output_channel_once_per_change():
    pipeline = ingress_pipeline(event_time="ts")
    processor, io = make_processor(pipeline, "s-0", Recording())
    processor.forward_watermark()
    assert io.watermarks == [] and io.idle == []  # nothing known yet, nothing changed
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=100))))
    processor.forward_watermark()
    processor.forward_watermark()
    outputs = pipeline.task("s-0").outputs
    assert len(outputs) == 2 and io.watermarks == [(channel, 100) for channel in outputs]


def test_a_sink_stage_forwards_no_watermark():
    processor, io = make_processor(ingress_pipeline(downstream=False, event_time="ts"), "s-0", Recording())
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=100))))
    processor.forward_watermark()
    assert processor.watermarks.current == 100 and io.stream == []


def test_after_a_batch_an_idle_partition_lets_the_watermark_move_and_downstream_hears_of_it():
    clock = Clock()
    pipeline = ingress_pipeline(event_time="ts", partitions=2, idle_timeout=1_000)
    operator = Windowing()
    processor, io = make_processor(pipeline, "s-0", operator, clock=clock)
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=300))))
    assert processor.watermarks.current is None and operator.watermarks == []  # partition 1 may speak
    clock.now = 2.0
    processor.watermarks.batch([IN0])  # a batch came without partition 1's records, two seconds on
    processor.follow_event_time()
    assert processor.watermarks.current == 300 and operator.watermarks == [300]
    outputs = pipeline.task("s-0").outputs
    assert io.watermarks == [(channel, 300) for channel in outputs]
    assert [(row["account"], headers["abs.wm"]) for _, row, headers in io.sent] == [("x", b"300")]


def test_a_task_without_event_time_follows_none_after_a_batch():
    operator = Windowing()
    processor, io = make_processor(ingress_pipeline(), "s-0", operator)
    processor.process(IN0, batch(("in", 0, 0, order("x", 1, ts=300))))
    processor.follow_event_time()
    processor.forward_watermark()
    assert processor.watermarks.current is None and operator.watermarks == []
    assert io.stream == []


# ---- counting


def test_every_record_of_a_segment_is_counted_per_channel():
    pipeline = ingress_pipeline(partitions=2)
    processor, _ = make_processor(pipeline, "s-0", Recording())
    processor.process(IN0, batch(("in", 0, 0, order("x", 1)), ("in", 0, 1, b"bad"), ("in", 0, 2, order("y", 1))))
    processor.process(IN1, batch(("in", 1, 0, order("z", 1))))
    assert processor.counters["records"] == 4
    assert sample(pipeline, "spark_abs_records_in_total", "s-0", channel="in:0") == 3
    assert sample(pipeline, "spark_abs_records_in_total", "s-0", channel="in:1") == 1


# ---- a micro-batch the stage's Spark code prepared

ROW_TYPE = pa.struct([("account", pa.string()), ("amount", pa.int64())])
PARTIAL_TYPE = pa.struct([("account", pa.string()), ("n", pa.int64())])
PREPARED = pa.schema(
    [
        *(RECORD_SCHEMA.field(name) for name in BATCH_COLUMNS),
        (PART, pa.int8()),
        (ROW, ROW_TYPE),
        (RECORDS, pa.int64()),
        (EVENT_TIME, pa.int64()),
        (REASON, pa.string()),
        (PARTIAL, PARTIAL_TYPE),
    ]
)


def prepared(*parts: tuple, row_type: pa.DataType = ROW_TYPE) -> pa.Table:
    """Rows of a prepared micro-batch of channel in:0: (part, offset, what):
    a row's values, a marker's (records, highest event time), a rejected
    record's (value, reason), a partial aggregate's values."""
    schema = PREPARED.set(PREPARED.get_field_index(ROW), pa.field(ROW, row_type))
    rows = []
    for part, offset, what in parts:
        row = {"topic": "in", "partition": 0, "offset": offset, "headers": [], PART: int(part)}
        if part is Part.ROW:
            row[ROW] = what
        elif part is Part.MARKER:
            row[RECORDS], row[EVENT_TIME] = what
        elif part is Part.REJECTED:
            row["value"], row[REASON] = what
        elif part is Part.PARTIAL:
            row[PARTIAL] = what
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


@pytest.mark.parametrize("operator", ["raises", "gives up"])
def test_rows_of_prepared_code_the_operator_raises_on_or_gives_up_on_do_not_move_event_time(operator):
    """As on the Python path: Spark measured the run's event time over every
    record, the one whose row the operator raises on (amount 13) or gives
    up on (no account) too; the run moves event time as far as the rows
    kept."""
    pipeline = ingress_pipeline(event_time="ts")
    chosen = Chain(totals(), raises_at(13)) if operator == "raises" else KeepsOrigin()
    processor, io = make_processor(pipeline, "s-0", chosen)
    timed = pa.struct([("account", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])
    bad = {"account": "y", "amount": 13} if operator == "raises" else {"account": None, "amount": 2}
    processor.process(
        IN0,
        prepared(
            (Part.ROW, 0, {"account": "x", "amount": 1, "ts": 1_000}),
            (Part.ROW, 1, {**bad, "ts": 999_000}),
            (Part.MARKER, 1, (2, 999_000)),
            row_type=timed,
        ),
    )
    assert [offset for _, offset, _ in io.dead] == [1]
    assert processor.watermarks.current == 1_000  # not 999_000: the row set aside was never there


def test_a_prepared_row_column_named_like_event_time_but_no_time_leaves_event_time_to_spark():
    """The stage's code made a text column of the event-time column's name: the run's event time is
    Spark's measure, as when the rows carry no such column, and the task goes on."""
    pipeline = ingress_pipeline(event_time="ts")
    processor, io = make_processor(pipeline, "s-0", KeepsOrigin())
    texts = pa.struct([("account", pa.string()), ("amount", pa.int64()), ("ts", pa.string())])
    processor.process(
        IN0,
        prepared(
            (Part.ROW, 0, {"account": "x", "amount": 1, "ts": "early"}),
            (Part.ROW, 1, {"account": None, "amount": 2, "ts": "late"}),
            (Part.MARKER, 1, (2, 5_000)),
            row_type=texts,
        ),
    )
    assert [offset for _, offset, _ in io.dead] == [1] and processor.watermarks.current == 5_000


def test_a_prepared_micro_batch_sends_rows_partials_and_rejected_records_where_they_belong():
    pipeline = ingress_pipeline(event_time="ts")
    operator = Merging()
    processor, io = make_processor(pipeline, "s-0", operator)
    processor.process(
        IN0,
        prepared(
            (Part.ROW, 0, {"account": "x", "amount": 1}),
            (Part.REJECTED, 1, (b"{oops", "value is not JSON: Spark says so")),
            (Part.ROW, 2, {"account": "y", "amount": 2}),
            (Part.PARTIAL, 3, {"account": "x", "n": 2}),
            (Part.MARKER, 3, (4, 180)),
        ),
    )
    # the code's rows as they are (no origin added), then the partials merged
    assert operator.rows() == [{"account": "x", "amount": 1}, {"account": "y", "amount": 2}]
    assert operator.partials == [[{"account": "x", "n": 2}]]
    sent = [(row["account"], row.get("amount"), row.get("n")) for _, row, _ in io.sent]
    assert sorted(sent, key=str) == [("x", 1, None), ("x", None, 20), ("y", 2, None)]
    assert io.dead == [("in:0", 1, "value is not JSON: Spark says so")] and io.letters[0]["value"] == b"{oops"
    # the markers: how many records the run had, and how far their event time got
    assert processor.counters["records"] == 4 and processor.watermarks.current == 180
    assert sample(pipeline, "spark_abs_records_in_total", "s-0", channel="in:0") == 4


def test_rows_of_prepared_code_the_operator_refuses_are_dead_letters_as_the_code_gave_them():
    pipeline = ingress_pipeline()
    processor, io = make_processor(pipeline, "s-0", Recording(refuse="no column 'ts'"))
    processor.process(
        IN0,
        prepared(
            (Part.ROW, 0, {"account": "x", "amount": 1}),
            (Part.ROW, 1, {"account": "y", "amount": 2}),
            (Part.MARKER, 1, (2, None)),
        ),
    )
    reason = "the stage's operator cannot take the rows its Spark code gives: no column 'ts'"
    assert io.dead == [("in:0", -1, reason), ("in:0", -1, reason)]
    assert [json.loads(letter["value"]) for letter in io.letters] == [
        {"account": "x", "amount": 1},
        {"account": "y", "amount": 2},
    ]
    assert io.sent == [] and processor.counters["records"] == 2
    assert sample(pipeline, "spark_abs_dead_letters_total", "s-0", reason="refused") == 2


@pytest.mark.parametrize("records", [0, 3])
def test_a_prepared_run_without_rows_reaches_no_operator_and_still_counts_its_records(records):
    operator = Recording()
    processor, io = make_processor(ingress_pipeline(), "s-0", operator)
    processor.process(IN0, prepared((Part.MARKER, 5, (records, None))))
    assert operator.batches == [] and io.stream == [] and io.dead == []
    assert processor.counters["records"] == records
