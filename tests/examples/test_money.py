"""The money-in-transit demo: transfer legs and balances, and the invariant
a consistent cut must show (balances + money in transit = total)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import Chain, OperatorConfigError
from operators.testing import parquet_roundtrip, run
from spark_abs_examples.money import Balances, transfer_legs

PROFILE = settings.get_profile("operators")
TRANSFER = pa.schema([("id", pa.int64()), ("source", pa.string()), ("target", pa.string()), ("amount", pa.int64())])


def transfers(*rows) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(TRANSFER.names, r)) for r in rows], schema=TRANSFER)


def test_transfer_legs_debit_then_credit() -> None:
    out = transfer_legs().process(transfers((1, "a", "b", 5), (2, "b", "c", 7)))
    assert out.to_pylist() == [
        {"id": 1, "account": "a", "amount": -5, "leg": "debit"},
        {"id": 1, "account": "b", "amount": 5, "leg": "credit"},
        {"id": 2, "account": "b", "amount": -7, "leg": "debit"},
        {"id": 2, "account": "c", "amount": 7, "leg": "credit"},
    ]


def test_balances_apply_signed_deltas_and_report_the_total() -> None:
    balances = Balances()
    balances.process(pa.table({"account": ["a", "b"], "amount": [100, 50]}))
    out = balances.process(pa.table({"account": ["a", "c"], "amount": [-30, 30]}))
    assert out.to_pylist() == [{"account": "a", "balance": 70}, {"account": "c", "balance": 30}]
    assert balances.total() == 150
    assert balances.balance("a") == 70 and balances.balance("zz") is None
    assert Balances().total() == 0


def test_null_amounts_and_accounts_are_dead_letters() -> None:
    balances = Balances(key="acct", amount="delta")
    schema = pa.schema([("acct", pa.string()), ("delta", pa.int64())])
    balances.process(
        pa.Table.from_pylist(
            [{"acct": "a", "delta": None}, {"acct": None, "delta": 3}, {"acct": "a", "delta": 1}], schema=schema
        )
    )
    assert [l.reason for l in balances.dead_letters.drain()] == ["null_value", "null_key"]
    assert balances.total() == 1


def test_bad_transfer_leg_names() -> None:
    with pytest.raises(OperatorConfigError):
        transfer_legs(source="x", target="x")


@PROFILE
@given(
    st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from("abcd"), st.integers(1, 100)), max_size=30), st.data()
)
def test_a_consistent_cut_conserves_money(transfer_rows, data) -> None:
    """Two tasks own accounts a-b and c-d.  A transfer's source task applies
    the debit and, in the same step, applies the credit itself or sends it to
    the other task through a FIFO channel.  At any cut between steps, the
    restored balances plus the credits in the channel add up to the money
    deposited."""
    owner = {"a": 0, "b": 0, "c": 1, "d": 1}
    tasks = [Balances(), Balances()]
    tasks[0].process(pa.table({"account": ["a", "b"], "amount": [1000, 1000]}))
    tasks[1].process(pa.table({"account": ["c", "d"], "amount": [1000, 1000]}))
    channel: list[pa.Table] = []  # credits sent to the other task, not yet applied
    cut = data.draw(st.integers(0, len(transfer_rows)))
    snapshot = None
    for index, row in enumerate(transfer_rows + [None]):
        if index == cut:
            snapshot = (
                [parquet_roundtrip(task.snapshot()) for task in tasks],
                sum(credit["amount"][0].as_py() for credit in channel),
            )
        if row is None:
            break
        debit, credit = transfer_legs().process(transfers((index, *row))).to_batches(max_chunksize=1)
        source = owner[row[0]]
        tasks[source].process(pa.Table.from_batches([debit]))
        if owner[row[1]] == source:
            tasks[source].process(pa.Table.from_batches([credit]))
        else:
            channel.append(pa.Table.from_batches([credit]))
        while channel and data.draw(st.booleans()):
            delivered = channel.pop(0)
            tasks[owner[delivered["account"][0].as_py()]].process(delivered)
    states, in_transit = snapshot
    restored = [Balances(), Balances()]
    for task, state in zip(restored, states):
        task.restore(state)
    assert sum(task.total() for task in restored) + in_transit == 4000


def test_chain_of_legs_and_balances() -> None:
    chain = Chain(transfer_legs(), Balances())
    result = run(chain, [transfers((1, "a", "b", 5)), transfers((2, "b", "a", 2))])
    assert result.outputs[-1].to_pylist() == [{"account": "b", "balance": 3}, {"account": "a", "balance": -3}]
    assert chain.operators[1].total() == 0
