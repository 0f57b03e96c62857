"""restore() refuses state it cannot take back (missing or extra tables,
wrong columns or types, duplicate or null keys, inconsistent windows or
buffers) with StateRestoreError, and leaves the operator as it was."""

from __future__ import annotations

import pyarrow as pa
import pytest

from operators import (
    KeyedAggregate,
    LatestValueJoin,
    OperatorError,
    StateRestoreError,
    TumblingWindowAggregate,
    Unmatched,
    count,
    min_,
    sum_,
)
from operators.testing import parquet_roundtrip
from spark_abs_examples.money import Balances


def aggregate() -> KeyedAggregate:
    op = KeyedAggregate("k", {"n": count(), "s": sum_("v"), "lo": min_("v")})
    op.process(pa.table({"k": ["a", "b"], "v": [1, 2]}))
    return op


def windows() -> TumblingWindowAggregate:
    op = TumblingWindowAggregate("k", "t", 10, {"n": count()})
    op.process(pa.table({"k": ["a"], "t": [15]}))
    op.on_watermark(15)
    return op


def join() -> LatestValueJoin:
    op = LatestValueJoin("id")
    op.process({"right": pa.table({"id": [1], "name": ["one"]}), "left": pa.table({"id": [2], "x": [0]})})
    return op


def replaced(state: dict, name: str, table: pa.Table) -> dict:
    return {**state, name: table}


AGGREGATE_CASES = {
    "missing table": ({}, "missing \\['state'\\]"),
    "extra table": ({"state": aggregate().snapshot()["state"], "old": pa.table({"x": [1]})}, "unexpected \\['old'\\]"),
    "not a table": ({"state": [1, 2]}, "not a pyarrow.Table"),
    "not a mapping": (None, "must be a mapping"),
    "wrong columns": ({"state": pa.table({"k": ["a"], "n": [1], "total": [1], "lo": [1]})}, "has columns"),
    "count as string": ({"state": pa.table({"k": ["a"], "n": ["1"], "s": [1], "lo": [1]})}, "cannot hold count"),
    "sum as string": ({"state": pa.table({"k": ["a"], "n": [1], "s": ["x"], "lo": [1]})}, "cannot hold sum"),
    "duplicate keys": ({"state": pa.table({"k": ["a", "a"], "n": [1, 1], "s": [1, 1], "lo": [1, 1]})}, "duplicate"),
    "null key": (
        {
            "state": pa.Table.from_pylist(
                [{"k": None, "n": 1, "s": 1, "lo": 1}],
                schema=pa.schema([("k", pa.string()), ("n", pa.int64()), ("s", pa.int64()), ("lo", pa.int64())]),
            )
        },
        "null keys",
    ),
}


@pytest.mark.parametrize("case", AGGREGATE_CASES)
def test_keyed_aggregate_rejects(case: str) -> None:
    state, message = AGGREGATE_CASES[case]
    op = aggregate()
    before = op.snapshot()
    with pytest.raises(StateRestoreError, match=message):
        op.restore(state)
    assert op.snapshot()["state"].equals(before["state"])


def test_restore_errors_are_operator_errors() -> None:
    assert issubclass(StateRestoreError, OperatorError)


def test_a_snapshot_of_another_spec_is_rejected() -> None:
    state = aggregate().snapshot()
    with pytest.raises(StateRestoreError, match="has columns \\['k', 'n', 's', 'lo'\\], expected \\['k', 'total'\\]"):
        KeyedAggregate("k", {"total": sum_("v")}).restore(state)
    with pytest.raises(StateRestoreError, match="lacks key|has columns"):
        KeyedAggregate("account", {"n": count(), "s": sum_("v"), "lo": min_("v")}).restore(state)


def test_windows_reject_bad_watermark_and_windows_that_should_have_closed() -> None:
    good = parquet_roundtrip(windows().snapshot())
    cases = [
        (replaced(good, "watermark", pa.table({"watermark": [1, 2]})), "one integer row"),
        (replaced(good, "watermark", pa.table({"watermark": ["x"]})), "one integer row"),
        (replaced(good, "watermark", pa.table({"wm": [1]})), "has columns"),
        (replaced(good, "watermark", pa.table({"watermark": [500]})), "should have closed"),
        (replaced(good, "windows", pa.table({"k": ["a"], "window_start": [13], "n": [1]})), "multiples of size"),
        (replaced(good, "windows", pa.table({"k": ["a"], "window_start": ["10"], "n": [1]})), "expected int64"),
        (replaced(good, "windows", pa.table({"k": ["a", "a"], "window_start": [10, 10], "n": [1, 1]})), "duplicate"),
        ({"windows": good["windows"]}, "missing \\['watermark'\\]"),
    ]
    for state, message in cases:
        op = windows()
        with pytest.raises(StateRestoreError, match=message):
            op.restore(state)
        assert op.watermark == 15 and op.open_windows.num_rows == 1


def test_join_rejects_inconsistent_buffers() -> None:
    good = parquet_roundtrip(join().snapshot())
    cases = [
        (replaced(good, "pending", pa.table({"id": [1], "x": [0]})), "already has a right value"),
        (replaced(good, "pending", pa.table({"x": [0]})), "lacks the left key"),
        (replaced(good, "pending", pa.table({"id": ["x1"], "x": [0]})), "differ in type"),
        (replaced(good, "right", pa.table({"id": [1, 1], "name": ["a", "b"]})), "duplicate"),
    ]
    for state, message in cases:
        op = join()
        with pytest.raises(StateRestoreError, match=message):
            op.restore(state)
        assert op.pending.to_pylist() == [{"id": 2, "x": 0}]
    with pytest.raises(StateRestoreError, match="never buffers"):
        LatestValueJoin("id", unmatched=Unmatched.EMIT_NULLS).restore(good)


def test_balances_reject_null_balances() -> None:
    schema = pa.schema([("account", pa.string()), ("balance", pa.int64())])
    with pytest.raises(StateRestoreError, match="null balances"):
        Balances().restore({"state": pa.Table.from_pylist([{"account": "a", "balance": None}], schema=schema)})


def test_restoring_replaces_whatever_state_there_was() -> None:
    op = aggregate()
    op.restore(KeyedAggregate("k", {"n": count(), "s": sum_("v"), "lo": min_("v")}).snapshot())
    assert op.state.num_rows == 0
    assert op.process(pa.table({"k": [7], "v": [1]})).to_pylist() == [{"k": 7, "n": 1, "s": 1, "lo": 1}]
