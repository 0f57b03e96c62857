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

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from barriers.failures import CheckpointFailure
from barriers.messages import CheckpointOptions
from streaming.adapters.kafka.admin import check_broker, create_topic, end_offsets
from streaming.adapters.objects import open_store, store_patiently
from streaming.adapters.serde.schema_registry import check_registry
from streaming.adapters.snapshots import SnapshotStore
from streaming.api import partitioning
from streaming.api.config import Connection, MetricsSettings, default_home
from streaming.api.pipeline import Pipeline, Scale, SinkKind, load_pipeline
from streaming.api.settings import WORKER_GROUPINGS, JobSettings
from streaming.api.topics import control_topic, dead_letter_topic
from streaming.engine import metrics
from streaming.engine.job.coordinator import (
    CheckpointRecord,
    CompletionHooks,
    CoordinatorService,
    CoordinatorStart,
    kafka_io,
)
from streaming.engine.job.liveness import DueRestore, Liveness, Verdict
from streaming.engine.job.supervisor import WorkerProcess, WorkerSupervisor
from streaming.engine.remote.leases import LeaseRenewal, RemoteMembers
from streaming.engine.remote.membership import incarnation
from streaming.engine.restore.changes import AllowDropped
from streaming.engine.restore.service import RestoreRecord, RestoreService
from streaming.errors import ConfigError, JobFailed, KafkaUnavailableError, SparkAbsError, StoreError

__all__ = ["JobRunner", "RunOptions", "RestoreRecord", "worker_groups"]

log = logging.getLogger(__name__)

# how long the runner waits for Kafka to answer when it asks whether it does (liveness)
_PROBE_TIMEOUT_S = 5.0
# a step (or the time between two) longer than this: the runner did not listen meanwhile (liveness.deaf)
_DEAF_AFTER_S = 2.0


def worker_groups(pipeline: Pipeline, workers: Mapping[str, list[str]] | str | None) -> dict[str, list[str]]:
    """Which worker runs which tasks: ``"one"`` (the default: one worker,
    ``all``), ``"per-stage"`` (a worker per stage, named after it) or a
    mapping of worker names to task names."""
    if workers is None or workers == "one":
        return {"all": [t.name for t in pipeline.tasks()]}
    if workers == "per-stage":
        groups: dict[str, list[str]] = {}
        for task in pipeline.tasks():
            groups.setdefault(task.stage, []).append(task.name)
        return groups
    if isinstance(workers, str):
        raise ConfigError(f"workers: {workers!r} is not one of {', '.join(WORKER_GROUPINGS)} or a mapping")
    return dict(workers)


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
        self.connection = connection
        # signs the job's control events, leases and barriers: without it the job does not start
        self.key = connection.job_key(self.job)
        self.on_complete = on_complete
        self.worker_env = dict(options.worker_env)
        self.groups = self._groups(self.pipeline)
        self.remote_names = set(self.groups) if remote is True else set(remote or ())
        unknown = sorted(self.remote_names - set(self.groups))
        if unknown:
            raise ConfigError(
                f"remote worker groups {', '.join(unknown)}: the job's groups are {', '.join(sorted(self.groups))}"
            )
        self.remote = RemoteMembers(
            incarnation(),
            pipeline_ref,
            self.job,
            settings.to_json(),
            settings.heartbeat_timeout_s,
            self._remote_groups(),
            lambda: LeaseRenewal(connection.kafka, self.key),
        )
        self.log_dir = options.log_dir or default_home() / "runs" / self.job
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.store = SnapshotStore(open_store(settings.store, connection), self.job)
        # a restore into a changed pipeline may drop these stages' state (streaming.engine.restore.changes)
        self.recovery = RestoreService(self.declared, self.store, settings, connection, options.allow_dropped)
        self.max_restores = options.max_restores
        self.restores: list[RestoreRecord] = []
        self.history: list[CheckpointRecord] = []
        self.metrics_settings = options.metrics or MetricsSettings.from_env()
        self.supervisor = self._supervisor(self.pipeline)
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
        self._due: DueRestore | None = None
        self.metrics_server: metrics.MetricsServer | None = None
        self.metrics_targets: metrics.Targets | None = None

    def _groups(self, pipeline: Pipeline) -> dict[str, list[str]]:
        groups = worker_groups(pipeline, self.options.workers)
        tasks = {t.name for t in pipeline.tasks()}
        grouped = [t for names in groups.values() for t in names]
        if sorted(grouped) != sorted(tasks):
            raise SparkAbsError(
                f"workers must run every task exactly once: tasks {sorted(tasks)}, workers run {sorted(grouped)}"
            )
        return groups

    def _supervisor(self, pipeline: Pipeline) -> WorkerSupervisor:
        local = {name: tasks for name, tasks in self.groups.items() if name not in self.remote_names}
        return WorkerSupervisor(
            self.pipeline_ref,
            self.job,
            local,
            self.settings,
            self.log_dir,
            scale=self._scale(),
            metrics=self.metrics_settings,
        )

    def _scale(self) -> Scale | None:
        """The job's scale when other than its code declares (None: as declared)."""
        return None if self.pipeline.scale == self.declared.scale else self.pipeline.scale

    def _remote_groups(self) -> dict[str, list[str]]:
        return {name: tasks for name, tasks in self.groups.items() if name in self.remote_names}

    def _use_scale(self, scale: Scale) -> None:
        """Run the pipeline at ``scale`` from now on: workers of another scale stop."""
        pipeline = self.declared.rescaled(scale)
        if pipeline.scale == self.pipeline.scale:
            return
        self.supervisor.stop_all()
        metrics.forget_tasks(self.job, [t.name for t in self.pipeline.tasks()])
        self.pipeline = pipeline
        self.groups = self._groups(pipeline)
        self.supervisor = self._supervisor(pipeline)
        self.remote.groups.groups = self._remote_groups()

    # ---- set-up

    def prepare(self) -> None:
        """Create the job's topics (idempotent)."""
        kafka = self.connection.kafka
        check_registry(self.pipeline, self.connection.schema_registry)
        for ingress in self.pipeline.ingress:
            create_topic(kafka, ingress.topic, ingress.partitions)
        for topic, partitions in self.pipeline.internal_topics().items():
            create_topic(kafka, topic, partitions)
        for stage in self.pipeline.stages:
            if (
                stage.sink is not None and stage.sink.kind is SinkKind.KAFKA and stage.sink.topic
            ):  # Sink checks it has one
                create_topic(kafka, stage.sink.topic, 1)
        create_topic(kafka, control_topic(self.job), 1)
        create_topic(kafka, dead_letter_topic(self.job), 1)

    def start(self, restore: int | None = None) -> None:
        """Start fresh, or from checkpoint ``restore`` (a new generation)."""
        self._serve_metrics()  # a port in use stops the start before anything is recorded
        # the store knows the job from its fresh start on (_JOB.json records generation 0): a job
        # whose runner stopped or died goes on from its checkpoints, or from the beginning as a new
        # generation (what the one before wrote is stale), never as a second generation 0
        known = store_patiently(
            lambda: self.store.read_job() is not None or bool(self.store.checkpoints()), "reading the job"
        )
        if restore is None and not known:
            self._refuse_an_unknown_earlier_run()
            self.prepare()
            scale = self.pipeline.scale.to_json()
            store_patiently(lambda: self.store.first_generation(scale=scale), "recording the fresh start")
            self._launch(generation=0, checkpoint_id=None)
        else:
            self.restore(
                f"restore requested from checkpoint {restore}" if restore else "restart",
                restore,
                cause="requested" if restore else "restart",
            )

    def _refuse_an_unknown_earlier_run(self) -> None:
        """A fresh start where an earlier run of this job name left its
        control events, but the store has no record of it (another store, or
        one emptied since): its barriers in the ingress topics and its
        records in the internal ones would be taken for this run's."""
        kafka, topic = self.connection.kafka, control_topic(self.job)
        create_topic(kafka, topic, 1)
        events = sum(end_offsets(kafka, topic, 1).values())
        if events:
            raise ConfigError(
                f"job {self.job}: Kafka holds an earlier run of this job ({events} events on {topic}, "
                f"barriers in its ingress topics, records in its internal topics), but the store "
                f"{self.settings.store} has no record of it; starting afresh would take that run's barriers "
                f"and records for this one's.  Run with the earlier run's --store to go on from its "
                f"checkpoints, or under another --job name (topics are named after the job)"
            )

    @property
    def workers(self) -> dict[str, WorkerProcess]:
        return self.supervisor.workers

    def _launch(self, generation: int, checkpoint_id: int | None) -> None:
        """Generation ``generation``: a coordinator of its own, then the workers from ``checkpoint_id``."""
        self._serve_metrics()
        metrics.generation(self.job, generation)
        if self.coordinator is not None:
            self.coordinator.abandon(CheckpointFailure.RESTORED, f"generation {generation} starts")
            self.history.extend(self.coordinator.records.values())
            self.coordinator.close()
            self.coordinator = None
        next_id = self._next_checkpoint_id()
        io = kafka_io(self.connection.kafka, self.key)
        if self.remote_names:
            poll = io.poll
            io.poll = lambda timeout_s: self.remote.observe(poll(timeout_s))
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
        if self.remote_names:
            scale = self._scale()
            self.remote.start_generation(
                generation, checkpoint_id, self._remote_groups(), scale.to_json() if scale else None
            )
        self._last_trigger = time.monotonic()
        self.liveness.launched()

    def _serve_metrics(self) -> None:
        """The runner's metrics endpoint and its targets file, the first time (none with ``MetricsSettings.off``)."""
        if self.metrics_server is not None:
            return
        self.metrics_server = metrics.serve(self.metrics_settings, "run --metrics-port")
        if self.metrics_server is None:
            return
        self.metrics_targets = metrics.Targets(
            self.log_dir / metrics.TARGETS_FILE, self.job, self.metrics_server.address
        )
        self.log.info(
            "job %s: metrics on %s; Prometheus targets (file_sd) in %s",
            self.job,
            self.metrics_server.url,
            self.metrics_targets.path,
        )

    def _note_endpoints(self, coordinator: CoordinatorService) -> None:
        """The workers' metrics endpoints their ready events named, into the targets file."""
        if self.metrics_targets is None or not coordinator.readiness.endpoints:
            return
        group_of = {task: group for group, tasks in self.groups.items() for task in tasks}
        self.metrics_targets.update(
            {group_of[task]: address for task, address in coordinator.readiness.endpoints.items() if task in group_of}
        )

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
        if self._due is not None:
            self._retry_restore(self._due)
            return
        coordinator = self.require_started()
        dead = self.supervisor.dead()
        if dead:
            worker = dead[0]
            self.log.info(
                "worker %s (tasks %s) exited with %s; last lines of %s:\n%s",
                worker.name,
                ", ".join(worker.tasks),
                worker.exit_text(),
                worker.log_path,
                worker.tail(),
            )
            if worker.pipeline_error:  # every restore would stop on it again
                raise JobFailed(
                    f"job {self.job}: worker {worker.name} (tasks {', '.join(worker.tasks)}) stopped on an error "
                    f"in the pipeline, which no restore can fix; fix it and run the job again "
                    f"(its log: {worker.log_path}):\n{worker.tail(4)}"
                )
            self._restore_or_wait(Verdict("worker_died", f"worker {worker.name} died"))
            return
        if self.remote_names:
            reason = self.remote.restore_reason()
            if reason is not None:
                self._restore_or_wait(Verdict("worker_lost", reason))
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
        self._note_endpoints(coordinator)
        if coordinator.kafka_troubles > troubles:
            self.liveness.lost()
        if time.monotonic() - began > _DEAF_AFTER_S:  # a send waited: what was heard meanwhile is read now
            self.liveness.deaf()
        local = {name: w.tasks for name, w in self.supervisor.workers.items()}
        verdict = self.liveness.verdict(coordinator.failures, local, coordinator.heard_at, coordinator.ready)
        if verdict is not None:
            self.log.warning("job %s: %s; killing its workers and restoring", self.job, verdict.reason)
            self.supervisor.kill_all()  # a frozen or stuck worker cannot restore in place
            self._restore_or_wait(verdict)

    def _restore_or_wait(self, verdict: Verdict) -> None:
        """Restore for ``verdict`` now, or, while Kafka or the store does not
        answer, kill every worker (nothing runs uncoordinated) and try again
        later (``_retry_restore``)."""
        now = time.monotonic()
        try:
            if not self.liveness.hears(fresh=True):
                raise KafkaUnavailableError(f"Kafka at {self.connection.kafka} does not answer")
            self.restore(verdict.reason, cause=verdict.cause)
        except (KafkaUnavailableError, StoreError) as exc:
            self.supervisor.kill_all()
            if self._due is None:
                self._due = DueRestore(verdict, since=now)
            pause = self._due.failed(now)
            self.log.warning(
                "job %s: restoring (%s) must wait: %s; trying again in %.0f s (waiting %.0f s of at most %.0f s, "
                "restore_wait_s)",
                self.job,
                verdict.reason,
                exc,
                pause,
                now - self._due.since,
                self.options.restore_wait_s,
            )
        else:
            self._due = None

    def _retry_restore(self, due: DueRestore) -> None:
        """A restore that waits: try it again once its pause is over; the
        job fails once it waited ``RunOptions.restore_wait_s``."""
        now = time.monotonic()
        if now - due.since > self.options.restore_wait_s:
            raise JobFailed(
                f"job {self.job}: the restore ({due.verdict.reason}) waited {now - due.since:.0f} s for Kafka "
                f"and the store, more than restore_wait_s ({self.options.restore_wait_s:g} s); "
                f"{due.attempts} attempts failed.  Bring them back and run the job again: it goes on from its "
                f"latest checkpoint"
            )
        if now < due.retry_at:
            time.sleep(min(0.2, due.retry_at - now))
            return
        self._restore_or_wait(due.verdict)

    def restore(self, reason: str, checkpoint_id: int | None = None, *, cause: str = "requested") -> RestoreRecord:
        """Stop every worker and start the next generation from a checkpoint:
        ``checkpoint_id`` or the latest that verifies, rescaled first when it
        was taken with other task counts than the job runs with now (the
        steps: ``streaming.engine.restore.service``).  ``cause`` names why in a
        word (``RESTORE_CAUSES``), for the store and the restores metric
        (``reason`` says it to a person)."""
        if len(self.restores) >= self.max_restores:
            raise JobFailed(f"job {self.job}: {len(self.restores)} restores already; giving up ({reason})")
        plan = self.recovery.prepare(
            checkpoint_id, self.parallelism, self.pipeline.scale, self._next_checkpoint_id, cause
        )
        record = plan.record(reason)
        self._use_scale(plan.scale)
        self.prepare()
        written = ""
        if plan.rescale is not None:
            written = f" (checkpoint {plan.rescaled_from} rescaled to {plan.scale.describe()})"
        elif plan.change is not None:
            written = f" (checkpoint {plan.changed_from} changed: {plan.change.describe()})"
        if plan.rewritten:
            if self.remote_names:
                poll = self.coordinator.poll if self.coordinator is not None else None
                why = (
                    f"checkpoint {plan.rescaled_from} is being rescaled to {plan.scale.describe()}"
                    if plan.rescale is not None
                    else f"checkpoint {plan.changed_from} is being restored into a changed pipeline"
                )
                self.remote.pause(plan.generation, why, poll, self.connection.kafka, self.key)
            self.stop_workers()
            self.recovery.write(plan)
        self.log.info(
            "restoring generation %d from %s%s (%s)",
            plan.generation,
            f"checkpoint {plan.checkpoint_id}" if plan.checkpoint_id else "the beginning (no complete checkpoint)",
            written,
            reason,
        )
        # a rescale or a change writes the checkpoint again under a new id: what it came from is what counts
        self._warn_of_a_rollback(plan.rescaled_from or plan.changed_from or plan.checkpoint_id, plan.generation)
        # workers that still run restore in place (their Spark stays up); dead ones start again
        self._launch(plan.generation, plan.checkpoint_id)
        self.restores.append(record)  # a restore that could not start (Kafka away) is not counted
        metrics.restored(self.job, cause)
        return record

    def _warn_of_a_rollback(self, checkpoint_id: int | None, generation: int) -> None:
        """Say on the console, not only in a worker's log, what going back
        past completed checkpoints of the job's line means for Kafka sinks:
        their transactions for those checkpoints cannot be taken back.  A
        checkpoint an earlier restore already left behind does not count
        (its epochs were superseded then); a store that cannot say is
        logged, never a failed restore."""
        sinks = [s.sink for s in self.pipeline.stages if s.sink is not None and s.sink.kind is SinkKind.KAFKA]
        topics = [sink.topic for sink in sinks if sink.topic]
        if not topics:
            return
        try:
            newer = self._on_the_line_after(checkpoint_id or 0, generation)
        except (SparkAbsError, ValueError, OSError) as exc:
            self.log.warning(
                "job %s: cannot tell whether this restore goes back past committed output: %s", self.job, exc
            )
            return
        if not newer:
            return
        self.log.warning(
            "job %s: going back to %s, while checkpoint(s) up to %d completed: Kafka sink topic(s) %s may hold "
            "what was committed after it (a transaction cannot be taken back). The restored job writes those "
            "results again and marks the earlier epochs superseded in <topic>.commits: read_committed consumers "
            "see them twice; streaming.read_kafka_output, or skipping superseded epochs by the abs.epoch header, "
            "reads each result once (docs/operations/sinks.md)",
            self.job,
            f"checkpoint {checkpoint_id}" if checkpoint_id else "the beginning",
            newer[-1],
            ", ".join(topics),
        )

    def _on_the_line_after(self, checkpoint_id: int, generation: int) -> list[int]:
        """The completed checkpoints after ``checkpoint_id`` that the job's
        line still held before generation ``generation`` started: none an
        earlier generation's restore left behind."""
        meta = self.store.read_job()
        if meta is None:
            return [c for c in self.store.completed() if c > checkpoint_id]
        # the job's history as it stood before this generation: JobMeta.abandoned, the rule a restore picks by
        before = dataclasses.replace(meta, restores=tuple(r for r in meta.restores if r.generation != generation))
        return [
            c
            for c in self.store.completed()
            if c > checkpoint_id and before.abandoned(c, self.store.read_manifest(c).generation) is None
        ]

    def rescale(self, parallelism: Mapping[str, int], checkpoint_id: int | None = None) -> RestoreRecord:
        """Restore the running job with ``parallelism`` (stage -> tasks; stages
        not named keep theirs) from ``checkpoint_id`` or the latest that
        verifies: ``run --restore N --parallelism ...`` without stopping the runner."""
        wanted = {**self.parallelism, **parallelism}
        self._groups(self.declared.rescaled(Scale(wanted)))  # an unknown stage, too many tasks: refused here
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
        if self.coordinator is not None:
            self.history.extend(self.coordinator.records.values())
            self.coordinator.close()
            self.coordinator = None
        self.store.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    def require_started(self) -> CoordinatorService:
        """The current generation's coordinator; a ``SparkAbsError`` before ``start``."""
        if self.coordinator is None:
            raise SparkAbsError(f"job {self.job} is not started")
        return self.coordinator
