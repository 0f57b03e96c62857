"""Checks of a recorded snapshot against the history of the run: the part
of the protocol that says what a snapshot *means*.

- ``is_consistent_cut``: every message received before the cut was sent
  before it, and each channel's recorded state is exactly the messages sent
  before the cut and not received before it.
- ``check_reachability`` (EWD 864a): the computation reordered as all white
  actions (before the cut) in their original order, then all red ones, is
  replayed from the initial state; it must be a valid computation, pass
  through the snapshot state and end in the final state.  So the snapshot
  state is reachable from the start, and the end is reachable from it.
- Stable predicates evaluated on any global state: ``termination`` (all
  processes passive, all channels empty) and ``conservation`` (process
  values plus values in transit add up to the total).

Every check returns a ``Verdict`` that names each violation (which message,
which process, which channel), not just a boolean.  The checks work on a
history without restores (one generation)."""

from __future__ import annotations

import collections
import copy
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from barriers.messages import ChannelId
from barriers.simulation.simulator import Action, Behaviour, GlobalSnapshot, GlobalState, History, Message

__all__ = [
    "Violation",
    "Verdict",
    "is_consistent_cut",
    "check_reachability",
    "check_snapshot",
    "termination",
    "conservation",
]


@dataclass(frozen=True, slots=True)
class Violation:
    """One thing a check found wrong; ``rule`` names the rule broken."""

    rule: str
    text: str
    process: str | None = None
    channel: ChannelId | None = None
    message: int | None = None

    def __str__(self) -> str:
        return f"[{self.rule}] {self.text}"


@dataclass(frozen=True)
class Verdict:
    """The result of one check: true when nothing was violated."""

    check: str
    violations: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations

    def __bool__(self) -> bool:
        return self.ok

    def rules(self) -> set[str]:
        return {v.rule for v in self.violations}

    def explain(self) -> str:
        head = f"{self.check}: {'holds' if self.ok else f'{len(self.violations)} violation(s)'}"
        return "\n".join([head, *(f"  - {v}" for v in self.violations), *(f"  . {n}" for n in self.notes)])

    def __add__(self, other: Verdict) -> Verdict:
        return Verdict(f"{self.check} + {other.check}", self.violations + other.violations, self.notes + other.notes)


def _require_one_generation(history: History) -> None:
    if history.generations > 1:
        raise ValueError(
            f"the history spans {history.generations} generations (restores); "
            f"check the snapshots of a run without failures"
        )


def _describe(history: History, action: Action) -> str:
    label = f" ({action.label})" if action.label else ""
    return f"{action.process}'s action {action.index + 1}{label}"


def _message(history: History, message_id: int) -> str:
    message = history.messages.get(message_id)
    return (
        f"message {message_id}"
        if message is None
        else (f"message {message.id} ({message.payload!r}, {message.sender} -> {message.receiver})")
    )


def _is_white(action: Action, cut: Mapping[str, int]) -> bool:
    return action.index < cut.get(action.process, 0)


def is_consistent_cut(history: History, snapshot: GlobalSnapshot) -> Verdict:
    """Whether ``snapshot``'s cut is consistent and its channel states are
    the messages in transit across it."""
    _require_one_generation(history)
    violations: list[Violation] = []
    counts = collections.Counter(a.process for a in history.actions)
    for process, taken in sorted(snapshot.cut.items()):
        if taken > counts[process]:
            violations.append(
                Violation(
                    "cut-beyond-history",
                    f"the cut puts {taken} actions of {process} before it, but {process} took only {counts[process]}",
                    process,
                )
            )
    sender = {m: a for a in history.actions for m in a.sent}
    white_received: set[int] = set()
    for action in history.actions:
        if action.received is None or not _is_white(action, snapshot.cut):
            continue
        white_received.add(action.received)
        sent_by = sender.get(action.received)
        if sent_by is None:
            violations.append(
                Violation(
                    "receive-without-send",
                    f"{_describe(history, action)} receives {_message(history, action.received)}, "
                    f"which no action sends",
                    action.process,
                    message=action.received,
                )
            )
        elif not _is_white(sent_by, snapshot.cut):
            violations.append(
                Violation(
                    "received-before-sent",
                    f"{_describe(history, action)} is before the cut and receives {_message(history, action.received)}, "
                    f"but {_describe(history, sent_by)} sends it after the cut "
                    f"(a red message accepted in a white action)",
                    action.process,
                    history.messages[action.received].channel,
                    action.received,
                )
            )
    in_transit: dict[ChannelId, list[Message]] = collections.defaultdict(list)
    for action in history.actions:
        if _is_white(action, snapshot.cut):
            for message_id in action.sent:
                if message_id not in white_received:
                    message = history.messages[message_id]
                    in_transit[message.channel].append(message)
    for channel in sorted(set(in_transit) | set(snapshot.channels)):
        expected = [m.id for m in sorted(in_transit.get(channel, ()), key=lambda m: (m.offset, m.id))]
        recorded = [m.id for m in snapshot.channels.get(channel, ())]
        if expected == recorded:
            continue
        missing = [m for m in expected if m not in recorded]
        extra = [m for m in recorded if m not in expected]
        parts = []
        if missing:
            parts.append(
                "misses "
                + ", ".join(_message(history, m) for m in missing)
                + " (sent before the cut, received after it)"
            )
        if extra:
            parts.append("holds " + ", ".join(_message(history, m) for m in extra) + " (not in transit across the cut)")
        if not parts:
            parts.append(f"has them in the order {recorded}, sent in the order {expected}")
        violations.append(
            Violation(
                "channel-state",
                f"channel {channel.topic} " + "; ".join(parts),
                channel=channel,
                message=next(iter(missing or extra), None),
            )
        )
    notes = (
        f"{sum(1 for a in history.actions if _is_white(a, snapshot.cut))} of {len(history.actions)} "
        f"actions before the cut",
    )
    return Verdict("consistent cut", tuple(violations), notes)


class _Replay:
    """Replays actions from a global state, checking each is enabled."""

    def __init__(self, history: History, behaviours: Mapping[str, Behaviour]):
        self.history = history
        self.behaviours = behaviours
        self.states = copy.deepcopy(history.initial_states)
        self.channels: dict[ChannelId, collections.deque[int]] = collections.defaultdict(collections.deque)
        self.violations: list[Violation] = []

    def apply(self, action: Action, colour: str) -> None:
        state = self.states[action.process]
        behaviour = self.behaviours[action.process]
        if action.received is not None:
            message = self.history.messages[action.received]
            queue = self.channels[message.channel]
            if not queue or queue[0] != message.id:
                where = (
                    "it is not in the channel yet"
                    if message.id not in queue
                    else f"{_message(self.history, queue[0])} is ahead of it (FIFO)"
                )
                self.violations.append(
                    Violation(
                        "not-enabled",
                        f"in the reordered computation {colour} {_describe(self.history, action)} "
                        f"cannot receive {_message(self.history, message.id)} on {message.channel.topic}: {where}",
                        action.process,
                        message.channel,
                        message.id,
                    )
                )
                if message.id in queue:
                    queue.remove(message.id)
            else:
                queue.popleft()
            outputs = behaviour.on_message(state, message.channel, message.payload)
        else:
            rng = random.Random(action.rng_seed)
            outputs = behaviour.spontaneous(state, rng) or []
        recorded = [(self.history.messages[m].channel, self.history.messages[m].payload) for m in action.sent]
        if list(outputs) != recorded:
            self.violations.append(
                Violation(
                    "replay-diverged",
                    f"replaying {_describe(self.history, action)} sends {list(outputs)!r}, "
                    f"the run recorded {recorded!r}",
                    action.process,
                )
            )
        for message_id in action.sent:
            self.channels[self.history.messages[message_id].channel].append(message_id)

    def compare(self, target: GlobalState, name: str) -> None:
        for process in sorted(target.states):
            if self.states.get(process) != target.states[process]:
                self.violations.append(
                    Violation(
                        "state-mismatch",
                        f"{name}: {process} is {self.states.get(process)!r} in the reordered "
                        f"computation, {target.states[process]!r} in the {name}",
                        process,
                    )
                )
        for channel in sorted(set(target.channels) | set(self.channels)):
            here = list(self.channels.get(channel, ()))
            there = [m.id for m in target.channels.get(channel, ())]
            if here != there:
                self.violations.append(
                    Violation(
                        "channel-mismatch",
                        f"{name}: channel {channel.topic} holds messages {here} in the reordered "
                        f"computation, {there} in the {name}",
                        channel=channel,
                    )
                )


def check_reachability(
    history: History,
    snapshot: GlobalSnapshot,
    behaviours: Behaviour | Mapping[str, Behaviour],
    final: GlobalState | None = None,
) -> Verdict:
    """EWD 864a's argument, executed: replay all white actions, then all red
    ones, in their original orders, from the initial state.  Every action
    must be enabled, the state between the two halves must be the snapshot
    state, and (when ``final`` is given) the end must be ``final``."""
    _require_one_generation(history)
    if not isinstance(behaviours, Mapping):
        behaviours = {p: behaviours for p in history.initial_states}
    replay = _Replay(history, behaviours)
    white = [a for a in history.actions if _is_white(a, snapshot.cut)]
    red = [a for a in history.actions if not _is_white(a, snapshot.cut)]
    for action in white:
        replay.apply(action, "white")
    replay.compare(snapshot, "snapshot state")
    for action in red:
        replay.apply(action, "red")
    if final is not None:
        replay.compare(final, "final state")
    notes = (f"replayed {len(white)} white then {len(red)} red actions",)
    return Verdict("reachability (EWD 864a)", tuple(replay.violations), notes)


def check_snapshot(
    history: History,
    snapshot: GlobalSnapshot,
    behaviours: Behaviour | Mapping[str, Behaviour],
    final: GlobalState | None = None,
) -> Verdict:
    """Both checks: a consistent cut whose state lies between start and end."""
    return is_consistent_cut(history, snapshot) + check_reachability(history, snapshot, behaviours, final)


def termination(state: GlobalState, behaviours: Behaviour | Mapping[str, Behaviour]) -> Verdict:
    """The stable predicate "terminated": every process passive (it cannot
    act on its own) and every channel empty."""
    if not isinstance(behaviours, Mapping):
        behaviours = {p: behaviours for p in state.states}
    violations = [
        Violation("active", f"{p} can still act: {s!r}", p)
        for p, s in sorted(state.states.items())
        if behaviours[p].can_act(s)
    ]
    violations += [
        Violation("in-transit", f"channel {c.topic} holds {', '.join(map(str, ms))}", channel=c, message=ms[0].id)
        for c, ms in sorted(state.channels.items())
        if ms
    ]
    return Verdict("termination", tuple(violations))


def conservation(
    state: GlobalState,
    total: int,
    *,
    value: Callable[[Any], int] = lambda s: s["balance"],
    message_value: Callable[[Any], int] = lambda p: p,
) -> Verdict:
    """The invariant "nothing created or lost": the values held by the
    processes plus the values of messages in the channels add up to ``total``."""
    held = {p: value(s) for p, s in sorted(state.states.items())}
    moving = {c: sum(message_value(m.payload) for m in ms) for c, ms in sorted(state.channels.items()) if ms}
    found = sum(held.values()) + sum(moving.values())
    notes = (f"held: {held}", f"in transit: {{{', '.join(f'{c.topic}: {v}' for c, v in moving.items())}}}")
    if found == total:
        return Verdict("conservation", (), notes)
    text = (
        f"processes hold {sum(held.values())} and channels carry {sum(moving.values())}: {found}, not the total {total}"
    )
    return Verdict("conservation", (Violation("not-conserved", text),), notes)
