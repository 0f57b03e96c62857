"""A deterministic simulator of the protocol: processes joined by FIFO
channels, each process driving its own ``BarrierHandler``.

- **Graph**: any directed graph (``Topology``), cycles included.  A channel
  is modelled like a Kafka partition: an append-only log of messages and
  barrier markers with offsets; the receiving process keeps a read position.
- **Processes**: a pluggable ``Behaviour`` says what a process does with a
  message and what it may do on its own (money transfers, token passing, a
  scripted run, a small dataflow of sources, keyed counters and sinks).  Each
  process is the ``Controller`` of its handler: ``snapshot`` keeps a copy of
  its state, ``forward_barrier`` appends a marker to every output log,
  ``block`` / ``release`` make the scheduler skip / read a channel.
- **Snapshots**: a plan of ``Initiation``s; each one is a checkpoint started
  by one or more initiators (the sources of a dataflow, or any processes of
  a cyclic graph, which must then be unaligned: EWD 864a's algorithm).  The
  simulator is its own coordinator (a ``CheckpointCoordinator``); several
  checkpoints may be in flight.
- **Interleavings**: a step is one process reading the head of one unblocked
  input, one spontaneous action, one initiator starting a checkpoint, or a
  crash.  ``RandomScheduler`` picks steps with a seeded ``random.Random``;
  ``explore`` enumerates every interleaving of a small run.
- **History**: every event (send, receive, internal, marker send/receive,
  snapshot, ...) with its process, sequence numbers and message ids, and the
  atomic actions the checker replays.
- **Failures** (docs/architecture/restore.md, "Restore"): a crash restores every process from
  the latest completed checkpoint in a new generation: states reset, each
  channel re-read from its checkpoint position (from the start of its
  in-flight range when the checkpoint recorded one, which replays that range
  first), and what the failed run wrote after the restored barrier is
  skipped.  Sinks are two-phase: their output is visible only once the
  checkpoint that closes it completes (``committed_output``).

Everything is deterministic for a given seed and sequence of steps."""

from __future__ import annotations

import copy
import enum
import random
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

from barriers.coordinator import CheckpointCoordinator, PendingCheckpoint
from barriers.errors import SimulationError
from barriers.failures import CheckpointFailure
from barriers.handler import BarrierHandler, CheckpointKind, TaskCheckpoint
from barriers.messages import Barrier, ChannelId, CheckpointOptions

__all__ = [
    "channel_id",
    "Topology",
    "Behaviour",
    "Money",
    "Tokens",
    "Scripted",
    "Source",
    "KeyedCounter",
    "Sink",
    "dataflow",
    "Message",
    "Marker",
    "EventKind",
    "Event",
    "Action",
    "History",
    "LocalSnapshot",
    "GlobalState",
    "GlobalSnapshot",
    "Initiation",
    "Receive",
    "Act",
    "Initiate",
    "Crash",
    "Step",
    "Simulator",
    "RandomScheduler",
    "explore",
    "SimulationError",
]

Output = list[tuple[ChannelId, Any]]
_TICK_SECONDS = 0.001  # the simulated clock advances one millisecond per step


def channel_id(src: str, dst: str) -> ChannelId:
    """The channel from ``src`` to ``dst`` (the seeds' C_ij)."""
    return ChannelId(f"{src}-{dst}", 0)


# --------------------------------------------------------------------------
# the graph


@dataclass(frozen=True)
class Topology:
    """Processes and the directed FIFO channels between them."""

    processes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "processes", tuple(self.processes))
        object.__setattr__(self, "edges", tuple(tuple(e) for e in self.edges))
        names = set(self.processes)
        if len(names) != len(self.processes):
            raise ValueError(f"process names repeat: {self.processes}")
        for name in self.processes:
            if not name or "-" in name or ":" in name:
                raise ValueError(f"process name {name!r} must be non-empty, without '-' or ':'")
        if len(set(self.edges)) != len(self.edges):
            raise ValueError(f"channels repeat: {self.edges}")
        for src, dst in self.edges:
            if src not in names or dst not in names:
                raise ValueError(f"channel {src}->{dst} joins an unknown process")
            if src == dst:
                raise ValueError(f"channel {src}->{dst} is a self-loop")

    @classmethod
    def ring(cls, n: int, *, both_ways: bool = False) -> Topology:
        names = tuple(f"P{i + 1}" for i in range(n))
        edges = [(names[i], names[(i + 1) % n]) for i in range(n)]
        if both_ways:
            edges += [(b, a) for a, b in edges if (b, a) not in edges]
        return cls(names, tuple(edges))

    @classmethod
    def complete(cls, n: int) -> Topology:
        names = tuple(f"P{i + 1}" for i in range(n))
        return cls(names, tuple((a, b) for a in names for b in names if a != b))

    @property
    def channels(self) -> tuple[ChannelId, ...]:
        return tuple(channel_id(src, dst) for src, dst in self.edges)

    def ends(self, channel: ChannelId) -> tuple[str, str]:
        src, _, dst = channel.topic.partition("-")
        return src, dst

    def inputs(self, process: str) -> tuple[ChannelId, ...]:
        return tuple(channel_id(src, dst) for src, dst in self.edges if dst == process)

    def outputs(self, process: str) -> tuple[ChannelId, ...]:
        return tuple(channel_id(src, dst) for src, dst in self.edges if src == process)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(p for p in self.processes if not self.inputs(p))

    @property
    def sinks(self) -> tuple[str, ...]:
        return tuple(p for p in self.processes if not self.outputs(p))

    def reachable_from(self, process: str) -> set[str]:
        seen, todo = {process}, [process]
        while todo:
            here = todo.pop()
            for src, dst in self.edges:
                if src == here and dst not in seen:
                    seen.add(dst)
                    todo.append(dst)
        return seen

    def is_strongly_connected(self) -> bool:
        return all(self.reachable_from(p) == set(self.processes) for p in self.processes)

    def is_acyclic(self) -> bool:
        return all(p not in self.reachable_from(dst) for p in self.processes for src, dst in self.edges if src == p)


# --------------------------------------------------------------------------
# behaviours


class Behaviour(Protocol):
    """What a process does.  States are plain data (dicts, lists, numbers),
    changed in place; outputs are ``(output channel, payload)`` pairs."""

    def initial_state(self, process: str, inputs: tuple[ChannelId, ...], outputs: tuple[ChannelId, ...]) -> Any:
        """The state of ``process`` before anything happened."""

    def on_message(self, state: Any, channel: ChannelId, payload: Any) -> Output:
        """Accept ``payload`` from ``channel``; return what to send."""

    def can_act(self, state: Any) -> bool:
        """Whether ``spontaneous`` would do something now."""

    def spontaneous(self, state: Any, rng: random.Random) -> Output | None:
        """Act on its own (None: nothing to do; the state is then unchanged)."""


@dataclass(frozen=True)
class Money:
    """Accounts: each process holds a balance and now and then sends a random
    amount of at most its balance to a neighbour; receiving adds it.  The sum
    of balances and money in transit is constant (the money demo, docs/architecture/invariants.md, "Invariants")."""

    balance: int = 100  # initial balance of every process
    transfers: int = 3  # spontaneous transfers each process makes

    def initial_state(self, process, inputs, outputs):
        return {"balance": self.balance, "transfers_left": self.transfers, "outputs": list(outputs)}

    def on_message(self, state, channel, payload):
        state["balance"] += payload
        return []

    def can_act(self, state):
        return state["transfers_left"] > 0 and state["balance"] > 0 and bool(state["outputs"])

    def spontaneous(self, state, rng):
        if not self.can_act(state):
            return None
        amount = rng.randint(1, state["balance"])
        target = rng.choice(state["outputs"])
        state["balance"] -= amount
        state["transfers_left"] -= 1
        return [(target, amount)]

    def total(self, processes: Iterable[str]) -> int:
        return self.balance * len(list(processes))

    @staticmethod
    def value(state: Any) -> int:
        return state["balance"]

    @staticmethod
    def message_value(payload: Any) -> int:
        return payload


@dataclass(frozen=True)
class Tokens:
    """One token passed around: its holder may pass it to a random neighbour
    while it has hops left.  Exactly one token exists, held or in transit;
    once the hops are spent the computation terminates."""

    holder: str
    hops: int = 4

    def initial_state(self, process, inputs, outputs):
        return {"token": self.hops if process == self.holder else None, "outputs": list(outputs)}

    def on_message(self, state, channel, payload):
        state["token"] = payload
        return []

    def can_act(self, state):
        return state["token"] is not None and state["token"] > 0 and bool(state["outputs"])

    def spontaneous(self, state, rng):
        if not self.can_act(state):
            return None
        hops, state["token"] = state["token"], None
        return [(rng.choice(state["outputs"]), hops - 1)]

    @staticmethod
    def value(state: Any) -> int:
        return 0 if state["token"] is None else 1

    @staticmethod
    def message_value(payload: Any) -> int:
        return 1


@dataclass(frozen=True)
class Scripted:
    """A run told event by event, as in seed 001: per process a list of
    ``("internal", label)``, ``("send", label, to_process)`` and
    ``("receive", label)``.  A process acts spontaneously while its next
    event is not a receive; a receive takes the next message, whatever it is.
    The payload of a message is the label of the event that sent it."""

    script: Mapping[str, Sequence[tuple[str, ...]]]

    def initial_state(self, process, inputs, outputs):
        return {"process": process, "events": [], "script": [tuple(e) for e in self.script.get(process, ())]}

    def on_message(self, state, channel, payload):
        if not state["script"] or state["script"][0][0] != "receive":
            raise SimulationError(
                f"{state['process']} got {payload!r} on {channel} but its script does not "
                f"receive next: {state['script'][:1]}"
            )
        _, label = state["script"].pop(0)
        state["events"].append(label)
        return []

    def can_act(self, state):
        return bool(state["script"]) and state["script"][0][0] != "receive"

    def spontaneous(self, state, rng):
        if not self.can_act(state):
            return None
        event = state["script"].pop(0)
        state["events"].append(event[1])
        if event[0] == "send":
            return [(channel_id(state["process"], event[2]), event[1])]
        return []

    @staticmethod
    def label(state: Any) -> str:
        return state["events"][-1] if state["events"] else ""


@dataclass(frozen=True)
class Source:
    """A dataflow source: emits ``records`` numbered records, each with a key,
    routed to one output by key.  Its state (the next record number) is its
    input offset, so a restore re-emits exactly what followed the cut."""

    records: int = 5
    keys: int = 3

    def initial_state(self, process, inputs, outputs):
        return {"process": process, "next": 0, "outputs": list(outputs)}

    def on_message(self, state, channel, payload):
        raise SimulationError(f"source {state['process']} has no inputs")

    def can_act(self, state):
        return state["next"] < self.records and bool(state["outputs"])

    def spontaneous(self, state, rng):
        if not self.can_act(state):
            return None
        number = state["next"]
        state["next"] += 1
        key = number % self.keys
        record = {"id": f"{state['process']}.{number}", "key": key}
        return [(state["outputs"][key % len(state["outputs"])], record)]


@dataclass(frozen=True)
class KeyedCounter:
    """A keyed operator: counts records per key and emits each record with
    its key's running count, routed to one output by key."""

    def initial_state(self, process, inputs, outputs):
        return {"counts": {}, "outputs": list(outputs)}

    def on_message(self, state, channel, payload):
        key = payload["key"]
        state["counts"][key] = state["counts"].get(key, 0) + 1
        if not state["outputs"]:
            return []
        record = {"id": payload["id"], "key": key, "count": state["counts"][key]}
        return [(state["outputs"][key % len(state["outputs"])], record)]

    def can_act(self, state):
        return False

    def spontaneous(self, state, rng):
        return None


@dataclass(frozen=True)
class Sink:
    """An exactly-once sink: appends what it receives; the simulator makes an
    epoch's output visible only when the checkpoint closing it completes."""

    def initial_state(self, process, inputs, outputs):
        return {"output": []}

    def on_message(self, state, channel, payload):
        state["output"].append(payload)
        return []

    def can_act(self, state):
        return False

    def spontaneous(self, state, rng):
        return None


def dataflow(topology: Topology, *, records: int = 5, keys: int = 3) -> dict[str, Behaviour]:
    """Behaviours for an acyclic graph: processes without inputs are sources,
    processes without outputs are sinks, the others keyed counters."""
    if not topology.is_acyclic():
        raise SimulationError("a dataflow needs an acyclic graph")
    behaviours: dict[str, Behaviour] = {}
    for process in topology.processes:
        if not topology.inputs(process):
            behaviours[process] = Source(records, keys)
        elif not topology.outputs(process):
            behaviours[process] = Sink()
        else:
            behaviours[process] = KeyedCounter()
    return behaviours


# --------------------------------------------------------------------------
# what the logs hold and the history records


@dataclass(frozen=True, slots=True)
class Message:
    """An application message: ``id`` is unique in a run."""

    id: int
    channel: ChannelId
    sender: str
    receiver: str
    payload: Any
    generation: int = 0
    offset: int = -1

    def __str__(self) -> str:
        return f"m{self.id} {self.payload!r} on {self.channel.topic}"


@dataclass(frozen=True, slots=True)
class Marker:
    """A barrier in a channel's log (the seeds' marker)."""

    barrier: Barrier
    channel: ChannelId
    sender: str
    offset: int

    @property
    def generation(self) -> int:
        return self.barrier.generation


class EventKind(enum.Enum):
    SEND = "send"
    RECEIVE = "receive"
    INTERNAL = "internal"
    MARKER_SEND = "marker send"
    MARKER_RECEIVE = "marker receive"
    TRIGGER = "trigger"
    SNAPSHOT = "snapshot"
    BLOCK = "block"
    RELEASE = "release"
    ACKNOWLEDGE = "acknowledge"
    ABORT = "abort"
    COMPLETE = "complete"
    SKIP = "skip"
    CRASH = "crash"
    RESTORE = "restore"


@dataclass(frozen=True, slots=True)
class Event:
    """One event: ``seq`` orders all events, ``step`` is the scheduler step it
    belongs to, ``index`` counts this process's events."""

    seq: int
    step: int
    process: str
    index: int
    kind: EventKind
    generation: int
    channel: ChannelId | None = None
    message: int | None = None
    checkpoint_id: int | None = None
    label: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Action:
    """An atomic action of the computation (EWD 864a): a process accepts at
    most one message and sends some.  ``index`` is its place in the
    process's own history; ``rng_seed`` makes spontaneous actions replayable."""

    step: int
    process: str
    index: int
    received: int | None = None
    sent: tuple[int, ...] = ()
    label: str = ""
    rng_seed: int | None = None
    generation: int = 0


@dataclass
class History:
    """What happened: messages by id, atomic actions in order, all events."""

    initial_states: dict[str, Any]
    messages: dict[int, Message] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def actions_of(self, process: str) -> list[Action]:
        return [a for a in self.actions if a.process == process]

    def events_of(self, process: str) -> list[Event]:
        return [e for e in self.events if e.process == process]

    @property
    def generations(self) -> int:
        return 1 + max((a.generation for a in self.actions), default=0)


@dataclass(frozen=True, slots=True)
class LocalSnapshot:
    """One process's recorded state for one checkpoint."""

    process: str
    checkpoint_id: int
    state: Any
    actions: int  # atomic actions of the process before the snapshot
    seq: int  # the event sequence number of the snapshot


@dataclass(frozen=True)
class GlobalState:
    """Process states and, per channel, the messages in it."""

    states: Mapping[str, Any]
    channels: Mapping[ChannelId, tuple[Message, ...]]


@dataclass(frozen=True)
class GlobalSnapshot(GlobalState):
    """A completed checkpoint as a global state, with its cut: for every
    process, how many of its atomic actions lie before it."""

    checkpoint_id: int = 0
    generation: int = 0
    cut: Mapping[str, int] = field(default_factory=dict)
    kinds: Mapping[str, CheckpointKind] = field(default_factory=dict)
    acks: Mapping[str, TaskCheckpoint] = field(default_factory=dict)


# --------------------------------------------------------------------------
# steps and the plan of checkpoints


@dataclass(frozen=True)
class Initiation:
    """A checkpoint to start: by ``initiators`` (default: the sources) with ``options``."""

    options: CheckpointOptions = field(default_factory=CheckpointOptions.aligned)
    initiators: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Receive:
    """``process`` reads the head of ``channel``."""

    process: str
    channel: ChannelId


@dataclass(frozen=True, slots=True)
class Act:
    """``process`` acts spontaneously."""

    process: str


@dataclass(frozen=True, slots=True)
class Initiate:
    """``process`` starts the checkpoint of plan entry ``plan_index``."""

    process: str
    plan_index: int


@dataclass(frozen=True, slots=True)
class Crash:
    """``process`` fails: the job restores from its latest completed checkpoint."""

    process: str


Step = Union[Receive, Act, Initiate, Crash]  # noqa: UP007 - a runtime alias


# --------------------------------------------------------------------------
# one process: the controller of its handler


class _Process:
    def __init__(self, sim: Simulator, name: str, behaviour: Behaviour):
        self.sim = sim
        self.name = name
        self.behaviour = behaviour
        self.inputs = sim.topology.inputs(name)
        self.outputs = sim.topology.outputs(name)
        self.state: Any = None
        self.handler: BarrierHandler  # made by reset(), which the simulator calls as it makes the process
        self.pos: dict[ChannelId, int] = {}
        self.actions = 0
        self.spontaneous = 0
        self.events = 0
        self.snapshots: dict[int, LocalSnapshot] = {}
        self.acks: dict[int, TaskCheckpoint] = {}
        self.initiated: set[int] = set()  # plan indexes this process initiated (or had no part in)

    def reset(self, state: Any, positions: Mapping[ChannelId, int], actions: int, newest_started: int) -> None:
        self.state = state
        self.pos = {c: positions.get(c, 0) for c in self.inputs}
        self.actions = actions
        self.snapshots, self.acks = {}, {}
        self.handler = BarrierHandler(
            self,
            self.inputs,
            positions=self.pos,
            generation=self.sim.generation,
            max_concurrent=self.sim.max_concurrent,
            clock=self.sim.now,
            wall_clock=self.sim.now,
            newest_started=newest_started,
        )

    @property
    def newest_snapshot(self) -> int:
        return max(self.snapshots, default=0)

    # ---- Controller

    def block(self, channel: ChannelId) -> None:
        self.sim._event(self, EventKind.BLOCK, channel=channel)

    def release(self, channel: ChannelId) -> None:
        self.sim._event(self, EventKind.RELEASE, channel=channel)

    def snapshot(self, barrier: Barrier) -> None:
        event = self.sim._event(self, EventKind.SNAPSHOT, checkpoint_id=barrier.checkpoint_id)
        self.snapshots[barrier.checkpoint_id] = LocalSnapshot(
            self.name, barrier.checkpoint_id, copy.deepcopy(self.state), self.actions, event.seq
        )

    def forward_barrier(self, barrier: Barrier) -> None:
        for channel in self.outputs:
            log = self.sim.logs[channel]
            log.append(Marker(barrier, channel, self.name, len(log)))
            self.sim._event(self, EventKind.MARKER_SEND, channel=channel, checkpoint_id=barrier.checkpoint_id)

    def record_in_flight(self, checkpoint_id: int, channel: ChannelId, start: int, end: int) -> None:
        pass  # the ranges arrive with the acknowledgement (TaskCheckpoint.in_flight)

    def acknowledge(self, checkpoint: TaskCheckpoint) -> None:
        self.acks[checkpoint.checkpoint_id] = checkpoint
        self.sim._event(
            self, EventKind.ACKNOWLEDGE, checkpoint_id=checkpoint.checkpoint_id, detail=checkpoint.kind.value
        )
        self.sim._acknowledged(self, checkpoint)

    def abort(self, checkpoint_id: int, reason: CheckpointFailure, detail: str) -> None:
        self.sim._event(self, EventKind.ABORT, checkpoint_id=checkpoint_id, detail=f"{reason.value}: {detail}")
        self.sim.aborts.append((self.name, checkpoint_id, reason))
        self.sim.coordinator.decline(self.name, checkpoint_id, reason, detail)


# --------------------------------------------------------------------------
# the simulator


class Simulator:
    """Processes of ``topology`` with ``behaviours`` (one for all, or one per
    process); ``plan``: the checkpoints to start, in order; ``max_concurrent``:
    checkpoints that may be pending at once (coordinator and handlers);
    ``seed``: makes spontaneous actions reproducible."""

    def __init__(
        self,
        topology: Topology,
        behaviours: Behaviour | Mapping[str, Behaviour],
        *,
        plan: Sequence[Initiation] = (),
        max_concurrent: int = 1,
        seed: int = 0,
    ):
        self.topology = topology
        if isinstance(behaviours, Mapping):
            missing = set(topology.processes) - set(behaviours)
            if missing:
                raise SimulationError(f"no behaviour for {sorted(missing)}")
            self.behaviours = dict(behaviours)
        else:
            self.behaviours = {p: behaviours for p in topology.processes}
        self.seed = seed
        self.max_concurrent = max_concurrent
        self.plan: list[Initiation] = []
        self._plan_ids: dict[int, int] = {}  # plan index -> checkpoint id
        self._dead: set[int] = set()  # plan indexes given up by a restore
        self._barriers: dict[int, Barrier] = {}
        self.generation = 0
        self.steps = 0
        self._now = 0.0
        self._seq = 0
        self.coordinator = CheckpointCoordinator(
            topology.processes, max_concurrent=max_concurrent, timeout_s=1e9, retain=1_000_000, clock=self.now
        )
        self.logs: dict[ChannelId, list[Message | Marker]] = {c: [] for c in topology.channels}
        self.stale: dict[ChannelId, list[tuple[int, int]]] = {c: [] for c in topology.channels}
        self.procs = {p: _Process(self, p, self.behaviours[p]) for p in topology.processes}
        initial = {}
        for name, proc in self.procs.items():
            state = proc.behaviour.initial_state(name, proc.inputs, proc.outputs)
            initial[name] = copy.deepcopy(state)
            proc.reset(state, {}, 0, 0)
        self.history = History(initial)
        self.completed: dict[int, GlobalSnapshot] = {}
        self.aborts: list[tuple[str, int, CheckpointFailure]] = []
        self.crashes = 0
        self._next_message = 1
        for initiation in plan:
            self.add_initiation(initiation)

    # ---- set-up and queries

    def now(self) -> float:
        return self._now

    def add_initiation(self, initiation: Initiation) -> int:
        """Append a checkpoint to the plan; returns its plan index."""
        initiators = initiation.initiators or self.topology.sources
        if not initiators:
            raise SimulationError("every process has inputs: name the initiators of the checkpoint")
        unknown = set(initiators) - set(self.topology.processes)
        if unknown:
            raise SimulationError(f"unknown initiators {sorted(unknown)}")
        self.plan.append(Initiation(initiation.options, tuple(initiators)))
        return len(self.plan) - 1

    @property
    def states(self) -> dict[str, Any]:
        return {name: proc.state for name, proc in self.procs.items()}

    def handler(self, process: str) -> BarrierHandler:
        return self.procs[process].handler

    def checkpoint_id(self, plan_index: int) -> int | None:
        return self._plan_ids.get(plan_index)

    def latest_completed(self) -> GlobalSnapshot | None:
        return self.completed[max(self.completed)] if self.completed else None

    def committed_output(self, sink: str) -> list[Any]:
        """What the two-phase sink ``sink`` has made visible: its output as of
        the latest completed checkpoint."""
        latest = self.latest_completed()
        return list(latest.states[sink]["output"]) if latest else []

    def final_state(self) -> GlobalState:
        """Process states now and, per channel, the messages not yet read."""
        channels = {}
        for channel, log in self.logs.items():
            receiver = self.procs[self.topology.ends(channel)[1]]
            channels[channel] = self._messages(channel, receiver.pos[channel], len(log))
        return GlobalState(copy.deepcopy(self.states), channels)

    def is_quiescent(self) -> bool:
        return not self.enabled_steps()

    # ---- steps

    def enabled_steps(self) -> list[Step]:
        """Every step that may come next, in a fixed order (crashes excluded)."""
        steps: list[Step] = []
        for name, proc in self.procs.items():
            for channel in proc.inputs:
                if proc.pos[channel] < len(self.logs[channel]) and not proc.handler.is_blocked(channel):
                    steps.append(Receive(name, channel))
            if proc.behaviour.can_act(proc.state):
                steps.append(Act(name))
            index = self._next_initiation(proc)
            if index is not None:
                steps.append(Initiate(name, index))
        return steps

    def apply(self, step: Step) -> None:
        """Take ``step`` (which must be enabled, crashes always are)."""
        self.steps += 1
        self._now += _TICK_SECONDS
        if isinstance(step, Receive):
            self._receive(self.procs[step.process], step.channel)
        elif isinstance(step, Act):
            self._act(self.procs[step.process])
        elif isinstance(step, Initiate):
            self._initiate(self.procs[step.process], step.plan_index)
        elif isinstance(step, Crash):
            self._crash(self.procs[step.process])
        else:
            raise SimulationError(f"unknown step {step!r}")
        for proc in self.procs.values():
            held = sum(len(self.logs[c]) - proc.pos[c] for c in proc.handler.blocked)
            proc.handler.tick(held)

    def run(self, scheduler: RandomScheduler | None = None, *, max_steps: int = 10_000) -> Simulator:
        """Take steps chosen by ``scheduler`` (default: seeded by ``seed``)
        until none is enabled or ``max_steps`` were taken."""
        scheduler = scheduler or RandomScheduler(self.seed)
        for _ in range(max_steps):
            step = scheduler.choose(self, self.enabled_steps())
            if step is None:
                break
            self.apply(step)
        return self

    def drain(self, *, max_steps: int = 100_000) -> Simulator:
        """Take the first enabled step until none is left."""
        for _ in range(max_steps):
            steps = self.enabled_steps()
            if not steps:
                return self
            self.apply(steps[0])
        raise SimulationError(f"still not quiescent after {max_steps} steps")

    def finish(
        self, options: CheckpointOptions | None = None, initiators: tuple[str, ...] | None = None
    ) -> GlobalSnapshot | None:
        """Drain, then take one last checkpoint so the sinks commit
        everything; returns it (None when it could not complete)."""
        self.drain()
        for checkpoint_id in sorted(self.coordinator.pending):
            self.coordinator.abort(checkpoint_id, CheckpointFailure.TIMEOUT, "the run ended without it")
        options = options or (self.plan[-1].options if self.plan else CheckpointOptions.aligned())
        index = self.add_initiation(Initiation(options, initiators))
        self.drain()
        last = self._plan_ids.get(index)
        return self.completed.get(last) if last is not None else None

    # ---- the steps themselves

    def _receive(self, proc: _Process, channel: ChannelId) -> None:
        offset = proc.pos[channel]
        entry = self.logs[channel][offset]
        proc.pos[channel] = offset + 1
        if self._is_stale(channel, offset):
            self._event(
                proc,
                EventKind.SKIP,
                channel=channel,
                message=entry.id if isinstance(entry, Message) else None,
                checkpoint_id=entry.barrier.checkpoint_id if isinstance(entry, Marker) else None,
                detail=f"generation {entry.generation} after the restored cut",
            )
            return
        if isinstance(entry, Marker):
            self._event(proc, EventKind.MARKER_RECEIVE, channel=channel, checkpoint_id=entry.barrier.checkpoint_id)
            proc.handler.barrier_received(channel, entry.barrier, offset)
            return
        proc.handler.record_processed(channel, offset)
        outputs = proc.behaviour.on_message(proc.state, channel, entry.payload)
        label = self._label(proc)
        self._event(proc, EventKind.RECEIVE, channel=channel, message=entry.id, label=label)
        sent = self._send(proc, outputs, label)
        self._record_action(
            proc, Action(self.steps, proc.name, proc.actions, entry.id, sent, label, None, self.generation)
        )

    def _act(self, proc: _Process) -> None:
        rng_seed = zlib.crc32(f"{self.seed}/{proc.name}/{self.generation}/{proc.spontaneous}".encode())
        proc.spontaneous += 1
        outputs = proc.behaviour.spontaneous(proc.state, random.Random(rng_seed))
        if outputs is None:
            raise SimulationError(f"{proc.name} could not act")
        label = self._label(proc)
        sent = self._send(proc, outputs, label)
        if not sent:
            self._event(proc, EventKind.INTERNAL, label=label)
        self._record_action(
            proc, Action(self.steps, proc.name, proc.actions, None, sent, label, rng_seed, self.generation)
        )

    def _initiate(self, proc: _Process, index: int) -> None:
        checkpoint_id = self._plan_ids.get(index)
        if checkpoint_id is None:
            # stamped with the trigger time, as the engine's coordinator does (the alignment timeout counts from it)
            barrier = self.coordinator.trigger(self.plan[index].options, timestamp_ms=round(self._now * 1000))
            self._plan_ids[index] = checkpoint_id = barrier.checkpoint_id
            self._barriers[checkpoint_id] = barrier
        proc.initiated.add(index)
        self._event(proc, EventKind.TRIGGER, checkpoint_id=checkpoint_id)
        proc.handler.trigger(self._barriers[checkpoint_id])

    def _next_initiation(self, proc: _Process) -> int | None:
        for index, initiation in enumerate(self.plan):
            if initiation.initiators is None:  # add_initiation names them (the sources by default)
                raise SimulationError(f"checkpoint {index} of the plan has no initiators")
            if index in proc.initiated or index in self._dead or proc.name not in initiation.initiators:
                continue
            checkpoint_id = self._plan_ids.get(index)
            if checkpoint_id is None:
                earlier_untriggered = any(i not in self._plan_ids and i not in self._dead for i in range(index))
                return None if earlier_untriggered or not self.coordinator.can_trigger() else index
            if (
                checkpoint_id not in self.coordinator.pending
                or checkpoint_id <= proc.newest_snapshot
                or checkpoint_id <= max(proc.handler.pending, default=0)
            ):
                proc.initiated.add(index)  # over, or reached this process through a marker first
                continue
            return index
        return None

    def _send(self, proc: _Process, outputs: Output, label: str) -> tuple[int, ...]:
        sent = []
        for channel, payload in outputs:
            if channel not in self.logs or self.topology.ends(channel)[0] != proc.name:
                raise SimulationError(f"{proc.name} sent on {channel}, which is not one of its outputs")
            log = self.logs[channel]
            message = Message(
                self._next_message,
                channel,
                proc.name,
                self.topology.ends(channel)[1],
                payload,
                self.generation,
                len(log),
            )
            self._next_message += 1
            log.append(message)
            self.history.messages[message.id] = message
            self._event(proc, EventKind.SEND, channel=channel, message=message.id, label=label)
            sent.append(message.id)
        return tuple(sent)

    def _record_action(self, proc: _Process, action: Action) -> None:
        proc.actions += 1
        self.history.actions.append(action)

    def _label(self, proc: _Process) -> str:
        label = getattr(proc.behaviour, "label", None)
        return label(proc.state) if callable(label) else ""

    # ---- checkpoints

    def _acknowledged(self, proc: _Process, checkpoint: TaskCheckpoint) -> None:
        result = self.coordinator.acknowledge(proc.name, checkpoint.checkpoint_id, checkpoint)
        if not isinstance(result, PendingCheckpoint):
            return
        done, _ = self.coordinator.complete(checkpoint.checkpoint_id)
        checkpoint_id = done.checkpoint_id
        acks: dict[str, TaskCheckpoint] = dict(done.acks)
        channels: dict[ChannelId, tuple[Message, ...]] = {}
        for channel in self.topology.channels:
            start, end = acks[self.topology.ends(channel)[1]].in_flight.get(channel, (0, 0))
            channels[channel] = self._messages(channel, start, end)
        snaps = {name: self.procs[name].snapshots[checkpoint_id] for name in self.topology.processes}
        self.completed[checkpoint_id] = GlobalSnapshot(
            states={name: s.state for name, s in snaps.items()},
            channels=channels,
            checkpoint_id=checkpoint_id,
            generation=self.generation,
            cut={name: s.actions for name, s in snaps.items()},
            kinds={name: ack.kind for name, ack in acks.items()},
            acks=acks,
        )
        self._event(proc, EventKind.COMPLETE, checkpoint_id=checkpoint_id)

    def _messages(self, channel: ChannelId, start: int, end: int) -> tuple[Message, ...]:
        return tuple(
            entry
            for offset, entry in enumerate(self.logs[channel][start:end], start)
            if isinstance(entry, Message) and not self._is_stale(channel, offset)
        )

    def _is_stale(self, channel: ChannelId, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.stale[channel])

    # ---- failures

    def _crash(self, proc: _Process) -> None:
        self.crashes += 1
        self._event(proc, EventKind.CRASH)
        latest = self.latest_completed()
        if latest is not None:
            self.coordinator.restore(latest.checkpoint_id)
            self.coordinator.release_restore(latest.checkpoint_id)
        else:
            for checkpoint_id in sorted(self.coordinator.pending):
                self.coordinator.abort(checkpoint_id, CheckpointFailure.RESTORED, "restoring the initial state")
            self.coordinator.generation += 1
        self.generation = self.coordinator.generation
        for index in range(len(self.plan)):
            if index in self._plan_ids:
                self._dead.add(index)
        newest = self.coordinator.next_checkpoint_id - 1
        positions: dict[str, dict[ChannelId, int]] = {p: {} for p in self.procs}
        for channel, log in self.logs.items():
            receiver = self.topology.ends(channel)[1]
            if latest is None:
                resume = start = 0
            else:
                ack = latest.acks[receiver]
                resume = ack.positions[channel]  # right after the restored barrier
                start = ack.in_flight.get(channel, (resume, resume))[0]
            if resume < len(log):
                self.stale[channel].append((resume, len(log)))
            positions[receiver][channel] = start
        for name, other in self.procs.items():
            if latest is None:
                state, actions = copy.deepcopy(self.history.initial_states[name]), 0
            else:
                state, actions = copy.deepcopy(latest.states[name]), latest.cut[name]
            other.reset(state, positions[name], actions, newest)
            self._event(
                other,
                EventKind.RESTORE,
                checkpoint_id=latest.checkpoint_id if latest else None,
                detail=f"generation {self.generation}",
            )

    # ---- history

    def _event(self, proc: _Process, kind: EventKind, **fields: Any) -> Event:
        self._seq += 1
        proc.events += 1
        event = Event(self._seq, self.steps, proc.name, proc.events, kind, self.generation, **fields)
        self.history.events.append(event)
        return event


class RandomScheduler:
    """Picks the next step with a seeded ``random.Random``; with
    ``crash_probability`` > 0 it also crashes a random process at some steps,
    at most ``max_crashes`` times."""

    def __init__(self, seed: int = 0, *, crash_probability: float = 0.0, max_crashes: int = 0):
        self.rng = random.Random(seed)
        self.crash_probability = crash_probability
        self.max_crashes = max_crashes
        self.crashes = 0

    def choose(self, sim: Simulator, steps: list[Step]) -> Step | None:
        if not steps:
            return None
        if self.crashes < self.max_crashes and self.rng.random() < self.crash_probability:
            self.crashes += 1
            return Crash(self.rng.choice(sim.topology.processes))
        return self.rng.choice(steps)


def explore(factory: Callable[[], Simulator], *, max_steps: int = 50) -> Iterator[Simulator]:
    """Every interleaving of the run ``factory`` builds (depth first): yields
    each simulator once no step is enabled or ``max_steps`` were taken."""
    stack = [factory()]
    while stack:
        sim = stack.pop()
        steps = sim.enabled_steps()
        if not steps or sim.steps >= max_steps:
            yield sim
            continue
        for step in reversed(steps[1:]):
            child = copy.deepcopy(sim)
            child.apply(step)
            stack.append(child)
        sim.apply(steps[0])
        stack.append(sim)
