"""The resume contract, property-tested for every stateful operator and for
chains: for random batches and a random cut, stopping after the cut,
snapshotting, restoring a fresh operator through Parquet and processing the
rest gives exactly the output (and dead letters) of an uninterrupted run;
and a snapshot already returned never changes."""

from __future__ import annotations

from unittest import mock

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import account_batches, join_steps, table, window_steps

from operators import (
    Chain,
    KeyedAggregate,
    LatestValueJoin,
    TumblingWindowAggregate,
    Unmatched,
    count,
    filter_rows,
    map_batches,
    max_,
    min_,
    sum_,
    with_column,
)
from operators.base import gathered, snapshot_later_of
from operators.testing import (
    Watermark,
    assert_changes_rebuild_the_state,
    assert_resumes_exactly,
    parquet_roundtrip,
    run,
    run_with_restore,
)
from spark_abs_examples.money import Balances, transfer_legs

PROFILE = settings.get_profile("operators")


def keyed_aggregate() -> KeyedAggregate:
    return KeyedAggregate(
        "account",
        {
            "count": count(),
            "total": sum_("amount"),
            "lo": min_("amount"),
            "hi": max_("amount"),
            "valid": count("amount"),
        },
    )


def window_factory(size: int, lateness: int):
    return lambda: TumblingWindowAggregate("k", "t", size, {"n": count(), "s": sum_("v")}, allowed_lateness=lateness)


def transfers_chain() -> Chain:
    return Chain(filter_rows(pc.is_valid(pc.field("amount"))), transfer_legs(), Balances())


def enrich_then_count() -> Chain:
    return Chain(
        LatestValueJoin("id"),
        with_column("big", pc.greater(pc.field("x"), 50)),
        KeyedAggregate("name", {"rows": count(), "x": sum_("x")}),
    )


def windows_chain() -> Chain:
    return Chain(
        filter_rows(pc.is_valid(pc.field("v"))),
        TumblingWindowAggregate("k", "t", 10, {"n": count(), "s": sum_("v")}, allowed_lateness=5),
        map_batches(lambda t: t.append_column("double", pc.multiply(t["s"], 2))),
        KeyedAggregate("k", {"windows": count(), "sum": sum_("s")}),
    )


def transfer_batches() -> st.SearchStrategy[list[pa.Table]]:
    schema = pa.schema([("source", pa.string()), ("target", pa.string()), ("amount", pa.int64())])
    row = st.fixed_dictionaries(
        {
            "source": st.sampled_from(["a", "b", "c"]),
            "target": st.sampled_from(["a", "b", "c"]),
            "amount": st.one_of(st.integers(1, 100), st.none()),
        }
    )
    return st.lists(st.lists(row, max_size=6).map(lambda rows: table(rows, schema)), max_size=6)


def assert_snapshot_frozen(make, steps, cut) -> None:
    """A snapshot taken at ``cut`` is unchanged by processing the rest, and so
    is one taken for later (``snapshot_later_of``) and gathered after it."""
    operator = make()
    run(operator, steps[:cut])
    with mock.patch("operators.state._GATHER_LATER_ROWS", 0):  # however small the state, gathered later
        later = snapshot_later_of(operator)
    snapshot = operator.snapshot()
    frozen = {name: (t.schema, t.to_pylist()) for name, t in snapshot.items()}
    run(operator, steps[cut:])
    assert {name: (t.schema, t.to_pylist()) for name, t in snapshot.items()} == frozen
    assert {name: (t.schema, t.to_pylist()) for name, t in gathered(later).items()} == frozen


def assert_restore_round_trips(make, steps, cut) -> None:
    """snapshot -> restore -> snapshot gives the same tables back."""
    operator = make()
    run(operator, steps[:cut])
    snapshot = parquet_roundtrip(operator.snapshot())
    again = make()
    again.restore(snapshot)
    assert {n: t.to_pylist() for n, t in again.snapshot().items()} == {n: t.to_pylist() for n, t in snapshot.items()}


def check_all(make, steps, cut) -> None:
    assert_resumes_exactly(make, steps, cut)
    assert_snapshot_frozen(make, steps, cut)
    assert_restore_round_trips(make, steps, cut)
    assert_changes_rebuild_the_state(make, steps, cut)


@PROFILE
@given(st.data())
def test_keyed_aggregate_resumes_exactly(data) -> None:
    steps = data.draw(account_batches())
    check_all(keyed_aggregate, steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data(), st.sampled_from([1, 7, 10]), st.sampled_from([0, 4, 25]))
def test_tumbling_windows_resume_exactly(data, size: int, lateness: int) -> None:
    steps = data.draw(window_steps())
    check_all(window_factory(size, lateness), steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data(), st.sampled_from(list(Unmatched)))
def test_latest_value_join_resumes_exactly(data, unmatched: Unmatched) -> None:
    steps = data.draw(join_steps())
    check_all(lambda: LatestValueJoin("id", unmatched=unmatched), steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data())
def test_balances_resume_exactly(data) -> None:
    steps = data.draw(account_batches())
    check_all(Balances, steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data())
def test_transfer_chain_resumes_exactly_and_conserves_money(data) -> None:
    steps = data.draw(transfer_batches())
    cut = data.draw(st.integers(0, len(steps)))
    check_all(transfers_chain, steps, cut)
    chain = transfers_chain()
    chain.restore(parquet_roundtrip(_snapshot_after(transfers_chain, steps[:cut])))
    run(chain, steps[cut:])
    assert chain.operators[2].total() == 0  # transfers only move money


@PROFILE
@given(st.data())
def test_join_headed_chain_resumes_exactly(data) -> None:
    steps = data.draw(join_steps())
    check_all(enrich_then_count, steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data())
def test_windows_chain_resumes_exactly(data) -> None:
    steps = data.draw(window_steps())
    check_all(windows_chain, steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data())
def test_resume_survives_several_restores(data) -> None:
    """Cutting the run at every one of several points gives the same result."""
    steps = data.draw(window_steps(max_steps=8))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(steps)), max_size=4)))
    make = window_factory(10, 3)
    expected = run(make(), steps)
    operator, outputs, letters, start = make(), [], [], 0
    for cut in [*cuts, len(steps)]:
        part = run(operator, steps[start:cut])
        outputs += part.outputs
        letters += part.dead_letters
        snapshot = parquet_roundtrip(operator.snapshot())
        operator = make()
        operator.restore(snapshot)
        start = cut
    assert [t.to_pylist() for t in outputs] == [t.to_pylist() for t in expected.outputs]
    assert tuple(letters) == expected.dead_letters


def _snapshot_after(make, steps):
    operator = make()
    run(operator, steps)
    return operator.snapshot()


class _Forgetful(KeyedAggregate):
    """Broken on purpose: its snapshot leaves the state out."""

    def snapshot(self):
        return {"state": self.state.slice(0, 0)}


def test_a_subclass_that_overrides_snapshot_only_is_stored_as_its_snapshot_says() -> None:
    """``_Forgetful`` inherits ``KeyedAggregate.snapshot_later()``; the task
    must still store what its own ``snapshot()`` gives."""
    schema = pa.schema([("account", pa.string()), ("amount", pa.int64())])
    for make, rows in ((_Forgetful, 0), (KeyedAggregate, 1)):
        operator = make("account", {"total": sum_("amount")})
        operator.process(table([{"account": "a", "amount": 1}], schema))
        assert gathered(snapshot_later_of(operator))["state"].num_rows == rows


def test_the_checker_catches_an_operator_that_forgets_state() -> None:
    batches = [
        table([{"account": "a", "amount": 1}], pa.schema([("account", pa.string()), ("amount", pa.int64())]))
    ] * 2
    make = lambda: _Forgetful("account", {"total": sum_("amount")})  # noqa: E731
    with pytest.raises(AssertionError, match="differs after resume"):
        assert_resumes_exactly(make, batches, 1)
    assert run_with_restore(make, batches, 1).rows() == [{"account": "a", "total": 1}] * 2


def test_watermark_steps_reach_on_watermark() -> None:
    make = window_factory(10, 0)
    steps = [
        table([{"k": "a", "t": 3, "v": 1}], pa.schema([("k", pa.string()), ("t", pa.int64()), ("v", pa.int64())])),
        Watermark(10),
    ]
    assert run(make(), steps).rows() == [{"k": "a", "window_start": 0, "window_end": 10, "n": 1, "s": 1}]
    assert_resumes_exactly(make, steps, 1)
