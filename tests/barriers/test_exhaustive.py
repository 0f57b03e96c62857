"""Every interleaving of small runs (up to three processes, a few messages,
one or two initiators) yields snapshots that pass the checker."""

from __future__ import annotations

import logging

import pytest

from barriers.handler import CheckpointKind
from barriers.messages import CheckpointOptions
from barriers.simulation import checker
from barriers.simulation.simulator import Initiation, Money, Simulator, Tokens, Topology, dataflow, explore

UNALIGNED = CheckpointOptions.unaligned()
CHAIN = Topology(("S", "K", "Z"), (("S", "K"), ("K", "Z")))
FAN_IN = Topology(("S1", "S2", "Z"), (("S1", "Z"), ("S2", "Z")))

CASES = {
    "money, two processes": lambda: Simulator(Topology.ring(2), Money(3, 1), plan=[Initiation(UNALIGNED, ("P1",))]),
    "money, three in a ring": lambda: Simulator(
        Topology.ring(3),
        {"P1": Money(2, 1), "P2": Money(2, 1), "P3": Money(2, 0)},
        plan=[Initiation(UNALIGNED, ("P1",))],
    ),
    "money, two initiators": lambda: Simulator(
        Topology.ring(3),
        {"P1": Money(2, 1), "P2": Money(2, 0), "P3": Money(2, 0)},
        plan=[Initiation(UNALIGNED, ("P1", "P3"))],
    ),
    "token, three in a ring": lambda: Simulator(
        Topology.ring(3), Tokens("P1", 2), plan=[Initiation(UNALIGNED, ("P2",))]
    ),
    "chain, aligned": lambda: Simulator(
        CHAIN, dataflow(CHAIN, records=2), plan=[Initiation(CheckpointOptions.aligned())]
    ),
    "chain, unaligned": lambda: Simulator(CHAIN, dataflow(CHAIN, records=2), plan=[Initiation(UNALIGNED)]),
    "fan-in, aligned": lambda: Simulator(
        FAN_IN, dataflow(FAN_IN, records=1), plan=[Initiation(CheckpointOptions.aligned())]
    ),
    "fan-in, unaligned": lambda: Simulator(FAN_IN, dataflow(FAN_IN, records=1), plan=[Initiation(UNALIGNED)]),
    "fan-in, aligned with timeout": lambda: Simulator(
        FAN_IN, dataflow(FAN_IN, records=1), plan=[Initiation(CheckpointOptions.aligned_with_timeout(timeout_ms=1))]
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_interleaving_yields_checked_snapshots(case, caplog):
    caplog.set_level(logging.ERROR)
    runs = snapshots = 0
    kinds: set[CheckpointKind] = set()
    for sim in explore(CASES[case], max_steps=40):
        assert not sim.enabled_steps(), "the bound cut a run short"
        runs += 1
        final = sim.final_state()
        assert sim.completed, "every run completes its checkpoint"
        for snapshot in sim.completed.values():
            snapshots += 1
            kinds |= set(snapshot.kinds.values())
            verdict = checker.check_snapshot(sim.history, snapshot, sim.behaviours, final)
            assert verdict, f"{case}, steps {[e.kind.value for e in sim.history.events]}:\n{verdict.explain()}"
            if isinstance(sim.behaviours.get("P1"), Money):
                assert checker.conservation(snapshot, 6)
    assert runs > 5 and snapshots == runs
    if case == "fan-in, aligned with timeout":
        assert {CheckpointKind.ALIGNED, CheckpointKind.TIMED_OUT_TO_UNALIGNED} <= kinds
