"""IntervalJoin: every pair of rows whose event times lie within the bounds
is emitted once, whatever the batch cuts; late rows and nulls go to the dead
letters; state leaves with the watermark (left-outer rows with it); resume
and rescale keep the output; bad state and bad arguments are refused."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from join_models import (
    FLUSH,
    LEFT,
    RIGHT,
    bag,
    cut_points,
    interval_join_model,
    interval_steps,
    letter_bag,
    part_of,
    route,
    rows_and_letters,
    run_steps,
)
from operator_cases import table

from operators import (
    Chain,
    InputSchemaError,
    KeyedAggregate,
    MultiInputOperator,
    OperatorConfigError,
    OperatorError,
    StateRestoreError,
    TumblingWindowAggregate,
    WatermarkAware,
    count,
)
from operators.interval_join import IntervalJoin
from operators.rescale import split_state
from operators.testing import Watermark, assert_resumes_exactly, parquet_roundtrip, run

PROFILE = settings.get_profile("operators")

COLUMNS = ["id", "t", "x", "t_right", "name"]
BOUNDS = [(0, 3), (-2, 2), (-5, -2), (2, 2), (0, 0), (1, 8)]
HOWS = ["inner", "left_outer"]


def make(lower: int, upper: int, how: str):
    return lambda: IntervalJoin("id", left_time="t", right_time="t", lower=lower, upper=upper, how=how)


def lefts(*rows: tuple) -> pa.Table:
    return table([dict(zip(LEFT.names, r)) for r in rows], LEFT)


def rights(*rows: tuple) -> pa.Table:
    return table([dict(zip(RIGHT.names, r)) for r in rows], RIGHT)


# -- properties -----------------------------------------------------------------


@PROFILE
@given(interval_steps(), st.sampled_from(BOUNDS), st.sampled_from(HOWS))
def test_matches_the_model(steps, bounds, how) -> None:
    join = make(*bounds, how)()
    expected = interval_join_model(steps, *bounds, how)
    seen_left = seen_right = False
    for index, (want, want_letters, want_left, want_right) in enumerate(expected):
        step = steps[index]
        out = join.on_watermark(step.value) if isinstance(step, Watermark) else join.process(step)
        assert bag(out.to_pylist()) == bag(want), f"step {index}"
        assert letter_bag(join.dead_letters.drain()) == letter_bag(want_letters), f"step {index}"
        # rows stay in state exactly as long as an on-time row can still match them
        state = join.snapshot()
        assert bag(state["left"].to_pylist()) == bag(want_left), f"step {index}"
        assert bag(state["right"].to_pylist()) == bag(want_right), f"step {index}"
        if want:
            assert out.column_names == list(want[0]), f"step {index}"
        seen_left = seen_left or (isinstance(step, dict) and "left" in step)
        seen_right = seen_right or (isinstance(step, dict) and "right" in step)
        if seen_left and seen_right:  # from then on every output has the same columns, rows or not
            assert out.column_names == COLUMNS, f"step {index}"


@PROFILE
@given(st.data(), st.sampled_from(BOUNDS), st.sampled_from(HOWS))
def test_output_does_not_depend_on_the_batch_cuts(data, bounds, how) -> None:
    """The rows between two watermark steps, shuffled across both sides and
    cut into other batches, give the same rows between the same steps."""
    steps = data.draw(interval_steps(max_steps=10))
    # the original steps as groups: the batches between two watermark steps, and each watermark step
    groups: list[list] = [[]]
    for step in steps:
        if isinstance(step, Watermark):
            groups += [[step], []]
        else:
            groups[-1].append(step)
    recut: list[list] = []
    for group in groups:
        if group and isinstance(group[0], Watermark):
            recut.append(group)
            continue
        items = [(side, row) for step in group for side, rows in step.items() for row in rows.to_pylist()]
        items = data.draw(st.permutations(items))
        ends = sorted(set(data.draw(st.lists(st.integers(0, len(items)), max_size=4)))) + [len(items)]
        batches, start = [], 0
        for end in ends:
            chunk, start = items[start:end], max(start, end)
            if chunk:
                sides = {side for side, _ in chunk}
                schemas = {"left": LEFT, "right": RIGHT}
                batches.append(
                    {side: table([r for s, r in chunk if s == side], schemas[side]) for side in sorted(sides)}
                )
        recut.append(batches)
    # both sides' columns known from the start, so that rows never differ by the columns they have
    both_known = {"left": table([], LEFT), "right": table([], RIGHT)}
    original = run_steps(make(*bounds, how)(), [both_known, *steps])[1:]
    other = run_steps(make(*bounds, how)(), [both_known, *[step for batches in recut for step in batches]])[1:]

    def per_group(result, step_groups) -> list[Counter]:
        bags, position = [], 0
        for group in step_groups:
            bags.append(bag([row for out, _ in result[position : position + len(group)] for row in out.to_pylist()]))
            position += len(group)
        return bags

    assert per_group(original, groups) == per_group(other, recut)
    assert letter_bag([l for _, ls in original for l in ls]) == letter_bag([l for _, ls in other for l in ls])


@PROFILE
@given(st.data(), st.sampled_from(BOUNDS), st.sampled_from(HOWS))
def test_resumes_exactly(data, bounds, how) -> None:
    steps = data.draw(interval_steps(max_steps=10))
    cut = data.draw(cut_points(steps))
    assert_resumes_exactly(make(*bounds, how), steps, cut)
    operator = make(*bounds, how)()
    run(operator, steps[:cut])
    watermark = operator.watermark
    snapshot = operator.snapshot()
    frozen = {name: t.to_pylist() for name, t in snapshot.items()}
    run(operator, steps[cut:])
    assert {name: t.to_pylist() for name, t in snapshot.items()} == frozen  # a snapshot never changes
    again = make(*bounds, how)()
    again.restore(parquet_roundtrip(snapshot))
    assert {n: t.to_pylist() for n, t in again.snapshot().items()} == frozen
    assert again.watermark == watermark


@PROFILE
@given(st.data(), st.sampled_from(BOUNDS), st.sampled_from(HOWS))
def test_state_divided_among_three_tasks_gives_the_same_output(data, bounds, how) -> None:
    steps = data.draw(interval_steps(max_steps=10))
    cut = data.draw(cut_points(steps))
    whole = run_steps(make(*bounds, how)(), steps)
    two = [make(*bounds, how)() for _ in range(2)]
    before = [run_steps(op, [part_of(s, "id", i, 2) for s in steps[:cut]]) for i, op in enumerate(two)]
    divided = split_state([parquet_roundtrip(op.snapshot()) for op in two], 3, ["id"], route)
    three = []
    for state in divided:
        operator = make(*bounds, how)()
        operator.restore(parquet_roundtrip(state))
        three.append(operator)
    after = [run_steps(op, [part_of(s, "id", i, 3) for s in steps[cut:]]) for i, op in enumerate(three)]

    assert rows_and_letters([r for task in before for r in task]) == rows_and_letters(whole[:cut])
    assert rows_and_letters([r for task in after for r in task]) == rows_and_letters(whole[cut:])


@PROFILE
@given(interval_steps(), st.sampled_from(BOUNDS), st.sampled_from(HOWS))
def test_state_is_empty_once_the_watermark_has_passed(steps, bounds, how) -> None:
    operator = make(*bounds, how)()
    run(operator, steps)
    buffered = operator.buffered_left.num_rows
    released = operator.on_watermark(FLUSH)
    assert operator.snapshot()["left"].num_rows == 0
    assert operator.snapshot()["right"].num_rows == 0
    assert released.num_rows <= buffered


# -- behaviour by example -------------------------------------------------------


def test_pairs_within_the_bounds_once_when_the_second_row_comes() -> None:
    join = make(-2, 5, "inner")()
    assert isinstance(join, MultiInputOperator) and isinstance(join, WatermarkAware)
    assert join.inputs == ("left", "right") and join.state_keys == {"left": "id", "right": "id"}
    assert join.process({"left": lefts((1, 10, 100), (2, 10, 200))}).num_rows == 0
    out = join.process({"right": rights((1, 7, "early"), (1, 8, "a"), (1, 15, "b"), (1, 16, "late"), (2, 12, "c"))})
    assert out.to_pylist() == [
        {"id": 1, "t": 10, "x": 100, "t_right": 8, "name": "a"},
        {"id": 1, "t": 10, "x": 100, "t_right": 15, "name": "b"},
        {"id": 2, "t": 10, "x": 200, "t_right": 12, "name": "c"},
    ]
    # a later left row meets the buffered right rows
    out = join.process({"left": lefts((1, 14, 300))})
    assert [(r["x"], r["t_right"]) for r in out.to_pylist()] == [(300, 15), (300, 16)]


def test_a_pair_within_one_call_is_found_once() -> None:
    join = make(0, 0, "inner")()
    out = join.process({"right": rights((1, 5, "r")), "left": lefts((1, 5, 1))})
    assert out.to_pylist() == [{"id": 1, "t": 5, "x": 1, "t_right": 5, "name": "r"}]
    assert join.process({"left": lefts((1, 5, 2))}).num_rows == 1  # the right row is still buffered


def test_output_columns_are_the_same_with_or_without_matches() -> None:
    join = make(0, 10, "inner")()
    join.process({"left": lefts((1, 0, 1)), "right": rights((9, 0, "z"))})
    assert join.process({"left": lefts((5, 0, 1))}).column_names == COLUMNS
    assert join.process({"right": rights((5, 50, "far"))}).column_names == COLUMNS
    assert join.on_watermark(30).column_names == COLUMNS


def test_left_outer_emits_unmatched_left_rows_once_when_they_leave_the_state() -> None:
    join = make(0, 10, "left_outer")()
    join.process({"left": lefts((1, 0, 1), (2, 0, 2), (3, 20, 3))})
    join.process({"right": rights((1, 4, "p"))})
    assert join.on_watermark(10).num_rows == 0  # 0 + 10 is not < 10: the rows may still match
    out = join.on_watermark(11)
    assert out.to_pylist() == [{"id": 2, "t": 0, "x": 2, "t_right": None, "name": None}]
    assert join.on_watermark(11).num_rows == 0
    assert join.buffered_left.to_pylist() == [{"id": 3, "t": 20, "x": 3}]


def test_before_the_first_right_batch_left_outer_rows_have_only_the_left_columns() -> None:
    join = make(0, 1, "left_outer")()
    join.process({"left": lefts((1, 0, 1))})
    assert join.on_watermark(5).to_pylist() == [{"id": 1, "t": 0, "x": 1}]


def test_late_and_null_rows_go_to_the_dead_letters_and_are_never_stored() -> None:
    join = make(-5, 5, "inner")()
    join.on_watermark(10)
    schema = pa.schema([("id", pa.int64()), ("t", pa.int64()), ("x", pa.int64())])
    rows = pa.Table.from_pylist(
        [
            {"id": None, "t": 20, "x": 0},
            {"id": 1, "t": None, "x": 1},
            {"id": 1, "t": 9, "x": 2},
            {"id": 1, "t": 10, "x": 3},
        ],
        schema=schema,
    )
    assert join.process({"left": rows}).num_rows == 0
    assert [(l.row["x"], l.reason) for l in join.dead_letters.drain()] == [
        (0, "null_key"),
        (1, "null_event_time"),
        (2, "late"),
    ]
    assert join.buffered_left["x"].to_pylist() == [3]
    assert join.process({"right": rights((1, 9, "late"))}).num_rows == 0  # a late right row matches nothing
    assert [l.reason for l in join.dead_letters.drain()] == ["late"]


def test_watermark_never_goes_back_and_rows_never_move_it() -> None:
    join = make(0, 10, "inner")()
    join.process({"left": lefts((1, 100, 1))})
    assert join.watermark is None
    join.on_watermark(50)
    join.on_watermark(20)
    assert join.watermark == 50


def test_the_watermark_is_held_at_the_earliest_buffered_left_row() -> None:
    join = make(0, 10, "left_outer")()
    assert join.watermark_hold() is None
    join.process({"left": lefts((1, 7, 1), (2, 4, 2)), "right": rights((1, 9, "p"))})
    assert join.watermark_hold() == 4
    join.on_watermark(15)  # 7 + 10 is not < 15
    assert join.watermark_hold() == 7
    join.on_watermark(18)
    assert join.watermark_hold() is None


def test_left_outer_rows_are_not_late_for_a_window_after_the_join() -> None:
    """In a chain the window gets the watermark held at the join's earliest
    buffered left row, so the left-outer row released later is on time."""
    chain = Chain(make(0, 10, "left_outer")(), TumblingWindowAggregate("id", "t", 5, {"n": count()}))
    chain.process({"left": lefts((1, 2, 1))})
    assert chain.on_watermark(8).num_rows == 0  # the window sees 2, not 8: [0, 5) stays open
    out = chain.on_watermark(20)
    assert out.to_pylist() == [{"id": 1, "window_start": 0, "window_end": 5, "n": 1}]
    assert chain.dead_letters.drain() == []


def test_timestamps_timedeltas_different_names_and_suffix() -> None:
    join = IntervalJoin(
        "user",
        "uid",
        left_time="shown",
        right_time="at",
        lower=dt.timedelta(seconds=-1),
        upper=dt.timedelta(seconds=2),
        right_suffix="_click",
    )
    base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    ts = pa.timestamp("us", "UTC")
    join.process({"left": pa.table({"user": ["u"], "shown": pa.array([base], ts), "page": ["home"]})})
    out = join.process(
        {
            "right": pa.table(
                {
                    "uid": ["u", "u", "u"],
                    "at": pa.array(
                        [base - dt.timedelta(milliseconds=1001), base + dt.timedelta(seconds=2), base],
                        pa.timestamp("ms"),
                    ),
                    "page": ["a", "b", "c"],
                }
            )
        }
    )
    assert out.column_names == ["user", "shown", "page", "at", "page_click"]
    assert out["page_click"].to_pylist() == ["b", "c"]
    join.on_watermark(base + dt.timedelta(seconds=3))
    assert join.buffered_left.num_rows == 0  # 0 s + 2 s < 3 s
    assert join.buffered_right["page"].to_pylist() == ["b"]  # 2 s + 1 s is not < 3 s


def test_a_join_heads_a_chain_and_resumes_in_it() -> None:
    def chain() -> Chain:
        return Chain(make(0, 10, "left_outer")(), KeyedAggregate("id", {"n": count(), "names": count("name")}))

    steps = [
        {"left": lefts((1, 0, 1), (2, 0, 2)), "right": rights((1, 3, "p"))},
        {"right": rights((1, 9, "q"))},
        Watermark(20),
        {"left": lefts((1, 30, 3))},
        Watermark(50),
    ]
    assert run(chain(), steps).rows()[-2:] == [
        {"id": 2, "n": 1, "names": 0},
        {"id": 1, "n": 3, "names": 2},
    ]
    for cut in range(len(steps) + 1):
        assert_resumes_exactly(chain, steps, cut)


def test_input_errors() -> None:
    join = make(0, 1, "inner")()
    with pytest.raises(OperatorError, match="unknown input 'middle'"):
        join.process({"middle": lefts()})
    with pytest.raises(InputSchemaError, match="no column 't'"):
        join.process({"left": pa.table({"id": [1]})})
    with pytest.raises(InputSchemaError, match="expected integer milliseconds or a timestamp"):
        join.process({"right": pa.table({"id": [1], "t": ["noon"]})})
    with pytest.raises(InputSchemaError, match="reserves"):
        join.process({"left": pa.table({"id": [1], "t": [1], "__matched": [True]})})
    join.process({"right": rights((1, 1, "p"))})
    with pytest.raises(InputSchemaError, match="keys of type string"):
        join.process({"left": pa.table({"id": ["one"], "t": [1]})})


def test_bad_arguments() -> None:
    def build(**changes) -> IntervalJoin:
        arguments = dict(left_time="t", right_time="t", lower=0, upper=1) | changes
        return IntervalJoin("id", **arguments)

    cases = [
        (dict(lower=5, upper=1), "lower must be <= upper"),
        (dict(lower=0.5), "int \\(ms\\) or a timedelta"),
        (dict(upper=True), "int \\(ms\\) or a timedelta"),
        (dict(upper=dt.timedelta(microseconds=10)), "whole milliseconds"),
        (dict(how="outer"), "how must be"),
        (dict(left="x", right="x"), "distinct input names"),
        (dict(right_suffix=""), "right_suffix"),
        (dict(left_time=""), "left_time"),
        (dict(right_time=None), "right_time"),
        (dict(left_time="__matched"), "reserved"),
    ]
    for changes, message in cases:
        with pytest.raises(OperatorConfigError, match=message):
            build(**changes)
    with pytest.raises(OperatorConfigError, match="key"):
        IntervalJoin("", left_time="t", right_time="t", lower=0, upper=1)
    assert "[-3, 4] ms" in repr(build(lower=-3, upper=4))


# -- restore errors -------------------------------------------------------------


def joined() -> IntervalJoin:
    join = make(0, 10, "left_outer")()
    join.process({"left": lefts((1, 20, 1)), "right": rights((2, 25, "p"))})
    join.on_watermark(15)
    return join


def test_restore_rejects_bad_state_and_leaves_the_operator_as_it_was() -> None:
    good = parquet_roundtrip(joined().snapshot())
    left_schema = pa.schema([("id", pa.int64()), ("t", pa.int64()), ("x", pa.int64()), ("__matched", pa.bool_())])
    cases = [
        ({k: v for k, v in good.items() if k != "watermark"}, "missing \\['watermark'\\]"),
        ({**good, "watermark": pa.table({"watermark": [1, 2]})}, "one integer row"),
        ({**good, "left": pa.table({"id": [1], "t": [20], "x": [1]})}, "lacks column\\(s\\) \\['__matched'\\]"),
        (
            {**good, "left": pa.Table.from_pylist([{"id": None, "t": 20, "x": 1, "__matched": False}], left_schema)},
            "null keys",
        ),
        ({**good, "left": pa.table({"id": [1], "t": [20], "x": [1], "__matched": [1]})}, "not bool"),
        ({**good, "right": pa.table({"id": [2], "t": pa.array([None], pa.int64())})}, "null event times"),
        ({**good, "right": pa.table({"id": [2], "t": ["x"]})}, "expected integers"),
        ({**good, "right": pa.table({"id": ["two"], "t": [25]})}, "differ in type"),
        (
            {**good, "left": pa.table({"id": [1], "t": [4], "x": [1], "__matched": [False]})},
            "should have left the state",
        ),
        ({**good, "right": pa.table({"id": [2], "t": [14]})}, "should have left the state"),
    ]
    for state, message in cases:
        join = joined()
        before = {name: t.to_pylist() for name, t in join.snapshot().items()}
        with pytest.raises(StateRestoreError, match=message):
            join.restore(state)
        assert {name: t.to_pylist() for name, t in join.snapshot().items()} == before
    fresh = make(0, 10, "left_outer")()
    fresh.restore(good)
    assert fresh.watermark == 15 and fresh.buffered_left.to_pylist() == [{"id": 1, "t": 20, "x": 1}]
