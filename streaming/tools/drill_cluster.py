"""A restore drill on the local cluster (``spark-abs drill --cluster``): its
failure kinds injected into a job whose worker groups are remote
(``spark-abs worker`` processes the drill runs, ``drill_job.WorkerHosts``),
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
  its lease lapsed (every member said it stopped its tasks); the job
  restores and the same members run every group, their Spark applications
  never stopped.

``damage`` kills the runner the same way on the cluster (``kill_runner``,
its lease let lapse)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

from streaming.adapters.kafka_admin import out_of_sync
from streaming.engine.membership import HEARTBEAT_INTERVAL_S
from streaming.errors import SparkAbsError
from streaming.tools.drill_job import pid_of
from streaming.tools.drill_plan import RUNNER_RESTARTS, FailureKind, FailureOutcome

__all__ = ["ClusterFailures", "until"]

# bounds of the waits, in seconds: for a lease that names a group's member running here; for a standby's
# first heartbeat (its Spark application starts before it); for the members to say they stopped their tasks,
# past the heartbeat timeout after the runner died; for a restarted Kafka node's replicas to be in sync again
MEMBER_WAIT_S = 30.0
STANDBY_JOIN_S = 180.0
LAPSE_MARGIN_S = 15.0
IN_SYNC_S = 120.0

# what each kind returns: (when it struck, the newest checkpoint completed then, the check once it recovered)
Struck = tuple[float, int, Callable[[], None]]
Member = tuple[str, subprocess.Popen]  # the incarnation the lease names, its process here


def until(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passed (False),
    while the runner is down (the drill's own wait fails when it exited)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


class ClusterFailures:
    """The cluster kinds, for a ``FailureInjector`` (its job, watch, runtime,
    wait, log and problems)."""

    def __init__(self, injector):
        self.injector = injector
        self.job = injector.job
        self.watch = injector.watch

    @property
    def hosts(self):
        return self.job.hosts

    def _problem(self, outcome: FailureOutcome, text: str) -> None:
        self.injector.problems.append(f"failure {outcome.failure.index + 1} ({outcome.failure.describe()}): {text}")

    def strike(self, outcome: FailureOutcome) -> Struck:
        """Inject ``outcome``'s failure; when it struck, the newest checkpoint
        completed then, and what to check once the job recovered."""
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

    def _node(self, outcome: FailureOutcome) -> Struck:
        failure = outcome.failure
        runtime = self.injector.runtime
        t0, newest = self._now()
        if runtime.stop_service(failure.target, kill=True) is None:
            outcome.note = f"{failure.target} was not running"

        def back() -> None:
            time.sleep(max(0.0, failure.outage_s - (time.monotonic() - t0)))
            started = time.monotonic()
            note = f"{failure.target} down {started - t0:.0f} s"
            runtime.up()  # the node starts again where it was (up waits for Kafka's brokers, Spark's ALIVE)
            if failure.kind is FailureKind.BROKER_NODE:
                bootstrap = self.job.connection.kafka_bootstrap
                lagging: list[str] = []

                def in_sync() -> bool:
                    try:
                        lagging[:] = out_of_sync(bootstrap, self.job.job)
                    except SparkAbsError as exc:  # the cluster settling: ask again
                        lagging[:] = [str(exc)]
                    return not lagging

                if until(in_sync, IN_SYNC_S, poll_s=1.0):
                    note += f", its replicas in sync {time.monotonic() - started:.1f} s after it started again"
                else:
                    self._problem(
                        outcome,
                        f"{len(lagging)} partitions of the job still out of sync {IN_SYNC_S:.0f} s after "
                        f"{failure.target} started again, e.g. {', '.join(lagging[:3])}",
                    )
            else:
                note += f", ALIVE again {time.monotonic() - started:.1f} s after it started again"
            outcome.note = "; ".join(filter(None, [outcome.note, note]))

        return t0, newest, back

    # ---- a worker group's member, with or without a standby

    def _member(self, group: str) -> Member | None:
        """The incarnation the latest lease names ``group``'s member and its process here."""
        incarnation = self.watch.members().get(group)
        process = self.hosts.process(incarnation) if incarnation else None
        return (incarnation, process) if process is not None else None

    def _group(self, outcome: FailureOutcome, *, standby: bool) -> Struck:
        group = outcome.failure.target
        found: list[Member] = []

        def named() -> bool:
            found[:] = [m] if (m := self._member(group)) is not None else []
            return bool(found)

        if not self.injector.wait(named, MEMBER_WAIT_S):
            self._problem(
                outcome, f"no lease named a member of group {group} running here within {MEMBER_WAIT_S:.0f} s"
            )
            return (*self._now(), lambda: None)
        killed, process = found[0]
        waiting = self._standby(outcome, group) if standby else None
        t0, newest = self._now()
        self.hosts.kill(process)  # without a standby, the drill's next poll starts a worker for the group

        def runs() -> None:
            now = self.watch.members().get(group)
            if standby and waiting is not None and now != waiting:
                self._problem(outcome, f"the standby {waiting} did not take group {group} over: the lease names {now}")
            elif now is None or now == killed:
                self._problem(outcome, f"no new member runs group {group}: the lease names {now}")
            what = "the standby" if standby else "a new worker"
            outcome.note = "; ".join(filter(None, [outcome.note, f"{killed} killed, {what} {now} runs {group}"]))

        return t0, newest, runs

    def _standby(self, outcome: FailureOutcome, group: str) -> str | None:
        """A second worker for ``group``, once its heartbeat was read (its
        Spark application up): it waits as the group's standby."""
        since = time.monotonic()
        process = self.hosts.start(group)
        joined: list[str] = []

        def beating() -> bool:
            joined[:] = [i for i in self.watch.heartbeats(since) if pid_of(i) == process.pid]
            return bool(joined)

        if not self.injector.wait(beating, STANDBY_JOIN_S):
            self._problem(outcome, f"the standby of group {group} sent no heartbeat within {STANDBY_JOIN_S:.0f} s")
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
            outcome.note = f"every member stopped its tasks {time.monotonic() - killed:.1f} s after the runner died"
        else:
            self._problem(
                outcome,
                f"the members of {', '.join(running)} still ran their tasks {bound:.0f} s after the runner died",
            )
        return members

    def _runner(self, outcome: FailureOutcome) -> Struck:
        t0, newest = self._now()
        members = self.kill_runner(outcome, lapse=outcome.failure.moment == RUNNER_RESTARTS[0])
        self.job.start_runner()

        def kept() -> None:
            now = self.watch.members()
            moved = sorted(g for g, (i, p) in members.items() if now.get(g) != i or p.poll() is not None)
            if moved:
                self._problem(
                    outcome,
                    f"group(s) {', '.join(moved)} did not run on the members the killed runner had "
                    f"(the lease names {', '.join(f'{g}={now.get(g)}' for g in moved)})",
                )
            else:
                note = f"the {len(members)} members kept, their Spark applications up"
                outcome.note = "; ".join(filter(None, [outcome.note, note]))

        return t0, newest, kept
