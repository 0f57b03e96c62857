"""KeyedState, the one-row-per-key table behind every keyed operator."""

from __future__ import annotations

import json
import sys
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from operators import KeyedState, OperatorConfigError, StateRestoreError, latest_per_key
from operators.state import KEYS_METADATA, StateChanges, StateMemory, apply_chain, apply_changes, use_memory


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


# ---- the index, against a model: a dict, which keeps keys in order of first arrival


def _apply(changes: StateChanges, replica: pa.Table) -> pa.Table:
    """The state a store rebuilds from ``replica`` and ``changes``."""
    if changes.full:
        return changes.upserts
    return apply_changes(replica, changes.removed, changes.upserts, ["k"])


def _rows(table: pa.Table) -> list[dict]:
    return table.select(["k", "v"]).to_pylist() if table.num_rows else []


_KEYS = st.sampled_from([f"k{i}" for i in range(12)])
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("merge"), st.dictionaries(_KEYS, st.integers(-5, 5), max_size=6)),
        st.tuples(st.just("upsert"), st.dictionaries(_KEYS, st.integers(-5, 5), max_size=6)),
        st.tuples(st.just("pop"), st.integers(-5, 5)),
        st.tuples(st.just("lookup"), st.lists(_KEYS, max_size=5)),
        st.tuples(st.just("changes"), st.none()),
        st.tuples(st.just("restore"), st.none()),
    ),
    max_size=40,
)


@given(steps=_STEPS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_index_keeps_the_rows_a_dict_would_and_its_changes_rebuild_them(steps, monkeypatch_slack) -> None:
    _check_against_the_model(steps)


@given(steps=_STEPS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_keys_whose_hashes_collide_keep_their_own_rows(steps, monkeypatch_slack, monkeypatch) -> None:
    hashes = KeyedState._hashes
    monkeypatch.setattr(KeyedState, "_hashes", lambda self, rows: hashes(self, rows) % 3)  # 12 keys, 3 hashes
    _check_against_the_model(steps)


@given(steps=_STEPS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_state_under_a_memory_budget_keeps_the_same_rows_and_its_rows_in_memory_within_it(
    steps, monkeypatch_slack, tight_memory
) -> None:
    _check_against_the_model(steps, tight_memory)


def _check_against_the_model(steps, memory: StateMemory | None = None) -> None:
    state, model = KeyedState(["k"], ["v"]), {}
    replica = pa.table({"k": pa.array([], pa.string()), "v": pa.array([], pa.int64())})
    base, links = replica, []  # a chain: the changes since the last base, folded together as a restore reads them
    for step, arg in steps:
        if step == "merge":
            if arg:
                out = state.merge(pa.table({"k": list(arg), "v": list(arg.values())}), add_values)
                for key, value in arg.items():
                    model[key] = model.get(key, 0) + value
                assert out.to_pylist() == [{"k": key, "v": model[key]} for key in arg]
        elif step == "upsert":
            state.upsert(
                pa.table({"k": pa.array(list(arg), pa.string()), "v": pa.array(list(arg.values()), pa.int64())})
            )
            model.update(arg)
        elif step == "pop" and len(state):
            popped = state.pop(pc.greater(state.table["v"], arg))
            assert popped.to_pylist() == [{"k": k, "v": v} for k, v in model.items() if v > arg]
            model = {k: v for k, v in model.items() if v <= arg}
        elif step == "lookup" and len(state):
            assert state.lookup(pa.array(arg, pa.string())).to_pylist() == [
                {"k": key if key in model else None, "v": model.get(key)} for key in arg
            ]
        elif step == "changes":
            changes = state.changes()
            replica = _apply(changes, replica)
            if changes.full:
                base, links = changes.upserts, []
            else:
                links += [("removed", changes.removed), ("upserts", changes.upserts)]
            assert _rows(apply_chain(base, links, ["k"])) == _rows(replica)
            assert _rows(replica) == [{"k": k, "v": v} for k, v in model.items()]  # the same rows, in the same order
        elif step == "restore":
            state.restore(state.snapshot(), "state")  # a restored state is tracked from the restore on
            replica = base = state.table
            links = []
        assert len(state) == len(model)
        if memory is not None:
            assert memory.in_memory() <= memory.budget_bytes
        assert state.table.to_pylist() == [{"k": k, "v": v} for k, v in model.items()]
    assert _rows(_apply(state.changes(), replica)) == [{"k": k, "v": v} for k, v in model.items()]


@pytest.fixture
def tight_memory(tmp_path):
    """Keyed states made in the test spill past 64 bytes of rows in memory."""
    memory = StateMemory(tmp_path / "spill", 64)
    previous = use_memory(memory)
    yield memory
    use_memory(previous)


def test_rows_past_the_budget_are_spilled_to_mapped_files_that_leave_nothing_behind(tmp_path) -> None:
    """100,000 keys updated in batches under a 256 kB budget: the rows held in
    memory stay within it, the rest are mapped files (unlinked at once), and
    every row reads back as it was written."""
    memory = StateMemory(tmp_path / "spill", 256 << 10)
    previous = use_memory(memory)
    try:
        state = KeyedState(["k"], ["v"])
        for _ in range(3):
            for start in range(0, 100_000, 20_000):
                keys = [f"key-{i}" for i in range(start, start + 20_000)]
                state.merge(pa.table({"k": keys, "v": [1] * len(keys)}), add_values)
                assert memory.in_memory() <= memory.budget_bytes
        assert memory.spilled_chunks > 0 and state.table.nbytes > 4 * memory.budget_bytes
        assert state.lookup(pa.array(["key-0", "key-99999", "nope"])).to_pylist() == [
            {"k": "key-0", "v": 3},
            {"k": "key-99999", "v": 3},
            {"k": None, "v": None},
        ]
        assert pc.sum(state.table["v"]).as_py() == 300_000 and len(state) == 100_000
        popped = state.pop(pc.less(pc.utf8_length(state.table["k"]), 9))  # key-0 ... key-9999
        assert popped.num_rows == 10_000 and len(state) == 90_000
        assert memory.in_memory() <= memory.budget_bytes
        assert list((tmp_path / "spill").iterdir()) == []  # mapped, then unlinked
    finally:
        use_memory(previous)


def test_a_state_spills_only_its_own_chunks_on_its_own_change(tmp_path) -> None:
    """The states of a process change on their tasks' threads: a change of
    one never rewrites another's chunks (which that task may be changing);
    the other spills its own at its next change."""
    memory = StateMemory(tmp_path / "spill", 2 << 20)
    previous = use_memory(memory)
    try:
        big, small = KeyedState(["k"], ["v"]), KeyedState(["k"], ["v"])
        big.merge(pa.table({"k": [f"key-{i}" for i in range(60_000)], "v": [1] * 60_000}), add_values)
        memory.budget_bytes = 1 << 10  # from here on, the big state alone is over the budget
        small.merge(pa.table({"k": ["x"], "v": [1]}), add_values)
        assert not any(big._mapped) and all(small._mapped)  # the small one spilled what it had; the big one untouched
        big.merge(pa.table({"k": ["key-0"], "v": [1]}), add_values)
        assert any(big._mapped) and memory.in_memory() <= memory.budget_bytes
    finally:
        use_memory(previous)


def test_states_on_several_threads_share_one_budget_and_each_spills_only_its_own_rows(tmp_path) -> None:
    """Two tasks' states, changed at the same time on two threads under one
    budget: each spills its own chunks, none loses or mixes a row, and the
    rows in memory end within the budget."""
    memory = StateMemory(tmp_path / "spill", 64 << 10)
    previous = use_memory(memory)
    try:
        states = [KeyedState(["k"], ["v"]), KeyedState(["k"], ["v"])]
        failures = []

        def feed(state, prefix):
            try:
                for round_ in range(3):
                    for start in range(0, 30_000, 500):
                        keys = [f"{prefix}-{i}" for i in range(start, start + 500)]
                        state.merge(pa.table({"k": keys, "v": [round_ + 1] * len(keys)}), add_values)
            except Exception as exc:  # reported below, with the thread's state
                failures.append(exc)

        threads = [threading.Thread(target=feed, args=(s, p)) for s, p in zip(states, "ab")]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # the threads take turns as often as they can
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            sys.setswitchinterval(interval)
        assert failures == []
        for state, prefix in zip(states, "ab"):
            assert len(state) == 30_000 and pc.sum(state.table["v"]).as_py() == 6 * 30_000
            assert pc.all(pc.starts_with(state.table["k"], f"{prefix}-")).as_py()
            state.merge(pa.table({"k": [f"{prefix}-0"], "v": [0]}), add_values)  # each counts itself again
        assert memory.spilled_chunks > 0 and memory.in_memory() <= memory.budget_bytes
    finally:
        use_memory(previous)


@pytest.fixture
def monkeypatch_slack(monkeypatch):
    """Compact, renumber and give up tracking after a handful of rows, so
    that small examples reach every path of the index (the same for every
    example, so one setting per test is enough)."""
    monkeypatch.setattr("operators.state._SLACK_ROWS", 3)


def test_a_state_that_stops_tracking_says_its_changes_are_the_whole_state(monkeypatch_slack) -> None:
    state = KeyedState(["k"], ["v"])
    state.upsert(pa.table({"k": [f"k{i}" for i in range(10)], "v": list(range(10))}))
    state.changes()
    state.pop(pc.greater_equal(state.table["v"], 2))  # 8 removed, 2 left: more than the state plus the slack
    changes = state.changes()
    assert changes.full and changes.upserts.to_pylist() == [{"k": "k0", "v": 0}, {"k": "k1", "v": 1}]
    assert not state.changes().full and state.changes().upserts.num_rows == 0


def test_changes_of_a_merge_hold_only_the_keys_it_touched() -> None:
    state = KeyedState(["k"], ["v"])
    state.merge(pa.table({"k": [f"k{i}" for i in range(1000)], "v": [1] * 1000}), add_values)
    state.changes()
    state.merge(pa.table({"k": ["k5", "k7"], "v": [1, 1]}), add_values)
    changes = state.changes()
    assert changes.upserts.to_pylist() == [{"k": "k5", "v": 2}, {"k": "k7", "v": 2}]
    assert changes.removed.num_rows == 0 and not changes.full
    assert json.loads(changes.upserts.schema.metadata[KEYS_METADATA]) == ["k"]


def test_a_chain_on_an_empty_base_applies_whatever_types_the_empty_base_was_stored_with():
    # a base taken before the task's first row: an empty table whose types were guessed
    base = pa.table({"k": pa.array([], pa.int64()), "n": pa.array([], pa.int64())})
    removed = pa.table({"k": ["a", "b"]})
    upserts = pa.table({"k": ["c", "a"], "n": [3, 1]})
    assert apply_chain(base, [("removed", removed), ("upserts", upserts)], ["k"]).to_pylist() == [
        {"k": "c", "n": 3},
        {"k": "a", "n": 1},
    ]
    assert apply_changes(base, removed, None, ["k"]).num_rows == 0
