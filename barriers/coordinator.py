"""The coordinator's bookkeeping: which checkpoints are pending, which tasks
acknowledged them, when they complete or are aborted and why, which completed
ones are retained, and the generations restores start.

No I/O: the coordinator service in ``streaming/`` sends the barriers, reads
the acks, writes the manifest and deletes what retention gives up.  The
lifecycle of a checkpoint (``CheckpointStatus``)::

    PENDING --(every task acknowledged)--> ACKNOWLEDGED --(manifest written)--> COMPLETED
       \\_________________________ ABORTED (with a CheckpointFailure) ___/

Checkpoint ids only ever grow, across generations too, so a barrier id never
means two different cuts."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from barriers.errors import CoordinatorError
from barriers.failures import CheckpointFailure
from barriers.messages import Barrier, CheckpointOptions

__all__ = [
    "CheckpointStatus",
    "PendingCheckpoint",
    "CompletedCheckpoint",
    "CompletedCheckpointStore",
    "CheckpointCoordinator",
    "CoordinatorError",
    "AckIgnored",
    "AckIgnoreReason",
]

log = logging.getLogger(__name__)


class CheckpointStatus(enum.StrEnum):
    PENDING = "pending"
    ACKNOWLEDGED = "acknowledged"
    COMPLETED = "completed"
    ABORTED = "aborted"


_NEXT = {
    CheckpointStatus.PENDING: {CheckpointStatus.ACKNOWLEDGED, CheckpointStatus.ABORTED},
    CheckpointStatus.ACKNOWLEDGED: {CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED},
    CheckpointStatus.COMPLETED: set(),
    CheckpointStatus.ABORTED: set(),
}


class AckIgnoreReason(enum.StrEnum):
    """Why the coordinator did not count an acknowledgement or decline."""

    NOT_A_TASK = "not a task of this job"
    NEVER_TRIGGERED = "never triggered"
    NO_LONGER_PENDING = "no longer pending (completed, aborted or of an older run)"
    ALREADY_ACKNOWLEDGED = "already acknowledged"
    ALREADY_COMPLETED = "already completed"
    ALREADY_ABORTED = "already aborted"
    DUPLICATE = "duplicate acknowledgement"


@dataclass(frozen=True, slots=True)
class AckIgnored:
    """An acknowledgement or decline the coordinator did not count, and why."""

    task: str
    checkpoint_id: int
    reason: AckIgnoreReason

    def __str__(self) -> str:
        return f"checkpoint {self.checkpoint_id}: message from task {self.task!r} ignored: {self.reason}"


@dataclass(slots=True)
class PendingCheckpoint:
    """Checkpoint n from its trigger until it completes or is aborted."""

    barrier: Barrier
    tasks: frozenset[str]
    triggered_at: float
    acks: dict[str, Any] = field(default_factory=dict)
    status: CheckpointStatus = CheckpointStatus.PENDING
    failure: CheckpointFailure | None = None
    failure_detail: str = ""

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    @property
    def missing(self) -> frozenset[str]:
        return self.tasks - set(self.acks)

    def move_to(self, status: CheckpointStatus) -> None:
        if status not in _NEXT[self.status]:
            raise CoordinatorError(
                f"checkpoint {self.checkpoint_id}: cannot go from {self.status.value} to {status.value}"
            )
        self.status = status


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    """A checkpoint with a manifest: every task's ack, kept for restores."""

    barrier: Barrier
    acks: Mapping[str, Any]
    triggered_at: float
    completed_at: float

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    @property
    def generation(self) -> int:
        return self.barrier.generation


class CompletedCheckpointStore:
    """The last ``retain`` completed checkpoints; older ones are given up for
    deletion unless pinned (a restore is reading them)."""

    def __init__(self, retain: int = 3):
        if retain < 1:
            raise ValueError(f"retain must be at least 1, got {retain}")
        self.retain = retain
        self._completed: dict[int, CompletedCheckpoint] = {}
        self._pinned: set[int] = set()

    def add(self, checkpoint: CompletedCheckpoint) -> list[int]:
        """Keep ``checkpoint``; return the ids that retention now gives up."""
        self._completed[checkpoint.checkpoint_id] = checkpoint
        return self._trim()

    def pin(self, checkpoint_id: int) -> None:
        self._pinned.add(checkpoint_id)

    def unpin(self, checkpoint_id: int) -> list[int]:
        self._pinned.discard(checkpoint_id)
        return self._trim()

    @property
    def pinned(self) -> frozenset[int]:
        return frozenset(self._pinned)

    @property
    def ids(self) -> list[int]:
        return sorted(self._completed)

    def latest(self) -> CompletedCheckpoint | None:
        return self._completed[max(self._completed)] if self._completed else None

    def get(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        return self._completed.get(checkpoint_id)

    def _trim(self) -> list[int]:
        keep = set(sorted(self._completed)[-self.retain :]) | self._pinned
        dropped = sorted(cid for cid in self._completed if cid not in keep)
        for cid in dropped:
            del self._completed[cid]
        return dropped


class CheckpointCoordinator:
    """Bookkeeping of a job's checkpoints.

    ``tasks``: the names of the tasks that must acknowledge every checkpoint;
    ``max_concurrent``: pending checkpoints allowed at once (a trigger beyond
    it is refused); ``timeout_s``: a pending checkpoint older than this is
    aborted by ``expire()``; ``retain``: completed checkpoints kept;
    ``next_checkpoint_id`` / ``generation``: where a restarted job goes on."""

    def __init__(
        self,
        tasks: Iterable[str],
        *,
        job: str = "",
        generation: int = 0,
        next_checkpoint_id: int = 1,
        max_concurrent: int = 1,
        timeout_s: float = 60.0,
        retain: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.tasks = frozenset(tasks)
        if not self.tasks:
            raise ValueError("a coordinator needs at least one task")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.job = job
        self.generation = generation
        self.max_concurrent = max_concurrent
        self.timeout_s = timeout_s
        self.clock = clock
        self.completed = CompletedCheckpointStore(retain)
        self.pending: dict[int, PendingCheckpoint] = {}
        self.aborted: list[PendingCheckpoint] = []
        self.ignored: list[AckIgnored] = []
        self._next_id = next_checkpoint_id

    @property
    def next_checkpoint_id(self) -> int:
        return self._next_id

    # ---- trigger

    def can_trigger(self) -> bool:
        return len(self.pending) < self.max_concurrent

    def trigger(self, options: CheckpointOptions | None = None, *, timestamp_ms: int = 0) -> Barrier:
        """The barrier of a new checkpoint, now pending."""
        if not self.can_trigger():
            raise CoordinatorError(
                f"checkpoint {self._next_id} not triggered: {len(self.pending)} pending "
                f"(max_concurrent={self.max_concurrent}): {sorted(self.pending)}"
            )
        barrier = Barrier(
            self._next_id, self.generation, options or CheckpointOptions.aligned(), timestamp_ms, self.job
        )
        self._next_id += 1
        self.pending[barrier.checkpoint_id] = PendingCheckpoint(barrier, self.tasks, self.clock())
        log.info("checkpoint %d: triggered (%s)", barrier.checkpoint_id, barrier.options.describe())
        return barrier

    # ---- acks and declines

    def acknowledge(self, task: str, checkpoint_id: int, payload: Any = None) -> PendingCheckpoint | AckIgnored | None:
        """Count ``task``'s ack.  Returns the checkpoint once every task
        acknowledged it (its manifest can be written), None while acks are
        missing, an ``AckIgnored`` when the ack does not count."""
        pending = self._addressed(task, checkpoint_id)
        if isinstance(pending, AckIgnored):
            return pending
        if task in pending.acks:
            return self._ignore(task, checkpoint_id, AckIgnoreReason.DUPLICATE)
        pending.acks[task] = payload
        if pending.missing:
            return None
        pending.move_to(CheckpointStatus.ACKNOWLEDGED)
        log.info("checkpoint %d: acknowledged by all %d tasks", checkpoint_id, len(self.tasks))
        return pending

    def decline(
        self, task: str, checkpoint_id: int, reason: CheckpointFailure = CheckpointFailure.DECLINED, detail: str = ""
    ) -> PendingCheckpoint | AckIgnored:
        """``task`` cannot take checkpoint n: abort it."""
        pending = self._addressed(task, checkpoint_id)
        if isinstance(pending, AckIgnored):
            return pending
        return self.abort(checkpoint_id, reason, f"task {task}: {detail}" if detail else f"task {task}")

    def complete(self, checkpoint_id: int) -> tuple[CompletedCheckpoint, list[int]]:
        """The manifest of checkpoint n is written: it is complete.  Returns it
        and the ids retention gives up (to delete).  Older pending
        checkpoints are subsumed."""
        pending = self.pending.get(checkpoint_id)
        if pending is None or pending.status is not CheckpointStatus.ACKNOWLEDGED:
            state = pending.status.value if pending else "not pending"
            raise CoordinatorError(f"checkpoint {checkpoint_id} cannot complete: it is {state}")
        pending.move_to(CheckpointStatus.COMPLETED)
        del self.pending[checkpoint_id]
        done = CompletedCheckpoint(pending.barrier, dict(pending.acks), pending.triggered_at, self.clock())
        for older in sorted(cid for cid in self.pending if cid < checkpoint_id):
            self.abort(older, CheckpointFailure.SUBSUMED, f"checkpoint {checkpoint_id} completed first")
        dropped = self.completed.add(done)
        log.info("checkpoint %d: completed in %.3f s", checkpoint_id, done.completed_at - done.triggered_at)
        return done, dropped

    def abort(self, checkpoint_id: int, reason: CheckpointFailure, detail: str = "") -> PendingCheckpoint:
        pending = self.pending.pop(checkpoint_id, None)
        if pending is None:
            raise CoordinatorError(f"checkpoint {checkpoint_id} cannot be aborted: it is not pending")
        pending.move_to(CheckpointStatus.ABORTED)
        pending.failure, pending.failure_detail = reason, detail
        self.aborted.append(pending)
        log.warning("checkpoint %d: aborted: %s%s", checkpoint_id, reason.value, f" ({detail})" if detail else "")
        return pending

    def expire(self) -> list[PendingCheckpoint]:
        """Abort the pending checkpoints older than the timeout."""
        now = self.clock()
        late = [cid for cid, p in self.pending.items() if now - p.triggered_at >= self.timeout_s]
        return [
            self.abort(
                cid,
                CheckpointFailure.TIMEOUT,
                f"missing acks from {sorted(self.pending[cid].missing)} after {self.timeout_s:g} s",
            )
            for cid in sorted(late)
        ]

    # ---- restore

    def restore(self, checkpoint_id: int | None = None) -> CompletedCheckpoint:
        """Start the next generation from checkpoint n (default: the latest
        completed).  Pending checkpoints are aborted; the restored one is
        pinned until ``release_restore``."""
        target = self.completed.latest() if checkpoint_id is None else self.completed.get(checkpoint_id)
        if target is None:
            known = self.completed.ids
            raise CoordinatorError(
                f"no completed checkpoint {checkpoint_id if checkpoint_id is not None else ''} to restore from"
                f" (retained: {known or 'none'})"
            )
        for cid in sorted(self.pending):
            self.abort(cid, CheckpointFailure.RESTORED, f"restoring checkpoint {target.checkpoint_id}")
        self.generation += 1
        self.completed.pin(target.checkpoint_id)
        log.info("checkpoint %d: restoring as generation %d", target.checkpoint_id, self.generation)
        return target

    def release_restore(self, checkpoint_id: int) -> list[int]:
        return self.completed.unpin(checkpoint_id)

    # ---- internals

    def _addressed(self, task: str, checkpoint_id: int) -> PendingCheckpoint | AckIgnored:
        if task not in self.tasks:
            return self._ignore(task, checkpoint_id, AckIgnoreReason.NOT_A_TASK)
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            if checkpoint_id >= self._next_id:
                return self._ignore(task, checkpoint_id, AckIgnoreReason.NEVER_TRIGGERED)
            return self._ignore(task, checkpoint_id, AckIgnoreReason.NO_LONGER_PENDING)
        if pending.status is not CheckpointStatus.PENDING:
            return self._ignore(task, checkpoint_id, AckIgnoreReason(f"already {pending.status.value}"))
        return pending

    def _ignore(self, task: str, checkpoint_id: int, reason: AckIgnoreReason) -> AckIgnored:
        ignored = AckIgnored(task, checkpoint_id, reason)
        self.ignored.append(ignored)
        log.warning("%s", ignored)
        return ignored
