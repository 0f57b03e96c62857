"""What a restore drill injects (``streaming.tools.drill``): the failure
kinds, the plan a seed draws (``plan_failures``: kinds, order, moments,
fault points, damage), what happened after each failure
(``FailureOutcome``), and how long a drill may take (``DrillBudget``: a
duration, a limit on each recovery; ``percentile`` of the recoveries so far
says whether the next failure still fits)."""

from __future__ import annotations

import enum
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from streaming.api.pipeline import Pipeline
from streaming.api.settings import Mode
from streaming.errors import ConfigError

__all__ = [
    "DAMAGES",
    "KINDS",
    "DrillBudget",
    "ORPHAN_BOUND_S",
    "WORKER_MOMENTS",
    "Failure",
    "FailureKind",
    "FailureOutcome",
    "fault_pools",
    "parse_duration",
    "percentile",
    "plan_failures",
]


class FailureKind(enum.StrEnum):
    WORKER = "worker"
    RUNNER = "runner"
    BROKER = "broker"
    STORE = "store"
    DAMAGE = "damage"
    RETENTION = "retention"


# every kind but retention, which deletes records of the job's internal topics: drilled when named (--kinds)
KINDS = tuple(k for k in FailureKind if k is not FailureKind.RETENTION)
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
        if self.kind is FailureKind.RETENTION:
            return "records only older checkpoints need deleted (DeleteRecords), a worker SIGKILLed"
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
    """``count`` failures drawn from ``seed``: the kinds in rounds, each kind
    once per round in a shuffled order (a drill stopped early by its duration
    has struck every kind about as often);
    worker failures a random kill first, then the fault points with a task
    in ``pools`` (``fault_pools``) in turn (shuffled), each at a task drawn
    from its pool; delays of 0.2 to 2 checkpoint intervals."""
    if count < 0:
        raise ConfigError(f"failures must be 0 or more, got {count}")
    if not kinds:
        raise ConfigError("a drill needs at least one failure kind")
    rng = random.Random(seed)
    drawn: list[FailureKind] = []
    while len(drawn) < count:  # every kind once per round, so any first k failures are balanced
        round_ = list(kinds)
        rng.shuffle(round_)
        drawn += round_
    drawn = drawn[:count]
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
    kept_from: int | None = None  # retention: the checkpoint whose records the drill kept (older ones' deleted)
    recovered_s: float | None = None  # injection -> the next checkpoint completed
    restore_s: float | None = None  # injection -> the runner started the first restore it caused (its generation)
    replayed: int | None = None  # ingress records processed again
    orphans_gone_s: float | None = None  # runner kills: until no worker of the job was left
    note: str = ""

    @property
    def recovered(self) -> bool:
        return self.recovered_s is not None


# ---- how long a drill may take


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0 to 100) of ``values``, interpolated between
    the two nearest ranks as numpy's default does; None when there are none."""
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile is between 0 and 100, got {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str) -> float:
    """``45m``, ``1h30m``, ``90s`` or ``90`` (seconds) as seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ConfigError(f"duration {text!r}: expected e.g. 45m, 1h30m, 90s or 90")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ConfigError(f"duration {text!r} must be more than 0")
    return total


@dataclass(frozen=True)
class DrillBudget:
    """How long a drill may take.

    ``duration_s`` bounds the whole run (None: only the number of failures
    does): failures stop once the next one would not end ``reserve_s`` before
    it, time kept to close the input, drain the job and check it; the
    duration is shared between the modes drilled one after the other.  A
    failure the job has not recovered from ``recovery_limit_s`` after it
    struck stops the drill, which fails, saying so."""

    duration_s: float | None = None
    reserve_s: float = 150.0  # draining and checking: about a minute each on a 2-core machine
    recovery_limit_s: float = 180.0
    first_estimate_s: float = 45.0  # a failure's time before any has been measured (an outage and its recovery)

    def __post_init__(self) -> None:
        if self.duration_s is not None and self.duration_s <= self.reserve_s:
            raise ConfigError(
                f"duration {self.duration_s:.0f} s leaves no time for failures: "
                f"{self.reserve_s:.0f} s go to draining and checking"
            )
        if self.recovery_limit_s <= 0:
            raise ConfigError(f"recovery limit must be more than 0 s, got {self.recovery_limit_s}")

    def phase_end(self, now: float, run_end: float | None, phases_left: int) -> float | None:
        """When the phase starting at ``now`` must stop injecting failures: its
        share of what is left of the run, less the reserve (None: no bound)."""
        if run_end is None:
            return None
        return now + (run_end - now) / max(1, phases_left) - self.reserve_s

    def estimate(self, recoveries: Sequence[float]) -> float:
        """How long the next failure will take: the 90th percentile of the
        failures so far (the first estimate before any)."""
        return percentile(recoveries, 90) if recoveries else self.first_estimate_s

    def fits(self, now: float, phase_end: float | None, recoveries: Sequence[float]) -> bool:
        """Whether one more failure (and its recovery) ends before ``phase_end``."""
        return phase_end is None or now + self.estimate(recoveries) <= phase_end
