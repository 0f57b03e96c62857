"""Seed 001's worked example, reproduced step by step with the simulator.

The figure of the seed is not in its text, so the run is rebuilt from what
the text says: P1 has events A-D, P2 F-H, P3 I; A sends to P2 (received at
F), H sends to P1 (received at D); P1 initiates right after B; its marker
reaches P3 quickly; P3's markers reach P1 (C31 empty) and then P2, which
records F, G and H; P1's marker on C12 arrives last but one, and C21 holds
the message sent at H."""

from __future__ import annotations

from barriers.handler import CheckpointKind
from barriers.messages import CheckpointOptions
from barriers.simulation import checker
from barriers.simulation.narrate import SEED_001_SCRIPT, SEED_001_STEPS, seed_001
from barriers.simulation.simulator import EventKind, Initiation, Scripted, Simulator, Topology, channel_id


def C(i: int, j: int):
    return channel_id(f"P{i}", f"P{j}")


def test_every_scripted_step_is_enabled_when_taken():
    sim = Simulator(
        Topology.complete(3), Scripted(SEED_001_SCRIPT), plan=[Initiation(CheckpointOptions.unaligned(), ("P1",))]
    )
    for step in SEED_001_STEPS:
        assert step in sim.enabled_steps(), step
        sim.apply(step)
    assert sim.enabled_steps() == []


def test_the_snapshot_is_exactly_the_seeds():
    sim = seed_001()
    assert list(sim.completed) == [1]
    snapshot = sim.completed[1]
    assert {p: s["events"] for p, s in snapshot.states.items()} == {
        "P1": ["A", "B"],
        "P2": ["F", "G", "H"],
        "P3": ["I"],
    }
    assert [m.payload for m in snapshot.channels[C(2, 1)]] == ["H"]
    for channel in (C(1, 2), C(1, 3), C(2, 3), C(3, 1), C(3, 2)):
        assert snapshot.channels[channel] == (), channel
    assert snapshot.cut == {"P1": 2, "P2": 3, "P3": 1}
    assert set(snapshot.kinds.values()) == {CheckpointKind.UNALIGNED}
    # the unaligned task checkpoint of P1 keeps C21's state as an offset range
    ((start, end),) = snapshot.acks["P1"].in_flight.values()
    assert sim.logs[C(2, 1)][start].payload == "H" and end == start + 1


def test_d_is_not_part_of_the_recorded_state():
    snapshot = seed_001().completed[1]
    assert "D" not in snapshot.states["P1"]["events"] and "C" not in snapshot.states["P1"]["events"]


def test_order_of_snapshots_and_markers_follows_the_seed():
    sim = seed_001()
    snapshots = [e.process for e in sim.history.events if e.kind is EventKind.SNAPSHOT]
    assert snapshots == ["P1", "P3", "P2"]
    markers = [(e.process, e.channel) for e in sim.history.events if e.kind is EventKind.MARKER_RECEIVE]
    assert markers == [
        ("P3", C(1, 3)),
        ("P1", C(3, 1)),
        ("P2", C(3, 2)),
        ("P2", C(1, 2)),
        ("P1", C(2, 1)),
        ("P3", C(2, 3)),
    ]


def test_the_seed_snapshot_is_consistent_and_lies_between_start_and_end():
    sim = seed_001()
    verdict = checker.check_snapshot(sim.history, sim.completed[1], sim.behaviours, sim.final_state())
    assert verdict, verdict.explain()


def test_token_in_transit_is_in_the_channel_state():
    # the seed's closing remark: if H passed a token to P1, the snapshot shows
    # it in transit on C21, so exactly one token exists in the snapshot
    snapshot = seed_001().completed[1]
    tokens = sum(1 for s in snapshot.states.values() if "D" in s["events"])
    tokens += sum(1 for m in snapshot.channels[C(2, 1)] if m.payload == "H")
    assert tokens == 1
