"""A remote worker: one worker group of a job, started on any host that
reaches the job's Kafka and object store (``spark-abs worker --job J
--group G``), with nothing shared with the runner but the control topic and
the store.  It waits for the runner's lease, joins its group (a heartbeat
every second from a thread of its own), runs the group's tasks in the
generation the lease names, restores in place when a later lease names a
newer generation, and stops its tasks when it is no longer the member or the
runner's lease lapses (``streaming.engine.remote.membership``).  Its Spark
application stays up between generations; it runs until SIGTERM or Ctrl-C.

The pipeline is the one its operator named (``--pipeline``): a worker never
imports what a lease names, it refuses (``LeaseRefused``) a lease for
another job or pipeline.  The job's settings and its scale come with the
lease, which the job's key signs (``streaming.adapters.kafka.control``).  The host
needs the pipeline's module importable and the ``SPARK_ABS_*`` connection
(Kafka, the store, a Spark master, the job secret) in its environment."""

from __future__ import annotations

import logging
import math
import socket
import threading
import time

from streaming.adapters.kafka.control.events import ControlEvent, Heartbeat, Lease
from streaming.adapters.kafka.control.transport import ControlTopic
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import Connection
from streaming.api.pipeline import Scale, load_pipeline, same_pipeline
from streaming.api.settings import JobSettings
from streaming.engine.remote.membership import (
    HEARTBEAT_INTERVAL_S,
    WAITING_NOTICE_S,
    Action,
    ActionKind,
    Membership,
    incarnation,
)
from streaming.engine.worker.worker import Worker
from streaming.errors import ConfigError, LeaseRefused, SparkAbsError
from streaming.waits import Deadline

__all__ = ["RemoteWorker", "check_lease", "incarnation", "wait_for_lease"]

log = logging.getLogger(__name__)


def check_lease(lease: Lease, job: str, pipeline_ref: str) -> None:
    """A ``LeaseRefused`` unless ``lease`` is for job ``job`` running the
    pipeline ``pipeline_ref`` names (the worker's own ``--pipeline``)."""
    if lease.job != job:
        raise LeaseRefused(f"the runner's lease is for job {lease.job!r}, not {job!r}: this worker runs nothing")
    if not same_pipeline(lease.pipeline, pipeline_ref):
        raise LeaseRefused(
            f"the runner of job {job} runs pipeline {lease.pipeline!r}, but this worker was started with "
            f"--pipeline {pipeline_ref!r}: start it with the runner's pipeline (a worker never runs a "
            "pipeline its command line does not name)"
        )


def wait_for_lease(
    control: ControlTopic,
    job: str,
    pipeline_ref: str,
    *,
    stop: threading.Event,
    timeout_s: float | None = None,
) -> Lease | None:
    """The first lease of ``job``'s runner on ``control``, checked against
    this worker's job and pipeline (``check_lease``); None when stopped or
    after ``timeout_s``."""
    notice = time.monotonic()
    deadline = Deadline(math.inf if timeout_s is None else timeout_s)
    while not stop.is_set() and not deadline.passed():
        for event in control.poll(0.5):
            if isinstance(event, Lease):
                check_lease(event, job, pipeline_ref)
                return event
        if time.monotonic() - notice >= WAITING_NOTICE_S:
            notice = time.monotonic()
            log.info(f"still waiting for the runner of job {job} (no lease on {control.topic} yet)")
    return None


class RemoteWorker(Worker):
    """Group ``group`` of the job whose runner published ``lease`` (see the module docstring)."""

    def __init__(
        self,
        lease: Lease,
        group: str,
        connection: Connection,
        pipeline_ref: str,
        *,
        spark=None,
        name: str | None = None,
    ):
        check_lease(lease, lease.job, pipeline_ref)
        self.pipeline_ref = pipeline_ref
        # the pipeline as the operator named it; each lease gives its scale
        self.declared = pipeline = load_pipeline(pipeline_ref, lease.job)
        super().__init__(
            pipeline,
            [],
            JobSettings.from_json(lease.settings),
            connection,
            generation=None,
            restore=None,
            spark=spark,
        )
        self.group = group
        self.incarnation = name or incarnation()
        self.membership = Membership(pipeline.job, group, self.incarnation)
        self._first = lease
        self._beats = threading.Thread(target=self._heartbeats, name="spark-abs-heartbeat", daemon=True)

    def start(self) -> None:
        """Open the clients and Spark; join on the first lease (the runner
        makes this worker the member when its group has none)."""
        self.open()
        self._beats.start()
        log.info(f"worker {self.incarnation}: group {self.group} of job {self.pipeline.job}, waiting to be its member")
        self._apply(self.membership.on_lease(self._first))

    def _heartbeats(self) -> None:
        sequence = 0
        while not self._stop.is_set():
            sequence += 1  # a copy of an earlier heartbeat is no news to the runner (RemoteGroups)
            lease = self.membership.lease
            beat = Heartbeat(
                self.group,
                self.incarnation,
                socket.gethostname(),
                self.membership.running,
                sequence,
                runner=lease.runner if lease is not None else "",
            )
            try:
                self.control.publish(beat)
            except SparkAbsError as exc:  # the broker is away: the next one tries again
                log.warning("heartbeat not published: %s", exc)
            self._stop.wait(HEARTBEAT_INTERVAL_S)

    def _on_control(self, event: ControlEvent) -> None:
        if isinstance(event, Heartbeat):
            if event.incarnation == self.incarnation:
                self.membership.own()
            return
        if isinstance(event, Lease):
            lease = event
            check_lease(lease, self.pipeline.job, self.pipeline_ref)
            self._apply(self.membership.on_lease(lease))
            if self.membership.unknown_group:
                raise ConfigError(
                    f"job {lease.job} runs remote worker groups {', '.join(sorted(lease.groups)) or '(none)'}, "
                    f"not {self.group!r}"
                )
            return
        super()._on_control(event)

    def _round(self) -> None:
        self._apply(self.membership.check())

    def _apply(self, action: Action | None) -> None:
        if action is None:
            return
        if action.kind is ActionKind.STOP:
            self.idle(action.reason)
            self.membership.running = None
            return
        lease = action.lease
        assert lease is not None
        self._adopt(lease)
        pipeline = self.declared
        if lease.scale is not None:
            pipeline = pipeline.rescaled(Scale.from_json(lease.scale))
        self.restart(lease.generation, lease.checkpoint, pipeline=pipeline, task_names=list(lease.groups[self.group]))
        self.membership.running = lease.generation

    def _adopt(self, lease: Lease) -> None:
        """The settings of the lease's runner (a restarted runner may run the job otherwise)."""
        settings = JobSettings.from_json(lease.settings)
        if settings == self.settings:
            return
        if settings.store != self.settings.store:
            self.store.close()
            self.store = SnapshotStore(
                open_store(settings.store, self.connection), lease.job, key=self.connection.store_key(lease.job)
            )
        self.settings = settings

    def serve(self) -> int:
        """Until stopped: a stage query that fails stops this group's tasks
        (the runner restores the job) and the worker waits for the next generation."""
        while True:
            try:
                code = super().serve()
            except LeaseRefused:
                raise
            except SparkAbsError as exc:  # Kafka or the store away past its bound: as a failed query
                log.warning("worker: %s", exc)
                code = 1
            if code == 0:
                return 0
            self.idle("a stage query failed")
            self.membership.running = None
