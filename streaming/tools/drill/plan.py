"""What a restore drill injects (``streaming.tools.drill.run``): the failure
kinds, those of the local runtime and those of the local cluster
(``check_kinds``), the plan a seed draws (``plan_failures``: kinds, order,
moments, fault points, damage, the node or group struck, how long an
outage or a freeze lasts past the job's ``LivenessBounds``), whether a kind
must restore or must not (``must_restore``, ``restore_problem``), what
happened after each failure (``FailureOutcome``), and how long a drill may
take (``DrillBudget``: a duration, a limit on each recovery; ``percentile``
of the recoveries so far and a kind's own waits, ``side_wait_s``, say
whether the next failure still fits)."""

from __future__ import annotations

import enum
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from streaming.adapters.objects import STORE_BOUND_S
from streaming.api.pipeline import Pipeline
from streaming.api.settings import JobSettings, Mode
from streaming.errors import ConfigError

__all__ = [
    "CLUSTER_KINDS",
    "CLUSTER_ONLY",
    "DAMAGES",
    "KINDS",
    "LIVENESS_KINDS",
    "LOCAL_ONLY",
    "NAMED_ONLY",
    "RUNNER_RESTARTS",
    "SIDE_WAITS_S",
    "DrillBudget",
    "LivenessBounds",
    "ORPHAN_BOUND_S",
    "WORKER_MOMENTS",
    "Failure",
    "FailureKind",
    "FailureOutcome",
    "check_kinds",
    "cluster_targets",
    "fault_pools",
    "must_restore",
    "parse_duration",
    "percentile",
    "plan_failures",
    "restore_problem",
    "side_wait_s",
]


class FailureKind(enum.StrEnum):
    WORKER = "worker"
    RUNNER = "runner"
    BROKER = "broker"
    STORE = "store"
    DAMAGE = "damage"
    RETENTION = "retention"
    # liveness: a service away past its clients' bounds, a worker frozen alive, a task stuck in a send
    BROKER_LONG = "broker-long"
    STORE_LONG = "store-long"
    WORKER_FROZEN = "worker-frozen"
    STUCK_SEND = "stuck-send"
    # records no schema expected, appended to the ingress topics: each a dead letter, no restore
    POISON = "poison"
    # the local cluster's (``spark-abs drill --cluster``): its job runs as remote worker groups
    BROKER_NODE = "broker-node"
    SPARK_WORKER = "spark-worker"
    GROUP = "group"
    GROUP_STANDBY = "group-standby"
    RUNNER_REMOTE = "runner-remote"


# drilled only on the local cluster: one Kafka node of three, a Spark worker, a remote group's member, the runner
# of remote members
CLUSTER_ONLY = (
    FailureKind.BROKER_NODE,
    FailureKind.SPARK_WORKER,
    FailureKind.GROUP,
    FailureKind.GROUP_STANDBY,
    FailureKind.RUNNER_REMOTE,
)
# what the job's liveness bounds must turn into a restore, or at least a recovery: an outage past the delivery
# timeout or the store's bound, a worker frozen past the heartbeat timeout, a task stuck in a send
LIVENESS_KINDS = (FailureKind.BROKER_LONG, FailureKind.STORE_LONG, FailureKind.WORKER_FROZEN, FailureKind.STUCK_SEND)
# not on the cluster: its workers are remote and outlive the runner (runner-remote), its Kafka is three nodes
# (broker-node); the liveness kinds are drilled on the local runtime only
LOCAL_ONLY = (FailureKind.RUNNER, FailureKind.BROKER, *LIVENESS_KINDS)
# drilled only when named (--kinds): retention deletes records of the job's internal topics; a long outage and
# a stuck send take minutes each (the outage, or the failed checkpoints it takes before the job restores)
# and poison, which needs a workload whose reference leaves its records out (DrillWorkload.poison_ready)
NAMED_ONLY = (
    FailureKind.RETENTION,
    FailureKind.BROKER_LONG,
    FailureKind.STORE_LONG,
    FailureKind.STUCK_SEND,
    FailureKind.POISON,
)
# the local runtime's default: every kind but those drilled when named and the cluster's
KINDS = tuple(k for k in FailureKind if k not in NAMED_ONLY and k not in CLUSTER_ONLY)
# the cluster's default (--cluster): its own kinds, then those of the local runtime that mean the same there
CLUSTER_KINDS = (*CLUSTER_ONLY, *(k for k in KINDS if k not in LOCAL_ONLY))
# whether a kind must restore (True) or must not (False); the others may or may not (a store outage that
# outlasts an upload can end in one; a broker outage past the delivery timeout ends in one when a worker had a
# send pending through it, which then failed: a worker with none goes on)
_RESTORES = {
    FailureKind.BROKER_NODE: False,  # two in-sync replicas go on
    FailureKind.SPARK_WORKER: False,  # the master starts executors on the other worker, Spark retries the tasks
    FailureKind.GROUP: True,
    FailureKind.GROUP_STANDBY: True,
    FailureKind.RUNNER_REMOTE: True,
    FailureKind.WORKER_FROZEN: True,  # the runner SIGKILLs a worker whose tasks are silent (worker_stuck)
    FailureKind.STUCK_SEND: True,  # checkpoints fail until the runner restores (checkpoints_failing)
    FailureKind.POISON: False,  # each record a dead letter, the job goes on
}
# what a cluster kind waits for outside its recovery, on a 2-core machine, in seconds (the budget counts it): a
# standby's Spark application and first heartbeat; a node started again (Kafka's brokers or Spark's ALIVE, then
# a Kafka node's replicas in sync), past its outage; the runner's lease lapsing (the heartbeat timeout, then the
# members' next heartbeats)
SIDE_WAITS_S = {
    FailureKind.GROUP_STANDBY: 60.0,
    FailureKind.BROKER_NODE: 40.0,
    FailureKind.SPARK_WORKER: 25.0,
    FailureKind.RUNNER_REMOTE: 15.0,
}
_NODES = (FailureKind.BROKER_NODE, FailureKind.SPARK_WORKER)
# where a worker failure strikes: at a random moment, or at a fault point armed in the running worker
WORKER_MOMENTS = ("random", "mid_batch", "during_alignment", "during_upload", "before_sink_commit", "during_restore")
DAMAGES = ("delete a part", "flip a byte")
# when the runner of remote members starts again: once its lease lapsed (the members stopped their tasks), or
# at once (they still run the old generation)
RUNNER_RESTARTS = ("after its lease lapsed", "at once")
# how long the workers of a runner that was SIGKILLed may run on (they notice its pipe closed)
ORPHAN_BOUND_S = 60.0


@dataclass(frozen=True)
class LivenessBounds:
    """The drilled job's bounds that the liveness kinds outlast, as it runs
    them (``JobSettings``' defaults, but a delivery timeout the drill
    shortens, ``--delivery-timeout``): a long broker outage lasts past the
    producers' delivery timeout, a long store outage past the store's
    retries (``STORE_BOUND_S``), a frozen worker past the heartbeat timeout;
    a stuck send is noticed once more checkpoints than the job tolerates
    failed, each at the checkpoint timeout (``stuck_notice_s``)."""

    delivery_timeout_s: float = JobSettings.default("delivery_timeout_s")
    heartbeat_timeout_s: float = JobSettings.default("heartbeat_timeout_s")
    checkpoint_timeout_s: float = JobSettings.default("timeout_s")
    tolerable_failed_checkpoints: int = JobSettings.default("tolerable_failed_checkpoints")
    store_bound_s: float = STORE_BOUND_S

    @classmethod
    def of(cls, delivery_timeout_s: float | None = None) -> LivenessBounds:
        """The job's defaults, with the delivery timeout the drill runs it with (None: the default)."""
        if delivery_timeout_s is None:
            return cls()
        if not (math.isfinite(delivery_timeout_s) and delivery_timeout_s > 0):
            raise ConfigError(f"delivery timeout must be positive and finite, got {delivery_timeout_s}")
        return cls(delivery_timeout_s=delivery_timeout_s)

    @property
    def shortened(self) -> bool:
        """Whether the drill runs the job with a delivery timeout shorter than a job's default."""
        return self.delivery_timeout_s < JobSettings.default("delivery_timeout_s")

    def stuck_notice_s(self) -> float:
        """How long the job may take to notice a task stuck in a send: the
        failed checkpoints it tolerates and the one after, each aborted at
        the checkpoint timeout."""
        return (self.tolerable_failed_checkpoints + 1) * self.checkpoint_timeout_s

    def describe(self) -> str:
        delivery = f"delivery timeout {self.delivery_timeout_s:g} s"
        if self.shortened:
            default = JobSettings.default("delivery_timeout_s")
            delivery += f" (shortened by the drill, --delivery-timeout; a job's default is {default:g} s)"
        return (
            f"{delivery}, heartbeat timeout {self.heartbeat_timeout_s:g} s, a restore at the "
            f"{self.tolerable_failed_checkpoints + 1}th failed checkpoint in a row (each aborted at "
            f"{self.checkpoint_timeout_s:g} s at the latest), the store's retries {self.store_bound_s:g} s"
        )


@dataclass(frozen=True)
class Failure:
    """One planned failure: what, after how long, and its details."""

    index: int
    kind: FailureKind
    delay_s: float  # after the job recovered from the previous failure
    moment: str = ""  # worker: a WORKER_MOMENTS entry; damage: a DAMAGES entry; runner-remote: RUNNER_RESTARTS
    task: str = ""  # worker at a fault point, stuck-send: the task armed
    # broker, store and their long kinds: how long the service is down; broker-node, spark-worker: at least;
    # worker-frozen: how long the worker is stopped at most (SIGCONT then, if the runner has not killed it)
    outage_s: float = 0.0
    target: str = ""  # broker-node, spark-worker: the service killed; group, group-standby: the group
    # stuck-send: how long the job may take to notice (LivenessBounds.stuck_notice_s) before the recovery limit
    # counts
    notice_s: float = 0.0

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
        if self.kind is FailureKind.BROKER_NODE:
            return f"Kafka node {self.target} SIGKILLed, down for {self.outage_s:.0f} s or more"
        if self.kind is FailureKind.SPARK_WORKER:
            return f"Spark worker {self.target} SIGKILLed, down for {self.outage_s:.0f} s or more"
        if self.kind is FailureKind.GROUP:
            return f"the member of worker group {self.target} SIGKILLed, no standby (a new worker started)"
        if self.kind is FailureKind.GROUP_STANDBY:
            return f"the member of worker group {self.target} SIGKILLed, a standby waiting"
        if self.kind is FailureKind.RUNNER_REMOTE:
            return f"job runner of remote members SIGKILLed, started again {self.moment}"
        if self.kind is FailureKind.BROKER_LONG:
            return f"Kafka broker down for {self.outage_s:.0f} s, past the delivery timeout"
        if self.kind is FailureKind.STORE_LONG:
            return f"S3 server down for {self.outage_s:.0f} s, past the store's retries"
        if self.kind is FailureKind.WORKER_FROZEN:
            return f"worker frozen (SIGSTOP) for up to {self.outage_s:.0f} s, past the heartbeat timeout"
        if self.kind is FailureKind.STUCK_SEND:
            return f"{self.task} stuck for good in a send (stuck_send)"
        if self.kind is FailureKind.POISON:
            return "records no schema expected appended to the ingress topics (poison)"
        service = "Kafka broker" if self.kind is FailureKind.BROKER else "S3 server"
        return f"{service} down for {self.outage_s:.0f} s"


def fault_pools(pipeline: Pipeline, mode: Mode) -> dict[str, list[str]]:
    """The tasks where each fault point can strike: any task mid-batch, during
    an upload or a restore, and stuck in a send (every task flushes what it
    sent before its snapshot); a task with more than one input during
    alignment (aligned modes only); a sink task between the manifest and its
    commit."""
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
        "stuck_send": every,
    }


def cluster_targets(
    pipeline: Pipeline, kafka_nodes: Sequence[str], spark_workers: Sequence[str], workers: str = "per-stage"
) -> dict[str, list[str]]:
    """What the cluster kinds strike, by kind: a Kafka node, a Spark worker,
    a worker group of the job's grouping (``workers``: ``per-stage``, a group
    per stage, or ``one``, the group ``all``), the pools ``plan_failures``
    draws from beside ``fault_pools``."""
    from streaming.engine.job.groups import worker_groups

    groups = list(worker_groups(pipeline, workers))
    return {
        FailureKind.BROKER_NODE.value: list(kafka_nodes),
        FailureKind.SPARK_WORKER.value: list(spark_workers),
        FailureKind.GROUP.value: groups,
        FailureKind.GROUP_STANDBY.value: groups,
    }


def check_kinds(kinds: Sequence[FailureKind], cluster: bool) -> None:
    """Refuse kinds the deployment cannot have: the cluster's without
    ``--cluster``, and on the cluster those it has in its own form and the
    liveness kinds (not drilled there yet)."""
    if cluster:
        instead = {FailureKind.RUNNER: "runner-remote", FailureKind.BROKER: "broker-node"}
        local = [k for k in kinds if k in instead]
        if local:
            raise ConfigError(
                f"failure kind(s) {', '.join(local)} are the local runtime's; on the cluster use "
                + ", ".join(instead[k] for k in local)
            )
        liveness = [k for k in kinds if k in LOCAL_ONLY]
        if liveness:
            raise ConfigError(f"failure kind(s) {', '.join(liveness)} are drilled on the local runtime only")
    else:
        remote = [k for k in kinds if k in CLUSTER_ONLY]
        if remote:
            raise ConfigError(
                f"failure kind(s) {', '.join(remote)} strike the local cluster: drill with --cluster "
                "(spark-abs local up --cluster)"
            )


def plan_failures(
    count: int,
    seed: int,
    kinds: Sequence[FailureKind],
    pools: Mapping[str, Sequence[str]],
    interval_s: float,
    bounds: LivenessBounds | None = None,
) -> list[Failure]:
    """``count`` failures drawn from ``seed``: the kinds in rounds, each kind
    once per round in a shuffled order (a drill stopped early by its duration
    has struck every kind about as often);
    worker failures a random kill first, then the fault points with a task
    in ``pools`` (``fault_pools``) in turn (shuffled), each at a task drawn
    from its pool; the cluster kinds a target each from theirs
    (``cluster_targets``), a Kafka node or Spark worker down for 5 to 15 s
    at least; the liveness kinds past the job's ``bounds`` (default: a job's
    defaults): a broker down 1.25 to 1.75 times the delivery timeout, the S3
    server 1.1 to 1.4 times the store's retries, a worker frozen 5 to 15 s
    past the heartbeat timeout, a send stuck in a task of its pool; delays
    of 0.2 to 2 checkpoint intervals."""
    if count < 0:
        raise ConfigError(f"failures must be 0 or more, got {count}")
    if not kinds:
        raise ConfigError("a drill needs at least one failure kind")
    for kind in kinds:
        if kind in _TARGETED and not pools.get(kind.value):
            raise ConfigError(f"failure kind {kind} has nothing to strike here: {_TARGETED[kind]}")
    bounds = bounds or LivenessBounds()
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
        elif kind in (FailureKind.BROKER_NODE, FailureKind.SPARK_WORKER):
            target = rng.choice(list(pools[kind.value]))
            plan.append(Failure(index, kind, delay, outage_s=round(rng.uniform(5.0, 15.0), 1), target=target))
        elif kind in (FailureKind.GROUP, FailureKind.GROUP_STANDBY):
            plan.append(Failure(index, kind, delay, target=rng.choice(list(pools[kind.value]))))
        elif kind is FailureKind.RUNNER_REMOTE:
            plan.append(Failure(index, kind, delay, rng.choice(RUNNER_RESTARTS)))
        elif kind is FailureKind.BROKER_LONG:
            outage = round(rng.uniform(1.25, 1.75) * bounds.delivery_timeout_s, 1)
            plan.append(Failure(index, kind, delay, outage_s=outage))
        elif kind is FailureKind.STORE_LONG:
            plan.append(Failure(index, kind, delay, outage_s=round(rng.uniform(1.1, 1.4) * bounds.store_bound_s, 1)))
        elif kind is FailureKind.WORKER_FROZEN:
            frozen = round(bounds.heartbeat_timeout_s + rng.uniform(5.0, 15.0), 1)
            plan.append(Failure(index, kind, delay, outage_s=frozen))
        elif kind is FailureKind.STUCK_SEND:
            task = rng.choice(list(pools["stuck_send"]))
            plan.append(Failure(index, kind, delay, task=task, notice_s=bounds.stuck_notice_s()))
        else:
            plan.append(Failure(index, kind, delay))
    return plan


# the cluster kinds' pools (``cluster_targets``), and what an empty one lacks
_TARGETED = {
    FailureKind.BROKER_NODE: "one Kafka node of several (the local cluster has three)",
    FailureKind.SPARK_WORKER: "a Spark worker of a standalone master (the local cluster has two)",
    FailureKind.GROUP: "a worker group",
    FailureKind.GROUP_STANDBY: "a worker group",
}


@dataclass
class FailureOutcome:
    """What happened after one failure."""

    failure: Failure
    at_s: float  # seconds into the drill when it was injected
    restored_from: list[int | None] = field(default_factory=list)  # per restore it caused (None: the beginning)
    causes: list[str | None] = field(default_factory=list)  # per restore it caused: why, as the store records it
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

    def add_note(self, text: str) -> None:
        """Add ``text`` to what the note says already."""
        self.note = "; ".join(filter(None, [self.note, text]))

    def restores(self, start: str = "start", prefix: str = "") -> list[str]:
        """Each restore the failure caused: the checkpoint it picked (``start``
        for the beginning, others after ``prefix``) and why, when the store says."""
        causes = self.causes + [None] * (len(self.restored_from) - len(self.causes))
        return [
            (start if c is None else f"{prefix}{c}") + (f" ({cause})" if cause else "")
            for c, cause in zip(self.restored_from, causes)
        ]


def must_restore(kind: FailureKind) -> bool | None:
    """Whether a failure of ``kind`` must restore (True), must not (False), or may (None)."""
    return _RESTORES.get(kind)


def side_wait_s(failure: Failure) -> float:
    """How long ``failure`` waits outside its recovery (``SIDE_WAITS_S``):
    none for a runner started again at once, a node's outage counted; a
    liveness kind's outage, freeze or time to notice (far longer than the
    recoveries the budget's estimate comes from)."""
    if failure.kind is FailureKind.RUNNER_REMOTE and failure.moment != RUNNER_RESTARTS[0]:
        return 0.0
    if failure.kind in LIVENESS_KINDS:
        return failure.outage_s + failure.notice_s
    return SIDE_WAITS_S.get(failure.kind, 0.0) + (failure.outage_s if failure.kind in _NODES else 0.0)


def restore_problem(outcome: FailureOutcome) -> str | None:
    """What is wrong with the restores ``outcome``'s failure caused, for a
    kind that must restore or must not (None: nothing; a kind not recovered
    is a problem of its own)."""
    must = must_restore(outcome.failure.kind)
    if must is None or not outcome.recovered:
        return None
    what = f"failure {outcome.failure.index + 1} ({outcome.failure.describe()})"
    if must and not outcome.restored_from:
        return f"{what}: the job went on without a restore, and it must restore (a new generation)"
    if not must and outcome.restored_from:
        picked = outcome.restored_from[0]
        return (
            f"{what}: the job restored (from {'the beginning' if picked is None else f'checkpoint {picked}'}), "
            "and it must go on without one"
        )
    return None


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
        estimate = percentile(recoveries, 90)  # None: no failure yet
        return estimate if estimate is not None else self.first_estimate_s

    def fits(self, now: float, phase_end: float | None, recoveries: Sequence[float]) -> bool:
        """Whether one more failure (and its recovery) ends before ``phase_end``."""
        return phase_end is None or now + self.estimate(recoveries) <= phase_end
