"""SessionWindowAggregate: rows at most a gap apart merged into one session,
in any order and across batches; the engine's watermark, exactly-once
final results, late rows and nulls to the dead letters, timestamp columns,
output independent of batch cuts, resume, rescale and restore checks."""

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
    session_model,
    timestamp_runs,
    watermark_outputs,
)

from operators import InputSchemaError, OperatorConfigError, StateRestoreError, count, max_, min_, sum_
from operators.rescale import MIN, RESCALE_METADATA, split_state
from operators.session_windows import SESSION_END, SESSION_START, SessionWindowAggregate
from operators.state import KEYS_METADATA
from operators.testing import Watermark, parquet_roundtrip, run

PROFILE = settings.get_profile("operators")
GAPS = [1, 5, 15, 40]
LATENESS = [0, 4, 25]


def batch(*rows) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(["k", "t", "v"], r)) for r in rows], schema=SCHEMA)


def sessions(gap=10, lateness=0) -> SessionWindowAggregate:
    return SessionWindowAggregate("k", "t", gap, {"n": count(), "s": sum_("v")}, allowed_lateness=lateness)


def factory(gap, lateness):
    return lambda: sessions(gap, lateness)


def spans(table: pa.Table) -> list[tuple]:
    return [(r["k"], r[SESSION_START], r[SESSION_END], r["n"]) for r in table.to_pylist()]


# -- properties --------------------------------------------------------------


STEPS = st.one_of(window_steps(), dense_window_steps())


@PROFILE
@given(STEPS, st.sampled_from(GAPS), st.sampled_from(LATENESS))
def test_matches_the_model(steps, gap, lateness) -> None:
    result = run(sessions(gap, lateness), steps)
    expected_outputs, expected_letters = session_model(steps, gap, lateness)
    assert [t.to_pylist() for t in result.outputs] == expected_outputs
    assert list(result.dead_letters) == expected_letters


@PROFILE
@given(st.data(), st.sampled_from(GAPS), st.sampled_from(LATENESS))
def test_output_does_not_depend_on_how_rows_are_cut_into_batches(data, gap, lateness) -> None:
    steps = data.draw(STEPS)
    other = data.draw(recut(steps))
    first, second = run(sessions(gap, lateness), steps), run(sessions(gap, lateness), other)
    assert watermark_outputs(steps, first) == watermark_outputs(other, second)
    assert letter_counts(first.dead_letters) == letter_counts(second.dead_letters)


@PROFILE
@given(window_steps(watermarks=False), st.sampled_from(GAPS))
def test_sessions_of_a_key_never_overlap_or_touch(steps, gap) -> None:
    op = sessions(gap)
    run(op, steps)
    open_ = sorted(spans(op.open_sessions))
    for (k1, _, end1, _), (k2, start2, _, _) in zip(open_, open_[1:]):
        assert k1 != k2 or end1 < start2
    assert all(end - start >= gap for _, start, end, _ in open_)
    assert sum(n for *_, n in open_) == sum(1 for s in steps for r in s.to_pylist() if r["k"] and r["t"] is not None)


@PROFILE
@given(st.data(), st.sampled_from(GAPS))
def test_rows_landing_in_a_long_session_join_it(data, gap) -> None:
    """A chain of rows at most a gap apart is one long session; rows of a
    later batch anywhere in it, however far apart, all join it."""
    steps = data.draw(st.lists(st.integers(0, gap), min_size=1, max_size=8))
    chain = [sum(steps[:i]) for i in range(len(steps) + 1)]
    inside = data.draw(st.lists(st.integers(0, chain[-1] + gap), min_size=1, max_size=5))
    op = sessions(gap)
    op.process(batch(*[("a", t, 1) for t in chain]))
    assert spans(op.open_sessions) == [("a", 0, chain[-1] + gap, len(chain))]
    op.process(batch(*[("a", t, 1) for t in inside]))
    assert spans(op.open_sessions) == [("a", 0, max(chain[-1], *inside) + gap, len(chain) + len(inside))]


@PROFILE
@given(st.data(), st.sampled_from(GAPS), st.sampled_from(LATENESS))
def test_resumes_exactly(data, gap, lateness) -> None:
    steps = data.draw(STEPS)
    check_resume(factory(gap, lateness), steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data(), st.sampled_from(GAPS), st.sampled_from(LATENESS))
def test_state_divided_among_three_tasks_closes_the_same_sessions(data, gap, lateness) -> None:
    """Two tasks run to a cut, their state is divided among three by key, the
    three go on: together they emit and reject what one task would have."""
    steps = data.draw(window_steps())
    cut = data.draw(st.integers(0, len(steps)))
    make = factory(gap, lateness)
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
@given(window_steps(), st.sampled_from(GAPS), st.sampled_from(["s", "ms", "us"]))
def test_timestamp_columns_give_the_sessions_of_their_milliseconds(steps, gap, unit) -> None:
    """The same times as timestamps (any unit, a zone) and as integer
    milliseconds give the same sessions; microseconds round down."""
    as_ints, as_stamps = timestamp_runs(lambda: sessions(gap * SCALE[unit]), steps, unit)
    for table in as_stamps.outputs:
        assert table.num_rows == 0 or table.schema.field(SESSION_END).type == pa.timestamp("ms", "Europe/Paris")
    assert [millis(r, SESSION_START, SESSION_END) for r in as_stamps.rows()] == as_ints.rows()


# -- examples ----------------------------------------------------------------


def test_rows_within_the_gap_form_one_session_that_ends_a_gap_after_the_last() -> None:
    op = sessions(gap=10)
    assert op.process(batch(("a", 5, 1), ("a", 12, 2), ("b", 7, 4), ("a", 30, 8))).num_rows == 0
    assert op.watermark is None  # rows never move it
    out = op.on_watermark(25)
    assert out.column_names == ["k", "session_start", "session_end", "n", "s"]
    assert out.to_pylist() == [
        {"k": "a", "session_start": 5, "session_end": 22, "n": 2, "s": 3},
        {"k": "b", "session_start": 7, "session_end": 17, "n": 1, "s": 4},
    ]
    assert spans(op.open_sessions) == [("a", 30, 40, 1)]


def test_a_row_exactly_a_gap_after_the_last_joins_its_session() -> None:
    op = sessions(gap=10)
    op.process(batch(("a", 0, 1)))
    op.process(batch(("a", 10, 1), ("b", 0, 1), ("b", 11, 1)))
    assert sorted(spans(op.open_sessions)) == [("a", 0, 20, 2), ("b", 0, 10, 1), ("b", 11, 21, 1)]


def test_a_row_between_two_sessions_merges_them() -> None:
    op = sessions(gap=10)
    op.process(batch(("a", 0, 1), ("a", 18, 2), ("a", 60, 4)))
    assert len(op.open_sessions) == 3
    op.process(batch(("a", 9, 8)))  # [9, 19) overlaps [0, 10) and [18, 28)
    assert sorted(spans(op.open_sessions)) == [("a", 0, 28, 3), ("a", 60, 70, 1)]
    assert op.on_watermark(100).select(["s"]).to_pylist() == [{"s": 11}, {"s": 4}]


def test_rows_inside_a_long_session_stay_in_it() -> None:
    op = sessions(gap=10)
    op.process(batch(("a", 0, 1), ("a", 10, 1), ("a", 20, 1), ("a", 30, 1)))  # [0, 40)
    op.process(batch(("a", 25, 1), ("a", 5, 1), ("a", 38, 1)))  # inside it, more than a gap apart
    assert spans(op.open_sessions) == [("a", 0, 48, 7)]


def test_sessions_are_per_key_and_ordered_by_start_then_key() -> None:
    op = sessions(gap=5)
    op.process(batch(("b", 3, 1), ("a", 3, 1), ("c", -4, 1), ("a", 50, 1)))
    out = op.on_watermark(100)
    assert [(r["session_start"], r["k"]) for r in out.to_pylist()] == [(-4, "c"), (3, "a"), (3, "b"), (50, "a")]


def test_late_rows_are_judged_alone_even_inside_an_open_session() -> None:
    op = sessions(gap=10, lateness=2)
    op.process(batch(("a", 0, 1), ("a", 9, 1), ("a", 18, 1)))  # [0, 28)
    op.on_watermark(22)
    op.process(batch(("a", 10, 5), ("a", 11, 6)))  # 10 + 10 + 2 <= 22: late; 11 + 12 > 22: counts
    assert [(x.row["t"], x.reason) for x in op.dead_letters.drain()] == [(10, "late")]
    assert spans(op.open_sessions) == [("a", 0, 28, 4)]


def test_allowed_lateness_keeps_sessions_open_after_the_watermark() -> None:
    op = sessions(gap=10, lateness=5)
    op.process(batch(("a", 0, 1)))
    assert op.on_watermark(14).num_rows == 0  # [0, 10) is open until 15
    op.process(batch(("a", 6, 1)))  # 6 + 10 + 5 > 14
    assert op.dead_letters.drain() == []
    assert op.on_watermark(20).num_rows == 0  # now [0, 16), open until 21
    assert spans(op.on_watermark(21)) == [("a", 0, 16, 2)]


def test_a_row_touching_a_closed_session_starts_a_new_one() -> None:
    op = sessions(gap=10)
    op.process(batch(("a", 0, 1)))
    assert spans(op.on_watermark(10)) == [("a", 0, 10, 1)]
    op.process(batch(("a", 5, 1)))  # 5 + 10 > 10: not late, but [0, 10) is gone
    assert op.dead_letters.drain() == []
    assert spans(op.on_watermark(15)) == [("a", 5, 15, 1)]


def test_merged_sessions_combine_min_and_max_and_count_of_a_column() -> None:
    op = SessionWindowAggregate("k", "t", 10, {"lo": min_("v"), "hi": max_("v"), "valid": count("v")})
    op.process(batch(("a", 0, 7), ("a", 30, None)))
    op.process(batch(("a", 20, 3), ("a", 10, 9)))
    assert op.on_watermark(40).to_pylist() == [
        {"k": "a", "session_start": 0, "session_end": 40, "lo": 3, "hi": 9, "valid": 3}
    ]


def test_on_watermark_takes_datetimes_and_never_goes_back() -> None:
    op = sessions()
    op.process(batch(("a", 5, 1), ("a", 30, 1)))
    assert spans(op.on_watermark(15)) == [("a", 5, 15, 1)]
    assert op.on_watermark(3).num_rows == 0 and op.watermark == 15
    assert spans(op.on_watermark(dt.datetime(1970, 1, 1, 0, 0, 0, 40_000))) == [("a", 30, 40, 1)]
    with pytest.raises(OperatorConfigError, match="watermark must be"):
        op.on_watermark("soon")


def test_null_keys_and_null_times_go_to_dead_letters() -> None:
    op = sessions()
    op.process(batch((None, 1, 1), ("a", None, 2), ("a", 1, 3)))
    assert [(x.reason, x.operator) for x in op.dead_letters.drain()] == [
        ("null_key", "SessionWindowAggregate"),
        ("null_event_time", "SessionWindowAggregate"),
    ]


def test_timestamp_sessions_keep_the_zone() -> None:
    op = SessionWindowAggregate("k", "ts", dt.timedelta(seconds=30), {"n": count()})
    at = lambda s: dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.UTC) + dt.timedelta(seconds=s)  # noqa: E731
    schema = pa.schema([("k", pa.int32()), ("ts", pa.timestamp("us", "UTC"))])
    op.process(pa.Table.from_pylist([{"k": 1, "ts": at(5.5)}, {"k": 1, "ts": at(35.5)}], schema=schema))
    out = op.on_watermark(at(100))
    assert out.schema.field(SESSION_START).type == pa.timestamp("ms", "UTC")
    assert out.to_pylist() == [{"k": 1, "session_start": at(5.5), "session_end": at(65.5), "n": 2}]


def test_time_column_must_be_integer_or_timestamp() -> None:
    with pytest.raises(InputSchemaError, match="expected integer milliseconds"):
        sessions().process(pa.table({"k": ["a"], "t": ["noon"], "v": [1]}))


def test_state_keys_repr_and_snapshot_metadata() -> None:
    op = sessions()
    op.process(batch(("a", 1, 1)))
    assert op.state_keys == {None: "k"}
    assert repr(op) == "SessionWindowAggregate(key='k', time='t', gap=10ms, lateness=0ms, n=count(), s=sum(v))"
    state = op.snapshot()
    assert sorted(state) == ["sessions", "watermark"]
    assert state["sessions"].schema.metadata[KEYS_METADATA] == b'["k", "session_start"]'
    assert state["watermark"].schema.metadata[RESCALE_METADATA] == MIN.encode()


# -- restore and arguments ---------------------------------------------------


def restored_op() -> SessionWindowAggregate:
    op = sessions()
    op.process(batch(("a", 17, 1), ("a", 40, 2)))
    op.on_watermark(15)  # [17, 27) and [40, 50) stay open
    return op


def session_table(starts, ends, keys=None, **columns) -> pa.Table:
    keys = keys or ["a"] * len(starts)
    values = {"n": [1] * len(starts), "s": [1] * len(starts), **columns}
    return pa.table({"k": keys, SESSION_START: starts, SESSION_END: ends, **values})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"watermark": pa.table({"watermark": [1, 2]})}, "one integer row"),
        ({"watermark": pa.table({"watermark": [1.5]})}, "one integer row"),
        ({"watermark": pa.table({"wm": [1]})}, "has columns"),
        ({"watermark": pa.table({"watermark": [27]})}, "should have closed"),
        ({"sessions": session_table([17], [20])}, "shorter than the gap"),
        ({"sessions": session_table([17, 25], [27, 35])}, "overlap or touch"),
        ({"sessions": session_table([17, 27], [27, 37])}, "overlap or touch"),
        ({"sessions": session_table([17, 17], [27, 30])}, "overlap or touch"),
        ({"sessions": session_table(["17"], ["27"])}, "expected int64"),
        ({"sessions": session_table([17], pa.array([27], pa.int32()))}, "must have one type"),
        ({"sessions": session_table([17], pa.array([None], pa.int64()))}, "null session_end"),
        ({"sessions": session_table([17], [27], s=["x"])}, "cannot hold sum"),
        ({"sessions": session_table([17], [27], keys=pa.array([None], pa.string()))}, "null keys"),
        ({"sessions": pa.table({"k": ["a"], SESSION_START: [17], "n": [1], "s": [1]})}, "has columns"),
        ({"sessions": None}, "missing \\['sessions'\\]"),
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
    assert sorted(spans(op.open_sessions)) == [("a", 17, 27, 1), ("a", 40, 50, 1)]


def test_sessions_of_different_keys_may_overlap_in_restored_state() -> None:
    op = sessions()
    op.restore(
        {"sessions": session_table([17, 20], [27, 30], keys=["a", "b"]), "watermark": pa.table({"watermark": [15]})}
    )
    assert sorted(spans(op.on_watermark(30))) == [("a", 17, 27, 1), ("b", 20, 30, 1)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gap": 0}, "gap must be > 0"),
        ({"gap": -5}, "gap must be > 0"),
        ({"gap": 2.5}, "gap must be an int"),
        ({"gap": dt.timedelta(microseconds=1500)}, "whole milliseconds"),
        ({"allowed_lateness": -1}, "allowed_lateness must be >= 0"),
        ({"allowed_lateness": "1s"}, "allowed_lateness must be an int"),
        ({"time_column": None}, "time_column"),
        ({"key": ""}, "key must be"),
        ({"key": "session_start"}, "reserved"),
        ({"aggregations": {"m": max_("session_end")}}, "reserved"),
        ({"aggregations": {"session_end": count()}}, "name of a key"),
        ({"aggregations": {"n": "count"}}, "must be built with"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message) -> None:
    arguments = {"key": "k", "time_column": "t", "gap": 10, "aggregations": {"n": count()}, **kwargs}
    with pytest.raises(OperatorConfigError, match=message):
        SessionWindowAggregate(**arguments)


def test_an_aggregation_named_like_the_internal_label_still_works() -> None:
    op = SessionWindowAggregate("k", "t", 10, {"__session": count()})
    op.process(batch(("a", 1, 1), ("a", 5, 1)))
    assert op.on_watermark(100).to_pylist() == [{"k": "a", "session_start": 1, "session_end": 15, "__session": 2}]
