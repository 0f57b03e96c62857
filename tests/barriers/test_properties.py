"""Properties over random graphs, interleavings, initiators and modes:
every completed snapshot is a consistent cut whose state lies between start
and end (EWD 864a), money and tokens are conserved in every snapshot,
aligned checkpoints never record channel state, and a run with crashes and
restores commits exactly the output of a run without them (at-least-once:
nothing lost, duplicates possible)."""

from __future__ import annotations

import collections
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from barriers.handler import CheckpointKind
from barriers.messages import CheckpointOptions
from barriers.simulation import checker
from barriers.simulation.simulator import Initiation, Money, RandomScheduler, Simulator, Tokens, Topology, dataflow


@pytest.fixture(autouse=True)
def _quiet_handler_warnings(caplog):
    caplog.set_level(logging.ERROR)


@st.composite
def strongly_connected(draw, max_processes: int = 4) -> Topology:
    """A ring through all processes in a random order, plus random chords."""
    n = draw(st.integers(2, max_processes))
    names = [f"P{i + 1}" for i in range(n)]
    order = draw(st.permutations(names))
    edges = {(order[i], order[(i + 1) % n]) for i in range(n)}
    pairs = st.tuples(st.sampled_from(names), st.sampled_from(names)).filter(lambda e: e[0] != e[1])
    edges |= draw(st.sets(pairs, max_size=n))
    topology = Topology(tuple(names), tuple(sorted(edges)))
    assert topology.is_strongly_connected()
    return topology


@st.composite
def dags(draw) -> Topology:
    """Sources -> layers of keyed counters -> one sink; every record reaches the sink."""
    sources = [f"S{i + 1}" for i in range(draw(st.integers(1, 2)))]
    counters = [f"K{i + 1}" for i in range(draw(st.integers(1, 2)))]
    edges: set[tuple[str, str]] = set()
    for j, counter in enumerate(counters):
        earlier = sources + counters[:j]
        edges |= {(src, counter) for src in draw(st.sets(st.sampled_from(earlier), min_size=1, max_size=2))}
    for source in sources:
        if not any(src == source for src, _ in edges):
            edges.add((source, draw(st.sampled_from(counters))))
    for j, counter in enumerate(counters):
        later = counters[j + 1 :] + ["Z"]
        edges |= {(counter, dst) for dst in draw(st.sets(st.sampled_from(later), min_size=1, max_size=2))}
    if draw(st.booleans()):
        edges.add((sources[0], "Z"))
    topology = Topology(tuple(sources + counters + ["Z"]), tuple(sorted(edges)))
    assert topology.is_acyclic() and topology.sinks == ("Z",)
    return topology


EXACTLY_ONCE = st.sampled_from(
    [
        CheckpointOptions.aligned(),
        CheckpointOptions.unaligned(),
        CheckpointOptions.aligned_with_timeout(timeout_ms=1),
        CheckpointOptions.aligned_with_timeout(timeout_ms=3),
    ]
)
MODES = st.one_of(EXACTLY_ONCE, st.just(CheckpointOptions.at_least_once()))
SEEDS = st.integers(0, 2**32 - 1)


def summary(output) -> tuple:
    """What exactly-once promises, whatever the interleaving: every record
    once, and per key the running counts 1..n."""
    return (
        sorted(collections.Counter(r["id"] for r in output).items()),
        sorted((r["key"], r.get("count", 0)) for r in output),
    )


def assert_snapshots_check_out(sim: Simulator) -> None:
    final = sim.final_state()
    for snapshot in sim.completed.values():
        verdict = checker.check_snapshot(sim.history, snapshot, sim.behaviours, final)
        assert verdict, verdict.explain()


@given(topology=strongly_connected(), seed=SEEDS, data=st.data())
def test_money_snapshots_are_consistent_and_conserve_money(topology, seed, data):
    initiators = tuple(data.draw(st.sets(st.sampled_from(topology.processes), min_size=1, max_size=2)))
    money = Money(balance=data.draw(st.integers(1, 50)), transfers=data.draw(st.integers(0, 4)))
    plan = [Initiation(CheckpointOptions.unaligned(), initiators)] * data.draw(st.integers(1, 3))
    sim = Simulator(topology, money, plan=plan, seed=seed, max_concurrent=data.draw(st.integers(1, 2)))
    sim.run(RandomScheduler(seed))
    assert sim.completed and not sim.enabled_steps()
    assert_snapshots_check_out(sim)
    total = money.total(topology.processes)
    final = sim.final_state()
    assert checker.conservation(final, total)
    for snapshot in sim.completed.values():
        verdict = checker.conservation(snapshot, total)
        assert verdict, verdict.explain()
        # termination is stable: if the snapshot shows it, the end has it
        if checker.termination(snapshot, money):
            assert checker.termination(final, money)


@given(topology=strongly_connected(), seed=SEEDS, data=st.data())
def test_exactly_one_token_in_every_snapshot(topology, seed, data):
    tokens = Tokens(holder=data.draw(st.sampled_from(topology.processes)), hops=data.draw(st.integers(0, 6)))
    initiators = (data.draw(st.sampled_from(topology.processes)),)
    sim = Simulator(topology, tokens, plan=[Initiation(CheckpointOptions.unaligned(), initiators)] * 2, seed=seed)
    sim.run(RandomScheduler(seed))
    assert_snapshots_check_out(sim)
    assert checker.termination(sim.final_state(), tokens)
    for snapshot in sim.completed.values():
        verdict = checker.conservation(snapshot, 1, value=Tokens.value, message_value=Tokens.message_value)
        assert verdict, verdict.explain()


@given(topology=dags(), options=MODES, seed=SEEDS, data=st.data())
def test_dataflow_snapshots_in_every_mode(topology, options, seed, data):
    plan = [Initiation(options)] * data.draw(st.integers(1, 3))
    sim = Simulator(
        topology,
        dataflow(topology, records=data.draw(st.integers(1, 4))),
        plan=plan,
        seed=seed,
        max_concurrent=data.draw(st.integers(1, 2)),
    )
    sim.run(RandomScheduler(seed))
    assert sim.completed
    if options == CheckpointOptions.at_least_once():
        return  # its cuts need not be consistent: see test_at_least_once_*
    assert_snapshots_check_out(sim)
    if options == CheckpointOptions.aligned():
        for snapshot in sim.completed.values():
            assert set(snapshot.kinds.values()) == {CheckpointKind.ALIGNED}
            assert all(not ack.in_flight for ack in snapshot.acks.values())
            assert all(not held for held in snapshot.channels.values())


def crashy_and_clean(topology, options, seed, crashes, checkpoints, records=4):
    plan = [Initiation(options)] * checkpoints
    clean = Simulator(topology, dataflow(topology, records=records), plan=plan, seed=seed)
    clean.run(RandomScheduler(seed))
    assert clean.finish() is not None
    crashy = Simulator(topology, dataflow(topology, records=records), plan=plan, seed=seed)
    crashy.run(RandomScheduler(seed, crash_probability=0.1, max_crashes=crashes))
    assert crashy.finish() is not None
    return clean, crashy


@given(topology=dags(), options=EXACTLY_ONCE, seed=SEEDS, crashes=st.integers(1, 3), checkpoints=st.integers(1, 4))
def test_crashes_and_restores_commit_exactly_the_output_of_a_run_without_them(
    topology, options, seed, crashes, checkpoints
):
    clean, crashy = crashy_and_clean(topology, options, seed, crashes, checkpoints)
    assert summary(crashy.committed_output("Z")) == summary(clean.committed_output("Z"))
    expected = {f"{s}.{i}" for s in topology.sources for i in range(4)}
    assert {r["id"] for r in clean.committed_output("Z")} == expected


@given(topology=dags(), seed=SEEDS, crashes=st.integers(1, 3), checkpoints=st.integers(1, 4))
def test_at_least_once_loses_nothing(topology, seed, crashes, checkpoints):
    clean, crashy = crashy_and_clean(topology, CheckpointOptions.at_least_once(), seed, crashes, checkpoints)
    counts = collections.Counter(r["id"] for r in crashy.committed_output("Z"))
    assert set(counts) == {r["id"] for r in clean.committed_output("Z")}
    assert all(n >= 1 for n in counts.values())


def test_at_least_once_shows_duplicates_and_inconsistent_cuts():
    topology = Topology(("S1", "S2", "K", "Z"), (("S1", "K"), ("S2", "K"), ("K", "Z")))
    with_duplicates = inconsistent = 0
    for seed in range(60):
        clean, crashy = crashy_and_clean(topology, CheckpointOptions.at_least_once(), seed, 2, 3)
        counts = collections.Counter(r["id"] for r in crashy.committed_output("Z"))
        with_duplicates += any(n > 1 for n in counts.values())
        inconsistent += any(not checker.is_consistent_cut(clean.history, s) for s in clean.completed.values())
    assert with_duplicates > 0 and inconsistent > 0
