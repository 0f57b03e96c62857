"""The simulator on small scripted runs: logs and markers, blocking, the
unaligned channel state, the alignment timeout, crashes and restores with
generations, two-phase sinks, determinism and exhaustive exploration."""

from __future__ import annotations

import collections

import pytest

from barriers.handler import CheckpointKind, Switch
from barriers.messages import CheckpointOptions
from barriers.simulation import checker
from barriers.simulation.simulator import (
    Act,
    Crash,
    EventKind,
    Initiate,
    Initiation,
    Marker,
    Message,
    Money,
    RandomScheduler,
    Receive,
    SimulationError,
    Simulator,
    Topology,
    channel_id,
    dataflow,
    explore,
)

FAN_IN = Topology(("S1", "S2", "K", "Z"), (("S1", "K"), ("S2", "K"), ("K", "Z")))
S1K, S2K, KZ = channel_id("S1", "K"), channel_id("S2", "K"), channel_id("K", "Z")


def fan_in(options: CheckpointOptions, records: int = 3) -> Simulator:
    return Simulator(FAN_IN, dataflow(FAN_IN, records=records, keys=2), plan=[Initiation(options)])


def take(sim: Simulator, *steps) -> None:
    for step in steps:
        assert step in sim.enabled_steps(), (step, sim.enabled_steps())
        sim.apply(step)


def ids(output) -> collections.Counter:
    return collections.Counter(record["id"] for record in output)


def test_topology_is_validated():
    with pytest.raises(ValueError, match="unknown process"):
        Topology(("A",), (("A", "B"),))
    with pytest.raises(ValueError, match="self-loop"):
        Topology(("A",), (("A", "A"),))
    with pytest.raises(ValueError, match="without '-'"):
        Topology(("A-B",), ())
    ring = Topology.ring(3)
    assert ring.is_strongly_connected() and not ring.is_acyclic()
    assert FAN_IN.is_acyclic() and not FAN_IN.is_strongly_connected()
    assert FAN_IN.sources == ("S1", "S2") and FAN_IN.sinks == ("Z",)
    assert ring.inputs("P1") == (channel_id("P3", "P1"),)
    with pytest.raises(SimulationError, match="acyclic"):
        dataflow(ring)


def test_cyclic_graphs_need_named_initiators():
    with pytest.raises(SimulationError, match="initiators"):
        Simulator(Topology.ring(2), Money(), plan=[Initiation(CheckpointOptions.unaligned())])


def test_channels_are_logs_with_offsets_and_markers_go_first():
    sim = fan_in(CheckpointOptions.aligned())
    take(sim, Act("S1"), Initiate("S1", 0), Act("S1"))
    log = sim.logs[S1K]
    assert [type(e) for e in log] == [Message, Marker, Message]
    assert [e.offset for e in log] == [0, 1, 2]
    assert log[1].barrier.checkpoint_id == 1 and log[1].barrier.generation == 0


def test_aligned_blocks_a_channel_until_every_barrier_came():
    sim = fan_in(CheckpointOptions.aligned())
    take(sim, Act("S1"), Initiate("S1", 0), Act("S1"), Receive("K", S1K), Receive("K", S1K))
    assert sim.handler("K").is_blocked(S1K)
    assert Receive("K", S1K) not in sim.enabled_steps()
    take(sim, Act("S2"), Receive("K", S2K), Initiate("S2", 0), Receive("K", S2K))
    assert not sim.handler("K").is_blocked(S1K)
    assert Receive("K", S1K) in sim.enabled_steps()
    sim.drain()
    snapshot = sim.completed[1]
    assert set(snapshot.kinds.values()) == {CheckpointKind.ALIGNED}
    assert all(not held for held in snapshot.channels.values())
    assert snapshot.states["Z"]["output"] and ids(snapshot.states["Z"]["output"]) == {"S1.0": 1, "S2.0": 1}


def unaligned_with_a_record_in_flight() -> Simulator:
    sim = fan_in(CheckpointOptions.unaligned())
    take(
        sim,
        Act("S1"),
        Initiate("S1", 0),
        Receive("K", S1K),
        Receive("K", S1K),  # K snapshots at once
        Act("S2"),
        Receive("K", S2K),  # S2.0 is processed after K's snapshot, before S2's barrier
        Initiate("S2", 0),
        Receive("K", S2K),
    )
    sim.drain()
    return sim


def test_unaligned_records_what_came_before_a_late_barrier_as_channel_state():
    sim = unaligned_with_a_record_in_flight()
    snapshot = sim.completed[1]
    assert [m.payload["id"] for m in snapshot.channels[S2K]] == ["S2.0"]
    assert snapshot.kinds["K"] is CheckpointKind.UNALIGNED
    assert snapshot.acks["K"].in_flight == {S2K: (0, 1)}
    assert snapshot.states["K"]["counts"] == {0: 1}  # S1.0 only: S2.0 is in the channel


def test_a_restore_replays_the_in_flight_range_then_resumes_after_the_barrier():
    sim = unaligned_with_a_record_in_flight()
    sim.apply(Crash("K"))
    assert sim.generation == 1
    assert sim.procs["K"].pos == {S1K: 2, S2K: 0}  # S2-K from the start of its in-flight range
    assert sim.states == sim.completed[1].states
    assert sim.handler("K").generation == 1
    snapshot = sim.finish()
    assert snapshot is not None and snapshot.generation == 1
    assert ids(sim.committed_output("Z")) == {f"S{s}.{i}": 1 for s in (1, 2) for i in range(3)}


def test_a_crash_before_any_checkpoint_restarts_from_scratch_and_skips_the_old_generation():
    sim = fan_in(CheckpointOptions.aligned())
    take(sim, Act("S1"), Act("S1"), Receive("K", S1K), Act("S2"))
    sim.apply(Crash("S2"))
    assert sim.generation == 1 and sim.states == sim.history.initial_states
    assert sim.stale[S1K] == [(0, 2)] and sim.stale[KZ] == [(0, 1)]
    sim.finish()
    skipped = [e for e in sim.history.events if e.kind is EventKind.SKIP]
    assert {e.channel for e in skipped} == {S1K, S2K, KZ}
    assert ids(sim.committed_output("Z")) == {f"S{s}.{i}": 1 for s in (1, 2) for i in range(3)}


def test_a_sink_shows_output_only_when_the_closing_checkpoint_completes():
    sim = fan_in(CheckpointOptions.aligned())
    take(sim, Act("S1"), Receive("K", S1K), Receive("Z", KZ))
    assert sim.states["Z"]["output"] and sim.committed_output("Z") == []
    take(sim, Initiate("S1", 0), Initiate("S2", 0), Receive("K", S1K), Receive("K", S2K), Receive("Z", KZ))
    assert ids(sim.committed_output("Z")) == {"S1.0": 1}


def test_the_alignment_timeout_turns_a_checkpoint_unaligned():
    # one simulated millisecond per step; the timeout counts from the trigger (step 1)
    sim = fan_in(CheckpointOptions.aligned_with_timeout(timeout_ms=2), records=5)
    take(sim, Initiate("S1", 0), Receive("K", S1K))
    assert sim.handler("K").is_blocked(S1K)
    take(sim, Act("S2"))  # 2 ms since the trigger, 1 ms since K's first barrier
    assert not sim.handler("K").is_blocked(S1K)
    take(sim, Act("S2"), Act("S2"), Receive("K", S2K), Initiate("S2", 0))
    sim.drain()
    snapshot = sim.completed[1]
    assert snapshot.kinds["K"] is CheckpointKind.TIMED_OUT_TO_UNALIGNED
    assert sim.procs["K"].acks[1].switch is Switch.TIMEOUT_WHILE_ALIGNING
    assert [m.payload["id"] for m in snapshot.channels[S2K]] == ["S2.0", "S2.1", "S2.2"]
    assert checker.check_snapshot(sim.history, snapshot, sim.behaviours, sim.final_state())


def test_a_barrier_that_reaches_a_task_after_the_timeout_takes_it_unaligned_at_once():
    sim = fan_in(CheckpointOptions.aligned_with_timeout(timeout_ms=3), records=5)
    take(sim, Act("S1"), Initiate("S1", 0), Act("S2"), Act("S2"), Act("S2"), Receive("K", S1K))
    assert sim.handler("K").pending == ()  # K read S1.0, not the barrier yet
    take(sim, Receive("K", S1K))  # the barrier, 5 ms after the trigger: K never blocks
    assert not sim.handler("K").is_blocked(S1K)
    take(sim, Initiate("S2", 0))
    sim.drain()
    snapshot = sim.completed[1]
    ack = sim.procs["K"].acks[1]
    assert ack.switch is Switch.LATE_BARRIER and ack.switched_after_ms == 5
    assert [m.payload["id"] for m in snapshot.channels[S2K]] == ["S2.0", "S2.1", "S2.2"]
    assert checker.check_snapshot(sim.history, snapshot, sim.behaviours, sim.final_state())


def test_at_least_once_duplicates_what_came_after_a_barrier_on_restore():
    sim = fan_in(CheckpointOptions.at_least_once())
    take(
        sim,
        Initiate("S1", 0),
        Receive("K", S1K),
        Act("S1"),
        Receive("K", S1K),  # S1.0 after S1's barrier
        Initiate("S2", 0),
        Receive("K", S2K),
    )
    sim.drain()
    assert sim.completed[1].states["K"]["counts"] == {0: 1}
    sim.apply(Crash("Z"))
    sim.finish()
    counts = ids(sim.committed_output("Z"))
    assert counts["S1.0"] == 2 and set(counts) == {f"S{s}.{i}" for s in (1, 2) for i in range(3)}


def test_runs_are_deterministic_for_a_seed():
    def run(seed):
        sim = Simulator(
            Topology.complete(3), Money(50, 3), seed=seed, plan=[Initiation(CheckpointOptions.unaligned(), ("P2",))]
        )
        return sim.run(RandomScheduler(seed, crash_probability=0.05, max_crashes=1)).history.events

    assert run(4) == run(4)
    assert run(4) != run(5)


def test_multiple_initiators_start_the_same_checkpoint():
    sim = Simulator(Topology.ring(3), Money(10, 0), plan=[Initiation(CheckpointOptions.unaligned(), ("P1", "P3"))])
    take(sim, Initiate("P1", 0), Initiate("P3", 0))
    sim.drain()
    assert list(sim.completed) == [1]
    triggers = [e.process for e in sim.history.events if e.kind is EventKind.TRIGGER]
    assert triggers == ["P1", "P3"]


def test_a_process_reached_by_a_marker_does_not_initiate_again():
    sim = Simulator(Topology.ring(2), Money(10, 0), plan=[Initiation(CheckpointOptions.unaligned(), ("P1", "P2"))])
    take(sim, Initiate("P1", 0), Receive("P2", channel_id("P1", "P2")))
    assert all(not isinstance(s, Initiate) for s in sim.enabled_steps())


def test_concurrent_checkpoints_can_be_in_flight():
    sim = Simulator(
        Topology.ring(3),
        Money(10, 0),
        max_concurrent=2,
        plan=[Initiation(CheckpointOptions.unaligned(), ("P1",)), Initiation(CheckpointOptions.unaligned(), ("P1",))],
    )
    take(sim, Initiate("P1", 0), Initiate("P1", 1))
    assert sorted(sim.coordinator.pending) == [1, 2]
    sim.drain()
    assert sorted(sim.completed) == [1, 2]


def test_a_newer_checkpoint_started_first_subsumes_an_older_one():
    sim = Simulator(
        Topology.ring(3),
        Money(10, 0),
        max_concurrent=2,
        plan=[Initiation(CheckpointOptions.unaligned(), ("P1",)), Initiation(CheckpointOptions.unaligned(), ("P2",))],
    )
    take(sim, Initiate("P1", 0), Initiate("P2", 1))  # P2 starts 2 before barrier 1 reaches it
    sim.drain()
    assert sorted(sim.completed) == [2]
    assert [(p.checkpoint_id, p.failure.name) for p in sim.coordinator.aborted] == [(1, "SUBSUMED")]


def test_explore_enumerates_distinct_interleavings():
    topology = Topology(("S", "Z"), (("S", "Z"),))
    runs = list(
        explore(
            lambda: Simulator(topology, dataflow(topology, records=2), plan=[Initiation(CheckpointOptions.aligned())])
        )
    )
    orders = {tuple((e.process, e.kind) for e in sim.history.events) for sim in runs}
    # S's three steps (two records, one trigger) in any order, Z reading each entry once S wrote it
    assert len(runs) == len(orders) > 3
    assert all(sim.completed for sim in runs)
