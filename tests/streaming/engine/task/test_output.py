"""Where a task's output goes (``streaming.engine.task.output``): rows routed
by key to the task's output channels as ``streaming.api.pipeline.route``
says, in Arrow records that decode back to the same rows, with the
generation, the format and the watermark in their headers, counted per
channel; a sink stage's rows kept for its epoch (taken by a snapshot, given
back by an abort ahead of the new ones); watermark records to every output
channel; the rows' origin column kept only for a stage that reads them in
Python.

The pipeline, its task specs and the task's metrics are real; the I/O is a
recorder of what was sent."""

from __future__ import annotations

import collections
import os
import uuid

import pyarrow as pa
import pytest

from barriers.headers import FORMAT_HEADER, GENERATION_HEADER, IDLE_HEADER, KIND_HEADER, WATERMARK_HEADER
from barriers.messages import ChannelId
from operators.dead_letters import ORIGIN, ORIGIN_TYPE
from operators.stateless import Passthrough
from streaming.adapters.serde import codec
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage, route
from streaming.engine import metrics
from streaming.engine.metrics import TaskMetrics
from streaming.engine.task.output import TaskOutput

SCHEMA = pa.schema([("account", pa.string()), ("amount", pa.int64())])
GENERATION = 4


class IO:
    """The task's ``send``, recorded: channel, key, value and headers of every record."""

    def __init__(self):
        self.sent: list[tuple[ChannelId, bytes | None, bytes, dict]] = []

    def send(self, channel, key, value, headers):
        self.sent.append((channel, key, value, dict(headers)))

    def rows(self) -> dict[ChannelId, list[dict]]:
        """The rows of every Arrow record sent, by channel, in the order sent."""
        rows: dict[ChannelId, list[dict]] = collections.defaultdict(list)
        for channel, _, value, _ in self.sent:
            table = codec.read_batch(value, codec.DECODED_BATCH_BYTES)
            assert isinstance(table, pa.Table), table
            rows[channel] += table.to_pylist()
        return dict(rows)


def _pipeline(job: str, *, downstream_tasks: int = 3, tasks: int = 2, key: str | None = "account", spark=False):
    """``in`` -> ``clean`` (``tasks`` tasks) -> ``sums`` (a sink; Spark code when ``spark``)."""
    clean = Stage("clean", ("in",), Passthrough, parallelism=tasks, key=key, schema=SCHEMA if spark else None)
    if spark:
        sums = Stage("sums", ("clean",), spark=lambda df: df, parallelism=downstream_tasks, sink=Sink())
    else:
        sums = Stage("sums", ("clean",), Passthrough, parallelism=downstream_tasks, sink=Sink())
    return Pipeline(job, (Ingress("in", 4, SCHEMA),), (clean, sums))


def _output(pipeline: Pipeline, task: str):
    spec = pipeline.task(task)
    io, counters = IO(), collections.Counter()
    output = TaskOutput(
        pipeline, spec, io, GENERATION, counters, TaskMetrics(pipeline.job, task, spec.inputs, spec.outputs)
    )
    return output, io, counters


def _rows(*accounts: str) -> pa.Table:
    return pa.table({"account": pa.array(accounts, pa.string()), "amount": pa.array(range(len(accounts)), pa.int64())})


def _with_origin(table: pa.Table) -> pa.Table:
    origins = pa.array([{"topic": "in", "partition": 1, "offset": 100 + n} for n in range(table.num_rows)], ORIGIN_TYPE)
    return table.append_column(pa.field(ORIGIN, ORIGIN_TYPE), origins)


def _sent_to(job: str, task: str, channel: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "spark_abs_records_out_total", {"job_name": job, "task": task, "channel": channel}
    )


@pytest.fixture
def job() -> str:
    return f"out-{uuid.uuid4().hex[:8]}"


# ---- routing


def test_every_row_goes_to_the_channel_its_key_routes_it_to(job):
    pipeline = _pipeline(job)
    output, io, counters = _output(pipeline, "clean-1")
    table = _rows(*[f"acct-{n % 17}" for n in range(60)], None)  # a null key is routed too
    output.emit(table, watermark=None)

    received = io.rows()
    targets = route(table, "account", 3).to_pylist()
    expected: dict[ChannelId, list[dict]] = collections.defaultdict(list)
    for row, target in zip(table.to_pylist(), targets):
        expected[output.spec.outputs[target]].append(row)
    assert received == dict(expected)  # each row once, on its channel, in the order emitted
    assert len(received) > 1  # 17 keys over 3 channels: more than one is used
    assert sum(len(rows) for rows in received.values()) == table.num_rows
    assert counters["output_rows"] == table.num_rows


def test_a_key_always_reaches_the_downstream_task_that_reads_its_channel(job):
    """Task clean-1 writes partitions 3..5 of the stage-to-stage topic; the rows
    route gives index s reach the partition downstream task sums-s reads."""
    pipeline = _pipeline(job)
    output, io, _ = _output(pipeline, "clean-1")
    assert [c.partition for c in output.spec.outputs] == [3, 4, 5]
    table = _rows(*[f"k{n}" for n in range(30)])
    for n in range(table.num_rows):  # a row at a time: one emit per row, the same channel for a key
        output.emit(table.slice(n, 1), watermark=None)
    targets = dict(zip(table["account"].to_pylist(), route(table, "account", 3).to_pylist()))
    for channel, rows in io.rows().items():
        for row in rows:
            reader = pipeline.task(f"sums-{targets[row['account']]}")
            assert channel in reader.inputs


def test_without_a_key_one_downstream_task_gets_everything(job):
    pipeline = _pipeline(job, downstream_tasks=1, key=None)
    output, io, _ = _output(pipeline, "clean-0")
    table = _rows("a", "b", "c", "d")
    output.emit(table, watermark=None)
    [(channel, key, _, _)] = io.sent
    assert channel == ChannelId(pipeline.topic_of("clean"), 0) and key is None
    assert io.rows() == {channel: table.to_pylist()}


def test_a_large_output_goes_in_several_records_below_the_message_size(job):
    pipeline = _pipeline(job, downstream_tasks=1, key=None)
    output, io, _ = _output(pipeline, "clean-0")
    blobs = [os.urandom(100_000) for _ in range(25)]  # 2.5 MB that does not compress
    table = pa.table({"account": [f"a{n}" for n in range(25)], "blob": blobs})
    output.emit(table, watermark=None)
    assert len(io.sent) > 1
    assert all(len(value) <= codec.MAX_BATCH_BYTES for _, _, value, _ in io.sent)
    [rows] = io.rows().values()
    assert rows == table.to_pylist()


# ---- headers and counts


def test_records_carry_the_generation_the_arrow_format_and_the_watermark(job):
    output, io, _ = _output(_pipeline(job), "clean-0")
    output.emit(_rows("a", "b", "c", "d", "e"), watermark=1_700_000)
    assert io.sent
    for _, _, _, headers in io.sent:
        assert headers == {
            GENERATION_HEADER: str(GENERATION).encode(),
            FORMAT_HEADER: codec.ARROW_FORMAT,
            WATERMARK_HEADER: b"1700000",
        }


def test_records_without_a_watermark_carry_none(job):
    output, io, _ = _output(_pipeline(job), "clean-0")
    output.emit(_rows("a"), watermark=None)
    [(_, _, _, headers)] = io.sent
    assert WATERMARK_HEADER not in headers
    assert headers[GENERATION_HEADER] == str(GENERATION).encode() and headers[FORMAT_HEADER] == b"arrow"


def test_rows_are_counted_per_output_channel_and_in_total(job):
    output, io, counters = _output(_pipeline(job), "clean-0")
    table = _rows(*[f"acct-{n}" for n in range(40)])
    output.emit(table, watermark=None)
    output.emit(table.slice(0, 10), watermark=None)
    assert counters["output_rows"] == 50
    received = io.rows()
    for channel in output.spec.outputs:
        assert _sent_to(job, "clean-0", str(channel)) == len(received.get(channel, []))
    assert sum(_sent_to(job, "clean-0", str(c)) for c in output.spec.outputs) == 50


@pytest.mark.parametrize("empty", [None, _rows()], ids=["none", "no-rows"])
def test_no_output_sends_and_counts_nothing(job, empty):
    output, io, counters = _output(_pipeline(job), "clean-0")
    output.emit(empty, watermark=5)
    assert io.sent == [] and counters["output_rows"] == 0
    sink, sink_io, sink_counters = _output(_pipeline(job), "sums-0")
    sink.emit(empty, watermark=5)
    assert sink.epoch_rows == [] and sink_io.sent == [] and sink_counters["output_rows"] == 0


# ---- a sink stage's epoch


def test_a_sink_stage_keeps_its_rows_for_the_epoch_and_sends_nothing(job):
    pipeline = _pipeline(job)
    output, io, counters = _output(pipeline, "sums-2")
    assert output.spec.outputs == () and output.to_sink
    first, second = _rows("a", "b"), _rows("c")
    output.emit(first, watermark=10)
    output.emit(second, watermark=20)
    assert io.sent == []
    assert output.epoch_rows == [first, second]
    assert counters["output_rows"] == 3
    assert _sent_to(job, "sums-2", "sink") == 3


def test_a_snapshot_takes_the_epoch_and_the_next_one_starts_empty(job):
    output, _, _ = _output(_pipeline(job), "sums-0")
    rows = _rows("a", "b")
    output.emit(rows, watermark=None)
    assert output.take_epoch() == [rows]
    assert output.epoch_rows == [] and output.take_epoch() == []


def test_an_aborted_epochs_rows_go_before_the_new_ones(job):
    output, _, _ = _output(_pipeline(job), "sums-0")
    old, new = _rows("old-1", "old-2"), _rows("new")
    output.emit(old, watermark=None)
    taken = output.take_epoch()
    output.emit(new, watermark=None)  # rows of the next epoch came while the snapshot was aborted
    output.give_back(taken)
    assert output.epoch_rows == [old, new]
    assert pa.concat_tables(output.take_epoch())["account"].to_pylist() == ["old-1", "old-2", "new"]


# ---- watermarks


def test_a_watermark_goes_to_every_output_channel_as_an_empty_record(job):
    output, io, counters = _output(_pipeline(job), "clean-1")
    output.watermark(1_234)
    assert [channel for channel, *_ in io.sent] == list(output.spec.outputs)
    for _, key, value, headers in io.sent:
        assert key is None and value == b""
        assert headers == {
            KIND_HEADER: b"watermark",
            WATERMARK_HEADER: b"1234",
            GENERATION_HEADER: str(GENERATION).encode(),
        }
    assert counters["output_rows"] == 0


def test_an_idle_task_says_so_and_an_unknown_watermark_has_no_value(job):
    output, io, _ = _output(_pipeline(job), "clean-0")
    output.watermark(None, idle=True)
    assert len(io.sent) == 3
    for _, _, value, headers in io.sent:
        assert value == b""
        assert headers[KIND_HEADER] == b"watermark" and headers[IDLE_HEADER] == b"1"
        assert WATERMARK_HEADER not in headers


def test_a_sink_stage_sends_no_watermark(job):
    output, io, _ = _output(_pipeline(job), "sums-0")
    output.watermark(99, idle=True)
    assert io.sent == []


# ---- the rows' origin


def test_rows_keep_their_origin_for_a_stage_that_reads_them_in_python(job):
    output, io, _ = _output(_pipeline(job), "clean-0")
    table = _with_origin(_rows("a", "b", "c"))
    output.emit(table, watermark=None)
    received = [row for rows in io.rows().values() for row in rows]
    assert sorted(row[ORIGIN]["offset"] for row in received) == [100, 101, 102]
    assert all(row[ORIGIN]["topic"] == "in" for row in received)


def test_rows_keep_their_origin_for_spark_code_to_name_a_row_it_raises_on(job):
    output, io, _ = _output(_pipeline(job, spark=True), "clean-0")
    table = _with_origin(_rows("a", "b", "c"))
    output.emit(table, watermark=None)
    received = [row for rows in io.rows().values() for row in rows]
    # Spark reads the columns the stage declares; a row its code raises on goes aside as the ingress record it names
    assert sorted(received, key=lambda r: r["account"]) == table.to_pylist()


def test_a_sink_never_gets_the_origin(job):
    output, _, counters = _output(_pipeline(job), "sums-1")
    output.emit(_with_origin(_rows("a", "b")), watermark=None)
    [kept] = output.epoch_rows
    assert kept.column_names == ["account", "amount"]
    assert kept.to_pylist() == _rows("a", "b").to_pylist()
    assert counters["output_rows"] == 2
