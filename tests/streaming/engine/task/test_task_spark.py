"""A stage task over micro-batches its stage's Spark code prepared on a
real Spark session: a barrier cuts the code's output exactly where it is
on each channel, and records Spark could not decode reach the dead letters."""

from __future__ import annotations

import pyarrow as pa
import pytest
from task_cases import batch, make_task

from barriers.messages import Barrier, ChannelId
from operators import KeyedAggregate, count, sum_
from streaming.adapters.spark.stage import SparkStage
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("account", pa.string()), ("amount", pa.int64())])


def _pipeline() -> Pipeline:
    return Pipeline(
        "job",
        (Ingress("in", 2, SCHEMA),),
        (
            Stage(
                "count",
                ("in",),
                lambda: KeyedAggregate("account", {"n": count(), "total": sum_("amount")}),
                sink=Sink(),
                spark="SELECT _position, account, amount * 10 AS amount FROM {input} WHERE amount > 0",
            ),
        ),
    )


def _totals(table: pa.Table) -> dict[str, tuple[int, int]]:
    return {r["account"]: (r["n"], r["total"]) for r in table.to_pylist()}


def test_a_barrier_cuts_the_output_of_spark_code_exactly(spark):
    pipeline = _pipeline()
    code = SparkStage(spark, pipeline.stage("count"), pipeline.ingress[0])
    task, io = make_task(pipeline, sink=True, max_segment_records=2)
    task.process_batch(
        code.records(
            batch(
                ("in", 0, 0, {"account": "x", "amount": 1}),
                ("in", 0, 1, {"account": "x", "amount": -5}),  # filtered out by the code
                ("in", 0, 2, {"account": "x", "amount": 2}),
                ("in", 0, 3, Barrier(1, job="job")),
                ("in", 0, 4, {"account": "x", "amount": 4}),  # after the barrier: checkpoint 2
                ("in", 1, 0, b"{not json"),
                ("in", 1, 1, {"account": "y", "amount": 8}),
                ("in", 1, 2, {"account": "y", "amount": -1}),  # filtered out, the channel's last record
            )
        )
    )
    # channel 0 is held at its barrier; channel 1 has not brought its own yet
    assert task.handler.blocked == {ChannelId("in", 0)}
    task.process_batch(
        code.records(
            batch(
                ("in", 1, 3, {"account": "y", "amount": 16}),
                ("in", 1, 4, Barrier(1, job="job")),
                ("in", 1, 5, {"account": "y", "amount": 32}),
            )
        )
    )
    task.wait_for_uploads()
    state, positions, in_flight, metadata = io.snapshots[1]
    assert positions == {"in:0": 4, "in:1": 5} and in_flight == {} and metadata["kind"] == "aligned"
    assert _totals(io.staged[1]) == {"x": (2, 30), "y": (2, 240)}  # the records before each barrier
    assert io.dead == [("in:1", 0, io.dead[0][2])] and io.dead[0][2].startswith("value is not JSON")
    task.process_batch(code.records(batch(("in", 0, 5, Barrier(2, job="job")), ("in", 1, 6, Barrier(2, job="job")))))
    task.wait_for_uploads()
    assert _totals(io.staged[2]) == {"x": (3, 70), "y": (3, 560)}  # and the ones after them
    assert task.progress().positions == {"in:0": 6, "in:1": 7}
    assert task.counters["records"] == 9  # every data record, filtered and undecodable ones too
