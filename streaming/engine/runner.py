"""Running a job: topics, the coordinator service, worker processes, and
restore when a worker dies.

``JobRunner`` starts one worker process per group of tasks, each its own
Spark application (``WorkerSupervisor``): by default one group, ``all``, so a
job needs one JVM and every task is a query of it (Spark's FAIR scheduler, a
pool per query); ``workers=`` groups tasks otherwise (one worker per stage,
as a cluster deployment would).  The coordinator service runs in the
runner's own process.  When a worker dies, the whole job restores (every task
rolls back to the same cut): the other workers are stopped, the latest
complete checkpoint that verifies is chosen (newer ones that do not are
skipped, and the runner says why), a new generation is recorded in the
store, and the workers start again from that checkpoint.  With no complete
checkpoint yet, the new generation starts from the beginning.

Groups named in ``remote=`` (``run --remote-workers``: all of them) are not
started here: each is a ``spark-abs worker`` process on any host, joined
through the control topic (``streaming.engine.membership``).  The runner
publishes a lease every second naming each group's member; a member silent
for ``heartbeat_timeout_s`` (or that stopped its tasks) is taken for dead and
the job restores, its standby taking over when one waits.

A job keeps the task counts of its latest generation (``_JOB.json`` records
each generation's ``Scale``); ``parallelism=`` (``run --parallelism``) asks
for others.  A restore whose checkpoint was taken with other task counts
rescales it first (``streaming.engine.rescale``): the checkpoint becomes one
of the new scale, written as the next checkpoint id, and that is restored."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from barriers.messages import CheckpointOptions
from streaming.adapters import codec
from streaming.adapters.control import ControlEvent, ControlKind, ControlTopic, control_topic_name, send_event
from streaming.adapters.kafka_admin import create_topic, end_offsets
from streaming.adapters.kafka_io import (
    DELIVERY_BOUND_S,
    DeadLetters,
    dead_letter_topic_name,
    producer,
    read_range,
    write_records,
)
from streaming.adapters.objects import open_store, patiently
from streaming.adapters.sinks import open_sink, sink_location
from streaming.adapters.snapshots import JobMeta, Manifest, SnapshotStore
from streaming.api.config import Connection, default_home
from streaming.api.pipeline import Pipeline, Scale, SinkKind, load_pipeline
from streaming.api.settings import WORKER_LAYOUTS, JobSettings
from streaming.engine.coordinator import CheckpointRecord, CoordinatorService, kafka_io
from streaming.engine.membership import HEARTBEAT_INTERVAL_S, LEASE_INTERVAL_S, Heartbeat, Lease, RemoteGroups
from streaming.engine.rescale import RescalePlan, plan_rescale, rerouted_headers, scale_of, target_scale
from streaming.engine.supervisor import WorkerProcess, WorkerSupervisor
from streaming.errors import ConfigError, JobFailed, SparkAbsError

__all__ = ["JobRunner", "RestoreRecord", "worker_groups"]

log = logging.getLogger(__name__)

# how often the runner says which remote groups it still waits for
WAITING_NOTICE_S = 30.0


class _LeaseRenewal:
    """Publishes the runner's latest lease every ``LEASE_INTERVAL_S`` from a
    thread of its own, on a producer of its own: a runner busy with a slow
    send (a barrier after an outage) or a restore is still alive, and its
    remote workers must not take it for dead."""

    def __init__(self, bootstrap: str, job: str):
        self.topic = control_topic_name(job)
        self._producer = producer(bootstrap)
        self._lease: Lease | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-abs-lease", daemon=True)
        self._thread.start()

    def renew(self, lease: Lease) -> None:
        """From now on publish ``lease``, the first time at once."""
        self._lease = lease
        self._wake.set()

    def _publish(self, lease: Lease, bound_s: float = DELIVERY_BOUND_S) -> None:
        send_event(self._producer, self.topic, lease.event(), bound_s, f"the lease of generation {lease.generation}")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(LEASE_INTERVAL_S)
            self._wake.clear()
            lease = self._lease
            if lease is None or self._stop.is_set():
                continue
            try:
                self._publish(lease)
            except SparkAbsError as exc:  # the broker is away: the next renewal tries again
                log.warning("lease not renewed: %s", exc)

    def end(self, lease: Lease) -> None:
        """Stop renewing and publish ``lease`` (the last one: members stop their tasks now)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2 * LEASE_INTERVAL_S + 1)
        try:
            # a stopping runner does not wait out an outage: without it the workers' leases lapse
            self._publish(lease, bound_s=10.0)
        except SparkAbsError as exc:
            log.warning("last lease not published: %s", exc)
        finally:
            self._producer.close()


@dataclass(frozen=True)
class RestoreRecord:
    generation: int
    checkpoint_id: int | None
    reason: str
    skipped: tuple[tuple[int, tuple[str, ...]], ...] = ()
    # a rescaling restore: the checkpoint that was rescaled into ``checkpoint_id``
    rescaled_from: int | None = None


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
        raise ConfigError(f"workers: {workers!r} is not one of {', '.join(WORKER_LAYOUTS)} or a mapping")
    return dict(workers)


class JobRunner:
    """Supervises one job (see the module docstring)."""

    def __init__(
        self,
        pipeline_ref: str,
        settings: JobSettings,
        connection: Connection,
        *,
        job: str | None = None,
        workers: Mapping[str, list[str]] | str | None = None,
        faults: str = "",
        say: Callable[[str], None] = print,
        log_dir: Path | None = None,
        max_restores: int = 10,
        on_complete: Callable[[int], None] | None = None,
        parallelism: Mapping[str, int] | None = None,
        remote: bool | Collection[str] = False,
    ):
        self.pipeline_ref = pipeline_ref
        # the pipeline as its code declares it; ``pipeline`` is it at the scale of the current generation
        self.declared: Pipeline = load_pipeline(pipeline_ref, job)
        self.parallelism = dict(parallelism or {})
        self.pipeline = self.declared.rescaled(Scale(self.parallelism))
        self.job = self.pipeline.job
        self.settings = settings
        self.connection = connection
        self.say = say
        self.on_complete = on_complete
        self.faults = faults
        self._workers_layout = workers
        self.groups = self._groups(self.pipeline)
        self.remote_names = set(self.groups) if remote is True else set(remote or ())
        unknown = sorted(self.remote_names - set(self.groups))
        if unknown:
            raise ConfigError(
                f"remote worker groups {', '.join(unknown)}: the job's groups are {', '.join(sorted(self.groups))}"
            )
        self.runner_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.remote = RemoteGroups(self._remote_groups(), settings.heartbeat_timeout_s, say=say)
        self._leases: _LeaseRenewal | None = None
        self._waiting_at = 0.0
        self._lost: list[str] = []
        self._checkpoint: int | None = None
        # while a rescaled checkpoint is written: (its generation, why); every lease then names no member
        self._paused: tuple[int, str] | None = None
        self.log_dir = log_dir or default_home() / "runs" / self.job
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.store = SnapshotStore(open_store(settings.store, connection), self.job)
        self.max_restores = max_restores
        self.restores: list[RestoreRecord] = []
        self.history: list[CheckpointRecord] = []
        self.supervisor = self._supervisor(self.pipeline)
        self.coordinator: CoordinatorService | None = None
        self._last_trigger = 0.0

    def _groups(self, pipeline: Pipeline) -> dict[str, list[str]]:
        groups = worker_groups(pipeline, self._workers_layout)
        tasks = {t.name for t in pipeline.tasks()}
        grouped = [t for names in groups.values() for t in names]
        if sorted(grouped) != sorted(tasks):
            raise SparkAbsError(
                f"workers must run every task exactly once: tasks {sorted(tasks)}, workers run {sorted(grouped)}"
            )
        return groups

    def _supervisor(self, pipeline: Pipeline) -> WorkerSupervisor:
        scale = None if pipeline.scale == self.declared.scale else pipeline.scale
        local = {name: tasks for name, tasks in self.groups.items() if name not in self.remote_names}
        return WorkerSupervisor(self.pipeline_ref, self.job, local, self.settings, self.log_dir, scale=scale)

    def _remote_groups(self) -> dict[str, list[str]]:
        return {name: tasks for name, tasks in self.groups.items() if name in self.remote_names}

    def _use_scale(self, scale: Scale) -> None:
        """Run the pipeline at ``scale`` from now on: workers of another scale stop."""
        pipeline = self.declared.rescaled(scale)
        if pipeline.scale == self.pipeline.scale:
            return
        self.supervisor.stop_all()
        self.pipeline = pipeline
        self.groups = self._groups(pipeline)
        self.supervisor = self._supervisor(pipeline)
        self.remote.groups = self._remote_groups()

    # ---- set-up

    def prepare(self) -> None:
        """Create the job's topics (idempotent)."""
        bootstrap = self.connection.kafka_bootstrap
        for ingress in self.pipeline.ingress:
            create_topic(bootstrap, ingress.topic, ingress.partitions)
        for topic, partitions in self.pipeline.internal_topics().items():
            create_topic(bootstrap, topic, partitions)
        for stage in self.pipeline.stages:
            if stage.sink is not None and stage.sink.kind is SinkKind.KAFKA:
                create_topic(bootstrap, stage.sink.topic, 1)
        create_topic(bootstrap, control_topic_name(self.job), 1)
        create_topic(bootstrap, dead_letter_topic_name(self.job), 1)

    def start(self, restore: int | None = None) -> None:
        """Start fresh, or from checkpoint ``restore`` (a new generation)."""
        # the store knows the job from its fresh start on (_JOB.json records generation 0): a job
        # whose runner stopped or died goes on from its checkpoints, or from the beginning as a new
        # generation (what the one before wrote is stale), never as a second generation 0
        known = patiently(
            lambda: self.store.read_job() is not None or bool(self.store.checkpoints()), "reading the job", self.say
        )
        if restore is None and not known:
            self._refuse_an_unknown_earlier_run()
            self.prepare()
            scale = self.pipeline.scale.to_json()
            patiently(lambda: self.store.first_generation(scale=scale), "recording the fresh start", self.say)
            self._launch(generation=0, checkpoint_id=None)
        else:
            self.restore(f"restore requested from checkpoint {restore}" if restore else "restart", restore)

    def _refuse_an_unknown_earlier_run(self) -> None:
        """A fresh start where an earlier run of this job name left its
        control events, but the store has no record of it (another store, or
        one emptied since): its barriers in the ingress topics and its
        records in the internal ones would be taken for this run's."""
        bootstrap, topic = self.connection.kafka_bootstrap, control_topic_name(self.job)
        create_topic(bootstrap, topic, 1)
        events = sum(end_offsets(bootstrap, topic, 1).values())
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
        if self.coordinator is not None:
            self.history.extend(self.coordinator.records.values())
            self.coordinator.close()
            self.coordinator = None
        next_id = self._next_checkpoint_id()
        io = kafka_io(self.connection.kafka_bootstrap, self.job)
        if self.remote_names:
            poll = io.poll
            io = dataclasses.replace(io, poll=lambda timeout_s: self._observe(poll(timeout_s)))
        self.coordinator = CoordinatorService(
            self.pipeline,
            io,
            self.store,
            self.settings,
            generation=generation,
            next_checkpoint_id=next_id,
            pinned=checkpoint_id,
            on_event=self.say,
            on_complete=self.on_complete,
            progress_log=self.log_dir / "checkpoints.jsonl",
        )
        env = {**os.environ, **self.connection.as_env(), "PYTHONUNBUFFERED": "1"}
        if self.faults:
            env["SPARK_ABS_FAULT"] = self.faults
        self.supervisor.launch(generation, checkpoint_id, env)
        self._checkpoint = checkpoint_id
        self._lost = []
        if self.remote_names:
            # members restore in place once the lease names the new generation; the others join
            self.remote.new_generation(self._remote_groups())
            if self._leases is None:
                self._leases = _LeaseRenewal(self.connection.kafka_bootstrap, self.job)
            self._renew_lease()
        self._last_trigger = time.monotonic()

    # ---- remote worker groups

    def _lease(self, *, ended: bool = False) -> Lease:
        """The lease as things are now; during a pause (``_pause_remote``)
        one of the paused generation that names no member, whoever joins."""
        generation, checkpoint, note = self.generation, self._checkpoint, ""
        if self._paused is not None:
            (generation, note), checkpoint = self._paused, None
        return Lease(
            runner=self.runner_id,
            generation=generation,
            checkpoint=checkpoint,
            pipeline=self.pipeline_ref,
            job=self.job,
            settings=self.settings.to_json(),
            scale=None if self.pipeline.scale == self.declared.scale else self.pipeline.scale.to_json(),
            groups={g: list(t) for g, t in self.remote.groups.items()},
            members={} if ended or self._paused is not None else dict(self.remote.members),
            timeout_s=self.settings.heartbeat_timeout_s,
            ended=ended,
            note=note,
        )

    def _renew_lease(self) -> None:
        """The lease as things are now, published from now on (the first time at once)."""
        if self._leases is not None:
            self._leases.renew(self._lease())

    def _pause_remote(self, generation: int, why: str) -> None:
        """Stop the remote workers' tasks before a rescaled checkpoint is
        written (as the local workers are stopped): a lease of ``generation``
        naming no member, heartbeats listened to until every worker heard
        (those of a runner before this one too) says its tasks stopped, or
        the heartbeat timeout passes.  The next lease names them again."""
        if not self.remote_names:
            return
        if self._leases is None:  # a runner's first restore: workers of the one before may still run
            self._leases = _LeaseRenewal(self.connection.kafka_bootstrap, self.job)
        self.remote.forget_reports()
        # a worker that joins meanwhile ("joined" renews the lease) is told to pause too
        self._paused = (generation, why)
        self._leases.renew(self._lease())
        control = None
        if self.coordinator is not None:
            poll = self.coordinator.poll
        else:
            control = ControlTopic(self.connection.kafka_bootstrap, self.job)
            control.seek_to_end()
            poll = lambda timeout_s: self._observe(control.poll(timeout_s))  # noqa: E731
        started = time.monotonic()
        deadline = started + self.settings.heartbeat_timeout_s + 5
        try:
            # every worker's heartbeat comes at least once a second: listen a little before concluding
            while time.monotonic() < deadline and (
                time.monotonic() - started < 2.5 * HEARTBEAT_INTERVAL_S or self.remote.still_running()
            ):
                poll(0.2)
        finally:
            self._paused = None
            if control is not None:
                control.close()
        running = self.remote.still_running()
        if running:
            self.say(f"remote worker group(s) {', '.join(running)} did not say their tasks stopped; rescaling anyway")

    def _observe(self, events: list[ControlEvent]) -> list[ControlEvent]:
        """Membership events on their way to the coordinator."""
        for event in events:
            if event.kind is ControlKind.LEASE and event.task == self.runner_id:
                self.remote.own()
            elif event.kind is ControlKind.HEARTBEAT:
                try:
                    beat = Heartbeat.from_event(event)
                except ValueError as exc:
                    self.say(f"ignored: {exc}")
                    continue
                outcome = self.remote.on_heartbeat(beat, self.generation)
                if outcome == "joined":
                    self._renew_lease()  # tell it at once
                elif outcome == "lost" and beat.group not in self._lost:
                    self._lost.append(beat.group)
        return events

    def _watch_remote(self) -> bool:
        """Restore when a remote group went silent or lost its tasks (True: a
        restore happened); say which groups nobody runs yet."""
        for group in self._lost:
            self.remote.drop(group)
            self.restore(f"worker group {group} stopped its tasks")
            return True
        for group in self.remote.silent():
            quiet = self.remote.quiet_for(group)
            member = self.remote.members.get(group)
            self.remote.drop(group)
            self.restore(
                f"worker group {group} ({member}) went silent: no heartbeat for {quiet:.0f} s "
                f"(heartbeat_timeout_s {self.settings.heartbeat_timeout_s:g})"
            )
            return True
        now = time.monotonic()
        missing = self.remote.missing()
        if missing and now - self._waiting_at >= WAITING_NOTICE_S:
            self._waiting_at = now
            self.say(
                "waiting for remote worker group(s) "
                + ", ".join(missing)
                + ": start `spark-abs worker --job "
                + self.job
                + " --group GROUP` on any host that reaches Kafka and the store"
            )
        return False

    # ---- running

    @property
    def generation(self) -> int:
        return self.coordinator.generation if self.coordinator else 0

    def step(self, *, trigger: bool = True, options: CheckpointOptions | None = None) -> None:
        """One round: trigger when the interval passed (with ``options``, or
        the job's), read control events, restore if a worker died."""
        coordinator = self._require()
        dead = self.supervisor.dead()
        if dead:
            worker = dead[0]
            self.say(
                f"worker {worker.name} (tasks {', '.join(worker.tasks)}) exited with "
                f"{worker.exit_text()}; last lines of {worker.log_path}:\n{worker.tail()}"
            )
            self.restore(f"worker {worker.name} died")
            return
        if self.remote_names and self._watch_remote():
            return
        due = time.monotonic() - self._last_trigger >= self.settings.interval_s
        if trigger and coordinator.all_ready and due and coordinator.trigger(options) is not None:
            self._last_trigger = time.monotonic()
        coordinator.poll(0.2)

    def restore(self, reason: str, checkpoint_id: int | None = None) -> RestoreRecord:
        """Stop every worker and start the next generation from a checkpoint:
        ``checkpoint_id`` or the latest that verifies, rescaled first when it
        was taken with other task counts than the job runs with now."""
        if len(self.restores) >= self.max_restores:
            raise JobFailed(f"job {self.job}: {len(self.restores)} restores already; giving up ({reason})")
        skipped: list[tuple[int, list[str]]] = []
        manifest: Manifest | None
        # an unreachable store (an outage) is waited for, boundedly; a damaged checkpoint is skipped
        if checkpoint_id is None:
            manifest, skipped = patiently(self.store.latest_verified, "picking a checkpoint", self.say)
            checkpoint_id = manifest.checkpoint_id if manifest else None
        else:
            named = checkpoint_id
            problems = patiently(lambda: self.store.verify(named), f"verifying checkpoint {named}", self.say)
            if problems:
                raise JobFailed(f"checkpoint {checkpoint_id} cannot be restored: {'; '.join(problems)}")
            manifest = patiently(lambda: self.store.read_manifest(named), f"reading checkpoint {named}", self.say)
        for skipped_id, problems in skipped:
            self.say(f"checkpoint {skipped_id} skipped: {'; '.join(problems)}")
        meta = patiently(self.store.read_job, "reading the job", self.say)
        generation = (meta.generation if meta else 0) + 1
        current = _recorded_scale(meta) or self.pipeline.scale
        wanted = {**current.parallelism, **self.parallelism}
        rescaled_from = None
        if manifest is None:
            scale = target_scale(self.declared, current, wanted, generation)
        else:
            scale = scale_of(manifest, self.declared)
            if scale.parallelism != wanted:
                new = target_scale(self.declared, scale, wanted, generation)
                plan = self._plan_rescale(manifest, scale, new, generation)
                rescaled_from, scale = checkpoint_id, plan.new
        details: dict[str, object] = {"scale": scale.to_json()}
        if rescaled_from is not None:
            checkpoint_id = self._next_checkpoint_id()
            details["rescaled_from"] = rescaled_from
        picked = checkpoint_id
        recorded = patiently(
            lambda: self.store.next_generation(picked, **details), "recording the generation", self.say
        )
        if recorded != generation:
            raise JobFailed(f"job {self.job}: generation {recorded} was recorded meanwhile; is another runner running?")
        record = RestoreRecord(
            generation, checkpoint_id, reason, tuple((cid, tuple(p)) for cid, p in skipped), rescaled_from
        )
        self.restores.append(record)
        self._use_scale(scale)
        self.prepare()
        if rescaled_from is not None:
            self._pause_remote(generation, f"checkpoint {rescaled_from} is being rescaled to {scale.describe()}")
            self._write_rescaled(plan, checkpoint_id, manifest)
        self.say(
            f"restoring generation {generation} from "
            + (f"checkpoint {checkpoint_id}" if checkpoint_id else "the beginning (no complete checkpoint)")
            + (f" (checkpoint {rescaled_from} rescaled to {scale.describe()})" if rescaled_from is not None else "")
            + f" ({reason})"
        )
        # workers that still run restore in place (their Spark stays up); dead ones start again
        self._launch(generation, checkpoint_id)
        return record

    def rescale(self, parallelism: Mapping[str, int], checkpoint_id: int | None = None) -> RestoreRecord:
        """Restore the running job with ``parallelism`` (stage -> tasks; stages
        not named keep theirs) from ``checkpoint_id`` or the latest that
        verifies: ``run --restore N --parallelism ...`` without stopping the runner."""
        wanted = {**self.parallelism, **parallelism}
        self._groups(self.declared.rescaled(Scale(wanted)))  # an unknown stage, too many tasks: refused here
        self.parallelism = wanted
        return self.restore(f"rescale to {Scale(wanted).describe()} requested", checkpoint_id)

    # ---- rescaling

    def _next_checkpoint_id(self) -> int:
        """Above every checkpoint the store holds (complete or not) and every one this runner triggered."""
        stored = patiently(self.store.checkpoints, "listing checkpoints", self.say)
        current = list(self.coordinator.records) if self.coordinator else []
        return max(stored + current + [r.checkpoint_id for r in self.history] + [0]) + 1

    def _plan_rescale(self, manifest: Manifest, old: Scale, new: Scale, generation: int) -> RescalePlan:
        """What rescaling ``manifest``'s checkpoint to ``new`` takes; a
        ``RescaleError`` before anything changes when it cannot be done."""
        source = manifest.checkpoint_id
        self.say(f"rescaling checkpoint {source} from {old.describe()} to {new.describe()}")
        loaded = {
            name: patiently(lambda n=name: self.store.load_task(source, n), f"reading task {name}", self.say)
            for name in manifest.tasks
        }
        bootstrap = self.connection.kafka_bootstrap
        return plan_rescale(
            self.declared,
            source,
            loaded,
            old,
            new,
            generation,
            lambda channel, start, end: read_range(bootstrap, channel, start, end),
        )

    def _write_rescaled(self, plan: RescalePlan, checkpoint_id: int, source: Manifest) -> None:
        """Checkpoint ``checkpoint_id``: ``plan`` written out.  The old sink
        tasks recover to the source checkpoint first (their staged epochs up to
        it committed, later ones discarded), the new topics get the re-routed
        channel state, then every task's snapshot and the manifest."""
        self.stop_workers()
        old_pipeline = self.declared.rescaled(plan.old)
        location = sink_location(self.settings, self.job, self.connection)
        for spec in old_pipeline.tasks():
            stage = old_pipeline.stage(spec.stage)
            if stage.sink is not None:
                sink = open_sink(
                    stage.sink, location, spec.name, job=self.job, bootstrap=self.connection.kafka_bootstrap
                )
                try:
                    sink.recover(plan.source)
                finally:
                    getattr(sink, "close", lambda: None)()
        bootstrap = self.connection.kafka_bootstrap
        if plan.rerouted:
            values = {c: [v for t in tables for v in codec.encode_batches(t)] for c, tables in plan.rerouted.items()}
            writer = producer(bootstrap, max_in_flight_requests_per_connection=1)
            try:
                plan.place(write_records(writer, values, rerouted_headers(plan.generation)))
            finally:
                writer.close()
        if plan.undecodable:
            letters = DeadLetters(bootstrap, self.job)
            try:
                for channel, offset, why in plan.undecodable:
                    letters.send(channel, offset, None, None, [], f"channel state not decodable when rescaling: {why}")
            finally:
                letters.close()
        snapshots = {}
        for name, task in plan.tasks.items():
            snapshots[name] = self.store.write_task(
                checkpoint_id,
                plan.generation,
                name,
                task.state,
                positions={str(c): p for c, p in task.positions.items()},
                in_flight={str(c): r for c, r in task.in_flight.items()},
                channel_records={str(c): t for c, t in task.channel_records.items()} or None,
                metadata={
                    "kind": "rescaled",
                    "rescaled_from": plan.source,
                    "watermarks": {str(c): w for c, w in task.watermarks.items()},
                    "lineage": task.lineage.to_json(),
                },
            )
        self.store.write_manifest(
            checkpoint_id,
            plan.generation,
            snapshots,
            options=source.options,
            metrics={
                "rescaled_from": plan.source,
                "scale": plan.new.to_json(),
                "previous_scale": plan.old.to_json(),
                "rerouted_rows": plan.rerouted_rows,
                "kinds": ["rescaled"],
                "tasks": {},
            },
        )
        self.say(plan.describe() + f": written as checkpoint {checkpoint_id}")

    def kill_worker(self, name: str) -> None:
        """SIGKILL a worker, named or by a task or stage it runs (a drill): the next ``step`` restores."""
        for group in self.remote_names:
            tasks = self.groups.get(group, [])
            if name == group or any(t == name or t.rsplit("-", 1)[0] == name for t in tasks):
                raise SparkAbsError(f"{name!r} runs in remote worker group {group}: kill its process on its host")
        self.supervisor.kill(name)

    def stop_workers(self, timeout_s: float = 15.0) -> None:
        self.supervisor.stop_all(timeout_s)

    def ingress_end_offsets(self) -> dict[str, int]:
        offsets = {}
        for ingress in self.pipeline.ingress:
            for partition, offset in end_offsets(
                self.connection.kafka_bootstrap, ingress.topic, ingress.partitions
            ).items():
                offsets[f"{ingress.topic}:{partition}"] = offset
        return offsets

    def run_until_caught_up(self, timeout_s: float = 300.0) -> CheckpointRecord:
        """Run until a checkpoint whose barriers come after everything now in
        the ingress topics is complete with no channel state (so all of it was
        processed, not only recorded in flight) and every sink committed it.
        Checkpoints triggered meanwhile are aligned: like a stop-with-savepoint,
        they drain the channels."""
        target = self.ingress_end_offsets()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.step(options=CheckpointOptions.aligned())
            record = self.committed_through(target)
            if record is not None:
                return record
        raise JobFailed(f"job {self.job}: input up to {target} not committed within {timeout_s:.0f} s")

    def committed_through(self, target: Mapping[str, int]) -> CheckpointRecord | None:
        """A completed checkpoint of this generation whose ingress barriers lie
        at or after ``target`` (``ingress_end_offsets()`` taken earlier), with
        no channel state and committed by every sink: everything up to
        ``target`` is processed and its output visible.  None while there is none."""
        coordinator = self._require()
        for record in coordinator.completed():
            covers = all(record.ingress_offsets.get(c, -1) >= o for c, o in target.items())
            if covers and record.in_flight == 0 and coordinator.sink_tasks <= record.committed:
                return record
        return None

    def checkpoints(self) -> list[CheckpointRecord]:
        """Every checkpoint seen, in trigger order."""
        current = list(self.coordinator.records.values()) if self.coordinator else []
        return sorted(self.history + current, key=lambda r: r.checkpoint_id)

    def close(self) -> None:
        self.stop_workers()
        if self._leases is not None:
            self._leases.end(self._lease(ended=True))
            self._leases = None
        if self.coordinator is not None:
            self.history.extend(self.coordinator.records.values())
            self.coordinator.close()
            self.coordinator = None
        self.store.close()

    def _require(self) -> CoordinatorService:
        if self.coordinator is None:
            raise SparkAbsError(f"job {self.job} is not started")
        return self.coordinator


def _recorded_scale(meta: JobMeta | None) -> Scale | None:
    """The scale of the job's latest generation, as ``_JOB.json`` recorded it."""
    for entry in reversed(meta.restores if meta else ()):
        if entry.get("scale"):
            return Scale.from_json(entry["scale"])
    return None
