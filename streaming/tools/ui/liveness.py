"""Whether the job still completes checkpoints, as the overview of
``spark-abs ui`` says it: how long ago the newest complete checkpoint in
the store completed and, from the control topic (``live``), how many
checkpoints have failed in a row against the job's
``tolerable_failed_checkpoints``, and how many records the stages' code
raised on were set aside.  The count and the bound are the
coordinator's own, carried by each abort: the numbers its runner restores
by (``streaming.engine.job.liveness``).

A job is called stalled after ``STALLED_S`` without a completed
checkpoint, the bound of the Prometheus alert ``SparkAbsCheckpointsStalled``
(``docker/prometheus-alerts.yml``): the page and the alert agree."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from streaming.tools.checkpoints.inspection import CheckpointRow
from streaming.tools.ui.live import ControlView

__all__ = ["STALLED_S", "Level", "JobLiveness"]

# no checkpoint completed for this long: the job is stalled (the alert's bound too)
STALLED_S = 300.0


class Level(enum.StrEnum):
    """How a part of the liveness line looks: plain, a warning, a problem."""

    OK = "ok"
    WARN = "warn"
    PROBLEM = "problem"


@dataclass(frozen=True)
class JobLiveness:
    """The newest complete checkpoint (None: none yet) and how many seconds
    ago it completed (None: its time is not known); the checkpoints failed
    in a row in the current generation and how many the job tolerates (None:
    not known: the store read alone, or aborts of an older runner)."""

    last_completed: int | None
    since_s: float | None
    failed_in_a_row: int | None = None
    tolerable: int | None = None
    # records on the control topic the job's key does not vouch for (not acted on), by reason
    rejected: Mapping[str, int] = field(default_factory=dict)
    # records the stages' code raised on in the current generation, set aside to the dead letters
    set_aside: int = 0

    @classmethod
    def of(cls, rows: Sequence[CheckpointRow], view: ControlView | None, now: float) -> JobLiveness:
        """From the store's ``rows`` and a look at the control topic (``view``) at Unix time ``now``."""
        complete = [r for r in rows if r.complete]
        newest = max(complete, key=lambda r: r.checkpoint_id, default=None)
        since = None
        if newest is not None:
            try:
                since = max(0.0, now - datetime.fromisoformat(newest.created_at).timestamp())
            except ValueError:  # a manifest without its time
                pass
        read = view if view is not None and view.problem is None else None
        return cls(
            newest.checkpoint_id if newest is not None else None,
            since,
            read.failed_in_a_row if read else None,
            read.tolerable_failed_checkpoints if read else None,
            dict(read.rejected) if read else {},
            read.set_aside if read else 0,
        )

    @property
    def stalled(self) -> bool:
        return self.since_s is not None and self.since_s > STALLED_S

    @property
    def past_tolerable(self) -> bool:
        """More failed in a row than the job tolerates: its runner should have restored it."""
        return self.failed_in_a_row is not None and self.tolerable is not None and self.failed_in_a_row > self.tolerable

    def parts(self) -> list[tuple[Level, str]]:
        """What the page says, each part with how it looks."""
        parts = []
        if self.last_completed is None:
            parts.append((Level.OK, "no checkpoint has completed yet"))
        elif self.since_s is not None and self.stalled:
            parts.append(
                (
                    Level.PROBLEM,
                    f"no checkpoint completed for {_age(self.since_s)} (the newest: {self.last_completed}): "
                    f"if the job runs, it is stalled; see the runner's log",
                )
            )
        elif self.since_s is not None:
            parts.append((Level.OK, f"the newest checkpoint completed {_age(self.since_s)} ago"))
        if self.failed_in_a_row is not None:
            said = f"{self.failed_in_a_row} checkpoint(s) failed in a row"
            if self.past_tolerable:
                said += f", more than the {self.tolerable} the job tolerates: its runner should have restored it"
                parts.append((Level.PROBLEM, said + "; see the runner's log"))
            else:
                bound = f" (the job restores past {self.tolerable})" if self.tolerable is not None else ""
                parts.append((Level.WARN if self.failed_in_a_row else Level.OK, said + bound))
        if self.rejected:
            counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.rejected.items()))
            parts.append(
                (
                    Level.PROBLEM,
                    f"{sum(self.rejected.values())} record(s) on the control topic not signed with the job's "
                    f"key ({counts}), ignored: someone else writes to the job's topics; see the runner's log",
                )
            )
        if self.set_aside:
            parts.append(
                (
                    Level.WARN,
                    f"{self.set_aside} record(s) the stages' code raised on set aside to the dead letters in this "
                    "generation (the job goes on without them); see the dead-letter topic",
                )
            )
        return parts


def _age(seconds: float) -> str:
    """``seconds`` as a person reads an age: 42 s, 7 min, 3.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
