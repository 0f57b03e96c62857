"""The control events a task takes (``StageTask.on_control``): the
coordinator's abort of a checkpoint, and the barrier positions announced by
the injector (``trigger``) and by upstream tasks (``announce``), which let an
unaligned checkpoint (or an aligned one whose timeout passed) start before
the backlog in front of its barrier is read.

They come on the control topic's thread; the task's processing thread takes
them between two segments (a large batch does not delay an unaligned
snapshot), or at once when the task is idle."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Mapping

from barriers.handler import BarrierHandler
from barriers.messages import UNSIGNED, Alignment, Barrier, BarrierRejected, ChannelId, decode
from streaming.adapters.kafka.control.events import Abort, Announce, ControlEvent, Trigger

__all__ = ["ControlInbox"]

log = logging.getLogger(__name__)


class ControlInbox:
    """The control events of task ``task`` (reading ``inputs``) of job
    ``job``, applied to its ``handler`` under the task's ``lock``."""

    def __init__(
        self,
        task: str,
        job: str,
        inputs: Mapping[ChannelId, object],
        handler: BarrierHandler,
        lock: threading.RLock,
    ):
        self.task = task
        self.job = job
        self.inputs = inputs
        self.handler = handler
        self.lock = lock
        self._events: collections.deque[ControlEvent] = collections.deque()

    def offer(self, event: ControlEvent) -> None:
        """Queue ``event``; apply it at once when the task is idle (its lock is free)."""
        self._events.append(event)
        if self.lock.acquire(blocking=False):
            try:
                self.apply()
            finally:
                self.lock.release()

    def apply(self) -> None:
        """Every queued event, in order (the caller holds the task's lock)."""
        while self._events:
            event = self._events.popleft()
            if isinstance(event, (Trigger, Announce)) and event.barrier:
                self._announced(event)
            elif isinstance(event, Abort) and event.task != self.task and event.checkpoint_id in self.handler.pending:
                self.handler.abort(event.checkpoint_id, event.reason, event.detail)

    def _announced(self, event: Trigger | Announce) -> None:
        # the fields come unsigned: the event's signature, verified as it was read, vouches for them
        try:
            barrier = decode(event.barrier_headers(), job=self.job, key=UNSIGNED)
        except BarrierRejected as exc:
            log.warning("%s: announcement of checkpoint %d ignored: %s", self.task, event.checkpoint_id, exc)
            return
        if not isinstance(barrier, Barrier) or (
            barrier.options.alignment is not Alignment.UNALIGNED and barrier.options.alignment_timeout_ms is None
        ):
            return  # aligned without a timeout and at-least-once checkpoints wait for the barriers themselves
        for name, offset in sorted(event.offsets.items()):
            try:
                channel = ChannelId.parse(name)
            except ValueError as exc:  # signed, yet no channel: said, and the others taken
                log.warning(
                    "%s: announcement of checkpoint %d names no channel %r: %s",
                    self.task,
                    event.checkpoint_id,
                    name,
                    exc,
                )
                continue
            if channel in self.inputs and isinstance(offset, int) and not isinstance(offset, bool):
                self.handler.announcement_received(channel, barrier, offset)
