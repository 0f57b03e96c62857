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
still speak)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kafka import KafkaProducer

from barriers.coordinator import CheckpointCoordinator, CompletedCheckpoint, PendingCheckpoint
from barriers.failures import CheckpointFailure
from barriers.messages import Alignment, Barrier, CheckpointOptions, encode
from streaming.errors import StoreError
from streaming.kafka_io import ControlEvent, ControlTopic, append_markers
from streaming.pipeline import Pipeline
from streaming.snapshots import SnapshotStore, TaskSnapshot
from streaming.task import announced_barrier

__all__ = ["CoordinatorService", "CheckpointRecord"]

log = logging.getLogger(__name__)


@dataclass
class CheckpointRecord:
    """What the service saw of one checkpoint, for progress output and tests."""

    checkpoint_id: int
    generation: int
    triggered_at: float
    ingress_offsets: dict[str, int]
    status: str = "pending"
    reason: str = ""
    completed_at: float | None = None
    committed: set[str] = field(default_factory=set)
    # offsets recorded as channel state (unaligned): input not yet processed into state or output
    in_flight: int = 0
    # what the tasks' checkpoints turned out to be (aligned, unaligned, switched after a timeout, ...)
    kinds: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float | None:
        return None if self.completed_at is None else self.completed_at - self.triggered_at


class CoordinatorService:
    """Triggers checkpoints, collects acks, writes manifests, applies retention."""

    def __init__(self, pipeline: Pipeline, bootstrap: str, store: SnapshotStore, *,
                 options: CheckpointOptions | None = None, generation: int = 0, next_checkpoint_id: int = 1,
                 max_concurrent: int = 1, timeout_s: float = 60.0, retain: int = 3,
                 pinned: int | None = None, job_key: bytes | None = None,
                 on_event: Callable[[str], None] = lambda line: None, control_start: int | None = None,
                 on_complete: Callable[[int], None] | None = None, progress_log: Path | None = None):
        self.pipeline = pipeline
        self.store = store
        self.options = options or CheckpointOptions.aligned()
        self.job_key = job_key
        self.say = on_event
        self.on_complete = on_complete
        self.progress_log = progress_log
        self.tasks = [t.name for t in pipeline.tasks()]
        self.sink_tasks = {t.name for t in pipeline.tasks() if pipeline.stage(t.stage).sink is not None}
        self.coordinator = CheckpointCoordinator(self.tasks, job=pipeline.job, generation=generation,
                                                 next_checkpoint_id=next_checkpoint_id,
                                                 max_concurrent=max_concurrent, timeout_s=timeout_s,
                                                 retain=retain)
        self.retain = retain
        self.pinned = pinned
        self.records: dict[int, CheckpointRecord] = {}
        # tasks of this generation whose queries run (a checkpoint before that would only wait)
        self.ready: set[str] = set()
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
        self.control = ControlTopic(bootstrap, pipeline.job, start_at=control_start or 0)
        if control_start is None:
            self.control.seek_to_end()

    @property
    def generation(self) -> int:
        return self.coordinator.generation

    @property
    def all_ready(self) -> bool:
        return self.ready >= set(self.tasks)

    # ---- trigger

    def trigger(self, options: CheckpointOptions | None = None) -> Barrier | None:
        """Inject barrier n into every ingress partition (None when too many are pending)."""
        if not self.coordinator.can_trigger():
            return None
        triggered_at = time.monotonic()  # the injection counts towards the checkpoint's time
        barrier = self.coordinator.trigger(options or self.options, timestamp_ms=int(time.time() * 1000))
        headers = encode(barrier, key=self.job_key)
        offsets = append_markers(self._producer, self.pipeline.ingress_channels(), headers)
        by_channel = {str(c): o for c, o in offsets.items()}
        self.records[barrier.checkpoint_id] = CheckpointRecord(barrier.checkpoint_id, barrier.generation,
                                                               triggered_at, by_channel)
        self.control.publish(ControlEvent("trigger", barrier.checkpoint_id, "",
                                          {"generation": self.generation, "offsets": by_channel,
                                           "barrier": announced_barrier(headers)}))
        return barrier

    # ---- events

    def poll(self, timeout_s: float = 0.2) -> None:
        for event in self.control.poll(timeout_s):
            self.handle(event)
        for expired in self.coordinator.expire():
            self._aborted(expired.checkpoint_id, expired.failure, expired.failure_detail)

    def handle(self, event: ControlEvent) -> None:
        if event.payload.get("generation") != self.generation or event.kind in ("trigger", "announce", "abort",
                                                                                 "complete"):
            return
        if event.kind == "ready":
            self.ready.add(event.task)
            return
        if event.kind == "committed":
            record = self.records.get(event.checkpoint_id)
            if record is not None:
                record.committed.add(event.task)
            return
        if event.kind == "decline":
            result = self.coordinator.decline(event.task, event.checkpoint_id,
                                              _failure(event.payload.get("reason")), str(event.payload.get("detail", "")))
            if isinstance(result, PendingCheckpoint):
                self._aborted(event.checkpoint_id, result.failure, result.failure_detail)
            return
        if event.kind == "ack":
            result = self.coordinator.acknowledge(event.task, event.checkpoint_id, dict(event.payload))
            if isinstance(result, PendingCheckpoint):
                self._complete(result.checkpoint_id)

    def _complete(self, checkpoint_id: int) -> None:
        pending = self.coordinator.pending[checkpoint_id]
        record = self.records.get(checkpoint_id)
        try:
            snapshots = {task: TaskSnapshot.from_json(json.dumps(ack.get("snapshot")))
                         for task, ack in pending.acks.items()}
            # per task: what it wrote with its snapshot, and what it measured after (the upload)
            task_metrics = {task: {**snapshots[task].metadata, **(ack.get("metrics") or {})}
                            for task, ack in pending.acks.items()}
            options = pending.barrier.options
            kinds = tuple(sorted({m.get("kind", "") for m in task_metrics.values()}))
            self.store.write_manifest(
                checkpoint_id, self.generation, snapshots,
                options={"alignment": options.describe(), "in_flight": options.in_flight.value,
                         "guarantee": _GUARANTEE[options.alignment]},
                metrics={"ingress_barrier_offsets": record.ingress_offsets if record else {},
                         "trigger_to_complete_s": time.monotonic() - record.triggered_at if record else None,
                         "kinds": list(kinds),
                         "tasks": task_metrics})
        except (StoreError, ValueError) as exc:
            self.coordinator.abort(checkpoint_id, CheckpointFailure.STORE_FAILURE, f"manifest not written: {exc}")
            self._aborted(checkpoint_id, CheckpointFailure.STORE_FAILURE, f"manifest not written: {exc}")
            return
        # the store applies retention below (it also sees orphaned parts the bookkeeping never knew)
        self.coordinator.complete(checkpoint_id)
        for older in [a for a in self.coordinator.aborted if a.failure is CheckpointFailure.SUBSUMED]:
            if older.checkpoint_id in self.records and self.records[older.checkpoint_id].status == "pending":
                self._aborted(older.checkpoint_id, older.failure, older.failure_detail)
        self.control.publish(ControlEvent("complete", checkpoint_id, "", {"generation": self.generation}))
        if record:
            record.status, record.completed_at = "completed", time.monotonic()
            record.in_flight = sum(e - s for snap in snapshots.values() for s, e in snap.in_flight.values())
            record.kinds = kinds
        in_flight = f"; {record.in_flight} offsets in flight" if record and record.in_flight else ""
        self.say(f"checkpoint {checkpoint_id} complete in {record.duration_s:.2f} s ({', '.join(kinds)}{in_flight})"
                 if record else f"checkpoint {checkpoint_id} complete")
        self._log_progress(checkpoint_id, pending.barrier, record, task_metrics)
        if self.on_complete is not None:
            self.on_complete(checkpoint_id)
        try:
            deleted = self.store.apply_retention(self.retain, pinned=[self.pinned] if self.pinned else [])
            if deleted:
                log.info("retention deleted checkpoints %s", deleted)
        except StoreError as exc:
            log.warning("checkpoint %d: retention failed (will retry next time): %s", checkpoint_id, exc)

    def _log_progress(self, checkpoint_id: int, barrier: Barrier, record: CheckpointRecord | None,
                      task_metrics: dict) -> None:
        """One JSON line per completed checkpoint: its timings and every task's metrics."""
        if self.progress_log is None:
            return
        line = {"checkpoint": checkpoint_id, "generation": self.generation, "options": barrier.options.describe(),
                "trigger_to_complete_s": record.duration_s if record else None,
                "kinds": list(record.kinds) if record else [], "in_flight_offsets": record.in_flight if record else 0,
                "tasks": task_metrics}
        try:
            with open(self.progress_log, "a") as log_file:
                log_file.write(json.dumps(line, sort_keys=True, default=str) + "\n")
        except OSError as exc:
            log.warning("progress log %s: %s", self.progress_log, exc)

    def _aborted(self, checkpoint_id: int, failure: CheckpointFailure | None, detail: str) -> None:
        record = self.records.get(checkpoint_id)
        if record is not None:
            record.status, record.reason = "aborted", f"{failure.value if failure else ''}: {detail}"
        self.control.publish(ControlEvent("abort", checkpoint_id, "", {
            "generation": self.generation, "reason": failure.name if failure else "USER", "detail": detail}))
        self.say(f"checkpoint {checkpoint_id} aborted: {failure.value if failure else ''} ({detail})")

    # ---- queries

    def completed(self) -> list[CheckpointRecord]:
        return [r for r in self.records.values() if r.status == "completed"]

    def latest_completed(self) -> CompletedCheckpoint | None:
        return self.coordinator.completed.latest()

    def close(self) -> None:
        self._producer.close()
        self.control.close()


_GUARANTEE = {
    Alignment.ALIGNED: "exactly-once",
    Alignment.UNALIGNED: "exactly-once (in-flight records are channel state, replayed on restore)",
    Alignment.AT_LEAST_ONCE: "at-least-once: no alignment, so replay after a restore may duplicate records",
}


def _failure(name: object) -> CheckpointFailure:
    try:
        return CheckpointFailure[str(name)]
    except KeyError:
        return CheckpointFailure.DECLINED
