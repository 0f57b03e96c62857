"""The coordinator service: the bookkeeping of ``barriers.coordinator`` wired
to Kafka and the snapshot store.

- **Injector**: on trigger n, barrier n is appended to every partition of
  every ingress topic; the offsets Kafka gives back are published on the
  job's control topic (a ``trigger`` event) and kept in the manifest.
- **Acks**: tasks acknowledge on the control topic with their snapshot's
  metadata; a decline aborts the checkpoint and the abort is published so
  every task lets it go.
- **Completion**: when every task acknowledged, the manifest is written (last,
  so only a checkpoint with a manifest is complete), a ``complete`` event
  tells the sinks to commit, and retention deletes what it gives up (never
  the newest checkpoint that verifies, nor one pinned by a restore: the rule
  of ``checkpoints gc`` too, ``snapshots.retention.plan_retention``).  A
  manifest that cannot be written aborts the checkpoint; the job goes on.
  ``CheckpointCompletion.complete`` lists the steps and what each does when
  it fails.  The manifest and the progress log store names
  (``format.stored_name``), never prose.

Events of other generations are ignored (a task of the run that failed may
still speak).

The service reaches Kafka only through a ``CoordinatorIO`` (``kafka_io``
makes the real one), so its logic runs in unit tests on an in-memory one."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from barriers.coordinator import CheckpointCoordinator, CheckpointStatus, CompletedCheckpoint, PendingCheckpoint
from barriers.failures import CheckpointFailure
from barriers.handler import CheckpointKind
from barriers.messages import Barrier, ChannelId, CheckpointOptions, Unsigned, encode
from streaming.adapters.kafka.control.events import (
    Abort,
    Ack,
    Committed,
    Complete,
    ControlEvent,
    Decline,
    Progress,
    Ready,
    Replayed,
    Trigger,
    announced_barrier,
)
from streaming.adapters.kafka.control.transport import ControlTopic
from streaming.adapters.kafka.producer import append_markers, close_producer, producer
from streaming.adapters.snapshots import SnapshotStore, TaskCheckpointMetrics, TaskSnapshot
from streaming.adapters.snapshots.format import options_to_json, parse_stored, stored_name
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Pipeline
from streaming.api.settings import JobSettings
from streaming.engine import metrics
from streaming.engine.job.checkpoint_failures import CheckpointFailureTolerance
from streaming.errors import KafkaUnavailableError, ManifestNotWritten, ProgressNotLogged, RetentionFailed, StoreError

__all__ = [
    "CheckpointCompletion",
    "CompletionHooks",
    "CoordinatorStart",
    "CheckpointRecord",
    "CoordinatorIO",
    "CoordinatorService",
    "TaskReadiness",
    "kafka_io",
]

log = logging.getLogger(__name__)


@dataclass
class CheckpointRecord:
    """What the service saw of one checkpoint, for progress output and tests."""

    checkpoint_id: int
    generation: int
    triggered_at: float
    ingress_offsets: dict[str, int]
    # pending, then completed or aborted (never acknowledged: the manifest is written at once)
    status: CheckpointStatus = CheckpointStatus.PENDING
    reason: str = ""
    completed_at: float | None = None
    committed: set[str] = field(default_factory=set)
    # offsets recorded as channel state (unaligned): input not yet processed into state or output
    in_flight: int = 0
    # what the tasks' checkpoints turned out to be (aligned, unaligned, switched after a timeout, ...)
    kinds: tuple[CheckpointKind, ...] = ()
    # per task, once complete: what it measured (the manifest's metrics), and its snapshot (positions, ranges)
    tasks: dict[str, TaskCheckpointMetrics] = field(default_factory=dict)
    snapshots: dict[str, TaskSnapshot] = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        return None if self.completed_at is None else self.completed_at - self.triggered_at


@dataclass
class CoordinatorIO:
    """What the coordinator service talks to, given to it (as ``TaskIO`` is to
    a task): ``inject({channel: headers})`` appends a barrier to each ingress
    channel, each with its own headers, and returns the offset each got; ``publish`` and ``poll(timeout_s)``
    are the job's control topic."""

    inject: Callable[[Mapping[ChannelId, list[tuple[str, bytes]]]], Mapping[ChannelId, int]]
    publish: Callable[[ControlEvent], Any]
    poll: Callable[[float], list[ControlEvent]]
    close: Callable[[], None] = lambda: None


# how long the runner waits for Kafka to take a barrier or a control event: it supervises the
# job meanwhile, so it gives up soon (what it gave up on expires in the producer, never arrives late)
RUNNER_SEND_BOUND_S = 10.0


def kafka_io(
    kafka: KafkaAccess,
    key: JobKey,
    *,
    control_start: int | None = None,
    bound_s: float = RUNNER_SEND_BOUND_S,
    observe: Callable[[list[ControlEvent]], list[ControlEvent]] | None = None,
) -> CoordinatorIO:
    """The coordinator's I/O on Kafka for job ``key.job``: a producer for the
    barriers and the control topic (events signed with ``key``), read from
    ``control_start`` (None: from its end), each poll's events seen by
    ``observe`` first (the remote groups' membership); a send Kafka has not
    taken within ``bound_s`` is a ``KafkaUnavailableError``."""
    job = key.job
    barriers = producer(kafka, delivery_timeout_s=bound_s)
    control = ControlTopic(
        kafka,
        job,
        key,
        start_at=control_start or 0,
        delivery_timeout_s=bound_s,
        on_rejected=functools.partial(metrics.control_rejected, job, "runner"),
    )
    if control_start is None:
        control.seek_to_end()

    def close() -> None:
        close_producer(barriers, f"the barriers of job {job}")
        control.close()

    return CoordinatorIO(
        inject=lambda markers: append_markers(barriers, markers, bound_s),
        publish=control.publish,
        poll=control.poll if observe is None else lambda timeout_s: observe(control.poll(timeout_s)),
        close=close,
    )


@dataclass(frozen=True)
class CoordinatorStart:
    """Where a coordinator service starts: its generation, the id its first
    checkpoint takes, and the checkpoint a restore started from (``pinned``:
    retention never deletes it)."""

    generation: int = 0
    next_checkpoint_id: int = 1
    pinned: int | None = None


@dataclass(frozen=True)
class CompletionHooks:
    """What hears of every checkpoint that completes: ``on_complete`` with
    its id, and ``progress_log``, a JSON line each (None: neither)."""

    on_complete: Callable[[int], None] | None = None
    progress_log: Path | None = None


class TaskReadiness:
    """Where the tasks of this generation are, from their events: which run
    (``ready``; a checkpoint triggered before they all do would only wait),
    when each started and when it had replayed the channel state it
    restored, and how far each has read."""

    def __init__(self, tasks: Iterable[str], clock: Callable[[], float]):
        self.tasks = list(tasks)
        self.clock = clock
        # tasks of this generation whose queries run
        self.ready: set[str] = set()
        # when (clock) each task said it was ready, and when it had replayed its restored channel state
        self.ready_at: dict[str, float] = {}
        self.replayed_at: dict[str, float] = {}
        # records of restored channel state (offset ranges) each task said it had to read again
        self.replaying: dict[str, int] = {}
        # each task's latest position per input channel (its progress events)
        self.positions: dict[str, dict[str, int]] = {}
        # where each task's worker process serves its metrics (host:port), as its ready event says
        self.endpoints: dict[str, str] = {}

    @property
    def all_ready(self) -> bool:
        return self.ready >= set(self.tasks)

    @property
    def all_replayed(self) -> bool:
        """Every task is running and has processed the channel state it restored."""
        return set(self.replayed_at) >= set(self.tasks)

    def handle(self, event: Ready | Progress | Replayed) -> None:
        """A task of this generation said it runs, where it is, or that it replayed its channel state."""
        if isinstance(event, Ready):
            self.ready.add(event.task)
            self.ready_at[event.task] = self.clock()
            self.replaying[event.task] = event.replaying
            self.endpoints[event.task] = event.endpoint
            if not event.replaying:
                self.replayed_at[event.task] = self.ready_at[event.task]
        elif isinstance(event, Progress):
            self.positions[event.task] = dict(event.positions)
        else:
            self.replayed_at[event.task] = self.clock()
            log.info(
                f"{event.task}: restored channel state replayed ({event.records} records, "
                f"{event.seconds:.1f} s after the task started)"
            )


class CheckpointCompletion:
    """Completes a checkpoint every task acknowledged, in the steps
    ``complete`` lists: the manifest, the bookkeeping, the sinks' commit,
    its record, its progress line, retention.

    ``records`` are the service's (``CheckpointRecord`` by checkpoint id);
    ``abort(checkpoint_id, failure, detail)`` records an abort and publishes
    it; ``retain`` and ``pinned`` (the checkpoint a restore started from,
    never deleted) are retention's; ``hooks`` hear of each completion."""

    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        store: SnapshotStore,
        records: dict[int, CheckpointRecord],
        *,
        publish: Callable[[ControlEvent], Any],
        abort: Callable[[int, CheckpointFailure | None, str], None],
        retain: int,
        pinned: int | None = None,
        hooks: CompletionHooks | None = None,
    ):
        self.coordinator = coordinator
        self.store = store
        self.records = records
        self.publish = publish
        self.abort = abort
        self.retain = retain
        self.pinned = pinned
        hooks = hooks or CompletionHooks()
        self.on_complete = hooks.on_complete
        self.progress_log = hooks.progress_log

    @property
    def generation(self) -> int:
        return self.coordinator.generation

    def complete(self, checkpoint_id: int) -> None:
        """Complete checkpoint ``checkpoint_id``: every task acknowledged it.

        The steps, in this order:

        1. Write the manifest (``_write_manifest``): the tasks' snapshots, the
           options and the metrics.  From here on the checkpoint is complete.
           A ``ManifestNotWritten`` aborts it (a store failure, published to
           every task) and ends the completion: the job goes on.
        2. Complete it in the bookkeeping (``CheckpointCoordinator.complete``),
           which subsumes the older checkpoints still pending.
        3. Publish the abort of each subsumed one still pending here
           (``_abort_subsumed``).
        4. Publish ``complete``: the sinks commit their epochs.
        5. Record it (``_record``): status, time, channel state, kinds and each
           task's metrics, for progress output and for Prometheus
           (``metrics.checkpoint_completed``).
        6. Say it (``_say_complete``).
        7. Append its progress line (``_log_progress``); a ``ProgressNotLogged``
           is logged and nothing more.
        8. Call ``on_complete``.
        9. Apply retention (``_apply_retention``); a ``RetentionFailed`` is
           logged, and the next completion tries again.

        Steps 2, 3, 4 and 8 catch nothing: a failure to reach Kafka, or of the
        callback, reaches whoever polled."""
        pending = self.coordinator.pending[checkpoint_id]
        record = self.records.get(checkpoint_id)
        try:
            acked = self._write_manifest(pending, record)
        except ManifestNotWritten as exc:
            self.coordinator.abort(checkpoint_id, CheckpointFailure.STORE_FAILURE, str(exc))
            self.abort(checkpoint_id, CheckpointFailure.STORE_FAILURE, str(exc))
            return
        # the store applies retention in step 9 (it also sees orphaned parts the bookkeeping never knew)
        self.coordinator.complete(checkpoint_id)
        self._abort_subsumed()
        self.publish(Complete(checkpoint_id=checkpoint_id, generation=self.generation))
        if record:
            self._record(record, acked)
        metrics.checkpoint_completed(
            self.coordinator.job,
            checkpoint_id,
            pending.barrier.options,
            record.duration_s if record else None,
            acked.metrics,
        )
        self._say_complete(checkpoint_id, record)
        try:
            self._log_progress(checkpoint_id, pending.barrier, record, acked.metrics)
        except ProgressNotLogged as exc:
            log.warning("%s", exc)
        if self.on_complete is not None:
            self.on_complete(checkpoint_id)
        try:
            self._apply_retention(checkpoint_id)
        except RetentionFailed as exc:
            log.warning("%s", exc)

    def _write_manifest(self, pending: PendingCheckpoint, record: CheckpointRecord | None) -> _Acknowledged:
        """Step 1: the manifest of ``pending``, written; what the tasks
        acknowledged.  ``ManifestNotWritten`` when an acknowledgement holds no
        snapshot (a malformed one is refused when the event is read) or the store
        refuses the manifest."""
        snapshots = {}
        for task, ack in pending.acks.items():
            if ack.snapshot is None:
                raise ManifestNotWritten(f"manifest not written: the acknowledgement of task {task} holds no snapshot")
            snapshots[task] = ack.snapshot
        # per task: what it measured with its snapshot and of the upload
        metrics = {task: ack.metrics for task, ack in pending.acks.items()}
        acked = _Acknowledged(snapshots, metrics, _kinds(metrics.values()))
        try:
            self.store.write_manifest(
                pending.checkpoint_id,
                self.generation,
                snapshots,
                options=options_to_json(pending.barrier.options),
                metrics={
                    "ingress_barrier_offsets": record.ingress_offsets if record else {},
                    "trigger_to_complete_s": time.monotonic() - record.triggered_at if record else None,
                    "kinds": [stored_name(k) for k in acked.kinds],
                    "tasks": {task: measured.to_json() for task, measured in metrics.items()},
                },
            )
        except (StoreError, ValueError) as exc:
            raise ManifestNotWritten(f"manifest not written: {exc}") from exc
        return acked

    def _abort_subsumed(self) -> None:
        """Step 3: abort every checkpoint the completion subsumed that is still pending here."""
        for older in [a for a in self.coordinator.aborted if a.failure is CheckpointFailure.SUBSUMED]:
            if (
                older.checkpoint_id in self.records
                and self.records[older.checkpoint_id].status is CheckpointStatus.PENDING
            ):
                self.abort(older.checkpoint_id, older.failure, older.failure_detail)

    @staticmethod
    def _record(record: CheckpointRecord, acked: _Acknowledged) -> None:
        """Step 5: what the checkpoint turned out to be, on its record."""
        record.status, record.completed_at = CheckpointStatus.COMPLETED, time.monotonic()
        record.in_flight = sum(e - s for snap in acked.snapshots.values() for s, e in snap.in_flight.values())
        record.kinds = acked.kinds
        record.tasks = dict(acked.metrics)
        record.snapshots = dict(acked.snapshots)

    def _say_complete(self, checkpoint_id: int, record: CheckpointRecord | None) -> None:
        """Step 6: one line for a person: how long it took, what it turned out to be, its channel state."""
        if record is None:
            log.info(f"checkpoint {checkpoint_id} complete")
            return
        kinds = ", ".join(k.value for k in record.kinds)
        in_flight = f"; {record.in_flight} offsets in flight" if record.in_flight else ""
        log.info(f"checkpoint {checkpoint_id} complete in {record.duration_s:.2f} s ({kinds}{in_flight})")

    def _log_progress(
        self,
        checkpoint_id: int,
        barrier: Barrier,
        record: CheckpointRecord | None,
        task_metrics: Mapping[str, TaskCheckpointMetrics],
    ) -> None:
        """Step 7: one JSON line per completed checkpoint, its timings and
        every task's metrics (names, as the manifest stores them); a
        ``ProgressNotLogged`` when the file cannot take it."""
        if self.progress_log is None:
            return
        line = {
            "checkpoint": checkpoint_id,
            "generation": self.generation,
            "options": options_to_json(barrier.options),
            "trigger_to_complete_s": record.duration_s if record else None,
            "kinds": [stored_name(k) for k in record.kinds] if record else [],
            "in_flight_offsets": record.in_flight if record else 0,
            "tasks": {task: measured.to_json() for task, measured in task_metrics.items()},
        }
        try:
            with open(self.progress_log, "a") as log_file:
                log_file.write(json.dumps(line, sort_keys=True, default=str) + "\n")
        except OSError as exc:
            raise ProgressNotLogged(f"progress log {self.progress_log}: {exc}") from exc

    def _apply_retention(self, checkpoint_id: int) -> None:
        """Step 9: delete the checkpoints retention gives up (never the
        newest that verifies, which the store verifies once per complete
        checkpoint, nor the one a restore started from); ``RetentionFailed``
        when the store refuses."""
        try:
            deleted = self.store.apply_retention(self.retain, pinned=[self.pinned] if self.pinned else [])
        except StoreError as exc:
            raise RetentionFailed(
                f"checkpoint {checkpoint_id}: retention failed (will retry next time): {exc}"
            ) from exc
        if deleted:
            log.debug("retention deleted checkpoints %s", deleted)


class CoordinatorService:
    """Triggers checkpoints, collects acks and declines, aborts; completes a
    checkpoint through its ``completion`` (``CheckpointCompletion``) and
    follows the tasks through its ``readiness`` (``TaskReadiness``).

    ``settings`` gives the options barriers carry, how many checkpoints may be
    pending, the timeout and the retention; a restore passes the checkpoint it
    started from as ``pinned`` (retention never deletes it) and its generation."""

    def __init__(
        self,
        pipeline: Pipeline,
        io: CoordinatorIO,
        store: SnapshotStore,
        settings: JobSettings,
        *,
        start: CoordinatorStart | None = None,
        hooks: CompletionHooks | None = None,
        job_key: bytes | Unsigned,
        clock: Callable[[], float] = time.monotonic,
    ):
        start = start or CoordinatorStart()
        self.pipeline = pipeline
        self.io = io
        self.options = settings.options
        self.job_key = job_key
        tasks = pipeline.tasks()
        self.tasks = [t.name for t in tasks]
        self.sink_tasks = {t.name for t in tasks if pipeline.stage(t.stage).sink is not None}
        self.coordinator = CheckpointCoordinator(
            self.tasks,
            job=pipeline.job,
            generation=start.generation,
            next_checkpoint_id=start.next_checkpoint_id,
            max_concurrent=settings.max_concurrent,
            timeout_s=settings.timeout_s,
            retain=settings.retain,
            clock=clock,
        )
        self.records: dict[int, CheckpointRecord] = {}
        self.readiness = TaskReadiness(self.tasks, clock)
        self.clock = clock
        # when each task was last heard (a progress event of this generation, numbered higher than the
        # last read: a copy appended again is no news): its worker's liveness
        self.heard_at: dict[str, float] = {}
        self._progress_numbers: dict[str, int] = {}
        job = pipeline.job
        # failed checkpoints in a row: counted from 0 each generation, against the job's tolerable number
        self.failures = CheckpointFailureTolerance(lambda count: metrics.failed_in_a_row(job, count), clock)
        # how many of the runner's sends Kafka did not take (the runner's liveness reads it)
        self.kafka_troubles = 0
        self.tolerable_failed = settings.tolerable_failed_checkpoints
        metrics.failed_in_a_row(job, 0)
        metrics.tolerable_failed_checkpoints(job, self.tolerable_failed)
        self.completion = CheckpointCompletion(
            self.coordinator,
            store,
            self.records,
            publish=self._publish,
            abort=self._aborted,
            retain=settings.retain,
            pinned=start.pinned,
            hooks=hooks,
        )

    @property
    def generation(self) -> int:
        return self.coordinator.generation

    # ---- where the tasks are: the readiness's

    @property
    def all_ready(self) -> bool:
        return self.readiness.all_ready

    @property
    def all_replayed(self) -> bool:
        """Every task is running and has processed the channel state it restored."""
        return self.readiness.all_replayed

    @property
    def ready(self) -> set[str]:
        return self.readiness.ready

    @property
    def ready_at(self) -> dict[str, float]:
        return self.readiness.ready_at

    @property
    def replayed_at(self) -> dict[str, float]:
        return self.readiness.replayed_at

    @property
    def replaying(self) -> dict[str, int]:
        return self.readiness.replaying

    @property
    def positions(self) -> dict[str, dict[str, int]]:
        return self.readiness.positions

    # ---- trigger

    def trigger(self, options: CheckpointOptions | None = None) -> Barrier | None:
        """Inject barrier n into every ingress partition (None when too many are pending)."""
        if not self.coordinator.can_trigger():
            return None
        triggered_at = time.monotonic()  # the injection counts towards the checkpoint's time
        barrier = self.coordinator.trigger(options or self.options, timestamp_ms=int(time.time() * 1000))
        metrics.checkpoint_triggered(self.pipeline.job, barrier.options)
        markers = {c: encode(barrier, key=self.job_key, channel=c) for c in self.pipeline.ingress_channels()}
        try:
            offsets = self.io.inject(markers)
        except KafkaUnavailableError as exc:
            self.kafka_troubles += 1
            # some channels may hold the barrier: the abort lets the tasks that saw it go on
            self.records[barrier.checkpoint_id] = CheckpointRecord(
                barrier.checkpoint_id, barrier.generation, triggered_at, {}
            )
            self.coordinator.abort(barrier.checkpoint_id, CheckpointFailure.TRIGGER_FAILURE, str(exc))
            self._aborted(barrier.checkpoint_id, CheckpointFailure.TRIGGER_FAILURE, str(exc))
            return None
        by_channel = {str(c): o for c, o in offsets.items()}
        self.records[barrier.checkpoint_id] = CheckpointRecord(
            barrier.checkpoint_id, barrier.generation, triggered_at, by_channel
        )
        self._publish(
            Trigger(
                checkpoint_id=barrier.checkpoint_id,
                generation=self.generation,
                offsets=by_channel,
                barrier=announced_barrier(barrier),
            )
        )
        return barrier

    # ---- events

    def poll(self, timeout_s: float = 0.2) -> None:
        for event in self.io.poll(timeout_s):
            self.handle(event)
        for expired in self.coordinator.expire():
            self._aborted(expired.checkpoint_id, expired.failure, expired.failure_detail)
        metrics.pending(self.pipeline.job, len(self.coordinator.pending))

    def handle(self, event: ControlEvent) -> None:
        if not event.belongs_to(self.generation):
            return
        if isinstance(event, Progress) and event.task in self.readiness.tasks:
            if event.sequence <= self._progress_numbers.get(event.task, 0):
                return  # a copy of one read already (or unnumbered): neither news nor a sign of life
            self._progress_numbers[event.task] = event.sequence
            self.heard_at[event.task] = self.clock()
        elif isinstance(event, Ready) and event.task in self.readiness.tasks and event.task not in self.heard_at:
            # a task's first word: its silence counts from here until it says its progress (a Spark
            # application's first micro-batch may come more than the heartbeat timeout after launch);
            # a copy of a Ready read already is no sign of life
            self.heard_at[event.task] = self.clock()
        if isinstance(event, (Ready, Progress, Replayed)):
            self.readiness.handle(event)
        elif isinstance(event, Committed):
            record = self.records.get(event.checkpoint_id)
            if record is not None:
                record.committed.add(event.task)
        elif isinstance(event, Decline):
            declined = self.coordinator.decline(event.task, event.checkpoint_id, event.reason, event.detail)
            if isinstance(declined, PendingCheckpoint):
                self._aborted(event.checkpoint_id, declined.failure, declined.failure_detail)
        elif isinstance(event, Ack):
            acked = self.coordinator.acknowledge(event.task, event.checkpoint_id, event)
            if isinstance(acked, PendingCheckpoint):
                self.completion.complete(acked.checkpoint_id)
                latest = self.coordinator.completed.latest()
                if latest is not None and latest.checkpoint_id == acked.checkpoint_id:
                    self.failures.completed()

    def _aborted(self, checkpoint_id: int, failure: CheckpointFailure | None, detail: str) -> None:
        """Checkpoint ``checkpoint_id`` is aborted: on its record, to every task, and said."""
        record = self.records.get(checkpoint_id)
        if record is not None:
            record.status, record.reason = CheckpointStatus.ABORTED, f"{failure.value if failure else ''}: {detail}"
        metrics.checkpoint_aborted(self.pipeline.job, failure)
        log.info(f"checkpoint {checkpoint_id} aborted: {failure.value if failure else ''} ({detail})")
        self.failures.failed(checkpoint_id, failure, detail)
        self._publish(
            Abort(
                checkpoint_id=checkpoint_id,
                generation=self.generation,
                reason=failure or CheckpointFailure.USER,
                detail=detail,
                failed_in_a_row=self.failures.in_a_row,
                tolerable_failed_checkpoints=self.tolerable_failed,
            )
        )

    def _publish(self, event: ControlEvent) -> None:
        """Publish ``event`` on the control topic, giving up after the
        runner's bound (``kafka_io``) with a warning: the runner goes on
        supervising while Kafka is away, and what the tasks miss (an abort,
        a completion) a later event or a restore makes up for."""
        try:
            self.io.publish(event)
        except KafkaUnavailableError as exc:
            self.kafka_troubles += 1
            log.warning("%s; the job runner goes on", exc)

    # ---- queries

    def completed(self) -> list[CheckpointRecord]:
        return [r for r in self.records.values() if r.status is CheckpointStatus.COMPLETED]

    def latest_completed(self) -> CompletedCheckpoint | None:
        return self.coordinator.completed.latest()

    def abandon(self, failure: CheckpointFailure, detail: str) -> None:
        """The checkpoints still pending will never complete (the job restores):
        each is recorded and counted as aborted with ``failure``."""
        for checkpoint_id in sorted(self.coordinator.pending):
            record = self.records.get(checkpoint_id)
            if record is not None and record.status is not CheckpointStatus.COMPLETED:
                record.status, record.reason = CheckpointStatus.ABORTED, f"{failure.value}: {detail}"
            metrics.checkpoint_aborted(self.pipeline.job, failure)
        metrics.pending(self.pipeline.job, 0)

    def close(self) -> None:
        self.io.close()


@dataclass(frozen=True)
class _Acknowledged:
    """What the tasks acknowledged of one checkpoint: each one's snapshot,
    what it measured (with its snapshot and after, the upload) and the kinds
    their checkpoints turned out to be."""

    snapshots: dict[str, TaskSnapshot]
    metrics: dict[str, TaskCheckpointMetrics]
    kinds: tuple[CheckpointKind, ...]


def _kinds(metrics: Iterable[TaskCheckpointMetrics]) -> tuple[CheckpointKind, ...]:
    """The kinds the tasks' metrics name, in ``CheckpointKind`` order (a
    kind no member names is left out)."""
    named = set()
    for measured in metrics:
        try:
            named.add(parse_stored(CheckpointKind, measured.kind))
        except ValueError:
            pass
    return tuple(k for k in CheckpointKind if k in named)
