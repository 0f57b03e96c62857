"""Stateless operators: map, filter, flat_map, select, with_column."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators import (
    InputSchemaError,
    Operator,
    OperatorConfigError,
    OperatorError,
    StateRestoreError,
    filter_rows,
    flat_map,
    map_batches,
    select,
    with_column,
)

BATCH = pa.table({"id": [1, 2, 3, 4], "amount": [10, None, -5, 7], "tags": [["x", "y"], None, [], ["z"]]})


def test_every_stateless_operator_has_an_empty_snapshot() -> None:
    for operator in (
        map_batches(lambda t: t),
        filter_rows(pc.field("id") > 1),
        flat_map("tags"),
        select("id"),
        with_column("one", pc.scalar(1)),
    ):
        assert isinstance(operator, Operator)
        assert operator.snapshot() == {}
        operator.restore({})
        with pytest.raises(StateRestoreError, match="stateless"):
            operator.restore({"state": pa.table({"x": [1]})})


def test_map_batches() -> None:
    double = map_batches(lambda t: t.select(["id"]).append_column("twice", pc.multiply(t["id"], 2)), name="double")
    assert double.process(BATCH)["twice"].to_pylist() == [2, 4, 6, 8]
    assert repr(double) == "map_batches(double)"
    with pytest.raises(OperatorError, match="not a pyarrow.Table"):
        map_batches(lambda t: t.to_pylist()).process(BATCH)
    with pytest.raises(OperatorConfigError):
        map_batches("not callable")  # type: ignore[arg-type]


def test_filter_with_an_expression_drops_false_and_null() -> None:
    assert filter_rows(pc.field("amount") > 0).process(BATCH)["id"].to_pylist() == [1, 4]


def test_filter_with_a_mask_function() -> None:
    assert filter_rows(lambda t: pc.less(t["id"], 3)).process(BATCH)["id"].to_pylist() == [1, 2]
    with pytest.raises(OperatorError, match="not booleans"):
        filter_rows(lambda t: t["id"]).process(BATCH)
    with pytest.raises(OperatorError, match="3 values for a batch of 4"):
        filter_rows(lambda t: pa.array([True] * 3)).process(BATCH)


def test_filter_keeps_row_order_across_chunks() -> None:
    batch = pa.concat_tables([pa.table({"x": list(range(i, i + 1000))}) for i in range(0, 5000, 1000)])
    assert filter_rows(pc.greater(pc.field("x"), 10)).process(batch)["x"].to_pylist() == list(range(11, 5000))


def test_flat_map_explodes_a_list_column() -> None:
    out = flat_map("tags").process(BATCH)
    assert out.select(["id", "tags"]).to_pylist() == [
        {"id": 1, "tags": "x"},
        {"id": 1, "tags": "y"},
        {"id": 4, "tags": "z"},
    ]
    assert out.column_names == BATCH.column_names


def test_flat_map_of_a_sliced_chunked_column() -> None:
    batch = pa.concat_tables([BATCH, BATCH]).slice(3, 3)
    assert flat_map("tags").process(batch)["tags"].to_pylist() == ["z", "x", "y"]


def test_flat_map_with_a_function_and_errors() -> None:
    assert flat_map(lambda t: pa.concat_tables([t, t])).process(BATCH).num_rows == 8
    with pytest.raises(OperatorError, match="not a list"):
        flat_map("id").process(BATCH)
    with pytest.raises(InputSchemaError, match="no column 'nope'"):
        flat_map("nope").process(BATCH)


def test_select_and_with_column() -> None:
    assert select("amount", "id").process(BATCH).column_names == ["amount", "id"]
    with pytest.raises(InputSchemaError):
        select("nope").process(BATCH)
    out = with_column("cents", pc.multiply(pc.field("amount"), 100)).process(BATCH)
    assert out["cents"].to_pylist() == [1000, None, -500, 700]
    replaced = with_column("id", lambda t: pc.negate(t["id"])).process(BATCH)
    assert replaced.column_names == BATCH.column_names and replaced["id"].to_pylist() == [-1, -2, -3, -4]


def test_empty_batches_pass_through() -> None:
    empty = BATCH.slice(0, 0)
    assert filter_rows(pc.field("id") > 0).process(empty).num_rows == 0
    assert flat_map("tags").process(empty).num_rows == 0
    assert with_column("y", pc.field("id")).process(empty).column_names[-1] == "y"


def test_literal_columns_and_bad_expressions() -> None:
    assert with_column("one", pc.scalar(1)).process(BATCH)["one"].to_pylist() == [1, 1, 1, 1]
    with pytest.raises(InputSchemaError, match="cannot evaluate"):
        filter_rows(pc.field("nope") > 1).process(BATCH)
