"""Property tests of what a task reads (``StageTask``, real operators, recorded
I/O): any mix of well-formed records and records no schema expected (random
bytes, JSON of the wrong shape and types, numbers of thousands of digits,
random ``abs.*`` headers, values the stage's own code raises on) never
raises out of the task; every record that is not well-formed is exactly one
dead letter, no well-formed one is; and what the well-formed records give
is what they give alone."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from task_cases import make_task

from spark_abs_examples import carts, money
from streaming.adapters.serde.records import RECORD_SCHEMA

KEY = b"k" * 32
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# headers the engine reads, with any value; a watermark record a producer may write is well-formed, not hostile
ENGINE_HEADERS = st.sampled_from(["abs.wm", "abs.gen", "abs.fmt", "abs.kind", "abs.checkpoint", "abs.job", "trace"])
HEADER_VALUES = st.one_of(st.binary(max_size=12), st.sampled_from([b"zz", b"", b"-", b"9" * 30, b"arrow", b"barrier"]))
JUNK_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)


def hostile_values(fields: list[str]) -> st.SearchStrategy[bytes]:
    """Values no schema expected, some of them JSON objects with the schema's fields of any type."""
    shaped = st.fixed_dictionaries({}, optional={f: JUNK_JSON for f in fields}).map(lambda d: json.dumps(d).encode())
    return st.one_of(
        st.binary(max_size=40),
        JUNK_JSON.map(lambda v: json.dumps(v).encode()),
        shaped,
        st.sampled_from(fields).map(lambda f: b'{"' + f.encode() + b'": ' + b"9" * 5000 + b"}"),
        st.integers(1_000, 5_000).map(lambda depth: b"[" * depth),
    )


def fed(pipeline, task: str, records: list[tuple[bytes, list[tuple[str, bytes]]]], cuts: list[int]):
    """``records`` (value, headers) at offsets 0, 1, ... of partition 0, fed to ``task`` (on recorded
    I/O, ``task_cases``) in micro-batches cut at ``cuts``; the task and the offsets of its dead letters."""
    sink = pipeline.stage(pipeline.task(task).stage).sink is not None
    # any share of the records may be bad here: the stop past max_isolated_share is tested on its own
    stage, io = make_task(pipeline, task, sink=sink, job_key=KEY, max_isolated_share=1.0)
    topic = pipeline.ingress[0].topic
    rows = [
        {
            "topic": topic,
            "partition": 0,
            "offset": offset,
            "key": None,
            "value": value,
            "headers": [{"key": k, "value": v} for k, v in headers],
            "timestamp": None,
        }
        for offset, (value, headers) in enumerate(records)
    ]
    table = pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)
    bounds = sorted({0, *(c for c in cuts if 0 < c < len(rows)), len(rows)})
    for start, end in zip(bounds[:-1], bounds[1:]):
        stage.process_batch(table.slice(start, end - start))
    return stage, [offset for _, offset, _ in io.dead]


def mixed(good: st.SearchStrategy[bytes], bad: st.SearchStrategy[tuple[bytes, list]]):
    """Lists of (value, headers, is_good), and where to cut them into micro-batches."""
    record = st.one_of(good.map(lambda v: (v, [], True)), bad.map(lambda vh: (*vh, False)))
    return st.tuples(st.lists(record, min_size=1, max_size=25), st.lists(st.integers(0, 25), max_size=4))


def bad_records(fields: list[str]) -> st.SearchStrategy[tuple[bytes, list]]:
    headers = st.lists(st.tuples(ENGINE_HEADERS, HEADER_VALUES), min_size=1, max_size=2).map(_not_a_watermark)
    return st.one_of(
        st.tuples(hostile_values(fields), st.just([])),
        st.tuples(st.just(b"{}"), headers),
    )


def _not_a_watermark(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """``headers``, with a watermark record's kind made another (a producer may write watermark records)."""
    return [(k, b"watermark?" if (k, v) == ("abs.kind", b"watermark") else v) for k, v in headers]


TRANSFERS = st.builds(
    lambda i, source, target, amount: json.dumps(
        {"id": i, "source": source, "target": target, "amount": amount, "ts": i}
    ).encode(),
    st.integers(0, 10**6),
    st.sampled_from("abc"),
    st.sampled_from("xyz"),
    st.integers(1, 500),
)


@FUZZ
@given(data=mixed(TRANSFERS, bad_records(["id", "source", "target", "amount", "ts"])))
def test_no_record_a_plain_producer_writes_fails_the_money_task_and_each_bad_one_is_one_dead_letter(data):
    records, cuts = data
    pipeline = money.pipeline("fuzzed")
    everything = [(value, headers) for value, headers, _ in records]
    stage, dead = fed(pipeline, "legs-0", everything, cuts)
    bad = [offset for offset, (_, _, good) in enumerate(records) if not good]
    # a record of the wrong shape may still be a transfer (JSON that happens to fit): then it is no dead letter
    assert len(dead) == len(set(dead)), "a record dead-lettered twice"
    assert set(dead) <= set(bad), "a well-formed transfer dead-lettered"
    alone, _ = fed(pipeline, "legs-0", [(v, h) for v, h, good in records if good], [])
    undecided = len(bad) - len(dead)
    assert stage.counters["output_rows"] >= alone.counters["output_rows"]
    assert stage.counters["output_rows"] <= alone.counters["output_rows"] + 2 * undecided


EVENTS = st.builds(
    lambda user, action, price, ts: json.dumps({"user": user, "action": action, "price": price, "ts": ts}).encode(),
    st.sampled_from(["u", "v"]),
    st.sampled_from(["add", "add", "checkout"]),
    st.integers(1, 100),
    st.integers(0, 1_000),
)
# what AbandonedCarts raises on: an item without a price
PRICELESS = st.builds(
    lambda user, ts: (json.dumps({"user": user, "action": "add", "price": None, "ts": ts}).encode(), []),
    st.sampled_from(["u", "v"]),
    st.integers(0, 1_000),
)


@FUZZ
@given(data=mixed(EVENTS, st.one_of(PRICELESS, bad_records(["user", "action", "price", "ts"]))))
# a record the operator gives up on (no user) far ahead in event time: it closed u's cart early
@example(data=([(b'{"user": "u", "action": "add", "price": 1, "ts": 0}', [], True), (b'{"ts":602000}', [], False)], []))
def test_records_the_carts_function_raises_on_are_set_aside_and_the_carts_are_those_of_the_others(data):
    records, cuts = data
    pipeline = carts.pipeline("fuzzed")
    stage, dead = fed(pipeline, "abandoned-carts-0", [(v, h) for v, h, _ in records], cuts)
    alone, _ = fed(pipeline, "abandoned-carts-0", [(v, h) for v, h, good in records if good], [])
    bad = {offset for offset, (_, _, good) in enumerate(records) if not good}
    priceless = {
        offset
        for offset, (value, headers, good) in enumerate(records)
        if not good and not headers and value.startswith(b'{"user"') and b'"price": null' in value
    }
    assert len(dead) == len(set(dead)) and set(dead) <= bad
    assert priceless <= set(dead)
    if set(dead) == bad:  # every bad record decided: the carts are exactly those of the good ones
        assert {u: stage.operator.state_of(u) for u in "uv"} == {u: alone.operator.state_of(u) for u in "uv"}
