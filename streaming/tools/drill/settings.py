"""What a drill does: ``DrillSettings``, ``spark-abs drill``'s options as one
object (``streaming.tools.drill.run``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streaming.api.settings import Mode, StateSnapshots
from streaming.tools.drill.plan import FailureKind
from streaming.tools.drill.workload import DrillWorkload

__all__ = ["DrillSettings"]


@dataclass(frozen=True)
class DrillSettings:
    """What a drill does (``spark-abs drill``'s options): which pipeline, fed
    what, struck by which failures, checkpointed how, written where.  A
    ``Drill`` phase gets them with each choice resolved (one mode, its share
    of the failures, its seed, its workload, its store and report
    directory)."""

    # a pipeline's name (``named_pipelines``) or ``module:attribute``
    pipeline: str = "money"
    # its workload: a DrillWorkload or ``module:function``; None: its module's (``workload_for``)
    workload: DrillWorkload | str | None = None
    # failures to inject (None: as many as the duration allows); two of each of the six kinds drilled by default
    failures: int | None = 12
    # how long the drill goes on (None: until the failures are done)
    duration_s: float | None = None
    # what the plan of failures is drawn from
    seed: int = 1
    # the failure kinds (None: KINDS, or CLUSTER_KINDS on the cluster)
    kinds: Sequence[FailureKind | str] | None = None
    # the checkpoint mode; several ("aligned,unaligned") are phases of their own, in turn
    mode: Mode | str | Sequence[Mode | str] = Mode.ALIGNED
    # seconds between checkpoints
    interval_s: float = 1.0
    # input records per second
    rate: float = 200.0
    # the snapshot store (None: s3://<the local bucket>/drills)
    store_uri: str | None = None
    # where the report goes (None: $SPARK_ABS_HOME/drills/<time>)
    report_dir: Path | None = None
    # a failure not recovered within this many seconds fails the drill (counted once a long outage or a
    # freeze ended, or a stuck send had the time its job takes to notice it)
    recovery_limit_s: float = 180.0
    # the job's delivery timeout (``spark-abs run --delivery-timeout``; None: a job's default, 120 s): a
    # broker-long outage lasts 1.25 to 1.75 times it, so a shorter one keeps such a drill short
    delivery_timeout_s: float | None = None
    # full or incremental snapshots
    state_snapshots: StateSnapshots | str = StateSnapshots.FULL
    # on the local cluster: the job's worker groups remote, made as ``workers`` says
    cluster: bool = False
    # a group per stage ("per-stage", None) or one for the job ("one"); only with ``cluster``
    workers: str | None = None
