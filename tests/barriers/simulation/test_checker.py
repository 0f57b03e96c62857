"""The checker on hand-made cuts of a small scripted run: consistent ones
pass, inconsistent ones fail and say which message breaks which rule."""

from __future__ import annotations

import copy

import pytest

from barriers.simulation import checker
from barriers.simulation.simulator import (
    Act,
    GlobalSnapshot,
    GlobalState,
    Money,
    Receive,
    Scripted,
    Simulator,
    Tokens,
    Topology,
    channel_id,
)

PQ, QP = channel_id("P", "Q"), channel_id("Q", "P")
SCRIPT = Scripted(
    {
        "P": [("send", "a", "Q"), ("internal", "b"), ("send", "c", "Q"), ("receive", "d")],
        "Q": [("receive", "e"), ("send", "f", "P"), ("receive", "g")],
    }
)


@pytest.fixture(scope="module")
def run() -> Simulator:
    sim = Simulator(Topology(("P", "Q"), (("P", "Q"), ("Q", "P"))), SCRIPT)
    for step in (Act("P"), Receive("Q", PQ), Act("P"), Act("Q"), Act("P"), Receive("P", QP), Receive("Q", PQ)):
        sim.apply(step)
    assert not sim.enabled_steps()
    return sim


def replayed_state(run: Simulator, cut: dict[str, int]) -> dict:
    """The process states after the first ``cut[p]`` actions of each process."""
    states = copy.deepcopy(run.history.initial_states)
    for action in run.history.actions:
        if action.index < cut[action.process]:
            state = states[action.process]
            if action.received is None:
                SCRIPT.spontaneous(state, None)
            else:
                SCRIPT.on_message(state, PQ, None)
    return states


def snapshot(run: Simulator, cut: dict[str, int], channels: dict | None = None, states: dict | None = None):
    by_id = run.history.messages
    return GlobalSnapshot(
        states=states or replayed_state(run, cut),
        channels={c: tuple(by_id[m] for m in ms) for c, ms in (channels or {}).items()},
        cut=cut,
        checkpoint_id=1,
    )


def message_id(run: Simulator, payload: str) -> int:
    return next(m.id for m in run.history.messages.values() if m.payload == payload)


@pytest.mark.parametrize(
    "cut, in_transit",
    [
        ({"P": 0, "Q": 0}, {}),
        ({"P": 1, "Q": 0}, {PQ: ["a"]}),
        ({"P": 1, "Q": 1}, {}),
        ({"P": 3, "Q": 1}, {PQ: ["c"]}),
        ({"P": 3, "Q": 2}, {PQ: ["c"], QP: ["f"]}),
        ({"P": 4, "Q": 3}, {}),
    ],
)
def test_consistent_cuts_pass_both_checks(run, cut, in_transit):
    snap = snapshot(run, cut, {c: [message_id(run, p) for p in ps] for c, ps in in_transit.items()})
    verdict = checker.check_snapshot(run.history, snap, SCRIPT, run.final_state())
    assert verdict, verdict.explain()


def test_a_message_received_before_the_cut_but_sent_after_it_is_named(run):
    snap = snapshot(run, {"P": 0, "Q": 1})
    verdict = checker.is_consistent_cut(run.history, snap)
    assert not verdict
    (violation,) = verdict.violations
    assert violation.rule == "received-before-sent"
    assert violation.message == message_id(run, "a") and violation.process == "Q" and violation.channel == PQ
    assert "Q's action 1 (e)" in violation.text and "P's action 1 (a)" in violation.text
    assert "received-before-sent" in verdict.explain()


def test_the_reordered_computation_of_an_inconsistent_cut_is_not_a_computation(run):
    verdict = checker.check_reachability(run.history, snapshot(run, {"P": 2, "Q": 3}), SCRIPT)
    assert "not-enabled" in verdict.rules()
    assert any(v.message == message_id(run, "c") for v in verdict.violations if v.rule == "not-enabled")


def test_a_missing_message_in_transit_is_named(run):
    verdict = checker.is_consistent_cut(run.history, snapshot(run, {"P": 1, "Q": 0}))
    (violation,) = verdict.violations
    assert violation.rule == "channel-state" and violation.message == message_id(run, "a")
    assert "misses" in violation.text and "P-Q" in violation.text


def test_a_message_recorded_in_transit_that_was_not_is_named(run):
    verdict = checker.is_consistent_cut(run.history, snapshot(run, {"P": 1, "Q": 1}, {PQ: [message_id(run, "a")]}))
    (violation,) = verdict.violations
    assert violation.rule == "channel-state" and "holds" in violation.text


def test_a_cut_beyond_the_history_is_named(run):
    verdict = checker.is_consistent_cut(run.history, snapshot(run, {"P": 9, "Q": 0}, states=run.states))
    assert "cut-beyond-history" in verdict.rules()


def test_a_wrong_process_state_is_not_reachable(run):
    states = replayed_state(run, {"P": 1, "Q": 1})
    states["Q"]["events"] = ["made up"]
    verdict = checker.check_reachability(run.history, snapshot(run, {"P": 1, "Q": 1}, states=states), SCRIPT)
    (violation,) = verdict.violations
    assert violation.rule == "state-mismatch" and violation.process == "Q"


def test_a_wrong_final_state_is_named(run):
    final = run.final_state()
    wrong = GlobalState({**final.states, "P": {"events": [], "script": [], "process": "P"}}, final.channels)
    verdict = checker.check_reachability(run.history, snapshot(run, {"P": 1, "Q": 1}), SCRIPT, wrong)
    assert any(v.rule == "state-mismatch" and "final state" in v.text for v in verdict.violations)


def test_histories_with_restores_are_refused():
    from barriers.simulation.simulator import Crash, Initiation, dataflow

    topology = Topology(("S", "Z"), (("S", "Z"),))
    sim = Simulator(topology, dataflow(topology, records=2), plan=[Initiation()])
    sim.apply(Act("S"))
    sim.apply(Crash("S"))
    sim.drain()
    with pytest.raises(ValueError, match="generations"):
        checker.is_consistent_cut(sim.history, GlobalSnapshot({}, {}, cut={}))


def test_conservation_counts_money_in_transit():
    held = GlobalState({"P": {"balance": 70}, "Q": {"balance": 100}}, {PQ: ()})
    assert not checker.conservation(held, 200)
    assert "170, not the total 200" in checker.conservation(held, 200).explain()
    sim = Simulator(Topology(("P", "Q"), (("P", "Q"),)), Money(100, 1), seed=3)
    sim.apply(Act("P"))
    moving = sim.final_state()
    assert checker.conservation(moving, 200), checker.conservation(moving, 200).explain()


def test_termination_names_active_processes_and_messages_in_transit():
    tokens = Tokens("P", hops=1)
    sim = Simulator(Topology(("P", "Q"), (("P", "Q"), ("Q", "P"))), tokens)
    verdict = checker.termination(sim.final_state(), tokens)
    assert verdict.rules() == {"active"}
    sim.apply(Act("P"))
    verdict = checker.termination(sim.final_state(), tokens)
    assert verdict.rules() == {"in-transit"} and verdict.violations[0].channel == PQ
    sim.apply(Receive("Q", PQ))
    assert checker.termination(sim.final_state(), tokens)
