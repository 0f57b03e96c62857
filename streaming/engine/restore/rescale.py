"""Restoring a checkpoint into different task counts (docs/architecture/restore.md,
"Rescaling").

A rescale turns checkpoint n, taken with the old ``Scale``, into a checkpoint
of the new one that the ordinary restore then starts from, so everything
after it (``plan_start``, the workers, the sinks) is unchanged:

- **Ingress channels** move to their new owner (partition ``p`` to task
  ``p mod tasks``) with their position, their watermark and their channel
  state (a range, or copied records), exactly as recorded.
- **Keyed state** of a stage whose task count changed is divided by key
  (``operators.rescale.split_state``): each row goes to the task that the
  upstream stage's routing (``route``: crc32 of the key, modulo the tasks)
  will now send its key to.  A stage that reads an ingress topic gets rows
  by partition, not by key, so its state cannot be divided: the rescale
  stops before it starts.
- **Internal topics** whose task count changed at either end are replaced by
  new ones (``spark-abs.<job>.<stage>.g<generation>``, ``p_U * p_S``
  partitions).  The unaligned channel state of the old topic (records an
  upstream task sent before barrier n that the downstream task had not yet
  processed) is decoded, routed again by key and written at the start of the
  new topic's partitions, each old channel's rows in their order into one
  new channel: on the new topic it is channel state kept as a range, as if
  it had been in flight there.  Records after barrier n on the old topic are
  never read again (the upstream tasks restart from n and write the new topic).
- **Watermarks**: a new channel starts from the lowest watermark any old
  channel of that input had, and a window operator from the lowest of the old
  tasks' (``"min"`` tables), so no window closes earlier than it would have.
- **Lineage**: a new task carries the restores of every old task it takes
  channels or state from.

``plan_rescale`` computes all of this from the loaded checkpoint and says
what cannot be rescaled (``RescaleError``) before anything is written; the
job runner then writes the re-routed records and the new checkpoint."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from barriers.headers import GENERATION_HEADER
from barriers.lineage import Lineage
from barriers.messages import ChannelId
from operators.rescale import StateDivisionError, split_state
from streaming.adapters.serde import codec
from streaming.adapters.snapshots import LoadedTask, Manifest
from streaming.api.pipeline import Pipeline, Scale, route
from streaming.api.topics import stage_topic, writer_of
from streaming.engine.task.segments import Segmenter, SegmentKind
from streaming.errors import ConfigError, RescaleError

__all__ = [
    "RescalePlan",
    "NewTask",
    "scale_of",
    "target_scale",
    "plan_rescale",
    "rerouted_headers",
    "merge_lineages",
]

# (channel, start, end) -> the records at [start, end), read from Kafka
ReadRange = Callable[[ChannelId, int, int], pa.Table]


@dataclass
class NewTask:
    """One task of the new scale, as its snapshot in the new checkpoint will say."""

    name: str
    state: dict[str, pa.Table] = field(default_factory=dict)
    positions: dict[ChannelId, int] = field(default_factory=dict)
    in_flight: dict[ChannelId, tuple[int, int]] = field(default_factory=dict)
    channel_records: dict[ChannelId, pa.Table] = field(default_factory=dict)
    watermarks: dict[ChannelId, int] = field(default_factory=dict)
    lineage: Lineage = field(default_factory=Lineage)


@dataclass
class RescalePlan:
    """Checkpoint ``source`` (scale ``old``) as a checkpoint of scale ``new``
    (``pipeline`` is the pipeline at that scale).  ``rerouted`` holds the rows
    of old channel state to write at the start of each new internal channel,
    one table per old channel, in order; once written, ``place`` records
    their offsets in the tasks that read them.  ``undecodable`` lists
    channel-state records that could not be decoded (for the dead letters)."""

    source: int
    generation: int
    old: Scale
    new: Scale
    pipeline: Pipeline
    tasks: dict[str, NewTask]
    rerouted: dict[ChannelId, list[pa.Table]]
    undecodable: list[tuple[ChannelId, int, str]] = field(default_factory=list)

    @property
    def rerouted_rows(self) -> int:
        return sum(t.num_rows for tables in self.rerouted.values() for t in tables)

    def place(self, written: Mapping[ChannelId, tuple[int, int]]) -> None:
        """``written``: the offset range each new channel's re-routed records got."""
        for task in self.tasks.values():
            for channel in task.positions:
                if channel in written:
                    start, end = written[channel]
                    task.positions[channel] = end
                    task.in_flight[channel] = (start, end)

    def describe(self) -> str:
        changed = [
            f"{stage} {self.old.parallelism.get(stage)} -> {tasks}"
            for stage, tasks in sorted(self.new.parallelism.items())
            if self.old.parallelism.get(stage) != tasks
        ]
        return (
            f"checkpoint {self.source} rescaled ({', '.join(changed) or 'no stage changed'}); "
            f"{self.rerouted_rows} rows of channel state routed again"
        )


def scale_of(manifest: Manifest, pipeline: Pipeline) -> Scale:
    """The scale checkpoint ``manifest`` was taken with: each stage's task
    count from its task names, each internal topic from the channels its
    readers recorded."""
    counts: dict[str, int] = defaultdict(int)
    for name in manifest.tasks:
        stage_name, _, index = name.rpartition("-")
        if not index.isdigit():
            raise ConfigError(f"checkpoint {manifest.checkpoint_id}: task {name!r} is not <stage>-<index>")
        counts[stage_name] += 1
    unknown = sorted(set(counts) - {s.name for s in pipeline.stages})
    if unknown:
        raise ConfigError(
            f"checkpoint {manifest.checkpoint_id} has tasks of stage {', '.join(unknown)}, "
            f"which pipeline {pipeline.job} does not have"
        )
    ingress = {i.topic for i in pipeline.ingress}
    topics: dict[str, str] = {}
    for stage in pipeline.stages:
        downstream = pipeline.downstream(stage.name)
        if downstream is None:
            continue
        for name, snapshot in manifest.tasks.items():
            if name.rpartition("-")[0] != downstream.name:
                continue
            found = {ChannelId.parse(c).topic for c in snapshot.positions} - ingress
            for topic in sorted(found):
                if writer_of(topic, pipeline.job) == stage.name:
                    topics[stage.name] = topic
    return Scale({s.name: counts.get(s.name, s.parallelism) for s in pipeline.stages}, topics)


def target_scale(pipeline: Pipeline, old: Scale, parallelism: Mapping[str, int], generation: int) -> Scale:
    """``old`` with the task counts ``parallelism`` names: an internal topic
    whose task count changed at either end becomes a topic of ``generation``."""
    unknown = sorted(set(parallelism) - {s.name for s in pipeline.stages})
    if unknown:
        raise ConfigError(
            f"pipeline {pipeline.job} has no stage {', '.join(unknown)} "
            f"(stages: {', '.join(s.name for s in pipeline.stages)})"
        )
    counts = {**old.parallelism, **parallelism}
    topics = {}
    for stage in pipeline.stages:
        downstream = pipeline.downstream(stage.name)
        if downstream is None:
            continue
        same = all(counts[s] == old.parallelism.get(s) for s in (stage.name, downstream.name))
        previous = old.topics.get(stage.name) or pipeline.topic_of(stage.name)
        topics[stage.name] = previous if same else stage_topic(pipeline.job, stage.name, generation)
    return Scale(counts, topics)


def rerouted_headers(generation: int) -> list[tuple[str, bytes]]:
    """Headers of a re-routed channel-state record: data of the new
    generation, Arrow rows, no watermark (the channel starts from the lowest)."""
    return [(GENERATION_HEADER, str(generation).encode()), (codec.FORMAT_HEADER, codec.ARROW_FORMAT)]


def merge_lineages(lineages: list[Lineage]) -> Lineage:
    """Every restore of every old task (all tasks of a job restore together,
    so they share generations; each names its own channels)."""
    by_generation: dict[int, dict[ChannelId, int]] = {}
    for lineage in lineages:
        for generation, positions in lineage.restores:
            by_generation.setdefault(generation, {}).update(positions)
    return Lineage(tuple(sorted(by_generation.items())))


class _Old:
    """The old tasks of the checkpoint and what each recorded, parsed once."""

    def __init__(self, pipeline: Pipeline, loaded: Mapping[str, LoadedTask]):
        self.pipeline = pipeline
        self.owner: dict[ChannelId, str] = {}
        self._positions: dict[str, dict[ChannelId, int]] = {}
        self._in_flight: dict[str, dict[ChannelId, tuple[int, int]]] = {}
        self._copies: dict[str, dict[ChannelId, pa.Table]] = {}
        self._watermarks: dict[str, dict[ChannelId, int]] = {}
        self._lineages: dict[str, Lineage] = {}
        for spec in pipeline.tasks():
            if spec.name not in loaded:
                raise RescaleError(f"the checkpoint has no snapshot of task {spec.name}")
            for channel in spec.inputs:
                self.owner[channel] = spec.name
            task = loaded[spec.name]
            snapshot = task.snapshot
            self._positions[spec.name] = {ChannelId.parse(c): p for c, p in snapshot.positions.items()}
            self._in_flight[spec.name] = {
                ChannelId.parse(c): (int(a), int(b)) for c, (a, b) in snapshot.in_flight.items()
            }
            self._copies[spec.name] = {ChannelId.parse(c): t for c, t in task.channel_records.items()}
            marks = snapshot.metadata.get("watermarks") or {}
            self._watermarks[spec.name] = {ChannelId.parse(c): int(w) for c, w in marks.items()}
            self._lineages[spec.name] = Lineage.from_json(snapshot.metadata.get("lineage"))

    def positions(self, task: str) -> dict[ChannelId, int]:
        return self._positions[task]

    def in_flight(self, task: str) -> dict[ChannelId, tuple[int, int]]:
        return self._in_flight[task]

    def copies(self, task: str) -> dict[ChannelId, pa.Table]:
        return self._copies[task]

    def watermarks(self, task: str) -> dict[ChannelId, int]:
        return self._watermarks[task]

    def lineage(self, task: str) -> Lineage:
        return self._lineages[task]


def plan_rescale(
    pipeline: Pipeline,
    source: int,
    loaded: Mapping[str, LoadedTask],
    old: Scale,
    new: Scale,
    generation: int,
    read_range: ReadRange,
) -> RescalePlan:
    """Checkpoint ``source`` of ``pipeline`` (its tasks' snapshots in
    ``loaded``, taken at scale ``old``) as a checkpoint of scale ``new``
    restored in ``generation``.  Raises ``RescaleError`` when a stage's state
    cannot be divided.

    1. each stage's state: kept by a stage whose task count stays, divided by
       key otherwise (``_divide_state``);
    2. each new task's channels: an old channel with what its owner recorded,
       a new one empty (``_assign_channels``);
    3. the channel state of every internal topic that is replaced, re-routed
       (``_reroute``)."""
    before = _Old(pipeline.rescaled(old), loaded)
    after = pipeline.rescaled(new)
    tasks = {spec.name: NewTask(spec.name) for spec in after.tasks()}
    _divide_state(pipeline, before, after, old, loaded, tasks)
    _assign_channels(before, after, tasks)
    rerouted: dict[ChannelId, list[pa.Table]] = defaultdict(list)
    undecodable: list[tuple[ChannelId, int, str]] = []
    for stage in after.stages:
        downstream = after.downstream(stage.name)
        if downstream is None or after.topic_of(stage.name) == before.pipeline.topic_of(stage.name):
            continue
        _reroute(before, after, stage.name, generation, read_range, rerouted, undecodable)
    return RescalePlan(source, generation, old, new, after, tasks, dict(rerouted), undecodable)


def _divide_state(
    pipeline: Pipeline,
    before: _Old,
    after: Pipeline,
    old: Scale,
    loaded: Mapping[str, LoadedTask],
    tasks: Mapping[str, NewTask],
) -> None:
    """Each new task's state and lineage: as it was where the stage's task
    count stays, else the old tasks' state divided by key and their
    lineages merged."""
    ingress = {i.topic for i in pipeline.ingress}
    for stage in after.stages:
        count, was = stage.parallelism, old.parallelism[stage.name]
        old_names = [f"{stage.name}-{i}" for i in range(was)]
        new_names = [f"{stage.name}-{i}" for i in range(count)]
        if count == was:
            for name in new_names:
                tasks[name].state = dict(loaded[name].state)
                tasks[name].lineage = before.lineage(name)
            continue
        states = [loaded[name].state for name in old_names]
        readers = [i for i in stage.inputs if i in ingress]
        if readers and any(t.num_rows for state in states for t in state.values()):
            raise RescaleError(
                f"stage {stage.name} keeps state but reads ingress topic {readers[0]}, whose partitions, "
                f"not a key, decide which task sees a row: its state cannot be divided among {count} tasks"
            )
        route_keys = [after.stage(i).key for i in stage.inputs if i not in ingress]
        try:
            divided = split_state(states, count, [k for k in route_keys if k], route)
        except StateDivisionError as exc:
            raise RescaleError(f"stage {stage.name} cannot go from {was} to {count} tasks: {exc}") from None
        lineage = merge_lineages([before.lineage(name) for name in old_names])
        for name, state in zip(new_names, divided):
            tasks[name].state = state
            tasks[name].lineage = lineage


def _assign_channels(before: _Old, after: Pipeline, tasks: Mapping[str, NewTask]) -> None:
    """Each new task's input channels: a channel that stays with its
    position, in-flight range, copied records and watermark as its old owner
    recorded them (and that owner's lineage); a channel of a new internal
    topic at position 0 with the lowest watermark of its input's old
    channels."""
    for spec in after.tasks():
        task = tasks[spec.name]
        for channel, input_name in spec.inputs.items():
            if channel in before.owner:  # an ingress channel, or one of an internal topic that stays
                owner = before.owner[channel]
                task.positions[channel] = before.positions(owner)[channel]
                if channel in before.in_flight(owner):
                    task.in_flight[channel] = before.in_flight(owner)[channel]
                if channel in before.copies(owner):
                    task.channel_records[channel] = before.copies(owner)[channel]
                if channel in before.watermarks(owner):
                    task.watermarks[channel] = before.watermarks(owner)[channel]
                if owner != spec.name:
                    task.lineage = merge_lineages([task.lineage, before.lineage(owner)])
            else:  # a channel of a new internal topic: starts empty, or with re-routed channel state
                task.positions[channel] = 0
                floor = _lowest_watermark(before, input_name)
                if floor is not None:
                    task.watermarks[channel] = floor


def _lowest_watermark(before: _Old, input_name: str) -> int | None:
    """The lowest watermark of the old channels of input ``input_name`` (None
    if one of them had none: then the new channels start without one too)."""
    topic = before.pipeline.topic_of(input_name)
    marks = []
    for channel, owner in before.owner.items():
        if channel.topic == topic:
            mark = before.watermarks(owner).get(channel)
            if mark is None:
                return None
            marks.append(mark)
    return min(marks) if marks else None


def _reroute(
    before: _Old,
    after: Pipeline,
    upstream: str,
    generation: int,
    read_range: ReadRange,
    rerouted: dict[ChannelId, list[pa.Table]],
    undecodable: list[tuple[ChannelId, int, str]],
) -> None:
    """The channel state of the old topic of ``upstream``'s output, routed to the new topic's channels."""
    old_topic = before.pipeline.topic_of(upstream)
    new_topic = after.topic_of(upstream)
    key = after.stage(upstream).key
    old_downstream, new_downstream = before.pipeline.downstream(upstream), after.downstream(upstream)
    if old_downstream is None or new_downstream is None:  # plan_rescale reroutes only what a stage reads
        raise RescaleError(f"stage {upstream}: no stage reads its output")
    old_readers = old_downstream.parallelism
    new_writers = after.stage(upstream).parallelism
    new_readers = new_downstream.parallelism
    internal = [before.pipeline.topic_of(s.name) for s in before.pipeline.stages]
    for channel, owner in sorted(before.owner.items()):
        if channel.topic != old_topic or channel not in before.in_flight(owner):
            continue
        start, end = before.in_flight(owner)[channel]
        records = before.copies(owner).get(channel)
        if records is None:
            records = read_range(channel, start, end) if end > start else None
        if records is None or records.num_rows == 0:
            continue
        restored = before.lineage(owner).after_restore(generation, before.positions(owner))
        segments = Segmenter(internal, generation, restored).cut(records)
        data = [s.rows for s in segments if s.kind is SegmentKind.DATA and s.rows is not None]
        if not data:
            continue
        held = pa.concat_tables(data)
        held = held.filter(pc.greater(pc.fill_null(pc.binary_length(held["value"]), 0), 0))
        decoded = codec.decode_records(held, codec.ChannelReading.internal())
        for index, reason in decoded.rejected:
            undecodable.append((channel, int(held["offset"][index].as_py()), reason))
        rows = decoded.table
        if rows.num_rows == 0:
            continue
        writer = (channel.partition // old_readers) % new_writers
        targets = route(rows, key, new_readers)
        for target in range(new_readers):
            part = rows.filter(pc.equal(targets, target))
            if part.num_rows:
                rerouted[ChannelId(new_topic, writer * new_readers + target)].append(part)
