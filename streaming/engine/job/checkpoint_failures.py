"""Checkpoint-failure tolerance (Flink's ``CheckpointFailureManager``): the
checkpoints that failed since the last one completed, counted as Flink's
``execution.checkpointing.tolerable-failed-checkpoints`` counts them
(declined, expired, the store failed; not one subsumed by a newer one,
cancelled by a restore or whose barriers could not be injected).  The
coordinator service counts (``CheckpointFailureTolerance``); the runner's
``Liveness`` restores the job when more than ``tolerable_failed_checkpoints``
failed in a row."""

from __future__ import annotations

import time
from collections.abc import Callable

from barriers.failures import CheckpointFailure

__all__ = ["COUNTED", "CheckpointFailureTolerance"]


# the failures tolerable_failed_checkpoints counts (Flink's CheckpointFailureManager counts these too)
COUNTED = frozenset({CheckpointFailure.DECLINED, CheckpointFailure.TIMEOUT, CheckpointFailure.STORE_FAILURE})


class CheckpointFailureTolerance:
    """The checkpoints that failed since the last one completed (see the
    module docstring for which count)."""

    def __init__(
        self, on_change: Callable[[int], None] = lambda count: None, clock: Callable[[], float] = time.monotonic
    ):
        self.in_a_row = 0
        self.last = ""
        self._on_change = on_change
        self.clock = clock
        # since when no checkpoint completed (clock): the generation's start, then each completion
        self.since = clock()

    def failed(self, checkpoint_id: int, failure: CheckpointFailure | None, detail: str) -> None:
        if failure in COUNTED:
            self.in_a_row += 1
            self.last = f"checkpoint {checkpoint_id}: {failure.value if failure else ''} ({detail})"
            self._on_change(self.in_a_row)

    def completed(self) -> None:
        self.since = self.clock()
        if self.in_a_row:
            self.in_a_row = 0
            self._on_change(0)
