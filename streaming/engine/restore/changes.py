"""Restoring a checkpoint into a changed pipeline (docs/operations/changing-a-pipeline.md;
docs/architecture/restore.md, "Restore").

Stages are matched by name, as Flink matches operators by their uids.
``plan_change`` compares a checkpoint (its tasks, their stages, the channels
their positions name, their state tables) with the pipeline as its code now
declares it, and says per stage what a restore does:

- **kept**: the same name, the same inputs: its tasks restore their
  snapshots as they are.
- **added**: no task of the checkpoint has its name: its tasks start with
  empty state.  An input another stage read at the checkpoint starts where
  that stage's tasks stood (the checkpoint's cut); an input nobody read
  starts at the beginning (a new topic of this restore's generation, for a
  stage's output).
- **removed**: the checkpoint has tasks of a stage the pipeline does not
  have.  What they hold (state rows, and channel state no other task takes
  over) would be dropped: refused unless allowed (``AllowDropped``, Flink's
  ``--allowNonRestoredState``); a stage that holds nothing goes quietly.
- **state schema changed**: a kept stage's stored state tables are given to
  a fresh operator of the new code (``restore()`` on a sample of their rows);
  when it refuses them, the restore is refused, naming the stored schema and
  the one the new operator snapshots.  Allowing the stage's state to be
  dropped starts it empty instead.
- **inputs changed**: a kept stage reads an input from another topic, a new
  input, or no longer reads one.

Edges, where the hard cases are.  A stage's output topic is read by one
stage.  When the stage reading it changes (a stage inserted after it, or
the one after it removed), the new reader takes the old reader's channels
(same topic, same partitions: the old reader's task ``i`` gives task ``i``
its positions, its unaligned channel state, its watermarks and lineage), so
records in flight at the cut reach the new reader; that needs the same task
count.  With another task count the new reader gets a new topic from the
beginning, which loses nothing when the old reader held no channel state on
it (an aligned checkpoint), and is refused otherwise.  An edge whose writer
is new, or whose writer wrote to a sink, gets a new topic
(``spark-abs.<job>.<stage>.g<generation>``), read from its beginning.

Task counts: kept stages keep the checkpoint's; a new stage gets the count
asked for, else its declared one.  Changing a kept stage's count in the same
restore is refused (restore the changed pipeline first, then rescale).

The plan is computed from the checkpoint alone (nothing is written); the job
runner writes it as a new checkpoint (``kind: changed``) and restores that,
as it does a rescale (``streaming.engine.restore.service``), so the workers, the
tasks and ``plan_start`` know nothing of it."""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from barriers.lineage import Lineage
from barriers.messages import ChannelId
from streaming.adapters.snapshots import LoadedTask, Manifest, TaskSnapshot
from streaming.api.pipeline import Pipeline, Scale, Stage
from streaming.api.topics import stage_topic, writer_of
from streaming.engine.restore.rescale import NewTask, merge_lineages
from streaming.errors import ConfigError, PipelineChangeError

__all__ = ["AllowDropped", "Change", "StageChange", "PipelineChange", "plan_change", "task_stage"]

# rows of each stored state table a fresh operator is asked to restore, to see it takes them
_SAMPLE_ROWS = 64


class Change(enum.StrEnum):
    """What happened to a stage between the checkpoint and the pipeline."""

    KEPT = "kept"
    ADDED = "added"
    REMOVED = "removed"
    STATE_SCHEMA = "state schema changed"
    INPUTS = "inputs changed"
    TASKS = "task count changed"


@dataclass(frozen=True)
class AllowDropped:
    """Which stages' state a restore may drop: none (``none()``, the
    default), the ones named (``of(...)``, ``--allow-dropped-state STAGE``)
    or every one (``everything()``, ``--allow-all-dropped-state``)."""

    stages: frozenset[str] = frozenset()
    every: bool = False

    @classmethod
    def none(cls) -> AllowDropped:
        return cls()

    @classmethod
    def of(cls, stages: Collection[str]) -> AllowDropped:
        return cls(frozenset(stages))

    @classmethod
    def everything(cls) -> AllowDropped:
        return cls(every=True)

    def allows(self, stage: str) -> bool:
        return self.every or stage in self.stages


@dataclass(frozen=True)
class StageChange:
    """One stage's fate: what changed, what the restore does about it, and
    (``refusal``) why it will not, with what to do, when it will not."""

    stage: str
    change: Change
    action: str
    refusal: str | None = None


@dataclass
class PipelineChange:
    """Checkpoint ``source`` as the pipeline now declared (``pipeline``, at
    ``scale``) would restore it in ``generation``: each stage's fate
    (``stages``) and, when anything changed, each new task's snapshot
    (``tasks``)."""

    source: int
    generation: int
    stages: tuple[StageChange, ...]
    scale: Scale
    pipeline: Pipeline
    tasks: dict[str, NewTask] = field(default_factory=dict)

    @property
    def changes(self) -> tuple[StageChange, ...]:
        return tuple(s for s in self.stages if s.change is not Change.KEPT)

    @property
    def changed(self) -> bool:
        """Whether the checkpoint must be written again before it is restored."""
        return bool(self.changes)

    @property
    def refusals(self) -> tuple[StageChange, ...]:
        return tuple(s for s in self.stages if s.refusal)

    def describe(self) -> str:
        return "; ".join(f"{s.stage} {s.change}" for s in self.changes) or "no stage changed"

    def check(self) -> None:
        """A ``PipelineChangeError`` naming every refusal, when there is one."""
        if not self.refusals:
            return
        problems = "\n".join(f"  - stage {s.stage} ({s.change}): {s.refusal}" for s in self.refusals)
        raise PipelineChangeError(
            f"checkpoint {self.source} cannot be restored into pipeline {self.pipeline.job} as it is now:\n"
            f"{problems}\n(`spark-abs restore --dry-run --pipeline ...` shows what a restore would do)"
        )


def task_stage(task: str, checkpoint_id: int) -> str:
    """The stage of task ``<stage>-<index>``."""
    stage, _, index = task.rpartition("-")
    if not stage or not index.isdigit():
        raise ConfigError(f"checkpoint {checkpoint_id}: task {task!r} is not <stage>-<index>")
    return stage


class _Checkpoint:
    """What the checkpoint's manifest says of its topology: each stage's
    task count, each channel's reader, each stage's inputs and the topic it
    read each from."""

    def __init__(self, manifest: Manifest, job: str):
        self.id = manifest.checkpoint_id
        self.snapshots: dict[str, TaskSnapshot] = dict(manifest.tasks)
        self.counts: dict[str, int] = defaultdict(int)
        self.readers: dict[ChannelId, list[str]] = defaultdict(list)  # channel -> tasks that read it
        self.inputs: dict[str, dict[str, str]] = defaultdict(dict)  # stage -> {input name: topic}
        for name, snapshot in sorted(manifest.tasks.items()):
            stage = task_stage(name, self.id)
            self.counts[stage] += 1
            for text in snapshot.positions:
                channel = ChannelId.parse(text)
                self.readers[channel].append(name)
                writer = writer_of(channel.topic, job)
                self.inputs[stage][writer or channel.topic] = channel.topic
        # a stage's output topic and the stage that read it
        self.output: dict[str, tuple[str, str]] = {
            writer: (topic, stage)
            for stage, inputs in self.inputs.items()
            for writer, topic in inputs.items()
            if writer_of(topic, job) == writer
        }

    def channel_state(self, task: str, channel: ChannelId) -> int:
        """Records of ``task``'s unaligned channel state on ``channel`` (a range's length, or copies)."""
        snapshot = self.snapshots[task]
        start, end = snapshot.in_flight.get(str(channel), (0, 0))
        return max(end - start, 0)


def plan_change(
    pipeline: Pipeline,
    manifest: Manifest,
    load: Callable[[str], LoadedTask],
    generation: int,
    *,
    counts: Mapping[str, int] | None = None,
    allow: AllowDropped = AllowDropped(),
    check_state: bool = True,
) -> PipelineChange:
    """Checkpoint ``manifest`` restored into ``pipeline`` (as its code
    declares it) in ``generation``: each stage's fate and, when anything
    changed, the new tasks' snapshots (``load(task)`` reads a task of the
    checkpoint, only the ones needed).  ``counts``: the task counts the job
    runs with (recorded and asked for); ``check_state``: give each kept
    stage's stored state to a fresh operator of the new code (reads one task
    per stage).  Refusals are in the result (``PipelineChange.check``).

    1. the stages: kept, added, removed (``_Checkpoint`` reads the manifest);
    2. the task counts, and each stage-to-stage topic (``_edges``);
    3. each kept stage's state against its new operator (``_state_refusal``);
    4. when anything changed, each new task's snapshot (``_build``) and what
       nobody takes over, which is dropped (``_dropped``)."""
    # 1. the stages
    old = _Checkpoint(manifest, pipeline.job)
    counts = dict(counts or {})
    declared = [s.name for s in pipeline.stages]
    removed = sorted(set(old.counts) - set(declared))
    loaded: dict[str, LoadedTask] = {}

    def task(name: str) -> LoadedTask:
        if name not in loaded:
            loaded[name] = load(name)
        return loaded[name]

    # 2. task counts and topics
    new_counts = {s.name: old.counts.get(s.name) or counts.get(s.name, s.parallelism) for s in pipeline.stages}
    edges = _edges(pipeline, old, new_counts, generation)
    after = pipeline.rescaled(Scale(new_counts, edges.topics))
    kept = [name for name in declared if name in old.counts]
    # 3. state schemas
    fates = _state_fates(pipeline, kept, task, old.id, allow) if check_state else {}
    changed_inputs = {n for n in kept if _inputs_of(after, pipeline.stage(n)) != old.inputs[n]}
    if not removed and len(kept) == len(declared) and not changed_inputs and not fates:
        unchanged = tuple(StageChange(n, Change.KEPT, "restores its snapshots") for n in kept)
        return PipelineChange(old.id, generation, unchanged, after.scale, after)
    # 4. the new tasks, and what nobody takes over
    empty = {n for n in declared if n not in old.counts} | {n for n, f in fates.items() if not f.refusal}
    tasks, taken = _build(after, old, task, empty, edges.takes)
    dropped = _dropped(old, pipeline, taken, {topic for topic, _ in edges.refusals.values()})
    for name in removed:
        fates[name] = _removed(name, old, task, dropped.get(name, 0), allow)
    for name in kept:
        if counts.get(name, old.counts[name]) != old.counts[name]:
            fates[name] = _count_refusal(name, old, counts[name])
    for stage in pipeline.stages:
        if stage.name not in fates:
            fates[stage.name] = _fate(stage, after, old, edges, changed_inputs, dropped.get(stage.name, 0), allow)
    stages = tuple(fates[n] for n in [*declared, *removed])
    return PipelineChange(old.id, generation, stages, after.scale, after, tasks)


def _state_fates(
    pipeline: Pipeline, kept: list[str], task: Callable[[str], LoadedTask], checkpoint_id: int, allow: AllowDropped
) -> dict[str, StageChange]:
    """The kept stages whose new operator does not take their stored state:
    refused, or (allowed) started empty."""
    fates = {}
    for name in kept:
        refusal = _state_refusal(pipeline.stage(name), task(f"{name}-0"), checkpoint_id)
        if refusal is None:
            continue
        if allow.allows(name):
            action = f"starts with empty state (its state dropped, as allowed): {refusal}"
            fates[name] = StageChange(name, Change.STATE_SCHEMA, action)
        else:
            fix = f"{refusal}. Change the operator back, or drop its state: --allow-dropped-state {name}"
            fates[name] = StageChange(name, Change.STATE_SCHEMA, "refused", fix)
    return fates


def _count_refusal(name: str, old: _Checkpoint, wanted: int) -> StageChange:
    was = old.counts[name]
    return StageChange(
        name,
        Change.TASKS,
        "refused",
        f"checkpoint {old.id} has {was} task(s) of it and the job runs {wanted}; a restore changes the pipeline "
        f"or the task counts, not both: restore the changed pipeline first (--parallelism {name}={was}), "
        f"then rescale it (run --restore N --parallelism {name}={wanted})",
    )


def _fate(
    stage: Stage,
    after: Pipeline,
    old: _Checkpoint,
    edges: _Edges,
    changed_inputs: Collection[str],
    dropped: int,
    allow: AllowDropped,
) -> StageChange:
    """What happens to ``stage``: kept, added, or kept with other inputs."""
    name = stage.name
    if name in old.counts and name not in changed_inputs:
        return StageChange(name, Change.KEPT, "restores its snapshots")
    refusal = edges.refusals[name][1] if name in edges.refusals else None
    if name not in old.counts:
        action = "starts with empty state; " + _reads(after, stage, old, edges.takes)
        return StageChange(name, Change.ADDED, "refused" if refusal else action, refusal)
    action = _reads(after, stage, old, edges.takes) + _no_longer(old.inputs[name], _inputs_of(after, stage))
    if refusal is None and dropped and not allow.allows(name):
        refusal = (
            f"{dropped} record(s) of its channel state on inputs it no longer reads would be dropped: "
            f"--allow-dropped-state {name}"
        )
    return StageChange(name, Change.INPUTS, "refused" if refusal else action, refusal)


def _inputs_of(pipeline: Pipeline, stage: Stage) -> dict[str, str]:
    """{input name: topic} of ``stage`` in ``pipeline``."""
    return {name: pipeline.topic_of(name) for name in stage.inputs}


@dataclass
class _Edges:
    """The new pipeline's stage-to-stage topics; ``takes``: new reader ->
    the old reader whose channels it takes over; ``refusals``: new reader ->
    (old topic, why it cannot take that topic's channel state)."""

    topics: dict[str, str] = field(default_factory=dict)
    takes: dict[str, str] = field(default_factory=dict)
    refusals: dict[str, tuple[str, str]] = field(default_factory=dict)


def _edges(pipeline: Pipeline, old: _Checkpoint, counts: Mapping[str, int], generation: int) -> _Edges:
    """Each stage-to-stage topic of the new pipeline: the old one where its
    reader stays, or where a new reader with the old reader's task count
    takes it over; a topic of ``generation`` otherwise, which a reader with
    another task count cannot take the old edge's channel state to."""
    edges = _Edges()
    for stage in pipeline.stages:
        reader = pipeline.downstream(stage.name)
        if reader is None:
            continue
        new_topic = stage_topic(pipeline.job, stage.name, generation)
        if stage.name not in old.output:  # a new stage, or one whose output went to a sink
            edges.topics[stage.name] = new_topic
            continue
        topic, was = old.output[stage.name]
        if was == reader.name or counts[reader.name] == old.counts[was]:
            edges.topics[stage.name] = topic
            if was != reader.name:
                edges.takes[reader.name] = was
            continue
        edges.topics[stage.name] = new_topic
        held = sum(old.channel_state(t, c) for c, tasks in old.readers.items() if c.topic == topic for t in tasks)
        if held:
            edges.refusals[reader.name] = (
                topic,
                f"it reads the output of {stage.name} with {counts[reader.name]} task(s) where {was} read it with "
                f"{old.counts[was]}, and {was} held {held} record(s) of unaligned channel state on {topic}, which "
                f"cannot be handed over: give {reader.name} {old.counts[was]} task(s) (rescale it afterwards), or "
                f"restore from an aligned checkpoint (one taken with --mode aligned)",
            )
    return edges


def _describe_schema(tables: Mapping[str, pa.Table], *, types: bool) -> str:
    if not tables:
        return "no state"
    described = []
    for name, table in sorted(tables.items()):
        columns = [f"{f.name}: {f.type}" if types else f.name for f in table.schema]
        described.append(f"{name}({', '.join(columns)})")
    return ", ".join(described)


def _state_refusal(stage: Stage, stored: LoadedTask, checkpoint_id: int) -> str | None:
    """Why a fresh operator of ``stage``'s new code does not take the state
    its task 0 stored (None: it does), naming both schemas.  The new
    operator's schema is its fresh ``snapshot()``'s tables and columns
    (types of an empty keyed state are placeholders, so they are not named)."""
    operator = stage.make_operator()
    expected = operator.snapshot()
    sample = {name: table.slice(0, _SAMPLE_ROWS) for name, table in stored.state.items()}
    try:
        operator.restore(sample)
    except Exception as exc:  # the new code's own error, whatever its kind, is the reason
        return (
            f"checkpoint {checkpoint_id} stored {_describe_schema(stored.state, types=True)}; "
            f"the new operator ({type(operator).__name__}) snapshots {_describe_schema(expected, types=False)} "
            f"and does not take the stored state ({exc})"
        )
    return None


def _build(
    after: Pipeline,
    old: _Checkpoint,
    task: Callable[[str], LoadedTask],
    empty: Collection[str],
    takes: Mapping[str, str],
) -> tuple[dict[str, NewTask], set[tuple[str, ChannelId]]]:
    """Each task of ``after``: the state of its own old task (none for a
    stage in ``empty``), and per input channel what the task that read it at
    the checkpoint recorded: itself (all of it), an old reader it takes over
    from (``takes``: all of it), or another stage's task reading the same
    ingress channel (its position, the cut, and watermark only); a channel
    nobody read starts at the beginning.  Also the (old task, channel) pairs
    whose channel state a new task took."""
    tasks: dict[str, NewTask] = {}
    taken: set[tuple[str, ChannelId]] = set()
    for spec in after.tasks():
        new = NewTask(spec.name)
        own = spec.name in old.snapshots
        if own:
            new.lineage = _lineage(task(spec.name))
            if spec.stage not in empty:
                new.state = dict(task(spec.name).state)
        giver = f"{takes[spec.stage]}-{spec.index}" if spec.stage in takes else None
        for channel in spec.inputs:
            readers = old.readers.get(channel, [])
            internal = writer_of(channel.topic, after.job) is not None
            whole = spec.name if own and spec.name in readers else giver if giver in readers else None
            if whole is not None:
                _take(new, task(whole), channel, whole=True)
                taken.add((whole, channel))
            elif readers and not internal:  # an ingress channel another stage read: from the cut
                _take(new, task(readers[0]), channel, whole=False)
            elif internal:  # a new topic of this generation: from its beginning
                new.positions[channel] = 0
            # an ingress channel nobody read: from the beginning of the topic (no position)
        tasks[spec.name] = new
    return tasks, taken


def _lineage(loaded: LoadedTask) -> Lineage:
    return Lineage.from_json(loaded.snapshot.metadata.get("lineage"))


def _take(new: NewTask, loaded: LoadedTask, channel: ChannelId, *, whole: bool) -> None:
    """``channel`` as ``loaded``'s task recorded it: its position and
    watermark, and (``whole``) its channel state and lineage too."""
    snapshot, key = loaded.snapshot, str(channel)
    new.positions[channel] = int(snapshot.positions[key])
    marks = snapshot.metadata.get("watermarks") or {}
    if key in marks:
        new.watermarks[channel] = int(marks[key])
    if whole:
        if key in snapshot.in_flight:
            new.in_flight[channel] = tuple(int(x) for x in snapshot.in_flight[key])  # type: ignore[assignment]
        if key in loaded.channel_records:
            new.channel_records[channel] = loaded.channel_records[key]
    new.lineage = merge_lineages([new.lineage, _lineage(loaded)])


def _dropped(
    old: _Checkpoint, pipeline: Pipeline, taken: Collection[tuple[str, ChannelId]], refused: Collection[str]
) -> dict[str, int]:
    """Per stage, the records of channel state no new task takes over: on a
    removed stage's output, the removed stage's; elsewhere the reader's
    (topics in ``refused`` are an edge's refusal already)."""
    declared = {s.name for s in pipeline.stages}
    dropped: dict[str, int] = defaultdict(int)
    for channel, readers in old.readers.items():
        for reader in readers:
            records = old.channel_state(reader, channel)
            if not records or (reader, channel) in taken or channel.topic in refused:
                continue
            writer = writer_of(channel.topic, pipeline.job)
            dropped[writer if writer is not None and writer not in declared else task_stage(reader, old.id)] += records
    return dropped


def _removed(
    name: str, old: _Checkpoint, task: Callable[[str], LoadedTask], records: int, allow: AllowDropped
) -> StageChange:
    """A stage of the checkpoint the pipeline no longer has: what dropping it drops."""
    rows = 0
    tables: set[str] = set()
    for index in range(old.counts[name]):
        for table, data in task(f"{name}-{index}").state.items():
            rows += data.num_rows
            tables.add(table)
    held = []
    if rows:
        held.append(f"{rows} row(s) of state (table {', '.join(sorted(tables))})")
    if records:
        held.append(f"{records} record(s) of channel state")
    if not held:
        return StageChange(name, Change.REMOVED, "dropped; it held no state")
    what = " and ".join(held)
    if allow.allows(name):
        return StageChange(name, Change.REMOVED, f"dropped with {what}, as allowed")
    return StageChange(
        name,
        Change.REMOVED,
        "refused",
        f"checkpoint {old.id} holds {what} of it, which the restore would drop: allow that with "
        f"--allow-dropped-state {name} (or --allow-all-dropped-state), or put the stage back",
    )


def _reads(after: Pipeline, stage: Stage, old: _Checkpoint, takes: Mapping[str, str]) -> str:
    """Where each input of ``stage`` starts, in words."""
    said = []
    for name in stage.inputs:
        topic = after.topic_of(name)
        if stage.name in takes and after.ingress_named(name) is None and old.output.get(name, ("", ""))[0] == topic:
            said.append(f"reads {name} where {takes[stage.name]} stood, with its channel state")
        elif old.inputs.get(stage.name, {}).get(name) == topic:
            continue
        elif any(c.topic == topic for c in old.readers):
            said.append(f"reads {name} from the checkpoint's cut")
        else:
            said.append(f"reads {name} from the beginning of {topic}")
    return "; ".join(said) or "reads its inputs as before"


def _no_longer(before: Mapping[str, str], now: Mapping[str, str]) -> str:
    gone = sorted(set(before) - set(now))
    return f"; no longer reads {', '.join(gone)}" if gone else ""
