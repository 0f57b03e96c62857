"""Restoring a job (docs/architecture/restore.md, "Restore" and "Rescaling"): which
checkpoint the next generation starts from, at which scale, and, when that
checkpoint was taken with other task counts, writing it again as a
checkpoint of the new scale.

A restore, in order (``RestoreService.prepare``, then the job runner):

1. **Pick** the checkpoint: the one asked for, which must verify, or the
   latest that verifies (newer ones that do not are skipped, with why),
   either one only while Kafka still holds every offset it reads again
   (``kafka_retention``: one that needs records retention removed is
   skipped too, and ``OffsetsGoneError`` stops the restore when none is left).
2. **Scale**: the task counts the job runs with (its latest generation's,
   as ``_JOB.json`` records them, with the ones asked for on top); when the
   checkpoint was taken with others, plan the rescale (``plan_rescale``: a
   ``RescaleError`` here, before anything changed, when it cannot be done)
   and name the rescaled checkpoint the next checkpoint id.  When the
   pipeline's stages changed since the checkpoint (``changes.plan_change``:
   stages added, removed, a state schema or an input changed), plan that
   instead (a ``PipelineChangeError`` naming every refusal, before anything
   changed) and name the changed checkpoint the next id; both at once are refused.
3. **Record** the new generation in the store (another runner that recorded
   one meanwhile fails this restore).
4. The runner stops its workers (and pauses remote ones), and a rescale or
   a change is **written** (``write``): old sink tasks recover to the source
   checkpoint, a rescale's re-routed channel state goes to the new internal
   topics, records that cannot be decoded to the dead letters, then every
   task's snapshot and the manifest, last.
5. The runner starts the workers of the new generation from the checkpoint.

The store is unreachable at times (an outage): every read and write here
waits for it, boundedly (``store_patiently``); a damaged checkpoint is skipped,
not waited for."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from barriers.handler import CheckpointKind
from streaming.adapters.kafka.admin import earliest_offsets, job_key
from streaming.adapters.kafka.control.transport import newest_generation
from streaming.adapters.kafka.dead_letters import DeadLetterTopic
from streaming.adapters.kafka.producer import close_producer, producer, write_records
from streaming.adapters.kafka.ranges import read_range
from streaming.adapters.objects import StoreLocation, store_patiently
from streaming.adapters.serde import codec
from streaming.adapters.sinks.factory import open_sink, sink_key, sink_location
from streaming.adapters.snapshots import JobMeta, Manifest, SnapshotStore, TaskParts
from streaming.adapters.snapshots.format import options_as_stored, stored_name
from streaming.adapters.snapshots.layout import JOB
from streaming.api.config import Connection
from streaming.api.pipeline import Pipeline, Scale, TaskSpec
from streaming.api.settings import JobSettings
from streaming.engine.kafka_retention import KafkaKept, pick_restorable
from streaming.engine.restore.changes import AllowDropped, PipelineChange, plan_change
from streaming.engine.restore.rescale import (
    NewTask,
    RescalePlan,
    plan_rescale,
    rerouted_headers,
    scale_of,
    target_scale,
)
from streaming.errors import JobFailed

__all__ = ["RESTORE_CAUSES", "RestoreRecord", "RestorePlan", "RestoreService", "recorded_scale"]

log = logging.getLogger(__name__)

# why a job restores: the stable word the store's ``_JOB.json`` and the restores metric keep, and
# what it says to a person
RESTORE_CAUSES = {
    "worker_died": "a worker process died",
    "worker_lost": "a remote worker group was lost",  # went silent, or stopped
    "worker_stuck": "a worker process was alive but silent",  # frozen, or stuck (liveness)
    "checkpoints_failing": "checkpoints kept failing",  # past tolerable_failed_checkpoints (liveness)
    "restart": "a runner started on the job",  # the store knew the job
    "requested": "a restore was asked for",  # --restore N
    "rescale": "a rescale was asked for",
}


@dataclass(frozen=True)
class RestoreRecord:
    """One restore of a job: the generation it started, from which checkpoint, and why."""

    generation: int
    checkpoint_id: int | None
    reason: str
    skipped: tuple[tuple[int, tuple[str, ...]], ...] = ()
    # a rescaling restore: the checkpoint that was rescaled into ``checkpoint_id``
    rescaled_from: int | None = None
    # a restore into a changed pipeline: the checkpoint that was changed into ``checkpoint_id``
    changed_from: int | None = None


@dataclass(frozen=True)
class RestorePlan:
    """What the next generation starts from (steps 1 to 3 of the module docstring)."""

    generation: int
    # the checkpoint it restores (the one written when rescaling or changing), None for the beginning
    checkpoint_id: int | None
    scale: Scale
    skipped: tuple[tuple[int, tuple[str, ...]], ...] = ()
    # a rescaling restore: the plan; ``source``: the checkpoint a rescale or a change writes again
    rescale: RescalePlan | None = None
    source: Manifest | None = None
    # a restore into a changed pipeline: the plan (stages added, removed, ...)
    change: PipelineChange | None = None

    @property
    def rescaled_from(self) -> int | None:
        return self.rescale.source if self.rescale is not None else None

    @property
    def changed_from(self) -> int | None:
        return self.change.source if self.change is not None else None

    @property
    def rewritten(self) -> bool:
        """Whether the checkpoint restored must be written first (``RestoreService.write``)."""
        return self.rescale is not None or self.change is not None

    def rewrite_note(self) -> str:
        """What writing the checkpoint again did, for the restore's log line ("" when it is not written)."""
        if self.rescale is not None:
            return f" (checkpoint {self.rescaled_from} rescaled to {self.scale.describe()})"
        if self.change is not None:
            return f" (checkpoint {self.changed_from} changed: {self.change.describe()})"
        return ""

    def pause_reason(self) -> str:
        """Why the job's remote workers pause while the checkpoint is written again."""
        if self.rescale is not None:
            return f"checkpoint {self.rescaled_from} is being rescaled to {self.scale.describe()}"
        return f"checkpoint {self.changed_from} is being restored into a changed pipeline"

    def record(self, reason: str) -> RestoreRecord:
        return RestoreRecord(
            self.generation, self.checkpoint_id, reason, self.skipped, self.rescaled_from, self.changed_from
        )


def recorded_scale(meta: JobMeta | None) -> Scale | None:
    """The scale of the job's latest generation, as ``_JOB.json`` recorded it."""
    for entry in reversed(meta.restores if meta else ()):
        if entry.scale:
            return Scale.from_json(entry.scale)
    return None


class RestoreService:
    """Plans and writes the restores of the job ``declared`` (the pipeline as
    its code declares it) kept in ``store`` (see the module docstring);
    ``allow_dropped`` names the stages whose state a changed pipeline may drop."""

    def __init__(
        self,
        declared: Pipeline,
        store: SnapshotStore,
        settings: JobSettings,
        connection: Connection,
        allow_dropped: AllowDropped | None = None,
        generation_heard: Callable[[], int | None] | None = None,
    ):
        self.declared = declared
        # the newest generation the job's signed events name (``newest_generation``; a test gives its own)
        self._generation_heard = generation_heard or (
            lambda: newest_generation(connection.kafka, declared.job, job_key(connection, declared.job))
        )
        self.allow_dropped = allow_dropped or AllowDropped.none()
        self.job = declared.job
        self.store = store
        self.settings = settings
        self.connection = connection
        self.log = logging.LoggerAdapter(log, {"job": self.job})

    def pick(self, checkpoint_id: int | None) -> tuple[Manifest | None, list[tuple[int, list[str]]]]:
        """Step 1: the manifest of ``checkpoint_id`` (it must verify), or of
        the latest checkpoint that verifies (None: there is none), and the
        newer checkpoints skipped with their problems."""
        # Kafka must still hold what the checkpoint reads again (kafka_retention): one query per restore
        kept = KafkaKept(lambda channels: earliest_offsets(self.connection.kafka, channels))
        if checkpoint_id is None:
            manifest, skipped = store_patiently(
                lambda: pick_restorable(self.store.latest_verified, kept), "picking a checkpoint"
            )
            for skipped_id, problems in skipped:
                self.log.warning("checkpoint %d skipped: %s", skipped_id, "; ".join(problems))
            return manifest, skipped
        problems = store_patiently(lambda: self.store.verify(checkpoint_id), f"verifying checkpoint {checkpoint_id}")
        if problems:
            raise JobFailed(f"checkpoint {checkpoint_id} cannot be restored: {'; '.join(problems)}")
        manifest = store_patiently(
            lambda: self.store.read_manifest(checkpoint_id), f"reading checkpoint {checkpoint_id}"
        )
        kept.check(manifest)
        return manifest, []

    def prepare(
        self,
        checkpoint_id: int | None,
        parallelism: Mapping[str, int],
        running: Scale,
        next_checkpoint_id: Callable[[], int],
        cause: str = "requested",
    ) -> RestorePlan:
        """Steps 1 to 3: the next generation's checkpoint and scale, recorded
        in the store.  ``parallelism`` holds the task counts asked for,
        ``running`` the scale the runner runs now (used when the store
        recorded none), ``next_checkpoint_id`` names a rescaled checkpoint,
        ``cause`` why the job restores (one of ``RESTORE_CAUSES``, recorded too)."""
        if cause not in RESTORE_CAUSES:
            raise ValueError(f"restore cause {cause!r} is none of {', '.join(RESTORE_CAUSES)}")
        manifest, skipped = self.pick(checkpoint_id)
        meta = store_patiently(self.store.read_job, "reading the job")
        generation = (meta.generation if meta else 0) + 1
        self._refuse_a_rolled_back_history(generation)
        current = recorded_scale(meta) or running
        wanted = {**current.parallelism, **parallelism}
        rescale = change = None
        if manifest is None:
            scale = target_scale(self.declared, current, wanted, generation)
        elif (change := self._plan_change(manifest, wanted, generation, cause)) is not None:
            scale = change.scale
        else:
            scale = scale_of(manifest, self.declared)
            if scale.parallelism != wanted:
                new = target_scale(self.declared, scale, wanted, generation)
                rescale = self._plan_rescale(manifest, scale, new, generation)
                scale = rescale.new
        picked = manifest.checkpoint_id if manifest else None
        if rescale is not None or change is not None:
            picked = next_checkpoint_id()
        recorded = store_patiently(
            lambda: self.store.next_generation(
                picked,
                scale=scale.to_json(),
                cause=cause,
                rescaled_from=rescale.source if rescale is not None else None,
                changed_from=change.source if change is not None else None,
            ),
            "recording the generation",
        )
        if recorded != generation:
            raise JobFailed(f"job {self.job}: generation {recorded} was recorded meanwhile; is another runner running?")
        return RestorePlan(
            generation,
            picked,
            scale,
            tuple((cid, tuple(p)) for cid, p in skipped),
            rescale,
            manifest if rescale is not None or change is not None else None,
            change,
        )

    def _refuse_a_rolled_back_history(self, generation: int) -> None:
        """A ``JobFailed`` when the control topic already names ``generation``
        or a later one: the store's ``_JOB.json`` was put back to an older copy
        (signed, so it verifies), and a new generation would reuse a number
        whose signed barriers and events are still in Kafka."""
        heard = self._generation_heard()
        if heard is not None and heard >= generation:
            raise JobFailed(
                f"job {self.job}: the store's job history ({JOB}) says generation {generation - 1} is the newest, "
                f"but the job's control topic holds events of generation {heard}: the history was rolled back "
                f"to an older copy. Starting generation {generation} would reuse a number whose barriers and "
                "events are still in Kafka. Put back the store's newest "
                f"{JOB} (from a backup or the bucket's versions) and restart"
            )

    def _plan_change(
        self, manifest: Manifest, wanted: Mapping[str, int], generation: int, cause: str
    ) -> PipelineChange | None:
        """What restoring ``manifest``'s checkpoint into the pipeline as now
        declared takes (None: its stages did not change); a
        ``PipelineChangeError`` before anything changes when it is refused.
        State schemas are checked when a runner starts (``restart``,
        ``requested``): its code cannot change while it runs."""
        source = manifest.checkpoint_id
        change = plan_change(
            self.declared,
            manifest,
            lambda name: store_patiently(lambda: self.store.load_task(source, name), f"reading task {name}"),
            generation,
            counts=wanted,
            allow=self.allow_dropped,
            check_state=cause in ("restart", "requested"),
        )
        change.check()
        if not change.changed:
            return None
        self.log.info("checkpoint %d restored into a changed pipeline: %s", source, change.describe())
        return change

    def _plan_rescale(self, manifest: Manifest, old: Scale, new: Scale, generation: int) -> RescalePlan:
        """What rescaling ``manifest``'s checkpoint to ``new`` takes; a
        ``RescaleError`` before anything changes when it cannot be done."""
        source = manifest.checkpoint_id
        self.log.info("rescaling checkpoint %d from %s to %s", source, old.describe(), new.describe())
        loaded = {
            name: store_patiently(functools.partial(self.store.load_task, source, name), f"reading task {name}")
            for name in manifest.tasks
        }
        kafka = self.connection.kafka
        return plan_rescale(
            self.declared,
            source,
            loaded,
            old,
            new,
            generation,
            lambda channel, start, end: read_range(kafka, channel, start, end),
        )

    # ---- step 4: writing a rescaled or changed checkpoint (every worker stopped)

    def write(self, plan: RestorePlan) -> None:
        """The checkpoint ``plan`` restores, written first (``plan.rewritten``)."""
        if plan.rescale is not None:
            self.write_rescaled(plan)
        else:
            self.write_changed(plan)

    def write_changed(self, plan: RestorePlan) -> None:
        """The change of ``plan`` written out as checkpoint ``plan.checkpoint_id``:
        every sink task of the changed pipeline recovers to the source
        checkpoint first, then every task's snapshot and the manifest."""
        change, source = plan.change, plan.source
        if change is None or source is None or plan.checkpoint_id is None:
            raise ValueError("write_changed needs a restore plan into a changed pipeline")
        self._recover_sinks(change.pipeline, change.source, change.generation)
        provenance = {"changed_from": change.source}
        metrics = {**provenance, "scale": change.scale.to_json(), "changes": [_change_json(c) for c in change.changes]}
        self._write_checkpoint(
            plan.checkpoint_id, change.generation, change.tasks, source, CheckpointKind.CHANGED, provenance, metrics
        )
        self.log.info(
            "checkpoint %d (%s): written as checkpoint %d", change.source, change.describe(), plan.checkpoint_id
        )

    def write_rescaled(self, plan: RestorePlan) -> None:
        """The rescale of ``plan`` written out as checkpoint ``plan.checkpoint_id``:
        the old sink tasks recover to the source checkpoint first (their
        staged epochs up to it committed, later ones discarded), the new
        topics get the re-routed channel state, undecodable records go to
        the dead letters, then every task's snapshot and the manifest."""
        rescale, source = plan.rescale, plan.source
        if rescale is None or source is None or plan.checkpoint_id is None:
            raise ValueError("write_rescaled needs a rescaling restore plan")
        self._recover_sinks(self.declared.rescaled(rescale.old), rescale.source, rescale.generation)
        self._write_rerouted(rescale)
        self._dead_letter_undecodable(rescale)
        provenance = {"rescaled_from": rescale.source}
        metrics = {
            **provenance,
            "scale": rescale.new.to_json(),
            "previous_scale": rescale.old.to_json(),
            "rerouted_rows": rescale.rerouted_rows,
        }
        self._write_checkpoint(
            plan.checkpoint_id, rescale.generation, rescale.tasks, source, CheckpointKind.RESCALED, provenance, metrics
        )
        self.log.info("%s: written as checkpoint %d", rescale.describe(), plan.checkpoint_id)

    def _recover_sinks(self, pipeline: Pipeline, source: int, generation: int) -> None:
        """Every sink task of ``pipeline`` recovers to checkpoint ``source``, in ``generation``."""
        location = sink_location(self.settings, self.job, self.connection)
        tasks = [spec for spec in pipeline.tasks() if pipeline.stage(spec.stage).sink is not None]
        # side by side: a Kafka sink starts a JVM for its transactions (about a second each)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, len(tasks)))) as pool:
            for done in [
                pool.submit(self._recover_sink, pipeline, spec, location, source, generation) for spec in tasks
            ]:
                done.result()

    def _recover_sink(
        self, pipeline: Pipeline, spec: TaskSpec, location: StoreLocation, source: int, generation: int
    ) -> None:
        stage = pipeline.stage(spec.stage)
        if stage.sink is not None:
            sink = open_sink(
                stage.sink,
                location,
                spec.name,
                job=self.job,
                kafka=self.connection.kafka,
                connection=self.connection,
                delivery_timeout_s=self.settings.delivery_timeout_s,
                kafka_client=self.settings.kafka_sink_client,
                key=sink_key(stage.sink, self.job, self.connection, lambda: job_key(self.connection, self.job)),
                generation=generation,
            )
            try:
                sink.recover(source)
            finally:
                getattr(sink, "close", lambda: None)()

    def _write_rerouted(self, rescale: RescalePlan) -> None:
        if not rescale.rerouted:
            return
        values = {c: [v for t in tables for v in codec.encode_batches(t)] for c, tables in rescale.rerouted.items()}
        bound_s = self.settings.delivery_timeout_s
        writer = producer(self.connection.kafka, delivery_timeout_s=bound_s, max_in_flight_requests_per_connection=1)
        try:
            rescale.place(write_records(writer, values, rerouted_headers(rescale.generation), bound_s + 5.0))
        finally:
            close_producer(writer, "re-routed channel state")

    def _dead_letter_undecodable(self, rescale: RescalePlan) -> None:
        if not rescale.undecodable:
            return
        letters = DeadLetterTopic(self.connection.kafka, self.job, delivery_timeout_s=self.settings.delivery_timeout_s)
        try:
            for channel, offset, why in rescale.undecodable:
                letters.send(channel, offset, None, None, [], f"channel state not decodable when rescaling: {why}")
            letters.flush()  # each one in Kafka before the rescaled checkpoint goes on without its record
        finally:
            letters.close()

    def _write_checkpoint(
        self,
        checkpoint_id: int,
        generation: int,
        tasks: Mapping[str, NewTask],
        source: Manifest,
        kind: CheckpointKind,
        provenance: Mapping[str, object],
        metrics: Mapping[str, object],
    ) -> None:
        """``tasks`` written as checkpoint ``checkpoint_id`` of ``kind``, made
        from ``source`` (``provenance`` names it in every snapshot)."""
        snapshots = {}
        for name, task in tasks.items():
            parts = TaskParts(
                state=task.state,
                positions={str(c): p for c, p in task.positions.items()},
                in_flight={str(c): r for c, r in task.in_flight.items()},
                channel_records={str(c): t for c, t in task.channel_records.items()},
                metadata={
                    "kind": stored_name(kind),
                    **provenance,
                    "watermarks": {str(c): w for c, w in task.watermarks.items()},
                    "lineage": task.lineage.to_json(),
                },
            )
            snapshots[name] = self.store.write_task(checkpoint_id, generation, name, parts)
        self.store.write_manifest(
            checkpoint_id,
            generation,
            snapshots,
            options=options_as_stored(source.options),
            metrics={**metrics, "kinds": [stored_name(kind)], "tasks": {}},
        )


def _change_json(change) -> dict[str, str]:
    """A stage's change as the manifest keeps it: stable names, and the action in words."""
    return {"stage": change.stage, "change": change.change.name.lower(), "action": change.action}
