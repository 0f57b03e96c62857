"""Deduplicate: the first row of a key is emitted and later ones dropped while
the key is remembered, whatever the batch cuts; a key is forgotten once the
watermark is ``within`` past its first row; late rows and null keys go to the
dead letters; resume and rescale keep the output; bad state and bad
arguments are refused."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from join_models import (
    DEDUP,
    FLUSH,
    bag,
    cut_points,
    dedup_model,
    dedup_steps,
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
    OperatorConfigError,
    StateRestoreError,
    TumblingWindowAggregate,
    WatermarkAware,
    count,
    sum_,
)
from operators.dedup import Deduplicate
from operators.rescale import split_state
from operators.testing import Watermark, assert_resumes_exactly, parquet_roundtrip, run

PROFILE = settings.get_profile("operators")
KEYS = [["k"], ["k", "g"]]
WITHIN = [1, 4, 10]


def make(columns: list[str], within: int):
    return lambda: Deduplicate(columns, "t", within)


def rows(*values: tuple) -> pa.Table:
    return table([dict(zip(DEDUP.names, v)) for v in values], DEDUP)


def seen_rows(seen: dict[tuple, int], columns: list[str]) -> list[dict]:
    return [{**dict(zip(columns, key)), "__first_time": first} for key, first in seen.items()]


# -- properties -----------------------------------------------------------------


@PROFILE
@given(dedup_steps(), st.sampled_from(KEYS), st.sampled_from(WITHIN))
def test_matches_the_model(steps, columns, within) -> None:
    dedup = make(columns, within)()
    for index, (want, want_letters, duplicates, seen) in enumerate(dedup_model(steps, columns, within)):
        step, before = steps[index], dedup.duplicates
        out = dedup.on_watermark(step.value) if isinstance(step, Watermark) else dedup.process(step)
        assert out.to_pylist() == want, f"step {index}"  # in batch order
        assert letter_bag(dedup.dead_letters.drain()) == letter_bag(want_letters), f"step {index}"
        assert dedup.duplicates - before == duplicates, f"step {index}"
        assert bag(dedup.snapshot()["seen"].to_pylist()) == bag(seen_rows(seen, columns)), f"step {index}"


@PROFILE
@given(st.data(), st.sampled_from(KEYS), st.sampled_from(WITHIN))
def test_output_does_not_depend_on_the_batch_cuts(data, columns, within) -> None:
    """The rows between two watermark steps, in the same order but cut into
    other batches, give the same rows between the same steps."""
    steps = data.draw(dedup_steps(max_steps=10))
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
        items = [row for step in group for row in step.to_pylist()]
        ends = sorted(set(data.draw(st.lists(st.integers(0, len(items)), max_size=4)))) + [len(items)]
        recut.append([table(items[start:end], DEDUP) for start, end in zip([0, *ends], ends) if end > start])

    def per_group(step_groups) -> tuple[list[list], Counter, int]:
        dedup = make(columns, within)()
        results = [run_steps(dedup, group) for group in step_groups]
        outputs = [[row for out, _ in result for row in out.to_pylist()] for result in results]
        letters = letter_bag([letter for result in results for _, batch in result for letter in batch])
        return outputs, letters, dedup.duplicates

    assert per_group(groups) == per_group(recut)


@PROFILE
@given(st.data(), st.sampled_from(KEYS), st.sampled_from(WITHIN))
def test_resumes_exactly(data, columns, within) -> None:
    steps = data.draw(dedup_steps(max_steps=10))
    cut = data.draw(cut_points(steps))
    assert_resumes_exactly(make(columns, within), steps, cut)
    operator = make(columns, within)()
    run(operator, steps[:cut])
    watermark = operator.watermark
    snapshot = operator.snapshot()
    frozen = {name: t.to_pylist() for name, t in snapshot.items()}
    run(operator, steps[cut:])
    assert {name: t.to_pylist() for name, t in snapshot.items()} == frozen  # a snapshot never changes
    again = make(columns, within)()
    again.restore(parquet_roundtrip(snapshot))
    assert {n: t.to_pylist() for n, t in again.snapshot().items()} == frozen
    assert again.watermark == watermark


@PROFILE
@given(st.data(), st.sampled_from(KEYS), st.sampled_from(WITHIN))
def test_state_divided_among_three_tasks_gives_the_same_output(data, columns, within) -> None:
    """Routed by the first key column (``state_keys``), as the stage must be."""
    steps = data.draw(dedup_steps(max_steps=10))
    cut = data.draw(cut_points(steps))
    whole_operator = make(columns, within)()
    whole = run_steps(whole_operator, steps[:cut])
    duplicates_before = whole_operator.duplicates
    whole += run_steps(whole_operator, steps[cut:])
    two = [make(columns, within)() for _ in range(2)]
    before = [run_steps(op, [part_of(s, "k", i, 2) for s in steps[:cut]]) for i, op in enumerate(two)]
    assert sum(op.duplicates for op in two) == duplicates_before
    route_keys = [make(columns, within)().state_keys[None]]
    divided = split_state([parquet_roundtrip(op.snapshot()) for op in two], 3, route_keys, route)
    three = []
    for state in divided:
        operator = make(columns, within)()
        operator.restore(parquet_roundtrip(state))
        three.append(operator)
    after = [run_steps(op, [part_of(s, "k", i, 3) for s in steps[cut:]]) for i, op in enumerate(three)]
    assert rows_and_letters([r for task in before for r in task]) == rows_and_letters(whole[:cut])
    assert rows_and_letters([r for task in after for r in task]) == rows_and_letters(whole[cut:])
    assert sum(op.duplicates for op in three) == whole_operator.duplicates - duplicates_before


@PROFILE
@given(dedup_steps(), st.sampled_from(KEYS), st.sampled_from(WITHIN))
def test_state_is_empty_once_the_watermark_has_passed(steps, columns, within) -> None:
    operator = make(columns, within)()
    run(operator, steps)
    assert operator.on_watermark(FLUSH).num_rows == 0
    assert operator.snapshot()["seen"].num_rows == 0


# -- behaviour by example -------------------------------------------------------


def test_first_row_of_a_key_wins_and_later_ones_are_counted() -> None:
    dedup = Deduplicate("k", "t", 10)
    assert isinstance(dedup, WatermarkAware) and dedup.state_keys == {None: "k"}
    out = dedup.process(rows(("a", 0, 5, 1), ("b", 0, 6, 2), ("a", 1, 4, 3)))
    assert out.to_pylist() == [{"k": "a", "g": 0, "t": 5, "v": 1}, {"k": "b", "g": 0, "t": 6, "v": 2}]
    assert dedup.process(rows(("b", 0, 30, 4))).num_rows == 0  # remembered: dropped however late its time
    assert dedup.duplicates == 2
    assert dedup.dead_letters.drain() == []


def test_several_key_columns() -> None:
    dedup = Deduplicate(["k", "g"], "t", 10)
    assert dedup.state_keys == {None: "k"}  # the stage routes by the first column
    out = dedup.process(rows(("a", 0, 5, 1), ("a", 1, 5, 2), ("a", 0, 6, 3)))
    assert out["v"].to_pylist() == [1, 2]
    assert sorted(dedup.seen.to_pylist(), key=lambda r: r["g"]) == [
        {"k": "a", "g": 0, "__first_time": 5},
        {"k": "a", "g": 1, "__first_time": 5},
    ]


def test_a_key_is_forgotten_once_the_watermark_is_within_past_its_first_row() -> None:
    dedup = Deduplicate("k", "t", 10)
    dedup.process(rows(("a", 0, 5, 1)))
    dedup.on_watermark(14)
    assert dedup.process(rows(("a", 0, 6, 2))).num_rows == 0  # 5 + 10 > 14: still remembered
    assert dedup.on_watermark(15).num_rows == 0
    assert dedup.seen.num_rows == 0
    assert dedup.process(rows(("a", 0, 6, 3))).num_rows == 1  # 6 + 10 > 15: on time, a new first row


def test_late_rows_and_null_keys_go_to_the_dead_letters() -> None:
    dedup = Deduplicate(["k", "g"], "t", 10)
    dedup.on_watermark(20)
    dedup.on_watermark(5)  # never goes back
    out = dedup.process(rows(("a", 0, 10, 1), ("a", 0, 11, 2), (None, 0, 30, 3), ("a", None, 30, 4), ("b", 0, None, 5)))
    assert out["v"].to_pylist() == [2]
    assert sorted((l.row["v"], l.reason) for l in dedup.dead_letters.drain()) == [
        (1, "late"),
        (3, "null_key"),
        (4, "null_key"),
        (5, "null_event_time"),
    ]
    assert dedup.watermark == 20  # rows never move it


def test_timestamps_timedeltas_and_dictionary_keys() -> None:
    dedup = Deduplicate("user", "at", dt.timedelta(minutes=1))
    base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    times = pa.array([base, base + dt.timedelta(seconds=30)], pa.timestamp("us", "UTC"))
    first = pa.table({"user": pa.array(["u", "v"]).dictionary_encode(), "at": times})
    assert dedup.process(first).num_rows == 2
    again = pa.table({"user": ["u", "v"], "at": times})
    assert dedup.process(again).num_rows == 0
    dedup.on_watermark(base + dt.timedelta(minutes=1))  # forgets u (base + 1 min <= watermark), not v
    assert dedup.seen["user"].to_pylist() == ["v"]


def test_rows_behind_the_watermark_are_not_late_for_a_window_after_it() -> None:
    """An on-time row may be up to ``within`` behind the watermark: the
    window after it gets the watermark held back that far."""
    dedup = Deduplicate("k", "t", 10)
    assert dedup.watermark_hold() is None
    chain = Chain(dedup, TumblingWindowAggregate("k", "t", 5, {"n": count()}))
    chain.process(rows(("a", 0, 2, 1)))
    assert chain.on_watermark(8).num_rows == 0
    assert dedup.watermark_hold() == -1
    assert chain.process(rows(("b", 0, 3, 2))).num_rows == 0  # 3 + 10 > 8: on time, into the open window [0, 5)
    out = chain.on_watermark(20)  # the window gets 11
    assert sorted(out.to_pylist(), key=lambda r: r["k"]) == [
        {"k": "a", "window_start": 0, "window_end": 5, "n": 1},
        {"k": "b", "window_start": 0, "window_end": 5, "n": 1},
    ]
    assert chain.dead_letters.drain() == []


def test_in_a_chain() -> None:
    def chain() -> Chain:
        return Chain(Deduplicate("k", "t", 5), KeyedAggregate("k", {"n": count(), "v": sum_("v")}))

    steps = [rows(("a", 0, 1, 1), ("a", 0, 2, 10)), Watermark(6), rows(("a", 0, 7, 100), ("a", 0, 8, 1000))]
    assert run(chain(), steps).rows() == [{"k": "a", "n": 1, "v": 1}, {"k": "a", "n": 2, "v": 101}]
    for cut in range(len(steps) + 1):
        assert_resumes_exactly(chain, steps, cut)


def test_input_errors() -> None:
    dedup = Deduplicate("k", "t", 5)
    with pytest.raises(InputSchemaError, match="no column 't'"):
        dedup.process(pa.table({"k": ["a"]}))
    with pytest.raises(InputSchemaError, match="expected integer milliseconds or a timestamp"):
        dedup.process(pa.table({"k": ["a"], "t": ["noon"]}))
    dedup.process(pa.table({"k": [1], "t": [1]}))
    with pytest.raises(InputSchemaError, match="cannot be cast"):
        dedup.process(pa.table({"k": ["x"], "t": [1]}))


def test_bad_arguments() -> None:
    cases = [
        (dict(columns=[]), "columns"),
        (dict(columns=5), "columns"),
        (dict(columns=["k", "k"]), "distinct"),
        (dict(columns=["k", ""]), "key"),
        (dict(columns="__first_time"), "reserved"),
        (dict(time_column=""), "time_column"),
        (dict(within=0), "within must be > 0"),
        (dict(within=-5), "within"),
        (dict(within=1.5), "int \\(ms\\) or a timedelta"),
        (dict(within=dt.timedelta(microseconds=1)), "whole milliseconds"),
    ]
    for changes, message in cases:
        arguments = dict(columns="k", time_column="t", within=5) | changes
        with pytest.raises(OperatorConfigError, match=message):
            Deduplicate(**arguments)
    assert repr(Deduplicate(["k", "g"], "t", 5)) == "Deduplicate(columns=['k', 'g'], time='t', within=5ms)"


# -- restore errors -------------------------------------------------------------


def deduplicated() -> Deduplicate:
    dedup = Deduplicate(["k", "g"], "t", 10)
    dedup.process(rows(("a", 0, 20, 1), ("b", 1, 25, 2)))
    dedup.on_watermark(15)
    return dedup


def test_restore_rejects_bad_state_and_leaves_the_operator_as_it_was() -> None:
    good = parquet_roundtrip(deduplicated().snapshot())
    schema = pa.schema([("k", pa.string()), ("g", pa.int64()), ("__first_time", pa.int64())])
    cases = [
        ({"seen": good["seen"]}, "missing \\['watermark'\\]"),
        ({**good, "extra": good["seen"]}, "unexpected \\['extra'\\]"),
        ({**good, "watermark": pa.table({"watermark": ["x"]})}, "one integer row"),
        ({**good, "seen": pa.table({"k": ["a"], "__first_time": [20]})}, "has columns"),
        ({**good, "seen": pa.table({"k": ["a"], "g": [0], "__first_time": ["20"]})}, "integer milliseconds"),
        (
            {**good, "seen": pa.Table.from_pylist([{"k": "a", "g": 0, "__first_time": None}], schema=schema)},
            "integer milliseconds",
        ),
        ({**good, "seen": pa.table({"k": ["a", "a"], "g": [0, 0], "__first_time": [20, 21]})}, "duplicate"),
        (
            {**good, "seen": pa.Table.from_pylist([{"k": None, "g": 0, "__first_time": 20}], schema=schema)},
            "null keys",
        ),
        ({**good, "seen": pa.table({"k": ["a"], "g": [0], "__first_time": [5]})}, "should have been forgotten"),
    ]
    for state, message in cases:
        dedup = deduplicated()
        before = {name: t.to_pylist() for name, t in dedup.snapshot().items()}
        with pytest.raises(StateRestoreError, match=message):
            dedup.restore(state)
        assert {name: t.to_pylist() for name, t in dedup.snapshot().items()} == before
    fresh = Deduplicate(["k", "g"], "t", 10)
    fresh.restore(good)
    assert fresh.watermark == 15 and fresh.seen.num_rows == 2
    assert fresh.duplicates == 0  # a metric, not state
