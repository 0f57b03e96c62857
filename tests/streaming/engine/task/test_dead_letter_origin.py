"""Dead letters name the ingress record a row came from, wherever the row
was when an operator gave up on it: in the stage that read the record, or
stages later, after the rows travelled through a stage-to-stage topic."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
from task_cases import batch, make_task

from barriers.messages import ChannelId
from operators import Deduplicate, KeyedAggregate, count, filter_rows
from operators.dead_letters import ORIGIN, ORIGIN_TYPE
from operators.windows import TumblingWindowAggregate
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.engine.task import quarantine

SCHEMA = pa.schema([("id", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])
INTERNAL = "spark-abs.job.clean"


def pipeline(second, first=lambda: filter_rows(pc.field("amount") > 0)) -> Pipeline:
    return Pipeline(
        "job",
        (Ingress("in", 1, SCHEMA, event_time="ts"),),
        (
            Stage("clean", ("in",), first),
            Stage("out", ("clean",), second, sink=Sink()),
        ),
    )


def windows():
    return TumblingWindowAggregate("id", "ts", 100, {"n": count()})


INGRESS = [
    {"id": "a", "amount": 1, "ts": 10},
    {"id": None, "amount": 2, "ts": 20},  # a null key: the first stage gives up on it
    {"id": "b", "amount": 3, "ts": 130},
    {"id": "c", "amount": 4, "ts": 30},  # late for the second stage's window [0, 100)
]


def ingress_records() -> pa.Table:
    return batch(*[("in", 0, 40 + n, value) for n, value in enumerate(INGRESS)])


def through_first_stage(second, first=lambda: filter_rows(pc.field("amount") > 0)):
    first, io = make_task(pipeline(second, first), "clean-0")
    records = ingress_records()
    for n in range(records.num_rows):
        first.process_batch(records.slice(n, 1))
    return io


def into_second_stage(io, second, read_range=None):
    task, down = make_task(pipeline(second), "out-0", sink=True)
    task.io.read_range = read_range
    for n, (_, value, headers) in enumerate(io.stream):
        task.process_batch(batch((INTERNAL, 0, n, value, 0, dict(headers))))
    return task, down


def test_the_stage_that_read_the_record_sends_the_record_itself():
    io = through_first_stage(windows, lambda: Deduplicate("id", "ts", 1_000))
    [letter] = io.letters
    assert letter["reason"] == "Deduplicate: null_key"
    assert (letter["channel"], letter["offset"]) == ("in:0", 41)
    assert json.loads(letter["value"]) == INGRESS[1]  # the record as it came
    assert json.loads(letter["headers"]["spark-abs-row"]) == INGRESS[1]
    assert letter["headers"]["spark-abs-read-from"] == b"in:0"
    # downstream the rows carry their origin, never to a sink (checked below)
    assert all(row[ORIGIN]["topic"] == "in" for _, row, _ in io.sent)


def test_a_later_stage_reads_the_ingress_record_back_by_its_offset():
    io = through_first_stage(windows)
    asked = []
    records = ingress_records()

    def read_range(channel, start, end, timeout_s=60.0, to_end=False):
        asked.append((str(channel), start, end))
        assert timeout_s <= quarantine.ORIGINAL_READ_S
        offsets = records["offset"]
        return records.filter(pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))

    task, down = into_second_stage(io, windows, read_range)
    null_key, late = down.letters
    assert null_key["reason"] == "TumblingWindowAggregate: null_key"
    assert (null_key["channel"], null_key["offset"]) == ("in:0", 41)
    assert json.loads(null_key["value"]) == INGRESS[1]
    assert late["reason"] == "TumblingWindowAggregate: late"
    assert (late["channel"], late["offset"]) == ("in:0", 43)
    assert json.loads(late["value"]) == INGRESS[3]  # the record as it came
    assert json.loads(late["headers"]["spark-abs-row"]) == INGRESS[3]  # the row where it failed
    assert late["headers"]["spark-abs-read-from"] == f"{INTERNAL}:0".encode()
    assert asked == [("in:0", 41, 42), ("in:0", 43, 44)]  # one read per batch with dead letters
    # the sink's rows have no origin column
    assert task.output.epoch_rows and all(ORIGIN not in t.column_names for t in task.output.epoch_rows)


def test_a_record_that_cannot_be_read_back_leaves_the_row_and_says_why():
    io = through_first_stage(windows)

    def read_range(channel, start, end, timeout_s=60.0, to_end=False):
        raise RuntimeError("broker gone")

    _, late = into_second_stage(io, windows, read_range)[1].letters
    letter = late
    assert (letter["channel"], letter["offset"]) == ("in:0", 43)
    assert json.loads(letter["value"]) == INGRESS[3]  # the row, as the operator had it
    assert b"could not be read back from Kafka: broker gone" in letter["headers"]["spark-abs-original"]


def test_an_origin_naming_another_topic_is_never_read():
    """An origin is data: a record of the stage-to-stage topic may say anything."""
    io = through_first_stage(windows)
    forged = []
    for _, value, headers in io.stream:
        if dict(headers).get("abs.fmt") == b"arrow":
            with pa.ipc.open_stream(value) as reader:
                table = reader.read_all()
            fake = pa.array([{"topic": "secrets", "partition": 0, "offset": 7}] * table.num_rows, ORIGIN_TYPE)
            table = table.set_column(table.schema.get_field_index(ORIGIN), ORIGIN, fake)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            value = sink.getvalue().to_pybytes()
        forged.append((None, value, headers))
    io.stream = forged

    def read_range(channel, start, end, timeout_s=60.0, to_end=False):
        raise AssertionError(f"read {channel}")

    for letter in into_second_stage(io, windows, read_range)[1].letters:
        assert (letter["channel"], letter["offset"]) == ("secrets:0", 7)
        assert b"not an ingress record" in letter["headers"]["spark-abs-original"]
    assert json.loads(letter["value"]) == INGRESS[3]


def test_rows_made_from_many_records_name_the_record_they_were_read_from():
    """An aggregate's output names no ingress record: a dead letter after it
    names the stage-to-stage record instead of offset -1."""

    def counts_then_filter():
        from operators import Chain

        return Chain(filter_rows(pc.field("n") > 0), KeyedAggregate("id", {"m": count()}))

    pipe = Pipeline(
        "job",
        (Ingress("in", 1, SCHEMA),),
        (
            Stage("clean", ("in",), lambda: KeyedAggregate("id", {"n": count()})),
            Stage("out", ("clean",), counts_then_filter, sink=Sink()),
        ),
    )
    first, io = make_task(pipe, "clean-0")
    first.process_batch(batch(("in", 0, 0, {"id": "a", "amount": 1, "ts": 1})))
    second, down = make_task(pipe, "out-0", sink=True)
    [(_, value, headers)] = io.stream
    # the aggregate's row, its key made null on the way (a writer of the topic may)
    with pa.ipc.open_stream(value) as reader:
        table = reader.read_all()
    assert ORIGIN not in table.column_names  # an aggregate's rows name no ingress record
    table = table.set_column(table.schema.get_field_index("id"), "id", pa.nulls(1, pa.string()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    second.process_batch(batch((INTERNAL, 0, 5, sink.getvalue().to_pybytes(), 0, dict(headers))))
    [letter] = down.letters
    assert (letter["channel"], letter["offset"]) == (f"{INTERNAL}:0", 5)
    assert b"not an ingress record" in letter["headers"]["spark-abs-original"]


def test_reading_back_is_bounded_per_batch():
    offsets = list(range(0, 200 * quarantine._WIDEST_GAP, 2 * quarantine._WIDEST_GAP))
    assert quarantine._runs([1, 2, 3, 150, 9_000]) == [(1, 151), (9_000, 9_001)]
    reads = []

    class IO:
        def read_range(self, channel, start, end, timeout_s=60.0, to_end=False):
            reads.append(start)
            return batch()

    originals = quarantine._Originals(IO(), ChannelId("x", 0), None, {"in": 1})
    originals.gather([(ChannelId("in", 0), o) for o in offsets])
    assert len(reads) == quarantine.ORIGINALS_READ
    record, why = originals.get(ChannelId("in", 0), offsets[-1])
    assert record is None and f"at most {quarantine.ORIGINALS_READ} ranges" in why
    # an origin is data: a partition the topic does not have is never read
    reads.clear()
    originals = quarantine._Originals(IO(), ChannelId("x", 0), None, {"in": 1})
    originals.gather([(ChannelId("in", 7), 3)])
    assert reads == [] and "has no partition 7" in originals.get(ChannelId("in", 7), 3)[1]
