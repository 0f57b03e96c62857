"""What a task does at barrier n, driven by the barrier handler of
``barriers.handler`` through its ``Controller`` interface.

``snapshot`` takes the operator's state (immutable Arrow tables; with
incremental snapshots, what changed since the task's previous snapshot, or
the whole state when a base is due) and closes the sink epoch,
``forward_barrier`` appends barrier n to every output partition after the
event-time progress before it and announces where it went, and ``acknowledge`` hands the snapshot to the ``SnapshotUploader``,
which uploads it in the background and then acknowledges on the job's
control topic, so processing never waits for the upload.  ``abort`` gives
an aborted epoch's output to the next one and declines on the control topic."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from barriers.failures import CheckpointFailure
from barriers.handler import BarrierHandler, TaskCheckpoint
from barriers.messages import Barrier, ChannelId, Unsigned, encode
from operators.base import changes_of, snapshot_later_of
from streaming.adapters.kafka.control.events import Announce, Decline, announced_barrier
from streaming.engine import faults
from streaming.engine.task.gate import InputGate
from streaming.engine.task.output import TaskOutput
from streaming.engine.task.record_errors import RecordErrors
from streaming.engine.task.replay import CopiedReplay
from streaming.engine.task.uploads import SnapshotUploader, TakenSnapshot
from streaming.engine.task.watermarks import WatermarkTracker
from streaming.errors import KafkaUnavailableError, SparkAbsError, TaskError

__all__ = ["TaskController", "TaskWiring"]

log = logging.getLogger(__name__)

# the barrier paths kept of checkpoints not yet acknowledged or aborted
_PATHS_KEPT = 32


@dataclass(frozen=True)
class TaskWiring:
    """The parts of a task its controller acts on: the operator whose state
    it snapshots, the input gate it blocks and releases, the output it
    forwards barriers on, the watermarks a snapshot keeps, the uploader of
    the asynchronous phase, and how the task sends its watermark on."""

    operator: Any
    gate: InputGate
    output: TaskOutput
    watermarks: WatermarkTracker
    uploader: SnapshotUploader
    forward_watermark: Callable[[], None]
    # rows the operator raised on: their counts start again at each snapshot, and a state put
    # back since the last one is stored whole (``record_errors``)
    record_errors: RecordErrors | None = None


class TaskController:
    """The ``Controller`` of task ``task`` (see the module docstring), acting
    on the task's parts (``wiring``); ``handler`` is set once the handler
    that drives it is made."""

    def __init__(
        self,
        task: str,
        generation: int,
        io: Any,
        wiring: TaskWiring,
        counters: collections.Counter,
        *,
        job_key: bytes | Unsigned,
        snapshotted: int = 0,
    ):
        self.task = task
        self.generation = generation
        self.io = io
        self.operator = wiring.operator
        self.gate = wiring.gate
        self.output = wiring.output
        self.watermarks = wiring.watermarks
        self.record_errors = wiring.record_errors
        self.uploader = wiring.uploader
        self.forward_watermark = wiring.forward_watermark
        self.counters = counters
        self.job_key = job_key
        self.handler: BarrierHandler | None = None
        # what each started checkpoint took (its synchronous phase)
        self._taken: dict[int, TakenSnapshot] = {}
        # the path of each started checkpoint's first barrier to this task, and on (wall clock)
        self._paths: dict[int, dict[str, float]] = {}
        # incremental snapshots: the checkpoint whose snapshot the operator's changes are counted from
        self._changes_since: int | None = None
        # channel state a restore copied and the task has not all processed yet (``StageTask.recover``)
        self.copied: CopiedReplay | None = None
        # the newest checkpoint whose snapshot the task took, or the one it started from (0: none):
        # what it sends from now on, a restore to that checkpoint sends again (its dead letters say it)
        self.snapshotted = snapshotted

    def barrier_path(self, checkpoint_id: int, **walls: float | None) -> None:
        """When checkpoint ``checkpoint_id``'s barrier got where (wall clock:
        appended to its channel, Spark began the micro-batch carrying it, the
        task received that batch); the first barrier of a checkpoint counts."""
        if checkpoint_id not in self._paths and (self.handler is None or checkpoint_id > self.handler.newest_started):
            self._paths[checkpoint_id] = {name: wall for name, wall in walls.items() if wall is not None}
            while len(self._paths) > _PATHS_KEPT:  # of barriers the handler ignored (stale, cancelled)
                del self._paths[min(self._paths)]

    def block(self, channel: ChannelId) -> None:
        log.debug("%s: %s blocked", self.task, channel)
        faults.point(self.task, "during_alignment", self.handler.newest_started if self.handler else 0)

    def release(self, channel: ChannelId) -> None:
        log.debug("%s: %s released", self.task, channel)

    def snapshot(self, barrier: Barrier) -> None:
        # what the task sent before the barrier (rows, dead letters) is in Kafka before its snapshot
        # counts it as sent: a send that failed or outlasts the delivery timeout fails the task
        self._flush(barrier.checkpoint_id)
        began = time.perf_counter()
        changes, since = None, None
        # a state put back since the last snapshot kept no track of its changes: stored whole
        rolled_back = self.record_errors.interval_ended() if self.record_errors is not None else False
        if self.uploader.incremental is not None:
            changes = changes_of(self.operator)  # also where the next changes are counted from
            since, self._changes_since = self._changes_since, barrier.checkpoint_id
            if since is None or rolled_back or self.uploader.wants_base():
                changes = None
        # a large table is gathered on the upload thread (snapshot_later_of), not here
        state = snapshot_later_of(self.operator) if changes is None else {}
        # copied channel state not processed yet: this checkpoint's channel state begins with it
        handler = self.handler
        if handler is None:
            raise TaskError(f"{self.task}: checkpoint {barrier.checkpoint_id}: no barrier handler drives the task")
        rest = self.copied.rest({c: handler.position(c) for c in self.copied.ends}) if self.copied else {}
        self.snapshotted = max(self.snapshotted, barrier.checkpoint_id)
        self._taken[barrier.checkpoint_id] = TakenSnapshot(
            state,
            self.output.take_epoch(),
            time.perf_counter() - began,
            time.time(),
            self.gate.take_held_max(),
            self.watermarks.snapshot(),
            changes=changes,
            since=since,
            replay_rest=rest,
        )

    def forward_barrier(self, barrier: Barrier) -> None:
        outputs = self.output.spec.outputs
        if not outputs:
            return
        self.forward_watermark()  # event-time progress before the barrier belongs to its epoch
        self._flush(barrier.checkpoint_id)
        # each output's copy names and signs its channel: it verifies on that one only
        offsets = self.io.append_barrier({c: encode(barrier, key=self.job_key, channel=c) for c in outputs})
        self._paths.setdefault(barrier.checkpoint_id, {})["forwarded"] = time.time()
        self.io.publish(
            Announce(
                checkpoint_id=barrier.checkpoint_id,
                task=self.task,
                generation=self.generation,
                barrier=announced_barrier(barrier),
                offsets={str(c): o for c, o in offsets.items()},
            )
        )

    def _flush(self, checkpoint_id: int) -> None:
        """Every record the task sent so far is in Kafka (``TaskIO.flush``:
        bounded, and a ``KafkaUnavailableError`` for a send that failed)."""
        faults.point(self.task, "stuck_send", checkpoint_id)
        try:
            self.io.flush()
        except SparkAbsError as exc:
            raise KafkaUnavailableError(f"{self.task}: checkpoint {checkpoint_id}: {exc}") from exc

    def record_in_flight(self, checkpoint_id: int, channel: ChannelId, start: int, end: int) -> None:
        log.debug("%s: checkpoint %d: %s in flight [%d, %d)", self.task, checkpoint_id, channel, start, end)

    def acknowledge(self, checkpoint: TaskCheckpoint) -> None:
        taken = self._taken.pop(checkpoint.checkpoint_id)
        path = self._paths.pop(checkpoint.checkpoint_id, {})
        self.uploader.submit(checkpoint, dataclasses.replace(taken, barrier_path=path))

    def abort(self, checkpoint_id: int, reason: CheckpointFailure, detail: str) -> None:
        taken = self._taken.pop(checkpoint_id, None)
        self._paths.pop(checkpoint_id, None)
        if taken is not None:
            self.output.give_back(taken.epoch)
        self.counters["aborted"] += 1
        self.io.publish(
            Decline(
                checkpoint_id=checkpoint_id, task=self.task, generation=self.generation, reason=reason, detail=detail
            )
        )
