"""Why a checkpoint did not complete: one enum shared by tasks and the
coordinator, so a manifest, a log line and a metric all name the same reason."""

from __future__ import annotations

import enum

__all__ = ["CheckpointFailure"]


class CheckpointFailure(enum.Enum):
    SUBSUMED = "subsumed by a newer checkpoint"
    CANCELLED = "cancelled upstream"
    DECLINED = "declined by a task"
    TIMEOUT = "not complete within the checkpoint timeout"
    TOO_MANY_CONCURRENT = "too many checkpoints pending"
    TASK_FAILURE = "a task failed"
    STORE_FAILURE = "the snapshot store failed"
    RESTORED = "the job restored from an earlier checkpoint"
    USER = "aborted on request"
