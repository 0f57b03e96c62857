"""What a restore drill injects (``streaming.tools.drill``): the failure
kinds, the plan a seed draws (``plan_failures``: kinds, order, moments,
fault points, damage) and what happened after each failure
(``FailureOutcome``)."""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from streaming.api.pipeline import Pipeline
from streaming.api.settings import Mode
from streaming.errors import ConfigError

__all__ = [
    "DAMAGES",
    "KINDS",
    "ORPHAN_BOUND_S",
    "WORKER_MOMENTS",
    "Failure",
    "FailureKind",
    "FailureOutcome",
    "fault_pools",
    "plan_failures",
]


class FailureKind(enum.StrEnum):
    WORKER = "worker"
    RUNNER = "runner"
    BROKER = "broker"
    STORE = "store"
    DAMAGE = "damage"


KINDS = tuple(FailureKind)
# where a worker failure strikes: at a random moment, or at a fault point armed in the running worker
WORKER_MOMENTS = ("random", "mid_batch", "during_alignment", "during_upload", "before_sink_commit", "during_restore")
DAMAGES = ("delete a part", "flip a byte")
# how long the workers of a runner that was SIGKILLed may run on (they notice its pipe closed)
ORPHAN_BOUND_S = 60.0


@dataclass(frozen=True)
class Failure:
    """One planned failure: what, after how long, and its details."""

    index: int
    kind: FailureKind
    delay_s: float  # after the job recovered from the previous failure
    moment: str = ""  # worker: a WORKER_MOMENTS entry; damage: a DAMAGES entry
    task: str = ""  # worker at a fault point: the task armed
    outage_s: float = 0.0  # broker, store: how long the service is down

    def describe(self) -> str:
        if self.kind is FailureKind.WORKER:
            where = "at a random moment" if self.moment == "random" else f"at {self.moment} of {self.task}"
            return f"worker SIGKILLed {where}"
        if self.kind is FailureKind.RUNNER:
            return "job runner SIGKILLed, started again"
        if self.kind is FailureKind.DAMAGE:
            return f"runner SIGKILLed, newest checkpoint damaged ({self.moment}), runner started again"
        service = "Kafka broker" if self.kind is FailureKind.BROKER else "S3 server"
        return f"{service} down for {self.outage_s:.0f} s"


def fault_pools(pipeline: Pipeline, mode: Mode) -> dict[str, list[str]]:
    """The tasks where each fault point can strike: any task mid-batch, during
    an upload or a restore; a task with more than one input during alignment
    (aligned modes only); a sink task between the manifest and its commit."""
    tasks = pipeline.tasks()
    every = [t.name for t in tasks]
    aligned = mode in (Mode.ALIGNED, Mode.ALIGNED_TIMEOUT)
    aligning = [t.name for t in tasks if len(t.inputs) > 1] if aligned else []
    sinks = [t.name for t in tasks if pipeline.stage(t.stage).sink is not None]
    return {
        "mid_batch": every,
        "during_alignment": aligning,
        "during_upload": every,
        "before_sink_commit": sinks,
        "during_restore": every,
    }


def plan_failures(
    count: int,
    seed: int,
    kinds: Sequence[FailureKind],
    pools: Mapping[str, Sequence[str]],
    interval_s: float,
) -> list[Failure]:
    """``count`` failures drawn from ``seed``: the kinds in turn (shuffled);
    worker failures a random kill first, then the fault points with a task
    in ``pools`` (``fault_pools``) in turn (shuffled), each at a task drawn
    from its pool; delays of 0.2 to 2 checkpoint intervals."""
    if count < 0:
        raise ConfigError(f"failures must be 0 or more, got {count}")
    if not kinds:
        raise ConfigError("a drill needs at least one failure kind")
    rng = random.Random(seed)
    drawn = [kinds[i % len(kinds)] for i in range(count)]
    rng.shuffle(drawn)
    moments = [m for m in WORKER_MOMENTS if m != "random" and pools.get(m)]
    rng.shuffle(moments)
    moments.insert(0, "random")  # the first worker failure is a plain kill, the others walk the fault points
    plan, worker_failures = [], 0
    for index, kind in enumerate(drawn):
        delay = round(rng.uniform(0.2, 2.0) * interval_s, 2)
        if kind is FailureKind.WORKER:
            moment = moments[worker_failures % len(moments)]
            worker_failures += 1
            task = "" if moment == "random" else rng.choice(list(pools[moment]))
            plan.append(Failure(index, kind, delay, moment, task))
        elif kind is FailureKind.DAMAGE:
            plan.append(Failure(index, kind, delay, rng.choice(DAMAGES)))
        elif kind in (FailureKind.BROKER, FailureKind.STORE):
            plan.append(Failure(index, kind, delay, outage_s=round(rng.uniform(3.0, 8.0), 1)))
        else:
            plan.append(Failure(index, kind, delay))
    return plan


@dataclass
class FailureOutcome:
    """What happened after one failure."""

    failure: Failure
    at_s: float  # seconds into the drill when it was injected
    restored_from: list[int | None] = field(default_factory=list)  # per restore it caused (None: the beginning)
    damaged: int | None = None  # the checkpoint the drill damaged
    recovered_s: float | None = None  # injection -> the next checkpoint completed
    replayed: int | None = None  # ingress records processed again
    orphans_gone_s: float | None = None  # runner kills: until no worker of the job was left
    note: str = ""

    @property
    def recovered(self) -> bool:
        return self.recovered_s is not None
