"""SlidingWindowAggregate: every row in size / slide windows, the engine's
watermark, exactly-once final results, late rows and nulls to the dead
letters, timestamp columns, output independent of batch cuts, resume,
rescale and restore checks."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import window_steps
from window_models import (
    SCALE,
    SCHEMA,
    assign,
    check_resume,
    dense_window_steps,
    letter_counts,
    millis,
    recut,
    routed,
    row_counts,
    sliding_model,
    timestamp_runs,
    watermark_outputs,
)

from operators import InputSchemaError, OperatorConfigError, StateRestoreError, count, max_, sum_
from operators.rescale import MIN, RESCALE_METADATA, split_state
from operators.state import KEYS_METADATA
from operators.testing import Watermark, parquet_roundtrip, run
from operators.windows import SlidingWindowAggregate

PROFILE = settings.get_profile("operators")
# (size, slide): overlapping windows, tumbling ones (slide == size), one-ms ones
SHAPES = [(10, 5), (12, 4), (6, 2), (7, 7), (1, 1), (30, 10)]
LATENESS = [0, 4, 25]
STEPS = st.one_of(window_steps(), dense_window_steps())


def batch(*rows) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(["k", "t", "v"], r)) for r in rows], schema=SCHEMA)


def sliding(size=10, slide=5, lateness=0) -> SlidingWindowAggregate:
    return SlidingWindowAggregate("k", "t", size, slide, {"n": count(), "s": sum_("v")}, allowed_lateness=lateness)


def factory(shape, lateness):
    return lambda: sliding(*shape, lateness)


# -- properties --------------------------------------------------------------


@PROFILE
@given(STEPS, st.sampled_from(SHAPES), st.sampled_from(LATENESS))
def test_matches_the_model(steps, shape, lateness) -> None:
    result = run(sliding(*shape, lateness), steps)
    expected_outputs, expected_letters = sliding_model(steps, *shape, lateness)
    assert [t.to_pylist() for t in result.outputs] == expected_outputs
    assert list(result.dead_letters) == expected_letters


@PROFILE
@given(st.data(), st.sampled_from(SHAPES), st.sampled_from(LATENESS))
def test_output_does_not_depend_on_how_rows_are_cut_into_batches(data, shape, lateness) -> None:
    steps = data.draw(STEPS)
    other = data.draw(recut(steps))
    first, second = run(sliding(*shape, lateness), steps), run(sliding(*shape, lateness), other)
    assert watermark_outputs(steps, first) == watermark_outputs(other, second)
    assert letter_counts(first.dead_letters) == letter_counts(second.dead_letters)


@PROFILE
@given(window_steps(), st.sampled_from(SHAPES))
def test_each_window_is_emitted_at_most_once(steps, shape) -> None:
    emitted = [(r["k"], r["window_start"]) for r in run(sliding(*shape), steps).rows()]
    assert len(emitted) == len(set(emitted))


@PROFILE
@given(st.data(), st.sampled_from(SHAPES), st.sampled_from(LATENESS))
def test_resumes_exactly(data, shape, lateness) -> None:
    steps = data.draw(STEPS)
    check_resume(factory(shape, lateness), steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data(), st.sampled_from(SHAPES), st.sampled_from(LATENESS))
def test_state_divided_among_three_tasks_closes_the_same_windows(data, shape, lateness) -> None:
    """Two tasks run to a cut, their state is divided among three by key, the
    three go on: together they emit and reject what one task would have."""
    steps = data.draw(window_steps())
    cut = data.draw(st.integers(0, len(steps)))
    make = factory(shape, lateness)
    whole = run(make(), [*steps, Watermark(1_000)])
    old = [make(), make()]
    results = [run(op, [routed(s, 2, task) for s in steps[:cut]]) for task, op in enumerate(old)]
    divided = split_state([parquet_roundtrip(op.snapshot()) for op in old], 3, ["k"], assign)
    for task, state in enumerate(divided):
        op = make()
        op.restore(state)
        results.append(run(op, [routed(s, 3, task) for s in [*steps[cut:], Watermark(1_000)]]))
    assert row_counts(r for result in results for r in result.rows()) == row_counts(whole.rows())
    assert letter_counts(x for result in results for x in result.dead_letters) == letter_counts(whole.dead_letters)


@PROFILE
@given(window_steps(), st.sampled_from(SHAPES), st.sampled_from(["s", "ms", "us"]))
def test_timestamp_columns_give_the_windows_of_their_milliseconds(steps, shape, unit) -> None:
    """The same times as timestamps (any unit, a zone) and as integer
    milliseconds give the same windows; microseconds round down."""
    as_ints, as_stamps = timestamp_runs(lambda: sliding(shape[0] * SCALE[unit], shape[1] * SCALE[unit]), steps, unit)
    for table in as_stamps.outputs:
        assert table.num_rows == 0 or table.schema.field("window_end").type == pa.timestamp("ms", "Europe/Paris")
    assert [millis(r, "window_start", "window_end") for r in as_stamps.rows()] == as_ints.rows()


# -- examples ----------------------------------------------------------------


def test_a_row_counts_in_every_window_that_holds_it() -> None:
    op = sliding(size=10, slide=5)
    assert op.process(batch(("a", 3, 1), ("a", 7, 2), ("a", 10, 4))).num_rows == 0
    assert op.watermark is None  # rows never move it
    out = op.on_watermark(15)
    assert out.column_names == ["k", "window_start", "window_end", "n", "s"]
    assert out.to_pylist() == [
        {"k": "a", "window_start": -5, "window_end": 5, "n": 1, "s": 1},
        {"k": "a", "window_start": 0, "window_end": 10, "n": 2, "s": 3},
        {"k": "a", "window_start": 5, "window_end": 15, "n": 2, "s": 6},
    ]
    assert op.open_windows.select(["window_start", "n"]).to_pylist() == [{"window_start": 10, "n": 1}]


def test_a_row_some_of_whose_windows_closed_counts_only_in_the_open_ones() -> None:
    op = sliding(size=10, slide=5)
    op.on_watermark(10)  # [0, 10) closed, [5, 15) open
    op.process(batch(("a", 7, 1)))
    assert op.dead_letters.drain() == []
    assert [(r["window_start"], r["n"]) for r in op.on_watermark(20).to_pylist()] == [(5, 1)]


def test_a_row_all_of_whose_windows_closed_is_late() -> None:
    op = sliding(size=10, slide=5, lateness=3)
    op.process(batch(("a", 12, 1)))
    op.on_watermark(18)  # [5, 15) closed at 15 + 3; [10, 20) is open
    op.process(batch(("a", 9, 1), ("b", 10, 1)))
    letters = op.dead_letters.drain()
    assert [(x.row, x.reason, x.operator) for x in letters] == [
        ({"k": "a", "t": 9, "v": 1}, "late", "SlidingWindowAggregate")
    ]
    assert sorted(op.open_windows.select(["k", "window_start"]).to_pylist(), key=str) == sorted(
        [{"k": "a", "window_start": 10}, {"k": "b", "window_start": 10}], key=str
    )


def test_output_is_ordered_by_window_then_key_and_negative_times_round_down() -> None:
    op = sliding(size=4, slide=2)
    op.process(batch(("b", -1, 1), ("a", 1, 1)))
    out = op.on_watermark(100)
    assert [(r["window_start"], r["k"]) for r in out.to_pylist()] == [(-4, "b"), (-2, "a"), (-2, "b"), (0, "a")]


def test_on_watermark_takes_datetimes_and_never_goes_back() -> None:
    op = sliding()
    op.process(batch(("a", 5, 1)))
    assert op.on_watermark(10).num_rows == 1  # [0, 10)
    assert op.on_watermark(3).num_rows == 0 and op.watermark == 10
    assert op.on_watermark(dt.datetime(1970, 1, 1, 0, 0, 0, 15_000)).to_pylist()[0]["window_end"] == 15
    with pytest.raises(OperatorConfigError, match="watermark must be"):
        op.on_watermark(1.5)


def test_null_keys_and_null_times_go_to_dead_letters() -> None:
    op = sliding()
    op.process(batch((None, 1, 1), ("a", None, 2), ("a", 1, 3)))
    assert [x.reason for x in op.dead_letters.drain()] == ["null_key", "null_event_time"]


def test_timestamp_windows_keep_the_zone() -> None:
    op = SlidingWindowAggregate("k", "ts", dt.timedelta(minutes=1), dt.timedelta(seconds=30), {"hi": max_("v")})
    at = lambda s: dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.UTC) + dt.timedelta(seconds=s)  # noqa: E731
    schema = pa.schema([("k", pa.int32()), ("ts", pa.timestamp("us", "UTC")), ("v", pa.float64())])
    op.process(pa.Table.from_pylist([{"k": 1, "ts": at(45.5), "v": 2.0}], schema=schema))
    out = op.on_watermark(at(120))
    assert out.schema.field("window_end").type == pa.timestamp("ms", "UTC")
    assert [(r["window_start"], r["window_end"]) for r in out.to_pylist()] == [(at(0), at(60)), (at(30), at(90))]


def test_time_column_must_be_integer_or_timestamp() -> None:
    with pytest.raises(InputSchemaError, match="expected integer milliseconds"):
        sliding().process(pa.table({"k": ["a"], "t": ["noon"], "v": [1]}))


def test_state_keys_repr_and_snapshot_metadata() -> None:
    op = sliding()
    op.process(batch(("a", 1, 1)))
    assert op.state_keys == {None: "k"}
    assert repr(op) == (
        "SlidingWindowAggregate(key='k', time='t', size=10ms, slide=5ms, lateness=0ms, n=count(), s=sum(v))"
    )
    state = op.snapshot()
    assert sorted(state) == ["watermark", "windows"]
    assert state["windows"].schema.metadata[KEYS_METADATA] == b'["k", "window_start"]'
    assert state["watermark"].schema.metadata[RESCALE_METADATA] == MIN.encode()


# -- restore and arguments ---------------------------------------------------


def restored_op() -> SlidingWindowAggregate:
    op = sliding()
    op.process(batch(("a", 17, 1)))
    op.on_watermark(15)  # [10, 20) and [15, 25) stay open
    return op


@pytest.mark.parametrize(
    "change, message",
    [
        ({"watermark": pa.table({"watermark": [1, 2]})}, "one integer row"),
        ({"watermark": pa.table({"watermark": ["x"]})}, "one integer row"),
        ({"watermark": pa.table({"wm": [1]})}, "has columns"),
        ({"watermark": pa.table({"watermark": [20]})}, "should have closed"),
        ({"windows": pa.table({"k": ["a"], "window_start": [12], "n": [1], "s": [1]})}, "multiples of slide"),
        ({"windows": pa.table({"k": ["a"], "window_start": ["10"], "n": [1], "s": [1]})}, "expected int64"),
        ({"windows": pa.table({"k": ["a"], "window_start": [10], "n": ["1"], "s": [1]})}, "cannot hold count"),
        ({"windows": pa.table({"k": ["a", "a"], "window_start": [10, 10], "n": [1, 1], "s": [1, 1]})}, "duplicate"),
        ({"windows": pa.table({"k": ["a"], "window_start": [10], "n": [1]})}, "has columns"),
        ({"windows": None}, "missing \\['windows'\\]"),
        ({"extra": pa.table({"x": [1]})}, "unexpected \\['extra'\\]"),
    ],
)
def test_restore_rejects_bad_state_and_leaves_the_operator_as_it_was(change, message) -> None:
    good = parquet_roundtrip(restored_op().snapshot())
    state = {name: table for name, table in {**good, **change}.items() if table is not None}
    op = restored_op()
    with pytest.raises(StateRestoreError, match=message):
        op.restore(state)
    assert op.watermark == 15
    assert op.open_windows.select(["window_start", "n"]).sort_by("window_start").to_pylist() == [
        {"window_start": 10, "n": 1},
        {"window_start": 15, "n": 1},
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size": 10, "slide": 3}, "size must be a multiple of slide"),
        ({"size": 5, "slide": 10}, "size must be a multiple of slide"),
        ({"slide": 0}, "slide must be > 0"),
        ({"size": 0}, "size must be > 0"),
        ({"slide": 2.5}, "slide must be an int"),
        ({"slide": True}, "slide must be an int"),
        ({"slide": dt.timedelta(microseconds=500)}, "whole milliseconds"),
        ({"allowed_lateness": -1}, "allowed_lateness must be >= 0"),
        ({"time_column": ""}, "time_column"),
        ({"key": None}, "key must be"),
        ({"key": "window_start"}, "reserved"),
        ({"aggregations": {"m": sum_("window_end")}}, "reserved"),
        ({"aggregations": {"window_end": count()}}, "name of a key"),
        ({"aggregations": {}}, "non-empty mapping"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message) -> None:
    arguments = {"key": "k", "time_column": "t", "size": 10, "slide": 5, "aggregations": {"n": count()}, **kwargs}
    with pytest.raises(OperatorConfigError, match=message):
        SlidingWindowAggregate(**arguments)


def test_timedelta_sizes_are_milliseconds() -> None:
    op = SlidingWindowAggregate("k", "t", dt.timedelta(seconds=1), dt.timedelta(milliseconds=250), {"n": count()})
    assert (op.size, op.slide) == (1000, 250)
