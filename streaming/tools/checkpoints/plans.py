"""What a restore would do, without doing it (``spark-abs restore
--dry-run``): which checkpoint it picks, which generation it starts and what
each task loads and replays; a rescaling restore's plan at new task counts;
and, given the pipeline as its code now declares it, what happens to each
stage (kept, added, removed, ...: ``streaming.engine.restore.changes``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import pyarrow as pa

from barriers.messages import ChannelId
from streaming.adapters.kafka.admin import earliest_offsets
from streaming.adapters.kafka.ranges import read_range
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import KafkaAccess
from streaming.api.pipeline import Pipeline
from streaming.engine.kafka_retention import KafkaKept, pick_restorable
from streaming.engine.restore.changes import AllowDropped, PipelineChange, plan_change
from streaming.engine.restore.rescale import RescalePlan, plan_rescale, scale_of, target_scale
from streaming.engine.restore.service import recorded_scale
from streaming.engine.restore.start import plan_start
from streaming.errors import KafkaUnavailableError, SnapshotMissingError

__all__ = ["RestorePreview", "RestorePlanner", "TaskPlan"]


@dataclass(frozen=True)
class TaskPlan:
    """What a task would load and replay: state rows per table, copied
    records replayed before its query reads anything, ranges read again
    from Kafka, and where its query starts on each channel."""

    task: str
    state_rows: dict[str, int]
    replayed_records: dict[str, int]
    reread_ranges: dict[str, tuple[int, int]]
    query_start: dict[str, int]


@dataclass(frozen=True)
class RestorePreview:
    """Which checkpoint a restore would pick (None: from the beginning), the
    newer complete ones it skips and why, the generation it would start and
    every task's plan."""

    job: str
    checkpoint_id: int | None
    skipped: list[tuple[int, list[str]]]
    generation: int
    tasks: list[TaskPlan]


class RestorePlanner:
    """Plans restores of ``store``'s job; ``kafka`` is the Kafka cluster
    a rescale reads channel-state ranges from."""

    def __init__(self, store: SnapshotStore, kafka: KafkaAccess | None = None):
        self.store = store
        self.job = store.job
        self.kafka = kafka

    def restore_plan(
        self, checkpoint_id: int | None = None, *, progress: Callable[[str], None] = lambda _: None
    ) -> RestorePreview:
        """What ``run --restore`` would do now: the checkpoint it picks
        (``checkpoint_id`` if it verifies, else the newest that does), the
        generation it starts and what every task loads and replays.  With a
        ``kafka``, as the restore does, only while Kafka still holds
        what the checkpoint reads again (``kafka_retention``: an
        ``OffsetsGoneError`` when the restore would stop on it)."""
        kept = None if self.kafka is None else KafkaKept(partial(earliest_offsets, self.kafka))
        if checkpoint_id is not None:
            manifest, problems = self.store.verifier.verify(checkpoint_id)
            if problems:
                raise SnapshotMissingError(f"checkpoint {checkpoint_id} cannot be restored: {'; '.join(problems)}")
            if kept is not None and manifest is not None:
                kept.check(manifest)
            skipped: list[tuple[int, list[str]]] = []
        elif kept is not None:
            manifest, skipped = pick_restorable(self.store.latest_verified, kept)
        else:
            manifest, skipped = self.store.latest_verified()
        meta = self.store.read_job()
        generation = (meta.generation if meta else 0) + 1
        if manifest is None:
            return RestorePreview(self.job, None, skipped, generation, [])
        tasks = []
        for name in sorted(manifest.tasks):
            progress(f"loading task {name} of checkpoint {manifest.checkpoint_id}")
            loaded = self.store.load_task(manifest.checkpoint_id, name)
            plan = plan_start(generation, manifest.checkpoint_id, loaded)
            snapshot = loaded.snapshot
            tasks.append(
                TaskPlan(
                    name,
                    {t: rows.num_rows for t, rows in loaded.state.items()},
                    {c: rows.num_rows for c, rows in loaded.channel_records.items()},
                    {c: r for c, r in snapshot.in_flight.items() if c not in loaded.channel_records},
                    {str(c): o for c, o in sorted(plan.query_start.items())},
                )
            )
        return RestorePreview(self.job, manifest.checkpoint_id, skipped, generation, tasks)

    def rescale_plan(
        self,
        pipeline: Pipeline,
        parallelism: Mapping[str, int],
        checkpoint_id: int | None = None,
        *,
        progress: Callable[[str], None] = lambda _: None,
    ) -> RescalePlan:
        """What ``run --restore N --parallelism ...`` would do with checkpoint
        ``checkpoint_id`` (or the newest that verifies): the state, channels
        and re-routed channel state of every task at the new task counts.
        Reads ranges from Kafka, writes nothing."""
        manifest = self._picked(checkpoint_id, "nothing to rescale")
        meta = self.store.read_job()
        generation = (meta.generation if meta else 0) + 1
        old = scale_of(manifest, pipeline)
        new = target_scale(pipeline, old, parallelism, generation)
        loaded = {}
        for name in sorted(manifest.tasks):
            progress(f"loading task {name} of checkpoint {manifest.checkpoint_id}")
            loaded[name] = self.store.load_task(manifest.checkpoint_id, name)

        def ranges(channel: ChannelId, start: int, end: int) -> pa.Table:
            if self.kafka is None:
                raise KafkaUnavailableError(f"channel state of {channel} is a range in Kafka: no broker given")
            return read_range(self.kafka, channel, start, end)

        return plan_rescale(pipeline, manifest.checkpoint_id, loaded, old, new, generation, ranges)

    def change_plan(
        self,
        pipeline: Pipeline,
        checkpoint_id: int | None = None,
        *,
        allow: AllowDropped | None = None,
        progress: Callable[[str], None] = lambda _: None,
    ) -> PipelineChange:
        """What ``run --restore`` of ``pipeline`` (as its code now declares
        it) would do with checkpoint ``checkpoint_id`` (or the newest that
        verifies): each stage kept, added, removed, its state schema or its
        inputs changed, and what is refused.  Reads, writes nothing."""
        manifest = self._picked(checkpoint_id, "nothing to restore")
        meta = self.store.read_job()
        generation = (meta.generation if meta else 0) + 1
        recorded = recorded_scale(meta)

        def load(name: str):
            progress(f"loading task {name} of checkpoint {manifest.checkpoint_id}")
            return self.store.load_task(manifest.checkpoint_id, name)

        counts = recorded.parallelism if recorded else {}
        return plan_change(pipeline, manifest, load, generation, counts=counts, allow=allow or AllowDropped.none())

    def _picked(self, checkpoint_id: int | None, otherwise: str):
        """The manifest of ``checkpoint_id`` (it must verify) or of the newest checkpoint that verifies."""
        if checkpoint_id is not None:
            manifest, problems = self.store.verifier.verify(checkpoint_id)
            if problems:
                raise SnapshotMissingError(f"checkpoint {checkpoint_id} cannot be restored: {'; '.join(problems)}")
        else:
            manifest, _ = self.store.latest_verified()
        if manifest is None:
            raise SnapshotMissingError(f"job {self.job}: no checkpoint verifies, {otherwise}")
        return manifest
