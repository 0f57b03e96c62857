"""The simulator as a teaching aid: runs an example and tells it in words,
step by step, the way the seeds tell their worked example, then prints the
snapshot and what the checker says of it.  ``spark-abs simulate`` runs this."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from barriers.errors import SimulationError
from barriers.handler import CheckpointKind
from barriers.messages import ChannelId, CheckpointOptions
from barriers.simulation import checker
from barriers.simulation.simulator import (
    Act,
    Event,
    EventKind,
    GlobalSnapshot,
    Initiate,
    Initiation,
    KeyedCounter,
    Money,
    RandomScheduler,
    Receive,
    Scripted,
    Simulator,
    Sink,
    Source,
    Tokens,
    Topology,
    channel_id,
    dataflow,
)

__all__ = [
    "main",
    "add_arguments",
    "problem",
    "tell",
    "DESCRIPTION",
    "EPILOG",
    "seed_001",
    "SEED_001_SCRIPT",
    "SEED_001_STEPS",
]

# Seed 001's run: P1 has events A-D, P2 F-H, P3 I.  A is a send to P2
# (received at F), H a send to P1 (received at D); B, C, G and I are internal.
SEED_001_SCRIPT: dict[str, list[tuple[str, ...]]] = {
    "P1": [("send", "A", "P2"), ("internal", "B"), ("internal", "C"), ("receive", "D")],
    "P2": [("receive", "F"), ("internal", "G"), ("send", "H", "P1")],
    "P3": [("internal", "I")],
}

_C = channel_id
# The interleaving the seed describes: P1 initiates right after B; its marker
# reaches P3 quickly; P3's markers reach P1, then P2 (after H); P1's marker
# on C12 arrives late; D receives H's message before P2's marker on C21.
SEED_001_STEPS = (
    Act("P3"),  # I
    Act("P1"),  # A: sends to P2 on C12
    Act("P1"),  # B
    Initiate("P1", 0),  # P1 records {A, B}, markers on C12 and C13
    Receive("P2", _C("P1", "P2")),  # F: receives A's message
    Receive("P3", _C("P1", "P3")),  # P3's first marker: records {I}, markers on C31, C32
    Receive("P1", _C("P3", "P1")),  # C31 recorded empty
    Act("P2"),  # G
    Act("P2"),  # H: sends to P1 on C21
    Receive("P2", _C("P3", "P2")),  # P2's first marker: records {F, G, H}
    Act("P1"),  # C
    Receive("P2", _C("P1", "P2")),  # P1's marker, at last: C12 recorded empty
    Receive("P1", _C("P2", "P1")),  # D: receives H's message, recorded on C21
    Receive("P1", _C("P2", "P1")),  # P2's marker: C21 recorded as [H's message]
    Receive("P3", _C("P2", "P3")),  # C23 recorded empty: done
)

_MODES = {
    "aligned": CheckpointOptions.aligned,
    "unaligned": CheckpointOptions.unaligned,
    "aligned-timeout": lambda: CheckpointOptions.aligned_with_timeout(timeout_ms=3),
    "at-least-once": CheckpointOptions.at_least_once,
}

_EPILOG = """\
examples:
  spark-abs simulate                          seed 001's worked example, step by step
  spark-abs simulate --example money --seed 7 --processes 4
                                              money moving between 4 accounts; the
                                              snapshot must account for every unit
  spark-abs simulate --example dataflow --mode aligned-timeout
                                              sources -> keyed counters -> sink, with
                                              checkpoints that give up aligning after 3 ms

seed-001 and money run on graphs with cycles, where the initiator must take
an unaligned snapshot (Chandy-Lamport as in EWD 864a); the dataflow example
accepts every mode.  One simulated millisecond passes per step.
"""


def seed_001() -> Simulator:
    """Seed 001's worked example, run to its end."""
    sim = Simulator(
        Topology.complete(3), Scripted(SEED_001_SCRIPT), plan=[Initiation(CheckpointOptions.unaligned(), ("P1",))]
    )
    for step in SEED_001_STEPS:
        sim.apply(step)
    return sim


def _money(processes: int, seed: int) -> tuple[Simulator, Money]:
    money = Money(balance=100, transfers=3)
    sim = Simulator(
        Topology.complete(processes), money, seed=seed, plan=[Initiation(CheckpointOptions.unaligned(), ("P1",))]
    )
    sim.run(RandomScheduler(seed))
    return sim, money


def _dataflow_topology(processes: int) -> Topology:
    sources = ["S1", "S2"] if processes >= 4 else ["S1"]
    counters = [f"K{i + 1}" for i in range(processes - len(sources) - 1)]
    edges = [(s, counters[0]) for s in sources]
    edges += list(zip(counters, counters[1:]))
    edges.append((counters[-1], "Z"))
    return Topology(tuple(sources + counters + ["Z"]), tuple(edges))


def _dataflow(processes: int, seed: int, options: CheckpointOptions) -> Simulator:
    topology = _dataflow_topology(processes)
    sim = Simulator(
        topology, dataflow(topology, records=4, keys=2), seed=seed, plan=[Initiation(options), Initiation(options)]
    )
    sim.run(RandomScheduler(seed))
    sim.finish()
    return sim


class _Teller:
    """Turns a simulator's history into sentences."""

    def __init__(self, sim: Simulator, out: TextIO):
        self.sim = sim
        self.out = out
        self.recording: dict[tuple[str, int], dict[ChannelId, list[str]]] = {}

    def channel(self, channel: ChannelId | None) -> str:
        if channel is None:
            raise SimulationError("an event on a channel that does not name it")
        src, dst = self.sim.topology.ends(channel)
        if src[1:].isdigit() and dst[1:].isdigit() and src[0] == dst[0] == "P" and len(src + dst) == 4:
            return f"C{src[1:]}{dst[1:]}"
        return f"{src}->{dst}"

    def message(self, message_id: int | None) -> str:
        if message_id is None:
            return "a message"
        message = self.sim.history.messages[message_id]
        behaviour = self.sim.behaviours[message.sender]
        if isinstance(behaviour, Scripted):
            return f"the message sent at {message.payload}"
        if isinstance(behaviour, Money):
            return f"a transfer of {message.payload}"
        if isinstance(behaviour, Tokens):
            return f"the token ({message.payload} hops left)"
        if isinstance(message.payload, dict) and "id" in message.payload:
            return f"record {message.payload['id']}"
        return repr(message.payload)

    def state(self, process: str, state: Any) -> str:
        behaviour = self.sim.behaviours[process]
        if isinstance(behaviour, Scripted):
            return "{" + ", ".join(state["events"]) + "}"
        if isinstance(behaviour, Money):
            return f"balance {state['balance']}"
        if isinstance(behaviour, Tokens):
            return "holds the token" if state["token"] is not None else "no token"
        if isinstance(behaviour, Source):
            return f"next record {state['next']}"
        if isinstance(behaviour, KeyedCounter):
            return "counts " + (", ".join(f"key {k}: {n}" for k, n in sorted(state["counts"].items())) or "none")
        if isinstance(behaviour, Sink):
            return f"{len(state['output'])} records"
        return repr(state)

    def tell(self) -> None:
        by_step: dict[int, list[Event]] = {}
        for event in self.sim.history.events:
            by_step.setdefault(event.step, []).append(event)
        for step in sorted(by_step):
            for sentence in self._step(by_step[step]):
                self.out.write(f"{step:3d}. {sentence}\n")

    def _step(self, events: list[Event]) -> list[str]:
        sentences: list[str] = []
        i = 0
        while i < len(events):
            event = events[i]
            who = event.process
            if event.kind is EventKind.MARKER_SEND:
                group = [event]
                while (
                    i + 1 < len(events) and events[i + 1].kind is EventKind.MARKER_SEND and events[i + 1].process == who
                ):
                    i += 1
                    group.append(events[i])
                sentences.append(
                    f"{who} sends markers of checkpoint {event.checkpoint_id} on "
                    f"{', '.join(self.channel(e.channel) for e in group)}, before anything else."
                )
            else:
                sentence = self._event(event, events)
                if sentence:
                    sentences.append(sentence)
            i += 1
        return sentences

    def _event(self, event: Event, step: list[Event]) -> str | None:
        who, kind, cid = event.process, event.kind, event.checkpoint_id
        label = f"event {event.label}: " if event.label else ""
        if kind is EventKind.INTERNAL:
            return f"{who}: {label}an internal event." if label else f"{who}: an internal action."
        if kind is EventKind.SEND:
            what = "a message" if isinstance(self.sim.behaviours[who], Scripted) else self.message(event.message)
            return f"{who}: {label}sends {what} on {self.channel(event.channel)}."
        if kind is EventKind.RECEIVE:
            notes = []
            for (process, checkpoint), channels in self.recording.items():
                if process == who and event.channel in channels:
                    channels[event.channel].append(self.message(event.message))
                    notes.append(
                        f" (recorded as in transit on {self.channel(event.channel)} for checkpoint {checkpoint})"
                    )
            return f"{who}: {label}receives {self.message(event.message)} on {self.channel(event.channel)}." + "".join(
                notes
            )
        if kind is EventKind.TRIGGER:
            return f"{who} initiates checkpoint {cid}."
        if kind is EventKind.SNAPSHOT:
            cid = _checkpoint_of(event)
            state = self.sim.procs[who].snapshots.get(cid)
            marker = next((e for e in step if e.kind is EventKind.MARKER_RECEIVE and e.process == who), None)
            inputs = [c for c in self.sim.topology.inputs(who) if marker is None or c != marker.channel]
            if self._unaligned(who, cid):
                self.recording[(who, cid)] = {c: [] for c in inputs}
            recorded = self.state(who, state.state) if state else "its state"
            text = f"{who} records its own state: {recorded}"
            if marker is not None and self._unaligned(who, cid):
                text += f"; marks {self.channel(marker.channel)} empty"
            if inputs and self._unaligned(who, cid):
                text += f"; starts recording {', '.join(self.channel(c) for c in inputs)}"
            return text + "."
        if kind is EventKind.MARKER_RECEIVE:
            cid = _checkpoint_of(event)
            first = any(
                e.kind is EventKind.SNAPSHOT and e.process == who and e.checkpoint_id == cid and e.seq > event.seq
                for e in step
            )
            text = f"{who} receives the marker of checkpoint {cid} on {self.channel(event.channel)}"
            channels = self.recording.get((who, cid), {})
            if first:
                return text + " - its first one."
            if event.channel in channels:
                held = channels.pop(event.channel)
                return (
                    text
                    + f" and stops recording it: {self.channel(event.channel)} = "
                    + (f"[{', '.join(held)}]." if held else "empty.")
                )
            return text + "."
        if kind is EventKind.BLOCK:
            return f"{who} holds back {self.channel(event.channel)} until the marker has come on every input."
        if kind is EventKind.RELEASE:
            return f"{who} reads {self.channel(event.channel)} again."
        if kind is EventKind.ACKNOWLEDGE:
            return f"{who} is done with checkpoint {cid} ({event.detail})."
        if kind is EventKind.COMPLETE:
            return f"Checkpoint {cid} is complete: every process recorded its state and its input channels."
        if kind is EventKind.ABORT:
            return f"{who} gives up checkpoint {cid}: {event.detail}."
        if kind is EventKind.CRASH:
            return f"{who} crashes."
        if kind is EventKind.RESTORE:
            return (
                f"{who} restores checkpoint {cid} ({event.detail})."
                if cid
                else f"{who} restarts from its initial state ({event.detail})."
            )
        if kind is EventKind.SKIP:
            return f"{who} skips an entry of {self.channel(event.channel)} ({event.detail})."
        return None

    def _unaligned(self, process: str, checkpoint_id: int | None) -> bool:
        snapshot = self.sim.completed.get(checkpoint_id) if checkpoint_id is not None else None
        if snapshot is not None and process in snapshot.kinds:
            return snapshot.kinds[process] not in (CheckpointKind.ALIGNED, CheckpointKind.AT_LEAST_ONCE)
        return True

    def snapshot(self, snapshot: GlobalSnapshot) -> None:
        self.out.write(f"\nSnapshot {snapshot.checkpoint_id}:\n")
        for process in self.sim.topology.processes:
            self.out.write(f"  {process} = {self.state(process, snapshot.states[process])}\n")
        empty = []
        for channel in sorted(self.sim.topology.channels, key=self.channel):
            held = snapshot.channels.get(channel, ())
            if held:
                self.out.write(f"  {self.channel(channel)} = [{', '.join(self.message(m.id) for m in held)}]\n")
            else:
                empty.append(self.channel(channel))
        if empty:
            self.out.write(f"  {', '.join(empty)}: empty\n")


def _checkpoint_of(event: Event) -> int:
    if event.checkpoint_id is None:
        raise SimulationError(f"a {event.kind.value} event that does not name its checkpoint")
    return event.checkpoint_id


# what ``spark-abs simulate --help`` says before and after its options
DESCRIPTION = (
    "Run a simulated snapshot (Chandy-Lamport / asynchronous barrier snapshots) and tell it "
    "in words: every event, every marker, what each process records, the resulting "
    "snapshot and whether it is a consistent cut."
)
EPILOG = _EPILOG


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a simulated run (``spark-abs simulate``), on ``parser``."""
    parser.add_argument(
        "--example",
        choices=("seed-001", "money", "dataflow"),
        default="seed-001",
        help="which run to tell (default: seed-001, the worked example of the seeds)",
    )
    parser.add_argument(
        "--seed", type=int, default=1, metavar="N", help="seed of the random interleaving (money, dataflow; default: 1)"
    )
    parser.add_argument(
        "--mode",
        choices=tuple(_MODES),
        default=None,
        help="alignment mode of the checkpoints (default: unaligned for seed-001 and money, aligned for dataflow)",
    )
    parser.add_argument(
        "--processes",
        type=_positive,
        default=None,
        metavar="N",
        help="number of processes (money: 2-9, default 3; dataflow: 3-9, default 4; seed-001 always has 3)",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Tell a simulated run (``python -m barriers.simulation.narrate``); returns
    0 when every snapshot checks out."""
    parser = argparse.ArgumentParser(
        prog="spark-abs simulate",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `spark-abs simulate -- --example money` hands the separator on
        argv = argv[1:]
    args = parser.parse_args(argv)
    wrong = problem(args)
    if wrong:
        parser.error(wrong)
    return tell(args, out or sys.stdout)


def problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the options ``args`` of a simulated run (None: nothing)."""
    mode = args.mode or ("aligned" if args.example == "dataflow" else "unaligned")
    if args.example != "dataflow" and mode != "unaligned":
        return (
            f"--mode {mode}: the {args.example} example runs on a graph with cycles, where an "
            f"initiator must take an unaligned snapshot; use --example dataflow for {mode}"
        )
    if args.example == "seed-001" and args.processes not in (None, 3):
        return "--processes: the seed-001 example has exactly 3 processes"
    if args.example == "money" and not 2 <= (args.processes or 3) <= 9:
        return "--processes: the money example takes 2 to 9 processes"
    if args.example == "dataflow" and not 3 <= (args.processes or 4) <= 9:
        return "--processes: the dataflow example takes 3 to 9 processes"
    return None


def tell(args: argparse.Namespace, out: TextIO) -> int:
    """Tell the simulated run ``args`` name (checked by ``problem``) on ``out``;
    0 when every snapshot checks out."""
    mode = args.mode or ("aligned" if args.example == "dataflow" else "unaligned")

    money = None
    if args.example == "seed-001":
        out.write("Seed 001: P1 initiates a snapshot right after event B.\n\n")
        sim = seed_001()
    elif args.example == "money":
        sim, money = _money(args.processes or 3, args.seed)
        out.write(
            f"Money: {len(sim.topology.processes)} accounts of 100 send each other transfers; "
            f"P1 initiates a snapshot (seed {args.seed}).\n\n"
        )
    else:
        sim = _dataflow(args.processes or 4, args.seed, _MODES[mode]())
        out.write(
            f"Dataflow {', '.join(f'{a}->{b}' for a, b in sim.topology.edges)}: the sources trigger "
            f"{mode} checkpoints (seed {args.seed}).\n\n"
        )
    teller = _Teller(sim, out)
    teller.tell()
    if not sim.completed:
        out.write("\nNo checkpoint completed.\n")
        return 1
    final = sim.final_state()
    status = 0
    for snapshot in sim.completed.values():
        teller.snapshot(snapshot)
        verdict = checker.is_consistent_cut(sim.history, snapshot)
        if snapshot.generation == 0 and sim.crashes == 0:
            verdict = verdict + checker.check_reachability(sim.history, snapshot, sim.behaviours, final)
        if money is not None:
            verdict = verdict + checker.conservation(snapshot, money.total(sim.topology.processes))
        out.write("\n" + verdict.explain() + "\n")
        if not verdict.ok and mode != "at-least-once":
            status = 1
    if args.example == "dataflow":
        committed = sim.committed_output(sim.topology.sinks[0])
        out.write(f"\nThe sink committed {len(committed)} records: {', '.join(r['id'] for r in committed)}.\n")
    return status
