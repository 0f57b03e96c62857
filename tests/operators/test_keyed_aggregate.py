"""KeyedAggregate: vectorised per-key aggregates against a plain-Python
model, emission of touched keys, null keys to the dead letters, types."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import account_batches, keyed_aggregate_model

from operators import (
    InputSchemaError,
    KeyedAggregate,
    OperatorConfigError,
    count,
    max_,
    min_,
    sum_,
)
from operators import aggregations as agg
from operators.testing import run

PROFILE = settings.get_profile("operators")

SPEC = {"count": count(), "total": sum_("amount"), "lo": min_("amount"), "hi": max_("amount"), "valid": count("amount")}


@PROFILE
@given(account_batches())
def test_matches_the_model(batches) -> None:
    result = run(KeyedAggregate("account", SPEC), batches)
    expected_outputs, expected_letters = keyed_aggregate_model(batches)
    assert [t.to_pylist() for t in result.outputs] == expected_outputs
    assert list(result.dead_letters) == expected_letters


def test_emits_updated_rows_of_touched_keys_in_first_appearance_order() -> None:
    op = KeyedAggregate("account", SPEC)
    op.process(pa.table({"account": ["a", "b"], "amount": [1, 2]}))
    out = op.process(pa.table({"account": ["c", "a", "c"], "amount": [5, 10, -1]}))
    assert out.to_pylist() == [
        {"account": "c", "count": 2, "total": 4, "lo": -1, "hi": 5, "valid": 2},
        {"account": "a", "count": 2, "total": 11, "lo": 1, "hi": 10, "valid": 2},
    ]
    assert sorted(op.state["account"].to_pylist()) == ["a", "b", "c"]


def test_output_columns_are_key_then_aggregations_in_order() -> None:
    out = KeyedAggregate("k", {"z": count(), "a": sum_("v")}).process(pa.table({"k": [1], "v": [2]}))
    assert out.column_names == ["k", "z", "a"]
    assert out.schema.field("z").type == pa.int64()


def test_integer_keys_and_float_values() -> None:
    op = KeyedAggregate("k", {"total": sum_("v"), "hi": max_("v")})
    op.process(pa.table({"k": [1, 2, 1], "v": [0.5, 1.0, 0.25]}))
    assert op.process(pa.table({"k": [1], "v": [1.0]})).to_pylist() == [{"k": 1, "total": 1.75, "hi": 1.0}]


def test_string_min_max() -> None:
    op = KeyedAggregate("k", {"first": min_("name"), "last": max_("name")})
    op.process(pa.table({"k": [1, 1], "name": ["m", "c"]}))
    assert op.process(pa.table({"k": [1], "name": ["x"]})).to_pylist() == [{"k": 1, "first": "c", "last": "x"}]


def test_null_keys_go_to_dead_letters_not_dropped() -> None:
    op = KeyedAggregate("account", {"n": count()})
    out = op.process(pa.table({"account": ["a", None, "a", None], "amount": [1, 2, 3, 4]}))
    assert out.to_pylist() == [{"account": "a", "n": 2}]
    letters = op.dead_letters.drain()
    assert [(l.row, l.reason, l.operator) for l in letters] == [
        ({"account": None, "amount": 2}, "null_key", "KeyedAggregate"),
        ({"account": None, "amount": 4}, "null_key", "KeyedAggregate"),
    ]


def test_all_null_values_give_null_sum_and_zero_valid_count() -> None:
    op = KeyedAggregate("k", {"n": count(), "valid": count("v"), "s": sum_("v")})
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    out = op.process(pa.Table.from_pylist([{"k": "a", "v": None}], schema=schema))
    assert out.to_pylist() == [{"k": "a", "n": 1, "valid": 0, "s": None}]
    out = op.process(pa.Table.from_pylist([{"k": "a", "v": 4}], schema=schema))
    assert out.to_pylist() == [{"k": "a", "n": 2, "valid": 1, "s": 4}]


def test_dictionary_encoded_keys_compare_by_value() -> None:
    op = KeyedAggregate("k", {"n": count()})
    op.process(pa.table({"k": pa.array(["a", "b"]).dictionary_encode()}))
    out = op.process(pa.table({"k": pa.array(["a"]).dictionary_encode()}))
    assert out.to_pylist() == [{"k": "a", "n": 2}]


def test_batch_types_are_cast_to_the_state_types() -> None:
    op = KeyedAggregate("k", {"s": sum_("v")})
    op.process(pa.table({"k": pa.array([1], pa.int64()), "v": pa.array([1], pa.int64())}))
    out = op.process(pa.table({"k": pa.array([1], pa.int32()), "v": pa.array([2], pa.int32())}))
    assert out.schema == pa.schema([("k", pa.int64()), ("s", pa.int64())]) and out["s"].to_pylist() == [3]
    with pytest.raises(InputSchemaError, match="cannot be cast"):
        op.process(pa.table({"k": ["x"], "v": [1]}))


def test_empty_batch_gives_empty_typed_output() -> None:
    op = KeyedAggregate("k", {"s": sum_("v")})
    out = op.process(pa.table({"k": pa.array([], pa.string()), "v": pa.array([], pa.int64())}))
    assert out.num_rows == 0 and out.column_names == ["k", "s"]


def test_missing_column_is_named() -> None:
    with pytest.raises(InputSchemaError, match="'amount'"):
        KeyedAggregate("k", {"s": sum_("amount")}).process(pa.table({"k": [1]}))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"key": "", "aggregations": {"n": count()}}, "key"),
        ({"key": "k", "aggregations": {}}, "non-empty mapping"),
        ({"key": "k", "aggregations": {"k": count()}}, "name of a key"),
        ({"key": "k", "aggregations": {"s": "sum"}}, "must be built with"),
    ],
)
def test_bad_specs_fail_at_construction(kwargs, message) -> None:
    with pytest.raises(OperatorConfigError, match=message):
        KeyedAggregate(**kwargs)


def test_aggregation_specs_are_frozen_and_validated() -> None:
    spec = sum_("amount")
    with pytest.raises(AttributeError):
        spec.column = "other"  # type: ignore[misc]
    assert str(spec) == "sum(amount)" and str(count()) == "count()"
    with pytest.raises(OperatorConfigError):
        sum_("")


def test_partials_computed_elsewhere_fold_in_as_their_rows_would_a_key_of_two_runs_too() -> None:
    rows = pa.table({"account": ["a", "b", "a", "c", "a"], "amount": [1, 2, None, 4, 5]})
    by_rows = KeyedAggregate("account", SPEC)
    by_rows.process(rows.slice(0, 2))
    by_rows.process(rows.slice(2))
    by_partials = KeyedAggregate("account", SPEC)
    by_partials.process(rows.slice(0, 2))
    # the partials of two runs of records: "a" in both
    partials = pa.table(
        {
            "account": ["a", "c", "a"],
            "count": [1, 1, 1],
            "total": [None, 4, 5],
            "lo": [None, 4, 5],
            "hi": [None, 4, 5],
            "valid": [0, 1, 1],
        }
    )
    by_partials.merge_partials(partials)
    assert by_partials.state.sort_by("account").to_pylist() == by_rows.state.sort_by("account").to_pylist()


@PROFILE
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-(2**40), 2**40)), st.one_of(st.none(), st.integers(-9, 9))),
        min_size=1,
        max_size=30,
    ),
    st.booleans(),
)
def test_folding_row_by_row_gives_what_grouping_gives(pairs, floats) -> None:
    kind = pa.float64() if floats else pa.int64()
    spec = {"count": count(), "total": sum_("amount"), "lo": min_("amount"), "hi": max_("amount")}
    columns = {
        name: pa.array([p if name != "count" else (p or 0) for p, _ in pairs], kind if name != "count" else pa.int64())
        for name in spec
    }
    held = {
        name: pa.array([h if name != "count" else (h or 0) for _, h in pairs], kind if name != "count" else pa.int64())
        for name in spec
    }
    keys = pa.array([f"k{i}" for i in range(len(pairs))])
    partial = pa.table({"account": keys, **columns})
    state = pa.table({"account": keys, **held})
    folded = agg.fold(partial, state, spec)
    assert folded is not None
    grouped = agg.combine(pa.concat_tables([partial, state]), ["account"], spec)
    assert folded.to_pylist() == _in_key_order(grouped, keys)


def _in_key_order(table: pa.Table, keys: pa.Array) -> list[dict]:
    at = pc.index_in(keys, value_set=table["account"])
    return table.take(at).drop_columns(["account"]).to_pylist()
