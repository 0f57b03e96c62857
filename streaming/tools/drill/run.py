"""Restore drills: ``run_drill`` runs one as ``DrillSettings`` say, each mode a
phase (``Drill``) whose steps are classes of their own; what a drill does,
its failure kinds and its report are ``spark-abs drill``'s (``streaming.tools.cli.drill``)."""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from streaming.adapters.kafka.admin import job_key
from streaming.adapters.serde.schema_registry import registry_users
from streaming.api.config import Connection, LocalRuntimeSettings, default_home
from streaming.api.pipeline import load_pipeline, pipeline_reference
from streaming.api.settings import WORKER_GROUPINGS, JobSettings, Mode
from streaming.engine.job.groups import worker_groups
from streaming.errors import ConfigError, SparkAbsError, parse_choice
from streaming.tools.drill.failures import FailureInjector
from streaming.tools.drill.feed import ProgressWatch, WorkloadFeed
from streaming.tools.drill.job import DrilledJob, job_processes, job_worker_pids
from streaming.tools.drill.plan import (
    CLUSTER_KINDS,
    CLUSTER_ONLY,
    DAMAGES,
    KINDS,
    LIVENESS_KINDS,
    ORPHAN_BOUND_S,
    DrillBudget,
    Failure,
    FailureKind,
    FailureOutcome,
    LivenessBounds,
    check_kinds,
    cluster_targets,
    fault_pools,
    plan_failures,
    side_wait_s,
)
from streaming.tools.drill.settings import DrillSettings
from streaming.tools.drill.verify import DrillVerification
from streaming.tools.drill.workload import (
    DrillWorkload,
    InputRecord,
    load_workload,
    workload_for,
)
from streaming.waits import Deadline, WaitTimeout, join_within, poll_until

__all__ = [
    "check_workers",
    "CLUSTER_KINDS",
    "CLUSTER_ONLY",
    "DAMAGES",
    "KINDS",
    "ORPHAN_BOUND_S",
    "DrillBudget",
    "DrillReport",
    "DrillProgress",
    "DrillRun",
    "DrillSettings",
    "DrillWorkload",
    "Failure",
    "FailureKind",
    "FailureOutcome",
    "InputRecord",
    "fault_pools",
    "job_processes",
    "job_worker_pids",
    "load_workload",
    "plan_failures",
    "run_drill",
    "split_failures",
    "workload_for",
]

# failures planned for a phase bounded by its duration alone (the duration stops it long before)
_UNBOUNDED = 100_000

log = logging.getLogger(__name__)


@dataclass
class DrillReport:
    job: str
    seed: int
    mode: Mode
    pipeline: str
    plan: list[Failure]
    outcomes: list[FailureOutcome]
    checks: list  # drill_checks.SuiteResult
    frames: dict[str, pd.DataFrame]
    produced: int
    malformed: int
    checkpoints: int
    seconds: float
    problems: list[str]  # what went wrong outside the expectations (a failure not recovered, an orphan)
    report_dir: Path | None = None
    stopped: str = ""  # why failures stopped before the plan's end (the duration), or the drill itself did
    bounds: LivenessBounds = dataclasses.field(default_factory=LivenessBounds)  # what the liveness kinds outlast

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.checks) and all(c.success for c in self.checks)


@dataclass
class DrillRun:
    """A whole ``spark-abs drill``: one ``DrillReport`` per mode drilled, in turn."""

    pipeline: str
    seed: int
    phases: list[DrillReport]
    seconds: float
    budget: DrillBudget
    requested: int | None  # the failures asked for (None: as many as the duration allows)

    @property
    def passed(self) -> bool:
        return bool(self.phases) and all(p.passed for p in self.phases)

    @property
    def outcomes(self) -> list[FailureOutcome]:
        return [o for p in self.phases for o in p.outcomes]


class Drill:
    """One drill (see the module docstring); ``run_drill`` is the way in.
    It runs the steps in order; the job's process and store
    (``DrilledJob``), the workload sent (``WorkloadFeed``), the progress
    watched (``ProgressWatch``), the failures (``FailureInjector``) and the
    checks (``DrillVerification``) are classes of their own."""

    def __init__(
        self,
        connection: Connection,
        settings: DrillSettings,
        *,
        runtime=None,
        spark=None,
        budget: DrillBudget | None = None,
        failures_end: float | None = None,  # monotonic time after which no failure may end (None: no bound)
        on_failure: Callable[[FailureOutcome], None] | None = None,
    ):
        """A phase of a drill: ``settings`` with one mode, a number of
        failures, a ``DrillWorkload``, a store and a report directory
        (``run_drill`` resolves them)."""
        if not isinstance(settings.workload, DrillWorkload) or settings.store_uri is None:
            raise ConfigError("a drill phase needs its workload and its store resolved (run_drill does it)")
        if settings.report_dir is None or settings.failures is None:
            raise ConfigError("a drill phase needs its report directory and its failures (run_drill gives them)")
        pipeline, failures, seed, cluster = settings.pipeline, settings.failures, settings.seed, settings.cluster
        kinds = tuple(parse_choice(FailureKind, k, "failure kind") for k in settings.kinds or ())
        workers = settings.workers or "per-stage"  # how the remote groups are made on the cluster
        interval_s, store_uri, report_dir = settings.interval_s, settings.store_uri, settings.report_dir
        self.connection = connection
        self.settings = settings
        self.pipeline_ref = pipeline
        self.workload = settings.workload
        self.seed = seed
        self.mode = parse_choice(Mode, settings.mode, "mode")
        self.interval_s = interval_s
        self.rate = settings.rate
        self.store_uri = store_uri
        self.report_dir = report_dir
        self.spark = spark
        self.budget = budget = budget or DrillBudget()
        self.failures_end = failures_end
        self.on_failure = on_failure
        self.recover_timeout_s = budget.recovery_limit_s
        self.stopped = ""
        self.job = f"drill-{seed}-{uuid.uuid4().hex[:6]}"
        self.pipeline = load_pipeline(pipeline, self.job)
        _check_kinds(kinds, runtime, store_uri, cluster)
        if FailureKind.POISON in kinds and not self.workload.poison_ready:
            raise ConfigError(
                f"failure kind poison appends records no schema expected to {pipeline}'s ingress topics, and its "
                "workload's reference does not say it leaves them out (DrillWorkload.poison_ready, POISON_FILTER): "
                "leave poison out of --kinds, or make the reference filter them"
            )
        self.bounds = LivenessBounds.of(settings.delivery_timeout_s)
        pools = fault_pools(self.pipeline, self.mode)
        if cluster:
            spark_workers = [spec.name for spec in runtime.specs() if spec.name.startswith("spark-worker-")]
            pools |= cluster_targets(self.pipeline, runtime.services.kafka_names(), spark_workers, workers)
        self.plan = plan_failures(failures, seed, kinds, pools, interval_s, self.bounds)
        self.problems: list[str] = []  # what went wrong outside the expectations
        self.drilled = DrilledJob(
            connection,
            self.job,
            dataclasses.replace(settings, mode=self.mode, workers=workers),
            # a fault during a restore makes two restores of one failure (a duration-bound plan: at most one a second)
            max_restores=2 * (len(self.plan) if len(self.plan) < _UNBOUNDED else int(budget.duration_s or 0)) + 10,
            # on the cluster the groups (a group per stage, or one), each a `spark-abs worker`
            # the drill runs
            remote_groups=list(worker_groups(self.pipeline, workers)) if cluster else (),
            problems=self.problems,  # a remote worker that exited unbidden
        )
        self.started = time.monotonic()
        self.outcomes: list[FailureOutcome] = []
        self._stop = threading.Event()  # the workload's end, and the progress watch's
        self.watch = ProgressWatch(
            connection.kafka, self.pipeline, lambda: job_key(connection, self.pipeline.job), self._stop
        )
        self.feed = WorkloadFeed(
            connection.kafka, self.workload, self.pipeline, seed=seed, rate=self.rate, stop=self._stop
        )
        self.failures = FailureInjector(
            self.drilled,
            self.watch,
            runtime=runtime,
            wait=self._wait,
            log=self._log,
            problems=self.problems,
            started=self.started,
            recover_timeout_s=self.recover_timeout_s,
            pipeline=self.pipeline,
            workload=self.workload,
            last_sent=lambda: dict(self.feed.last),
        )

    def _log(self, line: str) -> None:
        log.info(f"[{time.monotonic() - self.started:6.1f} s] {line}")

    def _wait(self, condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
        """Poll ``condition`` until it holds (True) or ``timeout_s`` passed
        (False); a runner that exited or a workload that failed ends the drill."""

        def tended() -> bool:
            self.drilled.tend()
            if self.feed.error is not None:
                raise SparkAbsError(f"producing the workload failed: {self.feed.error}")
            return condition()

        try:
            poll_until(tended, timeout_s, "a drill's condition", every_s=poll_s)
        except WaitTimeout:
            return False
        return True

    # ---- the steps

    def run(self) -> DrillReport:
        """Prepare the job, feed it, start it, inject every failure that fits
        the budget, close the input, drain the job, check; whatever of the
        job still runs is stopped.  A failure not recovered within the limit
        ends the drill there: no drain, no checks, a failed report."""
        self._prepare()
        self.feed.thread.start()
        self.watch.thread.start()
        rng = random.Random(self.seed + 1)
        frames: dict[str, pd.DataFrame] = {}
        checks: list = []
        try:
            self._start()
            if self._inject_all(rng):
                self._close_input()
                self._drain()
                frames, checks = self._check()
        finally:
            self._stop.set()
            try:
                self.drilled.stop()
            finally:
                self.failures.cluster.bring_back()  # a node a failure left down
        report = self._report(checks, frames)
        self.drilled.store.close()
        return report

    def _inject_all(self, rng: random.Random) -> bool:
        """Inject the plan's failures while they fit the budget; False when
        one was not recovered within the limit (the drill stops)."""
        recoveries: list[float] = []
        for failure in self.plan:
            # a cluster kind's own waits, a liveness kind's outage or time to notice
            start = Deadline(failure.delay_s + side_wait_s(failure)).at  # when its recovery would begin
            if not self.budget.fits(start, self.failures_end, recoveries):
                self.stopped = f"the duration allowed {len(self.outcomes)} of the {len(self.plan)} failures planned"
                if len(self.plan) >= _UNBOUNDED:
                    self.stopped = f"the duration allowed {len(self.outcomes)} failures"
                self._log(self.stopped)
                return True
            outcome = self._inject(failure, rng)
            if self.on_failure is not None:
                self.on_failure(outcome)
            if not outcome.recovered:
                self.stopped = (
                    f"failure {failure.index + 1} ({failure.describe()}) not recovered within the limit of "
                    f"{self.recover_timeout_s:.0f} s (--recovery-limit): the drill stopped there"
                )
                self._log(self.stopped)
                return False
            if outcome.recovered_s is not None:  # recovered: it was timed
                recoveries.append(outcome.recovered_s)
        return True

    def _prepare(self) -> None:
        """The job's topics, as ``spark-abs run`` would make them, before any record is sent."""
        from streaming.engine.job.runner import JobRunner

        prepare = JobRunner(self.pipeline_ref, JobSettings(store=self.store_uri), self.connection, job=self.job)
        prepare.prepare()
        prepare.store.close()
        count = "failures until the duration" if len(self.plan) >= _UNBOUNDED else f"{len(self.plan)} failures"
        self._log(
            f"drill {self.job}: {count} from seed {self.seed} on {self.pipeline_ref} "
            f"({self.mode} checkpoints every {self.interval_s:g} s, {self.rate:g} records/s); report in {self.report_dir}"
        )
        if self.bounds.shortened or any(f.kind in LIVENESS_KINDS for f in self.plan):
            self._log(f"the job's bounds: {self.bounds.describe()}")

    def _start(self) -> None:
        self.drilled.start_runner()
        self.drilled.start_workers()
        if not self._wait(lambda: bool(self.drilled.completed()), self.recover_timeout_s):
            raise SparkAbsError(
                f"the job completed no checkpoint within {self.recover_timeout_s:.0f} s; see {self.drilled.runner_log}"
            )
        self._log(f"job up: checkpoint {self.drilled.completed()[-1]} complete")

    def _inject(self, failure: Failure, rng: random.Random) -> FailureOutcome:
        time.sleep(failure.delay_s)
        of = "" if len(self.plan) >= _UNBOUNDED else f"/{len(self.plan)}"
        self._log(f"failure {failure.index + 1}{of}: {failure.describe()}")
        outcome = self.failures.inject(failure, rng)
        self.outcomes.append(outcome)
        self._log("  " + _outcome_line(outcome))
        return outcome

    def _close_input(self) -> None:
        self._stop.set()
        join_within(self.feed.thread, 600.0, "the drill's workload producer")
        self._log(
            f"input closed after {self.feed.produced} records ({len(self.feed.malformed)} malformed, "
            f"{len(self.failures.poisoned)} poison); draining the job"
        )

    def _drain(self) -> None:
        self.drilled.drain()
        if self.drilled.hosts is not None:  # the remote workers too: their Spark applications free the cluster
            self.drilled.hosts.stop()
        self._log("drained: every input record is processed and committed")

    def _check(self) -> tuple[dict[str, pd.DataFrame], list]:
        return DrillVerification(
            self.connection,
            self.drilled,
            pipeline=self.pipeline,
            workload=self.workload,
            outcomes=self.outcomes,
            malformed=[*self.feed.malformed, *self.failures.poisoned],
            spark=self.spark,
            log=self._log,
        ).run()

    def _report(self, checks: list, frames: dict[str, pd.DataFrame]) -> DrillReport:
        return DrillReport(
            self.job,
            self.seed,
            self.mode,
            self.pipeline_ref,
            self.plan,
            self.outcomes,
            checks,
            frames,
            self.feed.produced,
            len(self.feed.malformed) + len(self.failures.poisoned),
            len(frames["checkpoints"]) if "checkpoints" in frames else len(self.drilled.completed()),
            round(time.monotonic() - self.started, 1),
            self.problems,
            self.report_dir,
            self.stopped,
            self.bounds,
        )


def check_workers(workers: str | None, cluster: bool) -> str:
    """How the remote groups are made (None: a group per stage): one of ``spark-abs
    run``'s, and given only with ``--cluster`` (on the local runtime the
    drill runs the job as ``spark-abs run`` does by default, one worker)."""
    if workers is None:
        return "per-stage"
    if not cluster:
        raise ConfigError("--workers lays out the remote worker groups of a drill with --cluster; add --cluster")
    if workers not in WORKER_GROUPINGS:
        raise ConfigError(f"--workers: {workers!r} is not one of {', '.join(WORKER_GROUPINGS)}")
    return workers


# the kinds that stop a service of the local runtime
_OUTAGES = (FailureKind.BROKER, FailureKind.STORE, FailureKind.BROKER_LONG, FailureKind.STORE_LONG)


def _check_kinds(kinds: Sequence[FailureKind], runtime, store_uri: str, cluster: bool = False) -> None:
    """Refuse failure kinds the deployment cannot have: outages need the local runtime, a store outage an s3:// store,
    the cluster's kinds the local cluster (``check_kinds``)."""
    check_kinds(kinds, cluster)
    if cluster and (runtime is None or not runtime.settings.is_cluster):
        raise ConfigError("a drill with --cluster runs on the local cluster (spark-abs local up --cluster)")
    needs_runtime = set(_OUTAGES) & set(kinds)
    if needs_runtime and runtime is None:
        raise ConfigError(
            f"failure kinds {', '.join(sorted(needs_runtime))} stop services of the local runtime; "
            "this drill runs on another deployment (SPARK_ABS_* set): leave them out with --kinds"
        )
    stores = [k for k in (FailureKind.STORE, FailureKind.STORE_LONG) if k in kinds]
    if stores and not store_uri.startswith("s3://"):
        raise ConfigError(f"failure kind {stores[0]} stops the S3 server; the store {store_uri} is not on it")


def _outcome_line(outcome: FailureOutcome) -> str:
    parts = []
    if outcome.restored_from:
        parts.append("restored from " + ", then ".join(outcome.restores("the beginning", "checkpoint ")))
    if outcome.recovered_s is not None:
        parts.append(f"a checkpoint completed {outcome.recovered_s:.1f} s after the failure")
    else:
        parts.append("NOT RECOVERED")
    if outcome.replayed is not None:
        parts.append(f"{outcome.replayed} input records replayed")
    if outcome.note:
        parts.append(outcome.note)
    return "; ".join(parts)


def split_failures(failures: int | None, modes: int) -> list[int]:
    """``failures`` shared between ``modes`` phases, the first ones taking
    what does not divide; None (bounded by a duration alone): as many as fit
    in each."""
    if failures is None:
        return [_UNBOUNDED] * modes
    return [failures // modes + (1 if i < failures % modes else 0) for i in range(modes)]


def _modes(mode: Mode | str | Sequence[Mode | str]) -> list[Mode]:
    names = mode.split(",") if isinstance(mode, str) else list(mode)
    modes = [parse_choice(Mode, m.strip() if isinstance(m, str) else m, "mode") for m in names]
    if not modes:
        raise ConfigError("a drill needs at least one mode")
    return modes


def run_drill(
    settings: DrillSettings | None = None,
    connection: Connection | None = None,
    *,
    runtime=None,
    spark=None,
    on_failure: Callable[[FailureOutcome], None] | None = None,
) -> DrillRun:
    """Run a drill as ``settings`` say (see the module docstring and
    ``DrillSettings``) and write its report; the local runtime is started
    when no ``connection`` is given.  The pipeline's workload comes from its
    module (``workload_for``) unless the settings name or give one.  Several
    modes are phases of their own, in turn, the failures and the duration
    shared between them.  ``on_failure`` hears of each failure's outcome as
    it comes.  On the cluster (started when no ``connection`` is given), the
    job's worker groups are remote, made as ``workers`` says (a group per
    stage, or ``one`` for the whole job), and the failure kinds are by
    default ``CLUSTER_KINDS`` (else ``KINDS``).  Its progress is logged
    (INFO)."""
    from streaming.tools.drill import report as drill_report

    settings = settings or DrillSettings()
    failures, duration_s, kinds, cluster = settings.failures, settings.duration_s, settings.kinds, settings.cluster
    if failures is None and duration_s is None:
        raise ConfigError("a drill needs a number of failures, a duration, or both")
    if failures is not None and failures < 0:
        raise ConfigError(f"failures must be 0 or more, got {failures}")
    budget = DrillBudget(duration_s, recovery_limit_s=settings.recovery_limit_s)
    LivenessBounds.of(settings.delivery_timeout_s)  # a delivery timeout refused before the runtime starts
    modes = _modes(settings.mode)
    if kinds is None:
        kinds = CLUSTER_KINDS if cluster else KINDS
    chosen = tuple(parse_choice(FailureKind, k, "failure kind") for k in kinds)
    check_kinds(chosen, cluster)
    workers = check_workers(settings.workers, cluster)  # before the runtime starts
    pipeline = pipeline_reference(settings.pipeline)
    workload = settings.workload
    if not isinstance(workload, DrillWorkload):
        workload = load_workload(workload) if workload else workload_for(pipeline)
    started = time.monotonic()
    run_end = None if duration_s is None else started + duration_s
    if connection is None:
        from streaming.local import LocalRuntime

        runtime_settings = LocalRuntimeSettings.cluster(default_home()) if cluster else None
        runtime = runtime or LocalRuntime(runtime_settings, progress=log.info)
        # with the schema registry when the pipeline reads or writes Avro through one
        connection = runtime.up(registry=bool(registry_users(load_pipeline(pipeline))))
    # a workload's producer and reference find Avro schemas in the job's registry
    from streaming.adapters.serde.schema_registry import use_connection_registry

    use_connection_registry(connection)
    store_uri = settings.store_uri or f"s3://{connection.s3_bucket}/drills"
    report_dir = Path(settings.report_dir or default_home() / "drills" / time.strftime("%Y%m%d-%H%M%S"))
    phases: list[DrillReport] = []
    for index, (phase_mode, count) in enumerate(zip(modes, split_failures(failures, len(modes)))):
        phase = dataclasses.replace(
            settings,
            pipeline=pipeline,
            workload=workload,
            failures=count,
            seed=settings.seed + 7919 * index,  # the first mode's plan is the plan of a drill of that mode alone
            kinds=chosen,
            mode=phase_mode,
            store_uri=store_uri,
            report_dir=report_dir if len(modes) == 1 else report_dir / str(phase_mode),
            workers=workers,
        )
        drill = Drill(
            connection,
            phase,
            runtime=runtime,
            spark=spark,
            budget=budget,
            failures_end=budget.phase_end(time.monotonic(), run_end, len(modes) - index),
            on_failure=on_failure,
        )
        phases.append(drill.run())
        if not phases[-1].passed and not phases[-1].checks:  # stopped: a failure not recovered
            break
    run = DrillRun(pipeline, settings.seed, phases, round(time.monotonic() - started, 1), budget, failures)
    drill_report.write(run, report_dir)
    return run


class DrillProgress:
    """The drill's progress on a terminal (rich): failures done (of how many,
    or of the duration), the last recovery and the percentiles so far."""

    def __init__(self, failures: int | None, duration_s: float | None):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.total = failures
        self.duration_s = duration_s
        self.recoveries: list[float] = []
        self.progress = Progress(
            TextColumn("[bold]drill[/bold]"),
            BarColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            transient=False,
        )
        self.task = self.progress.add_task(self._text(0), total=failures)
        self.done = 0

    def _text(self, done: int) -> str:
        from streaming.tools.drill.plan import percentile

        of = f"{done}/{self.total}" if self.total is not None else f"{done}"
        text = f"{of} failures"
        if self.recoveries:
            p50, p90 = percentile(self.recoveries, 50), percentile(self.recoveries, 90)
            text += f", recovered in p50 {p50:.1f} s, p90 {p90:.1f} s, max {max(self.recoveries):.1f} s"
        if self.duration_s is not None:
            text += f" (duration {self.duration_s / 60:.0f} min)"
        return text

    def __call__(self, outcome: FailureOutcome) -> None:
        self.done += 1
        if outcome.recovered_s is not None:
            self.recoveries.append(outcome.recovered_s)
        self.progress.update(self.task, advance=1, description=self._text(self.done))
