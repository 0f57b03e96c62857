"""Worker groups that run anywhere: who runs which group in which
generation, and who has gone quiet, decided on the job's control topic alone
(with the object store, that is all a remote worker shares with the runner).

The runner publishes a **lease** every ``LEASE_INTERVAL_S``: the generation
and the checkpoint it starts from, the pipeline, the job's settings and scale,
the tasks of each remote group, and which worker (its *incarnation*) is the
member running each group in this generation.  A remote worker (``spark-abs
worker``) publishes a **heartbeat** every ``HEARTBEAT_INTERVAL_S`` from a
thread of its own, running or idle.

- A heartbeat counts only when it answers this runner: it names the runner
  incarnation whose lease its sender follows, and its number (counted up
  from 1 by its sender) is higher than the last one read from that sender.
  After a runner restarts, a dead worker's old heartbeats appended again
  answer the runner before it: they make no one a member and keep no one
  alive.
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
it published itself (``PeerSilence``).  A broker outage silences everyone,
this side included, and restores nobody.

Everything here is pure logic on a clock; ``streaming.engine.remote.leases`` (the
runner's side) and ``RemoteWorker`` wire it to Kafka."""

from __future__ import annotations

import enum
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from streaming.adapters.kafka.control.events import Heartbeat, Lease

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "LEASE_INTERVAL_S",
    "Lease",
    "PeerSilence",
    "Membership",
    "RemoteGroups",
    "Heartbeat",
    "HeartbeatOutcome",
    "Action",
    "ActionKind",
    "incarnation",
]

log = logging.getLogger(__name__)

# how often the runner renews its lease, and a remote worker says it is alive
LEASE_INTERVAL_S = 1.0
HEARTBEAT_INTERVAL_S = 1.0
# how often a side that waits for the other says so: the runner for the groups nobody runs yet,
# a remote worker for a runner's lease
WAITING_NOTICE_S = 30.0
# own events further apart than this: the topic (or this process) stalled, and silence before does not count
TOPIC_GAP_S = 3.0
# workers answering another runner remembered per group (a writer appending made-up ones fills no memory)
_UNANSWERED_MAX = 64


def incarnation() -> str:
    """This process's name among the job's runners and workers: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class HeartbeatOutcome(enum.Enum):
    """What a heartbeat changed on the runner's side (``RemoteGroups.on_heartbeat``)."""

    JOINED = "its sender became the member of its group"
    LOST = "the member stopped the tasks it ran in this generation"


class PeerSilence:
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


@dataclass
class RemoteGroups:
    """The runner's side: the remote groups' members, standbys and silence."""

    groups: dict[str, list[str]]
    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    # this runner's incarnation: the heartbeats that count answer it
    runner: str = ""
    members: dict[str, str] = field(default_factory=dict)
    standby: dict[str, str] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)  # incarnation -> host, for messages
    _refused: set[str] = field(default_factory=set)
    _ran: dict[str, int] = field(default_factory=dict)  # group -> the generation its member ran tasks in
    # group -> what its member's latest heartbeat said it runs (since ``forget_reports``)
    reported: dict[str, int | None] = field(default_factory=dict)
    # incarnation -> the sequence of its latest heartbeat read
    _sequences: dict[str, int] = field(default_factory=dict)
    # group -> {incarnation: what it runs}: workers heard answering another runner's lease (one that
    # has not heard this runner yet), while they say they run tasks; a pause waits for them too
    unanswered: dict[str, dict[str, int | None]] = field(default_factory=dict)
    _answering_elsewhere: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.liveness = PeerSilence(self.timeout_s, clock=self.clock)

    def own(self) -> None:
        self.liveness.own()

    def on_heartbeat(self, beat: Heartbeat, generation: int) -> HeartbeatOutcome | None:
        """A remote worker's heartbeat in ``generation``: ``JOINED`` when it
        made its sender a member (the lease should say so at once), ``LOST``
        when a member that ran the generation's tasks says it no longer does
        (it stopped them: the job must restore), else None.  A heartbeat that
        answers another runner, or is numbered no higher than the last one
        read from its sender (a copy appended again), is no news."""
        if beat.group in self.groups and beat.runner != self.runner:
            self._answers_elsewhere(beat)
            return None
        if beat.sequence <= self._sequences.get(beat.incarnation, 0):
            return None
        self._sequences[beat.incarnation] = beat.sequence
        self.unanswered.get(beat.group, {}).pop(beat.incarnation, None)
        self.hosts[beat.incarnation] = beat.host
        if beat.group not in self.groups:
            if beat.group not in self._refused:
                self._refused.add(beat.group)
                log.warning(
                    "a worker on %s offers group %r, which this job does not run remotely (remote groups: %s); ignored",
                    beat.host,
                    beat.group,
                    ", ".join(sorted(self.groups)) or "none",
                )
            return None
        member = self.members.get(beat.group)
        if member == beat.incarnation:
            self.liveness.heard(beat.group)
            self.reported[beat.group] = beat.running
            if beat.running == generation:
                self._ran[beat.group] = generation
            elif self._ran.get(beat.group) == generation:
                return HeartbeatOutcome.LOST
            return None
        if member is None:
            self.members[beat.group] = beat.incarnation
            self.reported[beat.group] = beat.running
            self.standby.pop(beat.group, None)
            self.liveness.watch(beat.group)
            log.info("worker group %s joined: %s on %s", beat.group, beat.incarnation, beat.host)
            return HeartbeatOutcome.JOINED
        if self.standby.get(beat.group) != beat.incarnation:
            self.standby[beat.group] = beat.incarnation
            log.info(
                "a second worker of group %s (%s on %s) waits as standby: %s runs it",
                beat.group,
                beat.incarnation,
                beat.host,
                member,
            )
        return None

    def _answers_elsewhere(self, beat: Heartbeat) -> None:
        """A worker that follows another runner's lease: one of a runner before
        this one that has not heard this one yet, or a copy of an old heartbeat.
        It counts for nothing but a pause's wait while it says it runs tasks."""
        heard = self.unanswered.setdefault(beat.group, {})
        if beat.running is None:
            heard.pop(beat.incarnation, None)
        elif beat.incarnation in heard or len(heard) < _UNANSWERED_MAX:
            heard[beat.incarnation] = beat.running
        if beat.incarnation not in self._answering_elsewhere and len(self._answering_elsewhere) < _UNANSWERED_MAX:
            self._answering_elsewhere.add(beat.incarnation)
            log.info(
                "a heartbeat of %s (group %s) answers runner %s, not this one (%s): a worker that has not heard "
                "this runner's lease yet, or a copy of an old heartbeat; it counts once it answers this runner",
                beat.incarnation,
                beat.group,
                beat.runner or "(none yet)",
                self.runner,
            )

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
            log.info("worker group %s: standby %s takes over", group, standby)

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
        self.unanswered.clear()

    def still_running(self) -> list[str]:
        """Members that have not said since ``forget_reports`` that their tasks
        stopped, and groups a worker following another runner's lease said it
        runs tasks of (until it answers this runner)."""
        members = {g for g in self.members if g not in self.reported or self.reported[g] is not None}
        return sorted(members | {g for g, heard in self.unanswered.items() if heard})

    def missing(self) -> list[str]:
        """Groups nobody runs yet in this generation."""
        return sorted(set(self.groups) - set(self.members))

    def member_of(self, task: str) -> str | None:
        for group, tasks in self.groups.items():
            if task in tasks:
                return group
        return None


class ActionKind(enum.Enum):
    """What a remote worker does with its group's tasks."""

    START = "start them in the lease's generation (restoring in place when some run)"
    STOP = "stop them and wait"


@dataclass(frozen=True)
class Action:
    """What a remote worker does after a lease or a lapse (``ActionKind``), and why."""

    kind: ActionKind
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
    _liveness: PeerSilence | None = None

    def own(self) -> None:
        """This worker's heartbeat was read back."""
        if self._liveness is not None:
            self._liveness.own()

    def on_lease(self, lease: Lease) -> Action | None:
        if lease.job != self.job or self._stale(lease):
            return None
        self.lease = lease
        if self._liveness is None or self._liveness.timeout_s != lease.timeout_s:
            self._liveness = PeerSilence(lease.timeout_s, clock=self.clock)
        self._liveness.watch("runner")
        if lease.ended:
            if self.running is not None:
                return Action(ActionKind.STOP, "the job runner stopped")
            return None
        if self.group not in lease.groups:
            if self.running is not None:
                return Action(ActionKind.STOP, f"generation {lease.generation} runs no group {self.group}")
            return None
        if lease.members.get(self.group) == self.incarnation:
            if lease.generation > self.started:
                self.started = lease.generation
                return Action(ActionKind.START, f"member of group {self.group} in generation {lease.generation}", lease)
            return None
        if self.running is not None:
            member = lease.members.get(self.group)
            why = f"{member} runs group {self.group}" if member else f"group {self.group} has no member yet"
            return Action(ActionKind.STOP, lease.note or f"not the member in generation {lease.generation} ({why})")
        return None

    def _stale(self, lease: Lease) -> bool:
        """A lease of an earlier generation than the newest seen, or a copy of
        one of its runner's already seen (its ``sequence`` not higher): no news
        from a runner, whoever appended it again."""
        newest = self.lease
        if newest is None:
            return False
        if lease.generation < newest.generation:
            return True
        same_runner = lease.runner == newest.runner and lease.generation == newest.generation
        return same_runner and lease.sequence <= newest.sequence

    def check(self) -> Action | None:
        """A ``stop`` once the runner's lease lapsed while this worker runs tasks."""
        if self.running is None or self._liveness is None or not self._liveness.silent():
            return None
        return Action(
            ActionKind.STOP,
            f"no lease from the job runner for {self._liveness.quiet_for('runner'):.0f} s "
            f"(its timeout is {self._liveness.timeout_s:g} s) while the control topic works",
        )

    @property
    def unknown_group(self) -> bool:
        """The job's lease runs remote groups, none of them this one."""
        return self.lease is not None and not self.lease.ended and self.group not in self.lease.groups
