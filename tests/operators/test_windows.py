"""TumblingWindowAggregate: window assignment, the engine's watermark, exactly-once
final results, late rows and nulls to the dead letters, timestamp columns."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import window_steps, windows_model

from operators import InputSchemaError, OperatorConfigError, TumblingWindowAggregate, count, max_, sum_
from operators.testing import run

PROFILE = settings.get_profile("operators")
SCHEMA = pa.schema([("k", pa.string()), ("t", pa.int64()), ("v", pa.int64())])


def batch(*rows) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(["k", "t", "v"], r)) for r in rows], schema=SCHEMA)


def windows(size=10, lateness=0) -> TumblingWindowAggregate:
    return TumblingWindowAggregate("k", "t", size, {"n": count(), "s": sum_("v")}, allowed_lateness=lateness)


@PROFILE
@given(window_steps(), st.sampled_from([1, 7, 10]), st.sampled_from([0, 4, 25]))
def test_matches_the_model(steps, size, lateness) -> None:
    result = run(windows(size, lateness), steps)
    expected_outputs, expected_letters = windows_model(steps, size, lateness)
    assert [t.to_pylist() for t in result.outputs] == expected_outputs
    assert list(result.dead_letters) == expected_letters


@PROFILE
@given(window_steps())
def test_each_window_is_emitted_at_most_once(steps) -> None:
    emitted = [(r["k"], r["window_start"]) for r in run(windows(), steps).rows()]
    assert len(emitted) == len(set(emitted))


def test_window_closes_when_watermark_passes_its_end() -> None:
    op = windows()
    assert op.process(batch(("a", 1, 1), ("a", 9, 2), ("a", 10, 5))).num_rows == 0
    assert op.watermark is None  # rows never move it: event time is the engine's
    assert op.on_watermark(9).num_rows == 0
    out = op.on_watermark(10)
    assert out.to_pylist() == [{"k": "a", "window_start": 0, "window_end": 10, "n": 2, "s": 3}]
    assert out.column_names == ["k", "window_start", "window_end", "n", "s"]


def test_late_rows_go_to_dead_letters_with_reason_late() -> None:
    op = windows()
    op.process(batch(("a", 25, 1)))
    op.on_watermark(20)
    assert op.process(batch(("a", 19, 7), ("b", 20, 1))).num_rows == 0
    letters = op.dead_letters.drain()
    assert [(l.row, l.reason) for l in letters] == [({"k": "a", "t": 19, "v": 7}, "late")]
    assert op.open_windows.num_rows == 2  # (a, 20) and (b, 20)


def test_rows_far_apart_in_one_batch_are_not_late() -> None:
    # rows of two upstream tasks arrive in one batch, far apart: none is late
    op = windows()
    assert op.process(batch(("a", 30, 1), ("a", 2, 1))).num_rows == 0
    assert op.dead_letters.drain() == []
    assert [(r["window_start"], r["n"]) for r in op.on_watermark(40).to_pylist()] == [(0, 1), (30, 1)]


def test_allowed_lateness_keeps_windows_open_after_the_watermark() -> None:
    op = windows(lateness=5)
    op.process(batch(("a", 2, 1)))
    assert op.on_watermark(12).num_rows == 0  # [0, 10) is open until 15
    assert op.process(batch(("a", 8, 1))).num_rows == 0 and op.dead_letters.drain() == []
    out = op.on_watermark(15)
    assert out.to_pylist() == [{"k": "a", "window_start": 0, "window_end": 10, "n": 2, "s": 2}]
    op.process(batch(("a", 9, 1)))
    assert [l.reason for l in op.dead_letters.drain()] == ["late"]


def test_windows_of_negative_times_round_down() -> None:
    op = windows()
    op.process(batch(("a", -1, 1), ("a", -10, 1), ("a", -11, 1)))
    out = op.on_watermark(-1)
    assert [(r["window_start"], r["n"]) for r in out.to_pylist()] == [(-20, 1)]
    assert op.open_windows.select(["window_start", "n"]).to_pylist() == [{"window_start": -10, "n": 2}]


def test_output_is_ordered_by_window_then_key() -> None:
    op = windows(lateness=50)
    assert op.process(batch(("b", 15, 1), ("a", 15, 1), ("b", 3, 1), ("c", 1, 1))).num_rows == 0
    out = op.on_watermark(100)
    assert [(r["window_start"], r["k"]) for r in out.to_pylist()] == [(0, "b"), (0, "c"), (10, "a"), (10, "b")]


def test_on_watermark_flushes_and_never_goes_back() -> None:
    op = windows()
    op.process(batch(("a", 5, 1)))
    assert op.on_watermark(5).num_rows == 0
    assert op.on_watermark(3).num_rows == 0 and op.watermark == 5
    assert op.on_watermark(dt.datetime(1970, 1, 1, 0, 0, 0, 10_000)).to_pylist()[0]["window_end"] == 10


def test_null_keys_and_null_times_go_to_dead_letters() -> None:
    op = windows()
    op.process(batch((None, 1, 1), ("a", None, 2), ("a", 1, 3)))
    assert [l.reason for l in op.dead_letters.drain()] == ["null_key", "null_event_time"]


def test_timestamp_columns_keep_their_zone_and_units() -> None:
    op = TumblingWindowAggregate("k", "ts", dt.timedelta(minutes=1), {"n": count(), "hi": max_("v")})
    at = lambda s: dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.UTC) + dt.timedelta(seconds=s)  # noqa: E731
    schema = pa.schema([("k", pa.int32()), ("ts", pa.timestamp("us", "UTC")), ("v", pa.float64())])
    rows = [
        {"k": 1, "ts": at(5.5), "v": 1.0},
        {"k": 1, "ts": at(59.999999), "v": 2.0},
        {"k": 1, "ts": at(61), "v": 0.0},
    ]
    assert op.process(pa.Table.from_pylist(rows[:2], schema=schema)).num_rows == 0
    assert op.process(pa.Table.from_pylist(rows[2:], schema=schema)).num_rows == 0
    out = op.on_watermark(at(61))
    assert out.schema.field("window_start").type == pa.timestamp("ms", "UTC")
    assert out.to_pylist() == [{"k": 1, "window_start": at(0), "window_end": at(60), "n": 2, "hi": 2.0}]


def test_second_timestamps_and_pre_epoch_times() -> None:
    op = TumblingWindowAggregate("k", "ts", 10_000, {"n": count()})
    schema = pa.schema([("k", pa.string()), ("ts", pa.timestamp("s"))])
    op.process(pa.Table.from_pylist([{"k": "a", "ts": dt.datetime(1969, 12, 31, 23, 59, 55)}], schema=schema))
    assert op.open_windows["window_start"].cast(pa.int64()).to_pylist() == [-10_000]


def test_time_column_must_be_integer_or_timestamp() -> None:
    with pytest.raises(InputSchemaError, match="expected integer milliseconds"):
        windows().process(pa.table({"k": ["a"], "t": ["noon"], "v": [1]}))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size": 0}, "size must be > 0"),
        ({"size": dt.timedelta(microseconds=1500)}, "whole milliseconds"),
        ({"size": 1.5}, "int"),
        ({"allowed_lateness": -1}, "allowed_lateness"),
        ({"aggregations": {"window_end": count()}}, "name of a key"),
        ({"key": "window_start"}, "reserved"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message) -> None:
    arguments = {"key": "k", "time_column": "t", "size": 10, "aggregations": {"n": count()}, **kwargs}
    with pytest.raises(OperatorConfigError, match=message):
        TumblingWindowAggregate(**arguments)
