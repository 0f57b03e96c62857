"""A restore drill on the local cluster (``spark-abs drill --cluster``): its
failure kinds injected into a job whose worker groups are remote
(``spark-abs worker`` processes the drill runs, ``job.WorkerHosts``),
and what each must come to once a checkpoint completed after it:

- ``broker-node``: one Kafka node of three SIGKILLed, down until the job
  completed a checkpoint without it (and ``outage_s`` at least), then
  started again; no restore; its replicas in sync again before the next
  failure;
- ``spark-worker``: one Spark worker of two SIGKILLed, the same way; no
  restore (the master gives each application executors on the other
  worker, Spark retries the lost tasks);
- ``group``: a worker group's member SIGKILLed with no standby; the drill
  starts a worker for the group at once, as a host's process manager
  would; the job restores (the member went silent) and the new worker runs
  the group;
- ``group-standby``: a second worker of the group started first, waiting as
  standby, then the member SIGKILLed: the job restores and the standby runs
  the group;
- ``runner-remote``: the runner SIGKILLed and started again, at once or once
  its lease lapsed (every member said it stopped its tasks); then the
  latest heartbeats of every member and of every worker the drill killed
  (signed by the job's key) are appended to the control topic again, byte
  for byte, as a writer of the topic without the key could: the job
  restores and the same members, one for every group, run them.

A kind that must restore recovers only once a checkpoint of a later
generation completed (``FailureInjector``).  A failure the drill found
nothing to strike for (no member named, a standby that never joined, a node
not running) is a problem, and nothing is killed.  A node killed is started
again whatever happens next (``bring_back``, also when the drill ends).
``worker`` and ``damage`` kill a member (``kill_a_member``) and the runner
(``kill_runner``, its lease let lapse) the same way on the cluster."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from barriers.messages import ChannelId
from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.kafka.admin import out_of_sync
from streaming.adapters.kafka.ranges import read_range
from streaming.api.topics import control_topic
from streaming.engine.remote.membership import HEARTBEAT_INTERVAL_S
from streaming.errors import SparkAbsError
from streaming.tools.drill.job import pid_of
from streaming.tools.drill.plan import RUNNER_RESTARTS, FailureKind, FailureOutcome
from streaming.waits import WaitTimeout, poll_until

__all__ = ["ClusterFailures", "Struck", "until"]

# bounds of the waits, in seconds: for a lease that names a group's member running here; for a standby's
# first heartbeat (its Spark application starts before it); for the members to say they stopped their tasks,
# past the heartbeat timeout after the runner died; for a restarted Kafka node's replicas to be in sync again
MEMBER_WAIT_S = 30.0
STANDBY_JOIN_S = 180.0
LAPSE_MARGIN_S = 40.0
IN_SYNC_S = 120.0

Member = tuple[str, subprocess.Popen]  # the incarnation the lease names, its process here


@dataclass(frozen=True)
class Struck:
    """A cluster kind injected: when, the newest checkpoint completed then,
    and what to check once the job recovered; ``struck`` False when the
    drill killed nothing (a problem says why): no restore is expected then."""

    at: float
    newest: int
    check: Callable[[], None] = lambda: None
    struck: bool = True


def until(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passed (False),
    while the runner is down (the drill's own wait fails when it exited)."""
    try:
        poll_until(condition, timeout_s, "a drill's condition", every_s=poll_s)
    except WaitTimeout:
        return False
    return True


class ClusterFailures:
    """The cluster kinds, for a ``FailureInjector`` (its job, watch, runtime,
    wait, log and problems)."""

    def __init__(self, injector):
        self.injector = injector
        self.job = injector.job
        self.watch = injector.watch
        self.down: str | None = None  # a node killed and not started again yet
        # the heartbeats of the members killed, as the topic held them (runner-remote appends them again)
        self.dead_heartbeats: dict[str, list[dict]] = {}

    @property
    def hosts(self):
        return self.job.hosts

    def _problem(self, outcome: FailureOutcome, text: str) -> None:
        self.injector.problems.append(f"failure {outcome.failure.index + 1} ({outcome.failure.describe()}): {text}")

    def strike(self, outcome: FailureOutcome) -> Struck:
        """Inject ``outcome``'s failure."""
        kind = outcome.failure.kind
        if self.hosts is None:
            raise SparkAbsError(f"failure kind {kind} needs the job's worker groups remote (drill --cluster)")
        if kind in (FailureKind.BROKER_NODE, FailureKind.SPARK_WORKER):
            return self._node(outcome)
        if kind in (FailureKind.GROUP, FailureKind.GROUP_STANDBY):
            return self._group(outcome, standby=kind is FailureKind.GROUP_STANDBY)
        if kind is FailureKind.RUNNER_REMOTE:
            return self._runner(outcome)
        raise ValueError(f"{kind} is not a kind of the cluster")

    def _now(self) -> tuple[float, int]:
        return time.monotonic(), max(self.job.completed() or [0])

    # ---- a Kafka node, a Spark worker

    def bring_back(self) -> None:
        """Start the node a failure left down again (``runtime.up`` starts
        what is not running); nothing when none is down."""
        if self.down is not None:
            self.injector.runtime.up()  # up waits for Kafka's brokers, Spark's ALIVE
            self.down = None

    def _node(self, outcome: FailureOutcome) -> Struck:
        failure = outcome.failure
        t0, newest = self._now()
        self.down = failure.target
        if self.injector.runtime.stop_service(failure.target, kill=True) is None:
            self._problem(outcome, f"{failure.target} was not running: nothing killed")
            return Struck(t0, newest, self.bring_back, struck=False)

        def back() -> None:
            time.sleep(max(0.0, failure.outage_s - (time.monotonic() - t0)))
            started = time.monotonic()
            note = f"{failure.target} down {started - t0:.0f} s"
            self.bring_back()  # the node starts again where it was
            if failure.kind is FailureKind.BROKER_NODE:
                if self._in_sync(outcome):
                    note += f", its replicas in sync {time.monotonic() - started:.1f} s after it started again"
            else:
                note += f", ALIVE again {time.monotonic() - started:.1f} s after it started again"
            outcome.add_note(note)

        return Struck(t0, newest, back)

    def _in_sync(self, outcome: FailureOutcome) -> bool:
        """Wait until every replica of the job's topics and of Kafka's own
        (``out_of_sync``) is in sync again; a problem when one is not within ``IN_SYNC_S``."""
        kafka = self.job.connection.kafka
        lagging: list[str] = []

        def in_sync() -> bool:
            try:
                lagging[:] = out_of_sync(kafka, self.job.job)
            except SparkAbsError as exc:  # the cluster settling: ask again
                lagging[:] = [str(exc)]
            return not lagging

        if until(in_sync, IN_SYNC_S, poll_s=1.0):
            return True
        self._problem(
            outcome,
            f"{len(lagging)} partitions still out of sync {IN_SYNC_S:.0f} s after {outcome.failure.target} "
            f"started again, e.g. {', '.join(lagging[:3])}",
        )
        return False

    # ---- a worker group's member, with or without a standby

    def _member(self, group: str) -> Member | None:
        """The incarnation the latest lease names ``group``'s member and its process here."""
        incarnation = self.watch.members().get(group)
        process = self.hosts.process(incarnation) if incarnation else None
        return (incarnation, process) if process is not None else None

    def _named(self, outcome: FailureOutcome, group: str, besides: str | None = None) -> Member | None:
        """Wait for a lease that names a member of ``group`` running here (not
        ``besides``); a problem when none does within ``MEMBER_WAIT_S``."""
        found: list[Member] = []

        def named() -> bool:
            m = self._member(group)
            found[:] = [m] if m is not None and m[0] != besides else []
            return bool(found)

        if self.injector.wait(named, MEMBER_WAIT_S):
            return found[0]
        other = f" other than its standby {besides}" if besides else ""
        self._problem(
            outcome,
            f"no lease named a member of group {group}{other} running here within {MEMBER_WAIT_S:.0f} s "
            f"(the lease names {self.watch.members().get(group)}): nothing killed",
        )
        return None

    def kill_a_member(self, rng: random.Random) -> None:
        """SIGKILL a member the latest lease names, running here (not a standby)."""
        members = [p for i in self.watch.members().values() if (p := self.hosts.process(i)) is not None]
        if members:
            self.hosts.kill(rng.choice(members))

    def _group(self, outcome: FailureOutcome, *, standby: bool) -> Struck:
        group = outcome.failure.target
        found = self._named(outcome, group)
        waiting = None
        if found is not None and standby:
            waiting = self._standby(outcome, group)
            # again once it joined: the lease may have moved while it started, and must not name it
            found = None if waiting is None else self._named(outcome, group, besides=waiting)
        if found is None:
            return Struck(*self._now(), struck=False)
        killed, process = found
        t0, newest = self._now()
        self.hosts.kill(process)  # without a standby, the drill's next poll starts a worker for the group
        self.dead_heartbeats[killed] = self.latest_heartbeats(killed)

        def runs() -> None:
            now = self.watch.members().get(group)
            if standby and now != waiting:
                self._problem(outcome, f"the standby {waiting} did not take group {group} over: the lease names {now}")
            elif now is None or now == killed:
                self._problem(outcome, f"no new member runs group {group}: the lease names {now}")
            what = "the standby" if standby else "a new worker"
            outcome.add_note(f"{killed} killed, {what} {now} runs {group}")

        return Struck(t0, newest, runs)

    def _standby(self, outcome: FailureOutcome, group: str) -> str | None:
        """A second worker for ``group``, once its heartbeat was read (its
        Spark application up): it waits as the group's standby.  One that
        sent none within ``STANDBY_JOIN_S`` is killed (a problem)."""
        since = time.monotonic()
        process = self.hosts.start(group)
        joined: list[str] = []

        def beating() -> bool:
            joined[:] = [i for i in self.watch.heartbeats(since) if pid_of(i) == process.pid]
            return bool(joined) or process.poll() is not None

        if not self.injector.wait(beating, STANDBY_JOIN_S) or not joined:
            self.hosts.kill(process)
            self._problem(
                outcome,
                f"the standby of group {group} sent no heartbeat within {STANDBY_JOIN_S:.0f} s: "
                "it was killed, the member was not",
            )
            return None
        time.sleep(2 * HEARTBEAT_INTERVAL_S)  # the runner reads it too: a group with a member takes it as standby
        return joined[0]

    # ---- the runner of remote members

    def kill_runner(self, outcome: FailureOutcome, *, lapse: bool) -> dict[str, Member]:
        """SIGKILL the runner; the members stay up.  ``lapse``: wait until each
        member said it stopped its tasks (no lease for the heartbeat timeout),
        a problem when one did not within ``LAPSE_MARGIN_S`` more.  The members
        the lease named, by group."""
        members = {g: m for g in self.hosts.groups if (m := self._member(g)) is not None}
        runner = self.job.runner
        assert runner is not None
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        killed = time.monotonic()
        if not lapse:
            return members
        bound = self.job.heartbeat_timeout_s + LAPSE_MARGIN_S
        running: list[str] = []

        def idle() -> bool:
            beats = self.watch.heartbeats(killed)
            running[:] = sorted(g for g, (i, _) in members.items() if i not in beats or beats[i].running is not None)
            return not running

        if until(idle, bound):
            outcome.add_note(f"every member stopped its tasks {time.monotonic() - killed:.1f} s after the runner died")
        else:
            self._problem(
                outcome,
                f"the members of {', '.join(running)} still ran their tasks {bound:.0f} s after the runner died",
            )
        return members

    def latest_heartbeats(self, incarnation: str) -> list[dict]:
        """``incarnation``'s latest heartbeats (``KEPT_BEATS``) on the
        control topic, as Kafka holds them (signed with the job's key):
        records as ``read_range`` gives them."""
        offsets = set(self.watch.heartbeat_offsets(incarnation))
        if not offsets:
            return []
        channel = ChannelId(control_topic(self.job.job), 0)
        records = read_range(
            self.job.connection.kafka, channel, min(offsets), max(offsets) + 1, timeout_s=MEMBER_WAIT_S
        )
        return [r for r in records.to_pylist() if r["offset"] in offsets]

    def replay_heartbeats(self) -> tuple[int, int]:
        """The latest heartbeats of the members and of the workers the drill
        killed (kept when it killed them) appended to the control topic
        again, key, value and headers (the job's signature) as they were:
        (records, workers)."""
        beats = dict(self.dead_heartbeats)
        for member in self.watch.members().values():
            beats[member] = self.latest_heartbeats(member)
        copies = [r for records in beats.values() for r in records]
        if not copies:
            return 0, 0
        producer = kafka_clients.raw_producer(self.job.connection.kafka, acks="all")
        try:
            for r in copies:
                headers = [(h["key"], h["value"]) for h in r["headers"]]
                producer.send(r["topic"], key=r["key"], value=r["value"], headers=headers, partition=0)
            producer.flush(MEMBER_WAIT_S)
        finally:
            producer.close()
        return len(copies), sum(1 for records in beats.values() if records)

    def _runner(self, outcome: FailureOutcome) -> Struck:
        t0, newest = self._now()
        members = self.kill_runner(outcome, lapse=outcome.failure.moment == RUNNER_RESTARTS[0])
        self.job.start_runner()
        copies, workers = self.replay_heartbeats()  # a dead worker's among them: none may rejoin
        outcome.add_note(f"{copies} old heartbeats of {workers} worker(s) appended again")

        def kept() -> None:
            now = self.watch.members()
            unnamed = [g for g in self.hosts.groups if g not in members]
            moved = sorted(g for g, (i, p) in members.items() if now.get(g) != i or p.poll() is not None)
            if unnamed:
                self._problem(
                    outcome,
                    f"before the runner was killed no lease named a member running here of group(s) "
                    f"{', '.join(unnamed)}",
                )
            if moved:
                self._problem(
                    outcome,
                    f"group(s) {', '.join(moved)} did not run on the members the killed runner had "
                    f"(the lease names {', '.join(f'{g}={now.get(g)}' for g in moved)})",
                )
            if not unnamed and not moved:
                outcome.add_note("the member kept" if len(members) == 1 else f"the {len(members)} members kept")

        return Struck(t0, newest, kept)
