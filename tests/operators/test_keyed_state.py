"""KeyedState, the one-row-per-key table behind every keyed operator."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators import KeyedState, OperatorConfigError, StateRestoreError, latest_per_key
from operators.state import KEYS_METADATA


def add_values(rows: pa.Table) -> pa.Table:
    grouped = rows.group_by("k", use_threads=False).aggregate([("v", "sum")])
    return pa.table({"k": grouped["k"], "v": grouped["v_sum"]})


def test_merge_returns_updated_rows_and_keeps_the_rest() -> None:
    state = KeyedState(["k"], ["v"])
    assert state.merge(pa.table({"k": ["a", "b"], "v": [1, 2]}), add_values).num_rows == 2
    updated = state.merge(pa.table({"k": ["b", "c"], "v": [10, 3]}), add_values)
    assert updated.to_pylist() == [{"k": "b", "v": 12}, {"k": "c", "v": 3}]
    assert sorted(state.table.to_pylist(), key=lambda r: r["k"]) == [
        {"k": "a", "v": 1},
        {"k": "b", "v": 12},
        {"k": "c", "v": 3},
    ]


def test_tables_handed_out_never_change() -> None:
    state = KeyedState(["k"], ["v"])
    state.merge(pa.table({"k": ["a"], "v": [1]}), add_values)
    before = state.table
    state.merge(pa.table({"k": ["a"], "v": [1]}), add_values)
    state.upsert(pa.table({"k": ["a"], "v": [100]}))
    assert before.to_pylist() == [{"k": "a", "v": 1}]


def test_multi_column_keys() -> None:
    state = KeyedState(["k", "w"], ["v"])
    combine = lambda rows: pa.table(  # noqa: E731
        {
            **{
                c: g
                for c, g in zip(
                    ["k", "w", "v"],
                    rows.group_by(["k", "w"], use_threads=False)
                    .aggregate([("v", "sum")])
                    .select(["k", "w", "v_sum"])
                    .columns,
                )
            }
        }
    )
    state.merge(pa.table({"k": ["a", "a"], "w": [0, 10], "v": [1, 2]}), combine)
    out = state.merge(pa.table({"k": ["a"], "w": [10], "v": [5]}), combine)
    assert out.to_pylist() == [{"k": "a", "w": 10, "v": 7}]
    popped = state.pop(pc.equal(state.table["w"], 0))
    assert popped.to_pylist() == [{"k": "a", "w": 0, "v": 1}] and len(state) == 1
    with pytest.raises(OperatorConfigError, match="single key"):
        state.lookup(pa.array(["a"]))


def test_upsert_and_lookup() -> None:
    state = KeyedState(["id"])
    state.upsert(pa.table({"id": [1, 2], "name": ["one", "two"]}))
    state.upsert(pa.table({"id": [2], "name": ["TWO"]}))
    assert state.lookup(pa.array([2, 3, 1])).to_pylist() == [
        {"id": 2, "name": "TWO"},
        {"id": None, "name": None},
        {"id": 1, "name": "one"},
    ]


def test_latest_per_key() -> None:
    rows = pa.table({"k": ["a", "b", "a", "c", "b"], "v": [1, 2, 3, 4, 5]})
    assert latest_per_key(rows, ["k"]).to_pylist() == [{"k": "a", "v": 3}, {"k": "c", "v": 4}, {"k": "b", "v": 5}]


def test_restore_checks_keys() -> None:
    state = KeyedState(["k"], ["v"])
    with pytest.raises(StateRestoreError, match="lacks key"):
        state.restore(pa.table({"v": [1]}), "t")
    with pytest.raises(StateRestoreError, match="2 duplicate"):
        state.restore(pa.table({"k": [1, 1, 1], "v": [1, 2, 3]}), "t")
    state.restore(pa.table({"k": [1, 2], "v": [1, 2]}), "t")
    assert len(state) == 2


def test_empty_state_takes_the_types_of_the_first_rows() -> None:
    state = KeyedState(["k"], ["v"])
    state.restore(pa.table({"k": pa.array([], pa.int64()), "v": pa.array([], pa.int64())}), "t")
    state.merge(pa.table({"k": ["a"], "v": [1.5]}), add_values)
    assert state.table.schema == pa.schema([("k", pa.string()), ("v", pa.float64())])


def test_a_snapshot_names_its_keys_and_a_restored_state_does_not_pass_them_on():
    state = KeyedState(["account", "day"], ["balance"])
    state.upsert(pa.table({"account": ["a"], "day": [1], "balance": [5]}))
    snapshot = state.snapshot()
    assert json.loads(snapshot.schema.metadata[KEYS_METADATA]) == ["account", "day"]
    restored = KeyedState(["account", "day"], ["balance"])
    restored.restore(snapshot, "balances")
    assert restored.table.schema.metadata is None  # rows taken from it go downstream without it
