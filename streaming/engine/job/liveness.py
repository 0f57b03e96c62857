"""Whether a running job is live, and when the runner restores one that is
not: a worker process that died is ``supervisor``'s to see; this module
sees the ones that did not die.

- **Failed checkpoints** (``streaming.engine.job.checkpoint_failures``):
  more than ``tolerable_failed_checkpoints`` in a row, and none completed
  for the checkpoint timeout: the job restores (cause
  ``checkpoints_failing``), as a task stuck in a send or an alignment would
  otherwise hold it for good.
- **Silent workers** (``WorkerSilence``): each task of a local worker
  publishes its progress twice a second.  A worker process alive but none
  of whose tasks was heard for ``heartbeat_timeout_s`` while the runner
  could hear the control topic (it asks Kafka, ``Liveness.hears``: during a
  broker outage nobody is heard and nobody is to blame) is frozen or
  stuck: the job restores (cause ``worker_stuck``).  A worker whose tasks
  are not all ready ``READY_BOUND_S`` after it started is stuck too.
- **A restore that must wait** (``DueRestore``): a restore needs Kafka and
  the store; while either is away it waits, no worker running, trying
  again with growing pauses, for at most ``RunOptions.restore_wait_s``;
  then the job fails with an error naming that bound.

Both restores begin by killing every local worker (SIGKILL of its process
group): a frozen or stuck process cannot restore in place."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from streaming.engine.job.checkpoint_failures import CheckpointFailureTolerance
from streaming.errors import JobFailed, KafkaUnavailableError, StoreError

__all__ = ["READY_BOUND_S", "DueRestore", "Liveness", "Verdict", "WaitingRestore", "WorkerSilence"]

log = logging.getLogger(__name__)


# how long a worker's tasks may take to be ready after it started (a Spark application, a restore's loads)
READY_BOUND_S = 300.0


# how often the runner asks Kafka whether it answers, while a worker is quiet
_PROBE_EVERY_S = 5.0


# a worker none of whose tasks was heard for this long is quiet (each says its progress twice a
# second): the runner starts asking Kafka, so that an outage shorter than the heartbeat timeout is
# seen, and the worker's silence counted from Kafka's return, not from before the outage
QUIET_S = 3.0


# the pauses between the attempts of a restore that must wait: growing from the first to the last
_RETRY_FIRST_S, _RETRY_MAX_S = 2.0, 30.0


@dataclass(frozen=True)
class Verdict:
    """Why a job that runs must restore: ``cause`` a ``RESTORE_CAUSES`` word,
    ``reason`` what it says to a person."""

    cause: str
    reason: str


class WorkerSilence:
    """When each local worker's tasks were last heard (any control event of
    the current generation naming them), and which workers have been silent
    too long; ``clock`` is monotonic."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self.clock = clock
        self.launched_at = clock()

    def launched(self) -> None:
        """A generation started: its workers are judged from now."""
        self.launched_at = self.clock()

    def silent(
        self,
        workers: Mapping[str, Sequence[str]],
        heard_at: Mapping[str, float],
        ready: set[str],
        hearing_since: float,
    ) -> list[tuple[str, str]]:
        """The workers (name, what was wrong) of ``workers`` (name -> tasks)
        none of whose tasks were heard for the timeout, counted from when
        the runner could hear (``hearing_since``) at the earliest; and those
        whose tasks are not all ``ready`` ``READY_BOUND_S`` after launch."""
        now = self.clock()
        found = []
        for name, tasks in workers.items():
            if not tasks:
                continue
            if not all(t in ready for t in tasks):
                if now - self.launched_at > READY_BOUND_S:
                    waiting = ", ".join(t for t in tasks if t not in ready)
                    found.append((name, f"tasks {waiting} not ready {READY_BOUND_S:.0f} s after the worker started"))
                continue
            last = self._last_heard(tasks, heard_at, hearing_since)
            if now - last > self.timeout_s:
                found.append(
                    (
                        name,
                        f"none of its tasks heard for {now - last:.0f} s while the control topic worked "
                        f"(heartbeat_timeout_s {self.timeout_s:g})",
                    )
                )
        return found

    def quiet(
        self,
        workers: Mapping[str, Sequence[str]],
        heard_at: Mapping[str, float],
        ready: set[str],
        hearing_since: float,
    ) -> bool:
        """Whether a worker whose tasks are all ready has not been heard for ``QUIET_S``."""
        now = self.clock()
        return any(
            tasks
            and all(t in ready for t in tasks)
            and now - self._last_heard(tasks, heard_at, hearing_since) > QUIET_S
            for tasks in workers.values()
        )

    def _last_heard(self, tasks: Sequence[str], heard_at: Mapping[str, float], hearing_since: float) -> float:
        """When one of ``tasks`` was last heard, counted from the launch and from ``hearing_since`` at the earliest."""
        return max([heard_at.get(t, self.launched_at) for t in tasks] + [self.launched_at, hearing_since])


@dataclass
class DueRestore:
    """A restore that could not start yet (Kafka or the store away): what it
    is for, since when it waits and when it tries again.

    A schedule, not a wait, so it does not go through ``streaming.waits``:
    nothing blocks on it; the runner's loop asks it at every step
    (``WaitingRestore.retry``, which pauses at most 0.2 s a step and
    fails the job, naming ``restore_wait_s``, once that bound passed), so
    whoever drives the runner keeps control between steps (Ctrl-C, SIGUSR1,
    the run's end are heard); ``waits.retry`` would hold the loop for the
    whole bound."""

    verdict: Verdict
    since: float
    attempts: int = 0
    retry_at: float = 0.0

    def failed(self, now: float) -> float:
        """One more attempt failed; the pause before the next (growing)."""
        self.attempts += 1
        pause = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2 ** (self.attempts - 1))
        self.retry_at = now + pause
        return pause


class Liveness:
    """The runner's view of whether its job is live: ``failures`` (counted
    by the coordinator service), ``silence`` of the local workers, and
    whether Kafka answers the runner (``probe``: a callable that raises
    when it does not, asked at most every few seconds)."""

    def __init__(
        self,
        tolerable_failed_checkpoints: int,
        heartbeat_timeout_s: float,
        probe: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        *,
        failing_for_s: float = 0.0,
    ):
        self.tolerable = tolerable_failed_checkpoints
        # failed checkpoints restore once none completed for this long too (the checkpoint timeout):
        # declines come fast, and a store away for seconds must not restart every worker
        self.failing_for_s = failing_for_s
        self.silence = WorkerSilence(heartbeat_timeout_s, clock)
        self.probe = probe
        self.clock = clock
        # since when Kafka answered the runner without a break (None: it did not, the last time asked)
        self.hearing_since: float | None = clock()
        self._probed_at = float("-inf")

    def launched(self) -> None:
        self.silence.launched()

    def lost(self) -> None:
        """A send of the runner's found Kafka away: nobody is heard until it answers again."""
        if self.hearing_since is not None:
            log.warning("Kafka does not take the job runner's sends: silent workers are not judged until it answers")
        self.hearing_since = None
        self._probed_at = float("-inf")

    def deaf(self) -> None:
        """The runner did not listen for a while (a long step): silence counts from now."""
        if self.hearing_since is not None:
            self.hearing_since = max(self.hearing_since, self.clock())

    def hears(self, *, fresh: bool = False) -> bool:
        """Whether Kafka answers the runner (asked again every few seconds, or now when ``fresh``)."""
        now = self.clock()
        if fresh or now - self._probed_at >= _PROBE_EVERY_S:
            self._probed_at = now
            try:
                self.probe()
            except Exception as exc:  # any failure to reach Kafka: nobody is to blame for silence
                if self.hearing_since is not None:
                    log.warning("Kafka does not answer the job runner (%s): silent workers are not judged", exc)
                self.hearing_since = None
            else:
                if self.hearing_since is None:
                    log.info("Kafka answers the job runner again")
                    self.hearing_since = now
        return self.hearing_since is not None

    def verdict(
        self,
        failed: CheckpointFailureTolerance,
        workers: Mapping[str, Sequence[str]],
        heard_at: Mapping[str, float],
        ready: set[str],
    ) -> Verdict | None:
        """Why the job must restore now, or None while it is live."""
        failing_s = self.clock() - failed.since
        if failed.in_a_row > self.tolerable and failing_s >= self.failing_for_s:
            return Verdict(
                "checkpoints_failing",
                f"{failed.in_a_row} checkpoints failed in a row, more than tolerable_failed_checkpoints "
                f"({self.tolerable}), and none completed for {failing_s:.0f} s; the last: {failed.last}",
            )
        if self.hearing_since is None and not self.hears():
            return None  # Kafka is away from the runner too: silence blames nobody
        # a quiet worker: is Kafka away? (asked every few seconds; an outage found restarts the count)
        if self.silence.quiet(workers, heard_at, ready, self.hearing_since or self.clock()) and not self.hears():
            return None
        silent = self.silence.silent(workers, heard_at, ready, self.hearing_since or self.clock())
        # Kafka is asked (every few seconds at most) only when a worker looks silent: does it answer?
        if silent and self.hears():
            name, why = silent[0]
            return Verdict("worker_stuck", f"worker {name} is alive but stuck: {why}")
        return None


class WaitingRestore:
    """The restores of job ``job`` that must wait: ``attempt`` restores for a
    verdict now (``restore``), or, while Kafka (``kafka``: ``hears``) or the
    store does not answer, kills every worker (``kill_all``: nothing runs
    uncoordinated) and keeps the restore ``due``; ``retry``, at each step of
    the runner's loop, tries it again once its pause is over and fails the
    job once it waited ``wait_s`` (``RunOptions.restore_wait_s``)."""

    def __init__(
        self,
        job: str,
        restore: Callable[[Verdict], object],
        kill_all: Callable[[], object],
        hears: Callable[[], bool],
        kafka: object,
        wait_s: float,
        log: logging.Logger | logging.LoggerAdapter,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.job = job
        self._restore = restore
        self._kill_all = kill_all
        self._hears = hears
        self._kafka = kafka
        self.wait_s = wait_s
        self.log = log
        self.clock = clock
        self.due: DueRestore | None = None

    def attempt(self, verdict: Verdict) -> None:
        """Restore for ``verdict`` now, or keep it due (see the class docstring)."""
        now = self.clock()
        try:
            if not self._hears():
                raise KafkaUnavailableError(f"Kafka at {self._kafka} does not answer")
            self._restore(verdict)
        except (KafkaUnavailableError, StoreError) as exc:
            self._kill_all()
            if self.due is None:
                self.due = DueRestore(verdict, since=now)
            pause = self.due.failed(now)
            self.log.warning(
                "job %s: restoring (%s) must wait: %s; trying again in %.0f s (waiting %.0f s of at most %.0f s, "
                "restore_wait_s)",
                self.job,
                verdict.reason,
                exc,
                pause,
                now - self.due.since,
                self.wait_s,
            )
        else:
            self.due = None

    def retry(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """The due restore again once its pause is over (until then a pause
        of at most 0.2 s, so the runner's loop goes on); a ``JobFailed``
        naming ``restore_wait_s`` once it waited that long."""
        due = self.due
        if due is None:
            return
        now = self.clock()
        if now - due.since > self.wait_s:
            raise JobFailed(
                f"job {self.job}: the restore ({due.verdict.reason}) waited {now - due.since:.0f} s for Kafka "
                f"and the store, more than restore_wait_s ({self.wait_s:g} s); "
                f"{due.attempts} attempts failed.  Bring them back and run the job again: it goes on from its "
                f"latest checkpoint"
            )
        if now < due.retry_at:
            sleep(min(0.2, due.retry_at - now))
            return
        self.attempt(due.verdict)
