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
    TRIGGER_FAILURE = "its barriers could not be injected"
    RESTORED = "the job restored from an earlier checkpoint"
    USER = "aborted on request"

    @classmethod
    def parse(cls, name: object, default: CheckpointFailure | None = None) -> CheckpointFailure:
        """The failure called ``name`` (as ``CheckpointFailure.X.name`` spells
        it, e.g. from a control message); an unknown or missing name is
        ``default`` (``DECLINED`` when not given)."""
        try:
            return cls[str(name)]
        except KeyError:
            return default if default is not None else cls.DECLINED
