"""The operator contract and Chain: order, namespaced snapshots,
all-or-nothing restore, dead letters gathered, multi-input heads, watermarks."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators import (
    Chain,
    KeyedAggregate,
    LatestValueJoin,
    MultiInputOperator,
    Operator,
    OperatorConfigError,
    OperatorError,
    StateRestoreError,
    TumblingWindowAggregate,
    Union,
    WatermarkAware,
    count,
    filter_rows,
    map_batches,
    sum_,
)


def counts() -> KeyedAggregate:
    return KeyedAggregate("k", {"n": count(), "s": sum_("v")})


def test_operators_satisfy_the_protocols() -> None:
    assert isinstance(counts(), Operator)
    assert isinstance(Chain(counts()), Operator) and not isinstance(Chain(counts()), MultiInputOperator)
    assert isinstance(Chain(Union(["a", "b"]), counts()), MultiInputOperator)
    assert isinstance(LatestValueJoin("k"), MultiInputOperator)
    assert not isinstance(counts(), MultiInputOperator)
    assert isinstance(TumblingWindowAggregate("k", "t", 10, {"n": count()}), WatermarkAware)


def test_operators_apply_in_order() -> None:
    chain = Chain(
        filter_rows(pc.field("v") > 0),
        map_batches(lambda t: t.append_column("w", pc.multiply(t["v"], 10))),
        KeyedAggregate("k", {"w": sum_("w")}),
    )
    out = chain.process(pa.table({"k": ["a", "a", "b"], "v": [1, -1, 2]}))
    assert out.to_pylist() == [{"k": "a", "w": 10}, {"k": "b", "w": 20}]


def test_snapshot_names_tables_by_position_nested_too() -> None:
    def make() -> Chain:
        return Chain(
            filter_rows(pc.field("v") > 0),
            counts(),
            Chain(map_batches(lambda t: t), KeyedAggregate("k", {"m": sum_("n")})),
        )

    chain = make()
    chain.process(pa.table({"k": ["a"], "v": [1]}))
    snapshot = chain.snapshot()
    assert sorted(snapshot) == ["1.state", "2.1.state"]
    fresh = make()
    fresh.restore(snapshot)
    assert fresh.operators[2].operators[1].state.to_pylist() == [{"k": "a", "m": 1}]


def test_restore_rejects_tables_of_no_operator() -> None:
    chain = Chain(counts())
    for name in ["state", "3.state", "x.state"]:
        with pytest.raises(StateRestoreError, match="belongs to no operator"):
            chain.restore({name: pa.table({"k": [1]})})


def test_restore_is_all_or_nothing() -> None:
    def make() -> Chain:
        return Chain(counts(), KeyedAggregate("k", {"n": count()}))

    chain = make()
    chain.process(pa.table({"k": ["a"], "v": [1]}))
    other = make()
    other.process(pa.table({"k": ["z", "y"], "v": [5, 6]}))
    state = other.snapshot()
    state["1.state"] = pa.table({"k": ["dup", "dup"], "n": [1, 1]})
    with pytest.raises(StateRestoreError, match="Chain operator 1: .*duplicate"):
        chain.restore(state)
    assert chain.operators[0].state.to_pylist() == [{"k": "a", "n": 1, "s": 1}]
    assert chain.operators[1].state.to_pylist() == [{"k": "a", "n": 1}]


def test_dead_letters_of_all_operators_are_gathered_in_order() -> None:
    chain = Chain(
        counts(),
        map_batches(lambda t: t.set_column(0, "k", pa.nulls(t.num_rows, pa.string()))),
        KeyedAggregate("k", {"n": count()}),
    )
    chain.process(
        pa.Table.from_pylist(
            [{"k": None, "v": 1}, {"k": "a", "v": 2}], schema=pa.schema([("k", pa.string()), ("v", pa.int64())])
        )
    )
    letters = chain.dead_letters.drain()
    assert [(l.row["v"] if "v" in l.row else l.row["s"], l.reason) for l in letters] == [
        (1, "null_key"),
        (2, "null_key"),
    ]
    assert [len(op.dead_letters) for op in (chain.operators[0], chain.operators[2])] == [0, 0]


def test_empty_step_output_ends_the_batch() -> None:
    calls = []
    chain = Chain(filter_rows(pc.field("v") > 100), map_batches(lambda t: calls.append(t) or t))
    assert chain.process(pa.table({"v": [1]})).num_rows == 0
    assert calls == []


def test_multi_input_head() -> None:
    chain = Chain(Union(["a", "b"]), counts())
    assert chain.inputs == ("a", "b")
    out = chain.process({"a": pa.table({"k": ["x"], "v": [1]}), "b": pa.table({"k": ["x"], "v": [2]})})
    assert out.to_pylist() == [{"k": "x", "n": 2, "s": 3}]
    with pytest.raises(OperatorError, match="mapping"):
        chain.process(pa.table({"k": ["x"]}))
    with pytest.raises(OperatorError, match="one pyarrow.Table"):
        Chain(counts()).process({"a": pa.table({"k": ["x"]})})


def test_only_the_first_operator_may_have_several_inputs() -> None:
    with pytest.raises(OperatorConfigError, match="only the first"):
        Chain(counts(), Union(["a", "b"]))
    with pytest.raises(OperatorConfigError):
        Chain()
    with pytest.raises(OperatorConfigError, match="no process"):
        Chain(object())  # type: ignore[arg-type]


def test_watermark_flows_through_the_rest_of_the_chain() -> None:
    chain = Chain(TumblingWindowAggregate("k", "t", 10, {"n": count()}), KeyedAggregate("k", {"windows": count()}))
    assert chain.process(pa.table({"k": ["a", "b"], "t": [1, 2]})).num_rows == 0
    out = chain.on_watermark(10)
    assert out.to_pylist() == [{"k": "a", "windows": 1}, {"k": "b", "windows": 1}]
    assert Chain(counts()).on_watermark(5).num_rows == 0
