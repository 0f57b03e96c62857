"""The runner's side of remote worker groups, on the control topic: the lease
it publishes every ``LEASE_INTERVAL_S`` from a thread of its own, the
heartbeats it reads (who joined, who stopped its tasks, who went silent),
and the pause that stops the remote tasks while a rescaled checkpoint is
written.  The decisions themselves are ``membership.RemoteGroups``'s; this
module wires them to Kafka (``streaming.engine.remote.membership`` has the whole
protocol)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from streaming.adapters.kafka.control.events import ControlEvent, Heartbeat, Lease
from streaming.adapters.kafka.control.transport import ControlTopic, send_event
from streaming.adapters.kafka.producer import DELIVERY_BOUND_S, close_producer, producer
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.topics import control_topic
from streaming.engine import metrics
from streaming.engine.remote.membership import (
    HEARTBEAT_INTERVAL_S,
    LEASE_INTERVAL_S,
    WAITING_NOTICE_S,
    HeartbeatOutcome,
    RemoteGroups,
)
from streaming.errors import SparkAbsError
from streaming.waits import Deadline, join_within

__all__ = ["LeaseRenewal", "RemoteMembers"]

log = logging.getLogger(__name__)


class LeaseRenewal:
    """Publishes the runner's latest lease every ``LEASE_INTERVAL_S`` from a
    thread of its own, on a producer of its own: a runner busy with a slow
    send (a barrier after an outage) or a restore is still alive, and its
    remote workers must not take it for dead."""

    def __init__(self, kafka: KafkaAccess, key: JobKey):
        self.topic = control_topic(key.job)
        self.key = key
        self._producer = producer(kafka)
        self._lease: Lease | None = None
        self._sequence = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-abs-lease", daemon=True)
        self._thread.start()

    def renew(self, lease: Lease) -> None:
        """From now on publish ``lease``, the first time at once."""
        self._lease = lease
        self._wake.set()

    def _publish(self, lease: Lease, bound_s: float = DELIVERY_BOUND_S) -> None:
        self._sequence += 1  # each publication its own number: a copy of one is no news (Membership)
        numbered = dataclasses.replace(lease, sequence=self._sequence)
        send_event(
            self._producer, self.topic, numbered, self.key, bound_s, f"the lease of generation {lease.generation}"
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(LEASE_INTERVAL_S)
            self._wake.clear()
            lease = self._lease
            if lease is None or self._stop.is_set():
                continue
            try:
                self._publish(lease)
            except SparkAbsError as exc:  # the broker is away: the next renewal tries again
                log.warning("lease not renewed: %s", exc)

    def end(self, lease: Lease) -> None:
        """Stop renewing and publish ``lease`` (the last one: members stop their tasks now)."""
        self._stop.set()
        self._wake.set()
        join_within(self._thread, 2 * LEASE_INTERVAL_S + 1, "the lease's renewals")
        try:
            # a stopping runner does not wait out an outage: without it the workers' leases lapse
            self._publish(lease, bound_s=10.0)
        except SparkAbsError as exc:
            log.warning("last lease not published: %s", exc)
        finally:
            close_producer(self._producer, "the lease")


class RemoteMembers:
    """The remote groups of one job runner (``runner`` is its incarnation):
    the lease as things are (``lease``), the heartbeats on their way to the
    coordinator (``observe``), why the job must restore (``restore_reason``),
    the pause around a rescale (``pause``) and the last lease (``end``).

    ``new_renewal`` makes the thread that publishes the lease, the first
    time one is needed (a ``LeaseRenewal`` on the job's Kafka)."""

    def __init__(
        self,
        runner: str,
        pipeline_ref: str,
        job: str,
        settings_json: str,
        timeout_s: float,
        groups: Mapping[str, list[str]],
        new_renewal: Callable[[], Any],
    ):
        self.runner = runner
        self.pipeline_ref = pipeline_ref
        self.job = job
        self.settings_json = settings_json
        self.timeout_s = timeout_s
        self.groups = RemoteGroups(dict(groups), timeout_s, runner=runner)
        self._new_renewal = new_renewal
        self._renewal: Any = None
        self.generation = 0
        self.checkpoint: int | None = None
        self.scale: Mapping[str, Any] | None = None
        # while a rescaled checkpoint is written: (its generation, why); every lease then names no member
        self.paused: tuple[int, str] | None = None
        self._lost: list[str] = []
        self._waiting_at = 0.0

    # ---- the lease

    def lease(self, *, ended: bool = False) -> Lease:
        """The lease as things are now; during a pause (``pause``) one of the
        paused generation that names no member, whoever joins."""
        generation, checkpoint, note = self.generation, self.checkpoint, ""
        if self.paused is not None:
            (generation, note), checkpoint = self.paused, None
        return Lease(
            runner=self.runner,
            generation=generation,
            checkpoint=checkpoint,
            pipeline=self.pipeline_ref,
            job=self.job,
            settings=self.settings_json,
            scale=self.scale,
            groups={g: list(t) for g, t in self.groups.groups.items()},
            members={} if ended or self.paused is not None else dict(self.groups.members),
            timeout_s=self.timeout_s,
            ended=ended,
            note=note,
        )

    def renew(self) -> None:
        """The lease as things are now, published from now on (the first time at once)."""
        if self._renewal is None:
            self._renewal = self._new_renewal()
        self._renewal.renew(self.lease())

    def start_generation(
        self, generation: int, checkpoint: int | None, groups: Mapping[str, list[str]], scale: Mapping[str, Any] | None
    ) -> None:
        """Generation ``generation`` starts from ``checkpoint``: members restore
        in place once the lease names it; the others join."""
        self.generation, self.checkpoint, self.scale = generation, checkpoint, scale
        self._lost = []
        self.groups.new_generation(groups)
        self.renew()

    def end(self) -> None:
        """The last lease: members stop their tasks now."""
        if self._renewal is not None:
            self._renewal.end(self.lease(ended=True))
            self._renewal = None

    # ---- heartbeats

    def observe(self, events: list[ControlEvent]) -> list[ControlEvent]:
        """Membership events on their way to the coordinator."""
        for event in events:
            if isinstance(event, Lease) and event.runner == self.runner:
                self.groups.own()
            elif isinstance(event, Heartbeat):
                metrics.heartbeat(self.job, event.group)
                outcome = self.groups.on_heartbeat(event, self.generation)
                if outcome is HeartbeatOutcome.JOINED:
                    self.renew()  # tell it at once
                elif outcome is HeartbeatOutcome.LOST and event.group not in self._lost:
                    self._lost.append(event.group)
        return events

    def restore_reason(self) -> str | None:
        """Why the job must restore (a group went silent or stopped its
        tasks; that member is dropped, its standby takes over), or None; say
        now and then which groups nobody runs yet."""
        for group in self._lost:
            self.groups.drop(group)
            return f"worker group {group} stopped its tasks"
        for group in self.groups.silent():
            quiet = self.groups.quiet_for(group)
            member = self.groups.members.get(group)
            self.groups.drop(group)
            return (
                f"worker group {group} ({member}) went silent: no heartbeat for {quiet:.0f} s "
                f"(heartbeat_timeout_s {self.timeout_s:g})"
            )
        now = time.monotonic()
        missing = self.groups.missing()
        if missing and now - self._waiting_at >= WAITING_NOTICE_S:
            self._waiting_at = now
            log.info(
                "waiting for remote worker group(s) %s: start `spark-abs worker --job %s --group GROUP` "
                "on any host that reaches Kafka and the store",
                ", ".join(missing),
                self.job,
            )
        return None

    # ---- pausing

    def pause(
        self, generation: int, why: str, poll: Callable[[float], Any] | None, kafka: KafkaAccess, key: JobKey
    ) -> None:
        """Stop the remote workers' tasks before a rescaled checkpoint is
        written (as the local workers are stopped): a lease of ``generation``
        naming no member, heartbeats listened to (through ``poll``, the
        coordinator's, which passes them through ``observe``; a control topic
        of its own when None) until every worker heard (those of a runner
        before this one too) says its tasks stopped, or the heartbeat timeout
        passes.  The next lease names them again."""
        self.groups.forget_reports()
        # a worker that joins meanwhile (JOINED renews the lease) is told to pause too
        self.paused = (generation, why)
        self.renew()
        control = None
        if poll is None:
            control = ControlTopic(
                kafka, self.job, key, on_rejected=functools.partial(metrics.control_rejected, self.job, "runner")
            )
            control.seek_to_end()
            poll = lambda timeout_s: self.observe(control.poll(timeout_s))  # noqa: E731
        # this module's time.monotonic, looked up now (a test moves it on)
        deadline = Deadline(self.timeout_s + 5, clock=time.monotonic)
        # every worker's heartbeat comes at least once a second: listen a little before concluding
        listened = Deadline(2.5 * HEARTBEAT_INTERVAL_S, clock=time.monotonic)
        try:
            while not deadline.passed() and (not listened.passed() or self.groups.still_running()):
                poll(0.2)
        finally:
            self.paused = None
            if control is not None:
                control.close()
        running = self.groups.still_running()
        if running:
            log.warning(
                "remote worker group(s) %s did not say their tasks stopped; rescaling anyway", ", ".join(running)
            )
