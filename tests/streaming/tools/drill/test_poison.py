"""The records a drill's poison kind appends (``streaming.tools.drill.poison``),
each fed to a real task of the example it is made for, on recorded I/O:
every one is exactly one dead letter saying why, nothing raises, and the
well-formed records around them are processed as if they had not been
there."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from barriers.headers import DRILL_HEADER
from spark_abs_examples import carts, money
from streaming.adapters.serde.records import RECORD_SCHEMA
from streaming.engine.task.stage_task import StageTask, TaskIO, TaskOptions
from streaming.tools.drill.poison import HOSTILE, hostile_records, own_poison
from streaming.tools.drill.workload import InputRecord

KEY = b"k" * 32


class Recorded:
    """A task's I/O that keeps its dead letters and its output rows' count."""

    def __init__(self) -> None:
        self.dead: list[tuple[str, int, str]] = []
        self.sent = 0

    def io(self) -> TaskIO:
        return TaskIO(
            send=lambda *record: setattr(self, "sent", self.sent + 1),
            append_barrier=lambda channels, headers: {c: 0 for c in channels},
            publish=lambda event: None,
            dead_letter=lambda channel, offset, key, value, headers, reason, notes: self.dead.append(
                (str(channel), offset, reason)
            ),
            write_snapshot=lambda *a, **k: None,
            stage_epoch=lambda epoch, table: None,
        )


def fed(pipeline, records: list[InputRecord], task: str) -> tuple[StageTask, Recorded]:
    """``records`` (one partition's, in order from offset 0) fed as one micro-batch to ``task``."""
    recorded = Recorded()
    stage = StageTask(pipeline, pipeline.task(task), recorded.io(), options=TaskOptions(job_key=KEY))
    stage.recover()
    rows = [
        {
            "topic": r.topic,
            "partition": r.partition,
            "offset": offset,
            "key": r.key,
            "value": r.value,
            "headers": [{"key": k, "value": v} for k, v in r.headers],
            "timestamp": None,
        }
        for offset, r in enumerate(records)
    ]
    stage.process_batch(pa.Table.from_pylist(rows, schema=RECORD_SCHEMA))
    return stage, recorded


def test_every_hostile_record_is_marked_for_the_references_and_made_for_every_ingress():
    pipeline = money.pipeline("poisoned")
    records = hostile_records(pipeline)
    assert len(records) == len(HOSTILE) - 1  # no Confluent wire format on a JSON ingress
    assert all(dict(r.headers)[DRILL_HEADER] == b"poison" and r.malformed for r in records)
    assert {r.partition for r in records} == set(range(pipeline.ingress[0].partitions))


@pytest.mark.parametrize("example", ["money", "carts"])
def test_each_hostile_record_is_one_dead_letter_with_its_reason_and_the_task_goes_on(example):
    if example == "money":
        pipeline, task = money.pipeline("poisoned"), "legs-0"
        good = json.dumps({"id": 1, "source": "a", "target": "b", "amount": 5, "ts": 1}).encode()
    else:
        pipeline, task = carts.pipeline("poisoned"), "abandoned-carts-0"
        good = json.dumps({"user": "u", "action": "add", "price": 3, "ts": 1_000}).encode()
    topic = pipeline.ingress[0].topic
    hostile = [InputRecord(topic, 0, r.value, r.headers) for r in hostile_records(pipeline)]
    records = [InputRecord(topic, 0, good), *hostile, InputRecord(topic, 0, good)]
    stage, recorded = fed(pipeline, records, task)
    assert sorted(offset for _, offset, _ in recorded.dead) == list(range(1, len(hostile) + 1))
    reasons = [reason for _, _, reason in sorted(recorded.dead, key=lambda d: d[1])]
    assert reasons[0].startswith("value is not JSON")
    assert "Exceeds the limit (4300 digits)" in reasons[1]
    assert "nested deeper than Python's recursion limit" in reasons[2]
    assert "Arrow" in reasons[3]
    assert reasons[4].startswith("header abs.wm is b'zz'") and reasons[5].startswith("header abs.gen is b'zz'")
    assert reasons[6] == "rejected control record: unsigned, but this job signs its barriers"
    # the two well-formed records went through as if the others had not been there
    if example == "money":
        assert stage.counters["output_rows"] == 4  # two legs each
    else:
        assert stage.operator.state_of("u") == {"started": 1_000, "last": 1_000, "items": 2, "value": 6}


def test_an_item_without_a_price_makes_the_carts_function_raise_and_is_set_aside_alone():
    pipeline = carts.pipeline("poisoned")
    topic = pipeline.ingress[0].topic
    sent = InputRecord(topic, 0, json.dumps({"user": "u", "action": "add", "price": 3, "ts": 1_000}).encode())
    [priceless] = own_poison(pipeline, carts.priceless, {topic: sent})
    assert dict(priceless.headers)[DRILL_HEADER] == b"poison" and json.loads(priceless.value)["price"] is None
    later = InputRecord(topic, 0, json.dumps({"user": "u", "action": "add", "price": 4, "ts": 2_000}).encode())
    stage, recorded = fed(pipeline, [sent, priceless, later], "abandoned-carts-0")
    [(channel, offset, reason)] = recorded.dead
    assert (channel, offset) == (f"{topic}:0", 1)
    assert reason.startswith("stage abandoned-carts raised TypeError: unsupported operand")
    # the cart holds the two items with a price, as if the third had not been there
    assert stage.operator.state_of("u") == {"started": 1_000, "last": 2_000, "items": 2, "value": 7}
