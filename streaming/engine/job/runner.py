"""Running a job: topics, the coordinator service, worker processes, and
restore when a worker dies or the job stops being live.

``JobRunner`` starts one worker process per group of tasks, each its own
Spark application (``WorkerSupervisor``): by default one group, ``all``, so a
job needs one JVM and every task is a query of it (their Spark jobs run in
the order they come); ``workers=`` groups tasks otherwise (one worker per stage,
as a cluster deployment would).  The coordinator service runs in the
runner's own process.  When a worker dies, the whole job restores (every task
rolls back to the same cut): the other workers are stopped, the latest
complete checkpoint that verifies is chosen (newer ones that do not are
skipped, and the runner says why), a new generation is recorded in the
store, and the workers start again from that checkpoint.  With no complete
checkpoint yet, the new generation starts from the beginning.

A job that runs but is not live restores too (``liveness``): more
consecutive failed checkpoints than ``tolerable_failed_checkpoints``, or a
worker process alive but silent for ``heartbeat_timeout_s`` (frozen, stuck)
while Kafka answers the runner; its workers are SIGKILLed first.  A restore
that needs Kafka or the store while they are away waits for them, no worker
running, for at most ``RunOptions.restore_wait_s``.  The runner's own sends
(barriers, control events) give up after ``coordinator.RUNNER_SEND_BOUND_S``:
it goes on supervising while Kafka is away.

Groups named in ``remote=`` (``run --remote-workers``: all of them) are not
started here: each is a ``spark-abs worker`` process on any host, joined
through the control topic (``streaming.engine.remote.membership``).  The runner
publishes a lease every second naming each group's member; a member silent
for ``heartbeat_timeout_s`` (or that stopped its tasks) is taken for dead and
the job restores, its standby taking over when one waits.

A job keeps the task counts of its latest generation (``_JOB.json`` records
each generation's ``Scale``); ``parallelism=`` (``run --parallelism``) asks
for others.  A restore whose checkpoint was taken with other task counts
rescales it first (``streaming.engine.restore.rescale``): the checkpoint becomes one
of the new scale, written as the next checkpoint id, and that is restored.
A restore whose checkpoint was taken with other stages (one added or removed,
an operator whose state schema changed) writes it as a checkpoint of the
pipeline as declared the same way (``streaming.engine.restore.changes``), and
refuses what would drop state unless ``allow_dropped=`` allows it.

The runner keeps the job's lifecycle (``start``, ``step``, ``close``) and
hands the rest to classes of their own: ``restore.service.RestoreService`` picks,
rescales and records what a restore starts from; ``remote.leases.RemoteMembers``
holds the remote groups' lease, heartbeats and pauses;
``operations`` drives a job from outside (drain, kill a worker).

The runner serves its Prometheus metrics (``metrics=``, ``run
--metrics-port``, ``SPARK_ABS_METRICS_PORT``: a free port by default) and
each worker its own; the runner lists every endpoint in
``prometheus-targets.json`` in its log directory, for Prometheus's
``file_sd_configs`` (``streaming.engine.metrics``)."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from barriers.coordinator import CheckpointStatus
from barriers.failures import CheckpointFailure
from barriers.messages import ChannelId, CheckpointOptions
from streaming.adapters.kafka.admin import check_broker, end_offsets, job_key
from streaming.adapters.kafka.dead_letters import DeadLetterTopic, Restored
from streaming.adapters.objects import open_store, store_patiently
from streaming.adapters.snapshots import SnapshotStore
from streaming.api import partitioning
from streaming.api.config import Connection, MetricsSettings, default_home
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Pipeline, Scale, load_pipeline
from streaming.api.settings import JobSettings, skip_range
from streaming.api.topics import dead_letter_topic
from streaming.engine import metrics
from streaming.engine.job.coordinator import (
    CheckpointRecord,
    CompletionHooks,
    CoordinatorService,
    CoordinatorStart,
    kafka_io,
)
from streaming.engine.job.endpoints import RunnerEndpoints
from streaming.engine.job.groups import JobGroups
from streaming.engine.job.liveness import Liveness, Verdict, WaitingRestore
from streaming.engine.job.preparation import create_topics, known_to, start_fresh
from streaming.engine.job.rollback import warn_of_a_rollback
from streaming.engine.job.supervisor import WorkerProcess, WorkerSupervisor
from streaming.engine.remote.leases import LeaseRenewal, RemoteMembers
from streaming.engine.remote.membership import incarnation
from streaming.engine.restore.changes import AllowDropped
from streaming.engine.restore.service import RestoreRecord, RestoreService
from streaming.errors import ConfigError, JobFailed, SparkAbsError, failed_at

__all__ = ["JobRunner", "RunOptions", "RestoreRecord"]

log = logging.getLogger(__name__)

# how long the runner waits for Kafka to answer when it asks whether it does (liveness)
_PROBE_TIMEOUT_S = 5.0
# a step (or the time between two) longer than this: the runner did not listen meanwhile (liveness.deaf)
_DEAF_AFTER_S = 2.0


# failures at the same place (a task, its channel, its error), with no checkpoint between, after which the
# runner stops the job rather than restore it into the same failure again
SAME_FAILURES = 3


def check_skip_records(pipeline: Pipeline, settings: JobSettings) -> None:
    """A ``ConfigError`` for a range of ``settings.skip_records`` on a
    channel no task of ``pipeline`` reads, or one a stage of Spark code reads
    (Spark prepares its records before the task sees them: the code's
    failures are searched by Spark instead)."""
    readers = {channel: spec for spec in pipeline.tasks() for channel in spec.inputs}
    for spec in settings.skip_records:
        topic, partition, _, _ = skip_range(spec)
        task = readers.get(ChannelId(topic, partition))
        if task is None:
            known = sorted({c.topic for c in readers})
            raise ConfigError(f"--skip-records {spec}: no task reads {topic}:{partition} (topics: {', '.join(known)})")
        if pipeline.stage(task.stage).spark is not None:
            raise ConfigError(
                f"--skip-records {spec}: stage {task.stage} reads {topic}:{partition} with Spark code, which "
                "prepares its records before the task sees them; records its code raises on are set aside "
                "already (docs/operations/record-errors.md)"
            )


@dataclass(frozen=True)
class RunOptions:
    """How a job runs, beside what its checkpoints are (``JobSettings``):
    ``spark-abs run``'s options that are not settings of the checkpoints."""

    # the worker processes: "one" (one Spark application for the job), "per-stage", or a
    # mapping of group name -> its tasks; None: WORKER_GROUPINGS' first, one
    workers: Mapping[str, list[str]] | str | None = None
    # tasks per stage other than the pipeline declares (a rescale when the job starts)
    parallelism: Mapping[str, int] = field(default_factory=dict)
    # the groups that `spark-abs worker` processes run on other hosts (True: every group)
    remote: bool | Collection[str] = False
    # added to the environment of the worker processes (a drill's or a test's fault points)
    worker_env: Mapping[str, str] = field(default_factory=dict)
    # the workers' logs and the progress log; None: $SPARK_ABS_HOME/runs/<job>
    log_dir: Path | None = None
    # restores after which the runner gives up
    max_restores: int = 10
    # where the runner and its workers serve Prometheus metrics; None: from the SPARK_ABS_METRICS_* variables
    metrics: MetricsSettings | None = None
    # stages whose state a restore into a changed pipeline may drop
    allow_dropped: AllowDropped | None = None
    # how long a restore may wait for Kafka and the store to come back before the job fails
    restore_wait_s: float = 1800.0


class JobRunner:
    """Supervises one job (see the module docstring), run as ``options``
    says (``RunOptions``); ``on_complete`` hears of every checkpoint that
    completes, by its id."""

    def __init__(
        self,
        pipeline_ref: str,
        settings: JobSettings,
        connection: Connection,
        *,
        job: str | None = None,
        options: RunOptions | None = None,
        on_complete: Callable[[int], None] | None = None,
    ):
        self.options = options = options or RunOptions()
        parallelism, remote = options.parallelism, options.remote
        self.pipeline_ref = pipeline_ref
        # the pipeline as its code declares it; ``pipeline`` is it at the scale of the current generation
        self.declared: Pipeline = load_pipeline(pipeline_ref, job)
        self.parallelism = dict(parallelism or {})
        self.pipeline = self.declared.rescaled(Scale(self.parallelism))
        partitioning.check(self.pipeline)  # a partitioning that cannot give the right answer never starts
        self.job = self.pipeline.job
        # every line says which job it is about (``record.job``), for a command that runs several
        self.log = logging.LoggerAdapter(log, {"job": self.job})
        self.settings = settings
        check_skip_records(self.pipeline, settings)
        self.connection = connection
        # the job's secret is needed now: without it the job does not start
        connection.store_key(self.job)
        self.on_complete = on_complete
        self.worker_env = dict(options.worker_env)
        # which worker group runs which tasks, at the job's scale, and which groups run remotely
        self.layout = JobGroups(self.declared, self.pipeline, options.workers, remote)
        self.remote = RemoteMembers(
            incarnation(),
            pipeline_ref,
            self.job,
            settings.to_json(),
            settings.heartbeat_timeout_s,
            self.layout.remote,
            lambda: LeaseRenewal(connection.kafka, self.key),
        )
        self.log_dir = options.log_dir or default_home() / "runs" / self.job
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.store = SnapshotStore(open_store(settings.store, connection), self.job, key=connection.store_key(self.job))
        # a restore into a changed pipeline may drop these stages' state (streaming.engine.restore.changes)
        self.recovery = RestoreService(self.declared, self.store, settings, connection, options.allow_dropped)
        self.max_restores = options.max_restores
        self.restores: list[RestoreRecord] = []
        # where each restore's failure was (a task, channel and error) and the newest checkpoint then
        self._failures: list[tuple[tuple[str, str, str] | None, int]] = []
        self.history: list[CheckpointRecord] = []
        self.metrics_settings = options.metrics or MetricsSettings.from_env()
        self.supervisor = self._supervisor()
        self.coordinator: CoordinatorService | None = None
        self._last_trigger = 0.0
        # restores a job that runs but is not live (streaming.engine.job.liveness)
        self.liveness = Liveness(
            settings.tolerable_failed_checkpoints,
            settings.heartbeat_timeout_s,
            lambda: check_broker(connection.kafka, _PROBE_TIMEOUT_S),
            failing_for_s=settings.timeout_s,
        )
        self._last_step_end = time.monotonic()
        # a restore waiting for Kafka or the store to come back
        self.waiting = WaitingRestore(
            self.job,
            lambda verdict: self.restore(verdict.reason, cause=verdict.cause),
            lambda: self.supervisor.kill_all(),
            lambda: self.liveness.hears(fresh=True),
            connection.kafka,
            options.restore_wait_s,
            self.log,
        )
        # the runner's metrics endpoint and the targets file of every endpoint of the job
        self.endpoints = RunnerEndpoints(self.metrics_settings, self.log_dir, self.job, self.log)

    @functools.cached_property
    def key(self) -> JobKey:
        """What signs the job's control events, leases and barriers: its key on its Kafka
        cluster (asked for the cluster's id when first needed)."""
        return job_key(self.connection, self.job)

    def _supervisor(self) -> WorkerSupervisor:
        return WorkerSupervisor(
            self.pipeline_ref,
            self.job,
            self.layout.local,
            self.settings,
            self.log_dir,
            scale=self.layout.scale,
            metrics=self.metrics_settings,
        )

    def _use_scale(self, scale: Scale) -> None:
        """Run the pipeline at ``scale`` from now on: workers of another scale stop."""
        pipeline = self.declared.rescaled(scale)
        if pipeline.scale == self.pipeline.scale:
            return
        self.supervisor.stop_all()
        metrics.forget_tasks(self.job, [t.name for t in self.pipeline.tasks()])
        self.pipeline = pipeline
        self.layout.at(pipeline)
        self.supervisor = self._supervisor()
        self.remote.groups.groups = self.layout.remote

    # ---- set-up

    def prepare(self) -> None:
        """Create the job's topics (idempotent; ``preparation.create_topics``)."""
        create_topics(self.pipeline, self.connection)

    def start(self, restore: int | None = None) -> None:
        """Start fresh, or from checkpoint ``restore`` (a new generation)."""
        self.endpoints.serve()  # a port in use stops the start before anything is recorded
        if restore is None and not known_to(self.store):
            start_fresh(self.pipeline, self.connection, self.store, self.settings.store)
            self._launch(generation=0, checkpoint_id=None)
        else:
            self.restore(
                f"restore requested from checkpoint {restore}" if restore else "restart",
                restore,
                cause="requested" if restore else "restart",
            )

    @property
    def workers(self) -> dict[str, WorkerProcess]:
        return self.supervisor.workers

    def _launch(self, generation: int, checkpoint_id: int | None) -> None:
        """Generation ``generation``: a coordinator of its own, then the workers from ``checkpoint_id``."""
        self.endpoints.serve()
        metrics.generation(self.job, generation)
        self._retire_coordinator(f"generation {generation} starts")
        next_id = self._next_checkpoint_id()
        io = kafka_io(
            self.connection.kafka, self.key, observe=self.remote.observe if self.layout.remote_names else None
        )
        self.coordinator = CoordinatorService(
            self.pipeline,
            io,
            self.store,
            self.settings,
            start=CoordinatorStart(generation, next_id, pinned=checkpoint_id),
            hooks=CompletionHooks(self.on_complete, self.log_dir / "checkpoints.jsonl"),
            job_key=self.key.barriers,
        )
        env = {**os.environ, **self.connection.as_env(), "PYTHONUNBUFFERED": "1", **self.worker_env}
        self.supervisor.launch(generation, checkpoint_id, env)
        if self.layout.remote_names:
            scale = self.layout.scale
            self.remote.start_generation(
                generation, checkpoint_id, self.layout.remote, scale.to_json() if scale else None
            )
        self._last_trigger = time.monotonic()
        self.liveness.launched()

    # ---- running

    @property
    def generation(self) -> int:
        return self.coordinator.generation if self.coordinator else 0

    def step(self, *, trigger: bool = True, options: CheckpointOptions | None = None) -> None:
        """One round: trigger when the interval passed (with ``options``, or
        the job's), read control events, restore if a worker died, a remote
        group went silent or lost its tasks, or the job is not live
        (``liveness``); while a restore waits for Kafka or the store, try it
        again when its pause is over."""
        began = time.monotonic()
        if began - self._last_step_end > _DEAF_AFTER_S:  # the caller did something else for a while
            self.liveness.deaf()
        try:
            self._step(began, trigger, options)
        finally:
            self._last_step_end = time.monotonic()

    def _step(self, began: float, trigger: bool, options: CheckpointOptions | None) -> None:
        if self.waiting.due is not None:
            self.waiting.retry()
            return
        coordinator = self.require_started()
        died = self.supervisor.death(self.job, self.log)
        if died is not None:
            self.waiting.attempt(Verdict("worker_died", died))
            return
        if self.layout.remote_names:
            reason = self.remote.restore_reason()
            if reason is not None:
                self.waiting.attempt(Verdict("worker_lost", reason))
                return
        due = time.monotonic() - self._last_trigger >= self.settings.interval_s
        troubles = coordinator.kafka_troubles
        # a trigger Kafka refused is tried again an interval later, as one that went out
        if (
            trigger
            and coordinator.all_ready
            and due
            and (coordinator.trigger(options) is not None or coordinator.kafka_troubles > troubles)
        ):
            self._last_trigger = time.monotonic()
        coordinator.poll(0.2)
        self.endpoints.note(coordinator.readiness.endpoints, self.layout.groups)
        if coordinator.kafka_troubles > troubles:
            self.liveness.lost()
        if time.monotonic() - began > _DEAF_AFTER_S:  # a send waited: what was heard meanwhile is read now
            self.liveness.deaf()
        local = {name: w.tasks for name, w in self.supervisor.workers.items()}
        verdict = self.liveness.verdict(coordinator.failures, local, coordinator.heard_at, coordinator.ready)
        if verdict is not None:
            self.log.warning("job %s: %s; killing its workers and restoring", self.job, verdict.reason)
            self.supervisor.kill_all()  # a frozen or stuck worker cannot restore in place
            self.waiting.attempt(verdict)

    def restore(self, reason: str, checkpoint_id: int | None = None, *, cause: str = "requested") -> RestoreRecord:
        """Stop every worker and start the next generation from a checkpoint:
        ``checkpoint_id`` or the latest that verifies, rescaled first when it
        was taken with other task counts than the job runs with now (the
        steps: ``streaming.engine.restore.service``).  ``cause`` names why in a
        word (``RESTORE_CAUSES``), for the store and the restores metric
        (``reason`` says it to a person)."""
        if len(self.restores) >= self.max_restores:
            raise JobFailed(f"job {self.job}: {len(self.restores)} restores already; giving up ({reason})")
        self._stop_a_repeated_failure(reason)
        plan = self.recovery.prepare(
            checkpoint_id, self.parallelism, self.pipeline.scale, self._next_checkpoint_id, cause
        )
        record = plan.record(reason)
        self._use_scale(plan.scale)
        self.prepare()
        if plan.rewritten:
            if self.layout.remote_names:
                poll = self.coordinator.poll if self.coordinator is not None else None
                self.remote.pause(plan.generation, plan.pause_reason(), poll, self.connection.kafka, self.key)
            self.stop_workers()
            self.recovery.write(plan)
        self.log.info(
            "restoring generation %d from %s%s (%s)",
            plan.generation,
            f"checkpoint {plan.checkpoint_id}" if plan.checkpoint_id else "the beginning (no complete checkpoint)",
            plan.rewrite_note(),
            reason,
        )
        # a rescale or a change writes the checkpoint again under a new id: what it came from is what counts
        source = plan.rescaled_from or plan.changed_from or plan.checkpoint_id
        warn_of_a_rollback(self.log, self.pipeline, self.store, source, plan.generation)
        self._mark_restore(Restored(plan.generation, source or 0))
        # workers that still run restore in place (their Spark stays up); dead ones start again
        self._launch(plan.generation, plan.checkpoint_id)
        self.restores.append(record)  # a restore that could not start (Kafka away) is not counted
        metrics.restored(self.job, cause)
        return record

    def _mark_restore(self, restored: Restored) -> None:
        """The dead letters older generations sent after the restored
        checkpoint are sent again by the replay: a signed mark in the
        dead-letter topic supersedes them, before any worker starts.  A
        topic with no letter gets none (an empty topic stays empty: no
        record was set aside)."""
        if not any(end_offsets(self.connection.kafka, dead_letter_topic(self.job), 1).values()):
            return
        letters = DeadLetterTopic(self.connection.kafka, self.job, delivery_timeout_s=self.settings.delivery_timeout_s)
        try:
            letters.mark_restore(restored, self.key)
        finally:
            letters.close()

    def _stop_a_repeated_failure(self, reason: str) -> None:
        """A ``JobFailed`` when a task failed at the same place (its task,
        channel and error: ``failed_at``) ``SAME_FAILURES`` times in a row
        with no checkpoint completed between: every restore meets it again.
        It says where, and how to restore past the records."""
        place = failed_at(reason)
        newest = max((r.checkpoint_id for r in self.checkpoints() if r.status is CheckpointStatus.COMPLETED), default=0)
        self._failures.append((None if place is None else (place[0], place[1], place[4]), newest))
        recent = self._failures[-SAME_FAILURES:]
        if place is None or len(recent) < SAME_FAILURES or len(set(recent)) > 1:
            return
        task, channel, first, last, error = place
        since = f"checkpoint {newest}" if newest else "the beginning"
        raise JobFailed(
            f"job {self.job}: task {task} failed {SAME_FAILURES} times in a row on {channel} (the last time at offsets "
            f"{first}..{last}), restored from {since} each time, with: {error}. Every restore meets it again. Fix the "
            f"stage's code and run the job again, or restore past the records, which then go to the dead letters: "
            f"spark-abs run ... --restore {newest or 0} --skip-records {channel}:{first}-{last} (widen the range "
            f"when another micro-batch cut it elsewhere)"
        )

    def rescale(self, parallelism: Mapping[str, int], checkpoint_id: int | None = None) -> RestoreRecord:
        """Restore the running job with ``parallelism`` (stage -> tasks; stages
        not named keep theirs) from ``checkpoint_id`` or the latest that
        verifies: ``run --restore N --parallelism ...`` without stopping the runner."""
        wanted = {**self.parallelism, **parallelism}
        self.layout.of(self.declared.rescaled(Scale(wanted)))  # an unknown stage, too many tasks: refused here
        self.parallelism = wanted
        return self.restore(f"rescale to {Scale(wanted).describe()} requested", checkpoint_id, cause="rescale")

    def _next_checkpoint_id(self) -> int:
        """Above every checkpoint the store holds (complete or not) and every one this runner triggered."""
        stored = store_patiently(self.store.checkpoints, "listing checkpoints")
        return max(stored + [r.checkpoint_id for r in self.checkpoints()] + [0]) + 1

    def stop_workers(self, timeout_s: float = 15.0) -> None:
        self.supervisor.stop_all(timeout_s)

    def checkpoints(self) -> list[CheckpointRecord]:
        """Every checkpoint seen, in trigger order."""
        current = list(self.coordinator.records.values()) if self.coordinator else []
        return sorted(self.history + current, key=lambda r: r.checkpoint_id)

    def close(self) -> None:
        self.stop_workers()
        self.remote.end()
        self._retire_coordinator(None)
        self.store.close()
        self.endpoints.close()

    def _retire_coordinator(self, abandoned: str | None) -> None:
        """The current coordinator closed, its records kept in ``history``;
        with ``abandoned``, its pending checkpoints abandoned first, why."""
        if self.coordinator is None:
            return
        if abandoned is not None:
            self.coordinator.abandon(CheckpointFailure.RESTORED, abandoned)
        self.history.extend(self.coordinator.records.values())
        self.coordinator.close()
        self.coordinator = None

    def require_started(self) -> CoordinatorService:
        """The current generation's coordinator; a ``SparkAbsError`` before ``start``."""
        if self.coordinator is None:
            raise SparkAbsError(f"job {self.job} is not started")
        return self.coordinator
