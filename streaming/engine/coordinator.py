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
  tells the sinks to commit, and retention deletes what it gives up (never a
  checkpoint pinned by a restore).  A manifest that cannot be written aborts
  the checkpoint; the job goes on.

Events of other generations are ignored (a task of the run that failed may
still speak).

The service reaches Kafka only through a ``CoordinatorIO`` (``kafka_io``
makes the real one), so its logic runs in unit tests on an in-memory one."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from barriers.coordinator import CheckpointCoordinator, CheckpointStatus, CompletedCheckpoint, PendingCheckpoint
from barriers.failures import CheckpointFailure
from barriers.messages import Alignment, Barrier, ChannelId, CheckpointOptions, encode
from streaming.adapters.control import ControlEvent, ControlKind, ControlTopic, announced_barrier
from streaming.adapters.kafka_io import append_markers, producer
from streaming.adapters.snapshots import SnapshotStore, TaskSnapshot
from streaming.api.pipeline import Pipeline
from streaming.api.settings import JobSettings
from streaming.errors import StoreError

__all__ = ["CoordinatorService", "CoordinatorIO", "CheckpointRecord", "kafka_io"]

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
    kinds: tuple[str, ...] = ()
    # per task, once complete: what it measured (the manifest's metrics), its positions and in-flight ranges
    tasks: dict[str, dict] = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        return None if self.completed_at is None else self.completed_at - self.triggered_at


@dataclass
class CoordinatorIO:
    """What the coordinator service talks to, given to it (as ``TaskIO`` is to
    a task): ``inject(channels, headers)`` appends a barrier to each ingress
    channel and returns the offset each got; ``publish`` and ``poll(timeout_s)``
    are the job's control topic."""

    inject: Callable[[Sequence[ChannelId], list[tuple[str, bytes]]], Mapping[ChannelId, int]]
    publish: Callable[[ControlEvent], Any]
    poll: Callable[[float], list[ControlEvent]]
    close: Callable[[], None] = lambda: None


def kafka_io(bootstrap: str, job: str, *, control_start: int | None = None) -> CoordinatorIO:
    """The coordinator's I/O on Kafka: a producer for the barriers and the
    control topic, read from ``control_start`` (None: from its end)."""
    barriers = producer(bootstrap)
    control = ControlTopic(bootstrap, job, start_at=control_start or 0)
    if control_start is None:
        control.seek_to_end()

    def close() -> None:
        barriers.close()
        control.close()

    return CoordinatorIO(
        inject=lambda channels, headers: append_markers(barriers, channels, headers),
        publish=control.publish,
        poll=control.poll,
        close=close,
    )


class CoordinatorService:
    """Triggers checkpoints, collects acks, writes manifests, applies retention.

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
        generation: int = 0,
        next_checkpoint_id: int = 1,
        pinned: int | None = None,
        job_key: bytes | None = None,
        on_event: Callable[[str], None] = lambda line: None,
        on_complete: Callable[[int], None] | None = None,
        progress_log: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.pipeline = pipeline
        self.io = io
        self.store = store
        self.options = settings.options
        self.job_key = job_key
        self.say = on_event
        self.on_complete = on_complete
        self.progress_log = progress_log
        tasks = pipeline.tasks()
        self.tasks = [t.name for t in tasks]
        self.sink_tasks = {t.name for t in tasks if pipeline.stage(t.stage).sink is not None}
        self.coordinator = CheckpointCoordinator(
            self.tasks,
            job=pipeline.job,
            generation=generation,
            next_checkpoint_id=next_checkpoint_id,
            max_concurrent=settings.max_concurrent,
            timeout_s=settings.timeout_s,
            retain=settings.retain,
            clock=clock,
        )
        self.retain = settings.retain
        self.pinned = pinned
        self.records: dict[int, CheckpointRecord] = {}
        # tasks of this generation whose queries run (a checkpoint before that would only wait)
        self.ready: set[str] = set()
        # when (clock) each task said it was ready, and when it had replayed its restored channel state
        self.clock = clock
        self.ready_at: dict[str, float] = {}
        self.replayed_at: dict[str, float] = {}
        # records of restored channel state (offset ranges) each task said it had to read again
        self.replaying: dict[str, int] = {}
        # each task's latest position per input channel (its progress events)
        self.positions: dict[str, dict[str, int]] = {}

    @property
    def generation(self) -> int:
        return self.coordinator.generation

    @property
    def all_ready(self) -> bool:
        return self.ready >= set(self.tasks)

    @property
    def all_replayed(self) -> bool:
        """Every task is running and has processed the channel state it restored."""
        return set(self.replayed_at) >= set(self.tasks)

    # ---- trigger

    def trigger(self, options: CheckpointOptions | None = None) -> Barrier | None:
        """Inject barrier n into every ingress partition (None when too many are pending)."""
        if not self.coordinator.can_trigger():
            return None
        triggered_at = time.monotonic()  # the injection counts towards the checkpoint's time
        barrier = self.coordinator.trigger(options or self.options, timestamp_ms=int(time.time() * 1000))
        headers = encode(barrier, key=self.job_key)
        offsets = self.io.inject(self.pipeline.ingress_channels(), headers)
        by_channel = {str(c): o for c, o in offsets.items()}
        self.records[barrier.checkpoint_id] = CheckpointRecord(
            barrier.checkpoint_id, barrier.generation, triggered_at, by_channel
        )
        self.io.publish(
            ControlEvent(
                ControlKind.TRIGGER,
                barrier.checkpoint_id,
                "",
                {"generation": self.generation, "offsets": by_channel, "barrier": announced_barrier(headers)},
            )
        )
        return barrier

    # ---- events

    def poll(self, timeout_s: float = 0.2) -> None:
        for event in self.io.poll(timeout_s):
            self.handle(event)
        for expired in self.coordinator.expire():
            self._aborted(expired.checkpoint_id, expired.failure, expired.failure_detail)

    def handle(self, event: ControlEvent) -> None:
        if event.payload.get("generation") != self.generation:
            return
        if event.kind is ControlKind.READY:
            self.ready.add(event.task)
            self.ready_at[event.task] = self.clock()
            self.replaying[event.task] = int(event.payload.get("replaying") or 0)
            if not event.payload.get("replaying"):
                self.replayed_at[event.task] = self.ready_at[event.task]
            return
        if event.kind is ControlKind.PROGRESS:
            self.positions[event.task] = dict(event.payload.get("positions") or {})
            return
        if event.kind is ControlKind.REPLAYED:
            self.replayed_at[event.task] = self.clock()
            self.say(
                f"{event.task}: restored channel state replayed ({event.payload.get('records')} records, "
                f"{float(event.payload.get('seconds') or 0):.1f} s after the task started)"
            )
            return
        if event.kind is ControlKind.COMMITTED:
            record = self.records.get(event.checkpoint_id)
            if record is not None:
                record.committed.add(event.task)
            return
        if event.kind is ControlKind.DECLINE:
            result = self.coordinator.decline(
                event.task,
                event.checkpoint_id,
                CheckpointFailure.parse(event.payload.get("reason")),
                str(event.payload.get("detail", "")),
            )
            if isinstance(result, PendingCheckpoint):
                self._aborted(event.checkpoint_id, result.failure, result.failure_detail)
            return
        if event.kind is ControlKind.ACK:
            result = self.coordinator.acknowledge(event.task, event.checkpoint_id, dict(event.payload))
            if isinstance(result, PendingCheckpoint):
                self._complete(result.checkpoint_id)

    def _complete(self, checkpoint_id: int) -> None:
        pending = self.coordinator.pending[checkpoint_id]
        record = self.records.get(checkpoint_id)
        try:
            snapshots = {
                task: TaskSnapshot.from_json(json.dumps(ack.get("snapshot"))) for task, ack in pending.acks.items()
            }
            # per task: what it wrote with its snapshot, and what it measured after (the upload)
            task_metrics = {
                task: {**snapshots[task].metadata, **(ack.get("metrics") or {})} for task, ack in pending.acks.items()
            }
            options = pending.barrier.options
            kinds = tuple(sorted({m.get("kind", "") for m in task_metrics.values()}))
            self.store.write_manifest(
                checkpoint_id,
                self.generation,
                snapshots,
                options={
                    "alignment": options.describe(),
                    "in_flight": options.in_flight.value,
                    "guarantee": _GUARANTEE[options.alignment],
                },
                metrics={
                    "ingress_barrier_offsets": record.ingress_offsets if record else {},
                    "trigger_to_complete_s": time.monotonic() - record.triggered_at if record else None,
                    "kinds": list(kinds),
                    "tasks": task_metrics,
                },
            )
        except (StoreError, ValueError) as exc:
            self.coordinator.abort(checkpoint_id, CheckpointFailure.STORE_FAILURE, f"manifest not written: {exc}")
            self._aborted(checkpoint_id, CheckpointFailure.STORE_FAILURE, f"manifest not written: {exc}")
            return
        # the store applies retention below (it also sees orphaned parts the bookkeeping never knew)
        self.coordinator.complete(checkpoint_id)
        for older in [a for a in self.coordinator.aborted if a.failure is CheckpointFailure.SUBSUMED]:
            if (
                older.checkpoint_id in self.records
                and self.records[older.checkpoint_id].status is CheckpointStatus.PENDING
            ):
                self._aborted(older.checkpoint_id, older.failure, older.failure_detail)
        self.io.publish(ControlEvent(ControlKind.COMPLETE, checkpoint_id, "", {"generation": self.generation}))
        if record:
            record.status, record.completed_at = CheckpointStatus.COMPLETED, time.monotonic()
            record.in_flight = sum(e - s for snap in snapshots.values() for s, e in snap.in_flight.values())
            record.kinds = kinds
            record.tasks = {
                task: {
                    **task_metrics[task],
                    "positions": dict(snapshot.positions),
                    "in_flight": {c: list(r) for c, r in snapshot.in_flight.items()},
                }
                for task, snapshot in snapshots.items()
            }
        in_flight = f"; {record.in_flight} offsets in flight" if record and record.in_flight else ""
        self.say(
            f"checkpoint {checkpoint_id} complete in {record.duration_s:.2f} s ({', '.join(kinds)}{in_flight})"
            if record
            else f"checkpoint {checkpoint_id} complete"
        )
        self._log_progress(checkpoint_id, pending.barrier, record, task_metrics)
        if self.on_complete is not None:
            self.on_complete(checkpoint_id)
        try:
            deleted = self.store.apply_retention(self.retain, pinned=[self.pinned] if self.pinned else [])
            if deleted:
                log.info("retention deleted checkpoints %s", deleted)
        except StoreError as exc:
            log.warning("checkpoint %d: retention failed (will retry next time): %s", checkpoint_id, exc)

    def _log_progress(
        self, checkpoint_id: int, barrier: Barrier, record: CheckpointRecord | None, task_metrics: dict
    ) -> None:
        """One JSON line per completed checkpoint: its timings and every task's metrics."""
        if self.progress_log is None:
            return
        line = {
            "checkpoint": checkpoint_id,
            "generation": self.generation,
            "options": barrier.options.describe(),
            "trigger_to_complete_s": record.duration_s if record else None,
            "kinds": list(record.kinds) if record else [],
            "in_flight_offsets": record.in_flight if record else 0,
            "tasks": task_metrics,
        }
        try:
            with open(self.progress_log, "a") as log_file:
                log_file.write(json.dumps(line, sort_keys=True, default=str) + "\n")
        except OSError as exc:
            log.warning("progress log %s: %s", self.progress_log, exc)

    def _aborted(self, checkpoint_id: int, failure: CheckpointFailure | None, detail: str) -> None:
        record = self.records.get(checkpoint_id)
        if record is not None:
            record.status, record.reason = CheckpointStatus.ABORTED, f"{failure.value if failure else ''}: {detail}"
        self.io.publish(
            ControlEvent(
                ControlKind.ABORT,
                checkpoint_id,
                "",
                {"generation": self.generation, "reason": failure.name if failure else "USER", "detail": detail},
            )
        )
        self.say(f"checkpoint {checkpoint_id} aborted: {failure.value if failure else ''} ({detail})")

    # ---- queries

    def completed(self) -> list[CheckpointRecord]:
        return [r for r in self.records.values() if r.status is CheckpointStatus.COMPLETED]

    def latest_completed(self) -> CompletedCheckpoint | None:
        return self.coordinator.completed.latest()

    def close(self) -> None:
        self.io.close()


_GUARANTEE = {
    Alignment.ALIGNED: "exactly-once",
    Alignment.UNALIGNED: "exactly-once (in-flight records are channel state, replayed on restore)",
    Alignment.AT_LEAST_ONCE: "at-least-once: no alignment, so replay after a restore may duplicate records",
}
