"""Union and LatestValueJoin: input order, schema unification, the policies
for left rows without a right value, null keys, output columns."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import join_model, join_steps

from operators import (
    InputSchemaError,
    LatestValueJoin,
    MultiInputOperator,
    OperatorConfigError,
    OperatorError,
    Union,
    Unmatched,
)
from operators.testing import run

PROFILE = settings.get_profile("operators")


@PROFILE
@given(join_steps(), st.sampled_from(list(Unmatched)))
def test_join_matches_the_model(steps, unmatched) -> None:
    result = run(LatestValueJoin("id", unmatched=unmatched), steps)
    expected_outputs, expected_letters = join_model(steps, unmatched.value)
    assert [t.to_pylist() for t in result.outputs] == expected_outputs
    assert list(result.dead_letters) == expected_letters


def test_left_rows_wait_for_their_key_and_are_emitted_once_it_arrives() -> None:
    join = LatestValueJoin("user")
    assert isinstance(join, MultiInputOperator) and join.inputs == ("left", "right")
    assert join.process({"left": pa.table({"user": [1, 2, 1], "click": ["a", "b", "c"]})}).num_rows == 0
    assert join.pending.num_rows == 3
    out = join.process({"right": pa.table({"user": [1], "name": ["ann"]})})
    assert out.to_pylist() == [{"user": 1, "click": "a", "name": "ann"}, {"user": 1, "click": "c", "name": "ann"}]
    assert join.pending.to_pylist() == [{"user": 2, "click": "b"}]


def test_right_side_of_the_same_batch_is_applied_first_and_last_row_wins() -> None:
    join = LatestValueJoin("user")
    join.process({"right": pa.table({"user": [1], "name": ["old"]})})
    out = join.process(
        {
            "left": pa.table({"user": [1], "click": ["x"]}),
            "right": pa.table({"user": [1, 1], "name": ["new", "newest"]}),
        }
    )
    assert out.to_pylist() == [{"user": 1, "click": "x", "name": "newest"}]
    assert join.latest.to_pylist() == [{"user": 1, "name": "newest"}]


def test_released_rows_come_before_this_batch_rows() -> None:
    join = LatestValueJoin("user")
    join.process({"left": pa.table({"user": [1], "click": ["early"]})})
    out = join.process(
        {"left": pa.table({"user": [1], "click": ["now"]}), "right": pa.table({"user": [1], "name": ["n"]})}
    )
    assert out["click"].to_pylist() == ["early", "now"]


def test_emit_nulls_is_a_left_outer_join() -> None:
    join = LatestValueJoin("user", unmatched=Unmatched.EMIT_NULLS)
    join.process({"right": pa.table({"user": [1], "name": ["ann"]})})
    out = join.process({"left": pa.table({"user": [2, 1], "click": ["a", "b"]})})
    assert out.to_pylist() == [{"user": 2, "click": "a", "name": None}, {"user": 1, "click": "b", "name": "ann"}]
    assert join.pending.num_rows == 0


def test_dead_letter_policy() -> None:
    join = LatestValueJoin("user", unmatched="dead_letter")
    join.process({"left": pa.table({"user": [7], "click": ["a"]})})
    assert [(l.row, l.reason) for l in join.dead_letters.drain()] == [({"user": 7, "click": "a"}, "no_match")]


def test_different_key_names_and_clashing_columns() -> None:
    join = LatestValueJoin("user_id", "id", right_suffix="_profile")
    join.process({"right": pa.table({"id": ["u1"], "name": ["ann"], "ts": [5]})})
    out = join.process({"left": pa.table({"user_id": ["u1"], "ts": [9]})})
    assert out.to_pylist() == [{"user_id": "u1", "ts": 9, "name": "ann", "ts_profile": 5}]


def test_null_keys_on_either_side_go_to_dead_letters() -> None:
    join = LatestValueJoin("k")
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    join.process(
        {
            "right": pa.Table.from_pylist([{"k": None, "v": "r"}], schema=schema),
            "left": pa.Table.from_pylist([{"k": None, "v": "l"}], schema=schema),
        }
    )
    assert [(l.row["v"], l.reason) for l in join.dead_letters.drain()] == [("r", "null_key"), ("l", "null_key")]


def test_key_types_that_cannot_match_are_an_input_error() -> None:
    join = LatestValueJoin("k")
    join.process({"right": pa.table({"k": [1], "v": ["r"]})})
    with pytest.raises(InputSchemaError, match="keys of type string"):
        join.process({"left": pa.table({"k": ["x"]})})


def test_unknown_input_name_is_an_error() -> None:
    with pytest.raises(OperatorError, match="unknown input 'middle'"):
        LatestValueJoin("k").process({"middle": pa.table({"k": [1]})})


def test_bad_join_arguments() -> None:
    with pytest.raises(OperatorConfigError, match="unmatched"):
        LatestValueJoin("k", unmatched="drop")
    with pytest.raises(OperatorConfigError, match="distinct input names"):
        LatestValueJoin("k", left="x", right="x")


def test_union_tags_and_unifies_in_input_order() -> None:
    union = Union(["orders", "refunds"])
    out = union.process(
        {
            "refunds": pa.table({"id": pa.array([2], pa.int32()), "why": ["bad"]}),
            "orders": pa.table({"id": pa.array([1], pa.int64()), "qty": [3]}),
        }
    )
    assert out.schema.field("id").type == pa.int64()
    assert out.to_pylist() == [
        {"id": 1, "qty": 3, "input": "orders", "why": None},
        {"id": 2, "qty": None, "input": "refunds", "why": "bad"},
    ]
    assert union.snapshot() == {}


def test_union_without_tag_and_with_nothing() -> None:
    assert Union(["a", "b"], tag_column=None).process({"a": pa.table({"x": [1]})}).to_pylist() == [{"x": 1}]
    assert Union(["a", "b"]).process({}).column_names == ["input"]


def test_union_rejects_incompatible_schemas_and_tag_clashes() -> None:
    with pytest.raises(InputSchemaError, match="cannot be unified"):
        Union(["a", "b"]).process({"a": pa.table({"x": [1]}), "b": pa.table({"x": ["one"]})})
    with pytest.raises(InputSchemaError, match="tag column"):
        Union(["a", "b"]).process({"a": pa.table({"input": [1]})})
    with pytest.raises(OperatorConfigError):
        Union(["a"])


def test_right_key_need_not_be_the_first_column() -> None:
    join = LatestValueJoin("id")
    join.process({"right": pa.table({"name": ["one", "two"], "id": [1, 2]})})
    join.process({"right": pa.table({"name": ["TWO"], "id": [2]})})
    out = join.process({"left": pa.table({"id": [2, 1]})})
    assert out.to_pylist() == [{"id": 2, "name": "TWO"}, {"id": 1, "name": "one"}]
