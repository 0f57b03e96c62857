"""Worker groups that run anywhere: who runs which group in which
generation, and who has gone quiet, decided on the job's control topic alone
(with the object store, that is all a remote worker shares with the runner).

The runner publishes a **lease** every ``LEASE_INTERVAL_S``: the generation
and the checkpoint it starts from, the pipeline, the job's settings and scale,
the tasks of each remote group, and which worker (its *incarnation*) is the
member running each group in this generation.  A remote worker (``spark-abs
worker``) publishes a **heartbeat** every ``HEARTBEAT_INTERVAL_S`` from a
thread of its own, running or idle.

- A heartbeat of a group with no member in the current generation makes its
  sender the member: the next lease names it and it starts the group's tasks
  from the generation's checkpoint.  A group runs at most once per
  generation: a second worker of a group that has a member waits as its
  standby.
- A member not heard for ``timeout_s`` is taken for dead: the job restores
  (a new generation, without it; its standby, if any, becomes the member).
  A member that the new generation's lease still names restores in place.
- A worker that hears no lease for ``timeout_s`` stops its tasks: no task
  works on with nobody coordinating it.  It stays up, and joins the next
  runner's generation.

Silence only counts while the topic itself works: each side reads back what
it published itself (``Liveness``).  A broker outage silences everyone,
this side included, and restores nobody.

Everything here is pure logic on a clock; the runner and ``RemoteWorker``
wire it to Kafka."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streaming.adapters.control import ControlEvent, ControlKind

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "LEASE_INTERVAL_S",
    "Lease",
    "Liveness",
    "Membership",
    "RemoteGroups",
    "Heartbeat",
]

# how often the runner renews its lease, and a remote worker says it is alive
LEASE_INTERVAL_S = 1.0
HEARTBEAT_INTERVAL_S = 1.0
# own events further apart than this: the topic (or this process) stalled, and silence before does not count
TOPIC_GAP_S = 3.0


class Liveness:
    """Which peers have gone quiet: a peer is silent when nothing of it was
    read for ``timeout_s`` while this side kept reading back its own events
    (``own``).  When its own events stop arriving for more than ``gap_s`` (a
    broker outage, a stalled process), every peer's silence starts over."""

    def __init__(self, timeout_s: float, *, gap_s: float = TOPIC_GAP_S, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self.gap_s = gap_s
        self.clock = clock
        self._heard: dict[str, float] = {}
        self._own: float | None = None

    def watch(self, peer: str) -> None:
        """Start (or restart) ``peer``'s clock."""
        self._heard[peer] = self.clock()

    def forget(self, peer: str) -> None:
        self._heard.pop(peer, None)

    def heard(self, peer: str) -> None:
        if peer in self._heard:
            self._heard[peer] = self.clock()

    def own(self) -> None:
        """One of this side's own events was read back: the topic works."""
        now = self.clock()
        if self._own is None or now - self._own > self.gap_s:
            for peer in self._heard:
                self._heard[peer] = max(self._heard[peer], now)
        self._own = now

    def quiet_for(self, peer: str) -> float:
        return self.clock() - self._heard[peer]

    def silent(self) -> list[str]:
        """Peers silent for more than the timeout while the topic works."""
        now = self.clock()
        if self._own is None or now - self._own > self.gap_s:
            return []
        return sorted(p for p, at in self._heard.items() if now - at > self.timeout_s)


@dataclass(frozen=True)
class Lease:
    """What the runner tells remote workers (see the module docstring)."""

    runner: str
    generation: int
    checkpoint: int | None
    pipeline: str
    job: str
    settings: str  # JobSettings as JSON
    scale: Mapping[str, Any] | None  # the job's Scale when other than declared
    groups: Mapping[str, list[str]]  # remote group -> its tasks
    members: Mapping[str, str]  # remote group -> the incarnation running it in this generation
    timeout_s: float
    ended: bool = False  # the runner stopped: members stop their tasks now
    note: str = ""  # why a lease names no members (a pause), for the workers' messages

    def event(self) -> ControlEvent:
        return ControlEvent(
            ControlKind.LEASE,
            0,
            self.runner,
            {
                "generation": self.generation,
                "checkpoint": self.checkpoint,
                "pipeline": self.pipeline,
                "job": self.job,
                "settings": self.settings,
                "scale": dict(self.scale) if self.scale is not None else None,
                "groups": {g: list(t) for g, t in self.groups.items()},
                "members": dict(self.members),
                "timeout_s": self.timeout_s,
                "ended": self.ended,
                "note": self.note,
            },
        )

    @classmethod
    def from_event(cls, event: ControlEvent) -> Lease:
        """Raises ValueError with the reason for a malformed lease."""
        p = event.payload
        try:
            checkpoint = p.get("checkpoint")
            return cls(
                runner=event.task,
                generation=int(p["generation"]),
                checkpoint=None if checkpoint is None else int(checkpoint),
                pipeline=str(p["pipeline"]),
                job=str(p["job"]),
                settings=str(p["settings"]),
                scale=p.get("scale"),
                groups={str(g): [str(t) for t in tasks] for g, tasks in dict(p["groups"]).items()},
                members={str(g): str(i) for g, i in dict(p.get("members") or {}).items()},
                timeout_s=float(p["timeout_s"]),
                ended=bool(p.get("ended")),
                note=str(p.get("note") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed lease from {event.task!r}: {exc!r}") from exc


@dataclass(frozen=True)
class Heartbeat:
    """A remote worker's heartbeat: its group, incarnation and where it runs."""

    group: str
    incarnation: str
    host: str
    running: int | None  # the generation its tasks run in, None while idle

    def event(self) -> ControlEvent:
        return ControlEvent(
            ControlKind.HEARTBEAT,
            0,
            self.group,
            {"incarnation": self.incarnation, "host": self.host, "running": self.running},
        )

    @classmethod
    def from_event(cls, event: ControlEvent) -> Heartbeat:
        p = event.payload
        try:
            running = p.get("running")
            return cls(
                event.task, str(p["incarnation"]), str(p.get("host", "?")), None if running is None else int(running)
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed heartbeat from {event.task!r}: {exc!r}") from exc


@dataclass
class RemoteGroups:
    """The runner's side: the remote groups' members, standbys and silence."""

    groups: dict[str, list[str]]
    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    say: Callable[[str], None] = lambda line: None
    members: dict[str, str] = field(default_factory=dict)
    standby: dict[str, str] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)  # incarnation -> host, for messages
    _refused: set[str] = field(default_factory=set)
    _ran: dict[str, int] = field(default_factory=dict)  # group -> the generation its member ran tasks in
    # group -> what its member's latest heartbeat said it runs (since ``forget_reports``)
    reported: dict[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.liveness = Liveness(self.timeout_s, clock=self.clock)

    def own(self) -> None:
        self.liveness.own()

    def on_heartbeat(self, beat: Heartbeat, generation: int) -> str | None:
        """A remote worker's heartbeat in ``generation``: ``"joined"`` when it
        made its sender a member (the lease should say so at once), ``"lost"``
        when a member that ran the generation's tasks says it no longer does
        (it stopped them: the job must restore), else None."""
        self.hosts[beat.incarnation] = beat.host
        if beat.group not in self.groups:
            if beat.group not in self._refused:
                self._refused.add(beat.group)
                self.say(
                    f"a worker on {beat.host} offers group {beat.group!r}, which this job does not run remotely "
                    f"(remote groups: {', '.join(sorted(self.groups)) or 'none'}); ignored"
                )
            return None
        member = self.members.get(beat.group)
        if member == beat.incarnation:
            self.liveness.heard(beat.group)
            self.reported[beat.group] = beat.running
            if beat.running == generation:
                self._ran[beat.group] = generation
            elif self._ran.get(beat.group) == generation:
                return "lost"
            return None
        if member is None:
            self.members[beat.group] = beat.incarnation
            self.reported[beat.group] = beat.running
            self.standby.pop(beat.group, None)
            self.liveness.watch(beat.group)
            self.say(f"worker group {beat.group} joined: {beat.incarnation} on {beat.host}")
            return "joined"
        if self.standby.get(beat.group) != beat.incarnation:
            self.standby[beat.group] = beat.incarnation
            self.say(
                f"a second worker of group {beat.group} ({beat.incarnation} on {beat.host}) waits as standby: "
                f"{member} runs it"
            )
        return None

    def silent(self) -> list[str]:
        return self.liveness.silent()

    def quiet_for(self, group: str) -> float:
        return self.liveness.quiet_for(group)

    def drop(self, group: str) -> None:
        """``group``'s member is taken for dead: its standby (if any) becomes the member."""
        self.members.pop(group, None)
        self._ran.pop(group, None)
        self.liveness.forget(group)
        standby = self.standby.pop(group, None)
        if standby is not None:
            self.members[group] = standby
            self.say(f"worker group {group}: standby {standby} takes over")

    def new_generation(self, groups: Mapping[str, list[str]]) -> None:
        """A new generation (perhaps of another scale): members keep their
        groups and restore in place; their silence starts over."""
        self.groups = {g: list(t) for g, t in groups.items()}
        for group in list(self.members):
            if group not in self.groups:
                self.members.pop(group)
        for group in self.members:
            self.liveness.watch(group)

    def forget_reports(self) -> None:
        self.reported.clear()

    def still_running(self) -> list[str]:
        """Members that have not said since ``forget_reports`` that their tasks stopped."""
        return sorted(g for g in self.members if g not in self.reported or self.reported[g] is not None)

    def missing(self) -> list[str]:
        """Groups nobody runs yet in this generation."""
        return sorted(set(self.groups) - set(self.members))

    def member_of(self, task: str) -> str | None:
        for group, tasks in self.groups.items():
            if task in tasks:
                return group
        return None


@dataclass(frozen=True)
class Action:
    """What a remote worker does after a lease or a lapse: ``start`` its
    group's tasks in ``lease.generation`` (restoring in place when it runs
    some), or ``stop`` them and wait."""

    kind: str  # "start" | "stop"
    reason: str
    lease: Lease | None = None


@dataclass
class Membership:
    """The remote worker's side: which lease it follows, whether it is the
    member of its group, and when the runner's lease lapsed."""

    job: str
    group: str
    incarnation: str
    clock: Callable[[], float] = time.monotonic
    running: int | None = None  # the generation this worker's tasks run in
    lease: Lease | None = None
    # the newest generation this worker started tasks in: tasks stopped in a generation never start
    # again in it (the others went on without them); the runner restores into the next
    started: int = -1
    _last_lease: float | None = None
    _liveness: Liveness | None = None

    def own(self) -> None:
        """This worker's heartbeat was read back."""
        if self._liveness is not None:
            self._liveness.own()

    def on_lease(self, lease: Lease) -> Action | None:
        if lease.job != self.job:
            return None
        self.lease = lease
        if self._liveness is None or self._liveness.timeout_s != lease.timeout_s:
            self._liveness = Liveness(lease.timeout_s, clock=self.clock)
        self._liveness.watch("runner")
        if lease.ended:
            if self.running is not None:
                return Action("stop", "the job runner stopped")
            return None
        if self.group not in lease.groups:
            if self.running is not None:
                return Action("stop", f"generation {lease.generation} runs no group {self.group}")
            return None
        if lease.members.get(self.group) == self.incarnation:
            if lease.generation > self.started:
                self.started = lease.generation
                return Action("start", f"member of group {self.group} in generation {lease.generation}", lease)
            return None
        if self.running is not None:
            member = lease.members.get(self.group)
            why = f"{member} runs group {self.group}" if member else f"group {self.group} has no member yet"
            return Action("stop", lease.note or f"not the member in generation {lease.generation} ({why})")
        return None

    def check(self) -> Action | None:
        """A ``stop`` once the runner's lease lapsed while this worker runs tasks."""
        if self.running is None or self._liveness is None or not self._liveness.silent():
            return None
        return Action(
            "stop",
            f"no lease from the job runner for {self._liveness.quiet_for('runner'):.0f} s "
            f"(its timeout is {self._liveness.timeout_s:g} s) while the control topic works",
        )

    @property
    def unknown_group(self) -> bool:
        """The job's lease runs remote groups, none of them this one."""
        return self.lease is not None and not self.lease.ended and self.group not in self.lease.groups
