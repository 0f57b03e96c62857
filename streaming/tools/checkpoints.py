"""Looking inside a job's checkpoints: the Python API behind ``spark-abs
checkpoints list|show|diff|verify``, ``spark-abs state`` and ``spark-abs
restore --dry-run`` (``streaming.tools.gc`` keeps the store tidy).

A checkpoint is Parquet and JSON in a documented layout
(``streaming.adapters.snapshots``), so everything here is a read of those
files, every part checked against its checksum:

- ``detail(n)``: the manifest in words: what each task's checkpoint turned
  out to be, its timings, state tables, in-flight channels and watermarks;
- ``state(n)``: operator state tables as Arrow, one per table name, the
  task as a column;
- ``channel_state(n)``: unaligned channel state, one row per Kafka record,
  copied records and ranges read back from Kafka alike (``held``), each
  marked with the generation that wrote it and whether it is stale (records
  an older generation wrote after a restore's cut are not channel state),
  plus the rows those records carry, decoded;
- ``diff(a, b)``: which keys' state changed between two checkpoints (a
  table that names no key columns: which rows were added and removed);
- ``restore_plan(n)``: which checkpoint a restore picks, which generation it
  starts and what each task loads and replays.

``to_spark`` turns any of these tables into a Spark DataFrame, to be queried
with SQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from barriers.handler import CheckpointKind, Switch
from barriers.lineage import Lineage
from barriers.messages import GENERATION_HEADER, KIND_HEADER, Alignment, ChannelId, InFlightFormat
from operators.state import KEYS_METADATA
from streaming.adapters import codec
from streaming.adapters.kafka_io import read_range
from streaming.adapters.objects import open_store
from streaming.adapters.records import RECORD_SCHEMA, header_values
from streaming.adapters.snapshots import LoadedTask, Manifest, SnapshotStore
from streaming.adapters.snapshots.format import options_from_json, parse_stored, text_of
from streaming.api.config import Connection
from streaming.api.pipeline import Pipeline
from streaming.engine.rescale import RescalePlan, plan_rescale, scale_of, target_scale
from streaming.engine.restore import plan_start
from streaming.errors import KafkaUnavailableError, SnapshotCorruptError, SnapshotMissingError, SparkAbsError

__all__ = [
    "Checkpoints",
    "CheckpointRow",
    "CheckpointDetail",
    "TaskDetail",
    "ChannelState",
    "TableDiff",
    "RestorePlan",
    "TaskPlan",
    "classify_channel_records",
    "channel_rows",
    "state_keys",
    "to_spark",
]


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint directory of a job, as ``checkpoints list`` shows it."""

    checkpoint_id: int
    complete: bool
    problems: tuple[str, ...] = ()  # why a restore could not use it (empty: it verifies)
    generation: int | None = None
    created_at: str = ""
    kinds: tuple[str, ...] = ()
    trigger_to_complete_s: float | None = None
    state_bytes: int = 0
    in_flight_offsets: int = 0

    @property
    def usable(self) -> bool:
        return self.complete and not self.problems


@dataclass(frozen=True)
class TaskDetail:
    """One task's part of a checkpoint: what it turned out to be (``kind``:
    aligned, unaligned, ...), when it saw the checkpoint and how long each
    step took, its state tables ``{name: (rows, bytes)}``, its in-flight
    channels ``{channel: [start, end)}`` and the rows copied of each."""

    task: str
    kind: str
    first_barrier_s: float | None
    alignment_s: float | None
    sync_snapshot_s: float | None
    async_snapshot_s: float | None
    held_bytes_max: int | None
    state_tables: dict[str, tuple[int, int]]
    in_flight: dict[str, tuple[int, int]]
    copied_rows: dict[str, int]
    positions: dict[str, int]
    watermarks: dict[str, int]
    restores: list = field(default_factory=list)  # the lineage: [[generation, {channel: offset}], ...]
    # an aligned checkpoint that turned unaligned here: why, and when (ms since the trigger)
    switch_reason: str | None = None
    switched_after_ms: float | None = None

    @property
    def state_bytes(self) -> int:
        return sum(b for _, b in self.state_tables.values())


@dataclass(frozen=True)
class CheckpointDetail:
    """A complete checkpoint, read from its manifest, and what keeps it from
    being restored (``problems``, empty when it verifies)."""

    job: str
    checkpoint_id: int
    generation: int
    created_at: str
    alignment: str
    in_flight_format: str
    guarantee: str
    trigger_to_complete_s: float | None
    ingress_barrier_offsets: dict[str, Any]
    tasks: list[TaskDetail]
    problems: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ChannelState:
    """A checkpoint's channel state: ``records`` (one row per Kafka record:
    task, channel, offset, held as ``copied`` or ``kafka``, written_by,
    stale, kind, value rows and bytes, then the record itself), ``rows`` (the
    data rows of the records that are channel state, decoded, with task,
    channel and offset) and ``problems`` (ranges Kafka no longer holds,
    records that do not decode)."""

    records: pa.Table
    rows: pa.Table
    problems: list[str]


@dataclass(frozen=True)
class TableDiff:
    """How one state table of one task changed from checkpoint ``a`` to ``b``,
    by key: keys added, removed, changed (same key, other values) and
    unchanged, and a sample of each that changed (the ``b`` side, or ``a`` for
    removed keys)."""

    task: str
    table: str
    keys: tuple[str, ...]
    added: int
    removed: int
    changed: int
    unchanged: int
    sample: pa.Table  # a "change" column (added/removed/changed), then the table's columns


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
class RestorePlan:
    """Which checkpoint a restore would pick (None: from the beginning), the
    newer complete ones it skips and why, the generation it would start and
    every task's plan."""

    job: str
    checkpoint_id: int | None
    skipped: list[tuple[int, list[str]]]
    generation: int
    tasks: list[TaskPlan]


def state_keys(table: pa.Table) -> tuple[str, ...]:
    """The key columns of a state table as keyed state records them in its
    schema (``spark-abs.keys``); empty when the table names none."""
    recorded = (table.schema.metadata or {}).get(KEYS_METADATA)
    if recorded:
        keys = tuple(json.loads(recorded))
        if keys and all(k in table.column_names for k in keys):
            return keys
    return ()


def _concat(parts: list[pa.Table]) -> pa.Table:
    """The parts of one table across tasks.  An empty keyed state has no fixed
    types (placeholder columns), so empty parts only count when all are."""
    filled = [p for p in parts if p.num_rows] or parts[:1]
    return pa.concat_tables(filled, promote_options="permissive").replace_schema_metadata(filled[0].schema.metadata)


def classify_channel_records(
    records: pa.Table, channel: ChannelId, generation: int, lineage: Lineage, *, task: str = "", held: str = "copied"
) -> pa.Table:
    """``records`` (Kafka records as a task holds them) with what they are:
    ``written_by`` (the generation in their header, null for records a
    producer outside spark-abs wrote), ``stale`` (written by an older
    generation after a restore's cut on this channel: the task skips them,
    they are not channel state), ``kind`` (data, barrier, watermark, ...) and
    ``value_bytes``."""
    n = records.num_rows
    written = pc.cast(pc.cast(header_values(records, GENERATION_HEADER), pa.string()), pa.int64())
    offsets = records["offset"].to_pylist()
    stale = [
        gen is not None and 0 <= gen < generation and lineage.is_stale(channel, gen, offset)
        for gen, offset in zip(written.to_pylist(), offsets)
    ]
    kinds = pc.fill_null(pc.cast(header_values(records, KIND_HEADER), pa.string()), "data")
    values = records["value"]
    described = pa.table(
        {
            "task": pa.array([task] * n, pa.string()),
            "channel": pa.array([str(channel)] * n, pa.string()),
            "offset": records["offset"],
            "held": pa.array([held] * n, pa.string()),
            "written_by": written,
            "stale": pa.array(stale, pa.bool_()),
            "kind": kinds,
            "value_bytes": pc.fill_null(pc.binary_length(values), 0),
        }
    )
    for name in ("key", "value", "headers", "timestamp"):
        described = described.append_column(name, records[name])
    return described


def channel_rows(described: pa.Table, problems: list[str]) -> pa.Table:
    """The data rows carried by the records of ``described`` (from
    ``classify_channel_records``) that are channel state, with task, channel
    and offset first; records that do not decode are added to ``problems``."""
    keep = pc.and_(pc.invert(described["stale"]), pc.equal(described["kind"], "data"))
    keep = pc.and_(keep, pc.greater(described["value_bytes"], 0))
    held = described.filter(keep)
    if held.num_rows == 0:
        return pa.table({"task": pa.array([], pa.string()), "channel": pa.array([], pa.string())})
    decoded = codec.decode_records(held)
    for index, reason in decoded.rejected[:5]:
        problems.append(f"{held['channel'][index]} offset {held['offset'][index]}: {reason}")
    if len(decoded.rejected) > 5:
        problems.append(f"... and {len(decoded.rejected) - 5} more records that do not decode")
    index = pa.array(decoded.index, pa.int64())
    rows = decoded.table
    front = {name: held[name].take(index) for name in ("task", "channel", "offset")}
    for position, (name, column) in enumerate(front.items()):
        label = name if name not in rows.column_names else f"_{name}"
        rows = rows.add_column(position, label, column)
    return rows


class Checkpoints:
    """The checkpoints of job ``job`` in ``store`` (a ``SnapshotStore``);
    ``bootstrap`` is the Kafka cluster channel-state ranges are read back
    from (without it, ranges are reported, not read)."""

    def __init__(self, store: SnapshotStore, *, bootstrap: str | None = None):
        self.store = store
        self.job = store.job
        self.bootstrap = bootstrap

    @classmethod
    def open(cls, uri: str, job: str, connection: Connection | None = None) -> Checkpoints:
        """``uri`` is the store (``file:///dir`` or ``s3://bucket/prefix``);
        ``connection`` reaches S3 and Kafka."""
        return cls(
            SnapshotStore(open_store(uri, connection), job),
            bootstrap=connection.kafka_bootstrap if connection else None,
        )

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- listing and verifying ----------------------------------------------

    def rows(self, *, checksums: bool = True) -> list[CheckpointRow]:
        """Every checkpoint of the job, ascending, each verified."""
        rows = []
        complete = set(self.store.completed())
        for checkpoint_id in self.store.checkpoints():
            if checkpoint_id not in complete:
                rows.append(CheckpointRow(checkpoint_id, False, ("no manifest: never completed",)))
                continue
            try:
                manifest = self.store.read_manifest(checkpoint_id)
                problems = tuple(self.store.verify(checkpoint_id, checksums=checksums))
            except (SnapshotMissingError, ValueError, SparkAbsError) as exc:
                rows.append(CheckpointRow(checkpoint_id, True, (str(exc),)))
                continue
            tasks = manifest.tasks.values()
            rows.append(
                CheckpointRow(
                    checkpoint_id,
                    True,
                    problems,
                    manifest.generation,
                    manifest.created_at,
                    tuple(text_of(CheckpointKind, k) for k in manifest.metrics.get("kinds", ())),
                    manifest.metrics.get("trigger_to_complete_s"),
                    sum(p.bytes for t in tasks for p in t.state_parts),
                    sum(end - start for t in tasks for start, end in t.in_flight.values()),
                )
            )
        return rows

    def generation(self) -> int | None:
        """The job's current generation (None: the store has never seen the job)."""
        meta = self.store.read_job()
        if meta is not None:
            return meta.generation
        return 0 if self.store.checkpoints() else None  # a job of an older version wrote no job file in generation 0

    def verify(
        self,
        checkpoint_id: int | None = None,
        *,
        checksums: bool = True,
        progress: Callable[[str], None] = lambda _: None,
    ) -> dict[int, list[str]]:
        """Problems per complete checkpoint (``checkpoint_id``, or every one);
        an empty list means it verifies.  A checkpoint that is not complete
        raises SnapshotMissingError."""
        ids = [checkpoint_id] if checkpoint_id is not None else self.store.completed()
        results = {}
        for n, c in enumerate(ids, 1):
            progress(f"verifying checkpoint {c} ({n} of {len(ids)})")
            results[c] = self.store.verify(c, checksums=checksums)
        return results

    # -- one checkpoint ------------------------------------------------------

    def detail(self, checkpoint_id: int) -> CheckpointDetail:
        manifest, problems = self.store.verifier.verify(checkpoint_id)  # the manifest read once
        if manifest is None:
            raise SnapshotCorruptError(problems[0])
        return _detail(manifest, problems)

    def state(self, checkpoint_id: int, *, task: str | None = None, table: str | None = None) -> dict[str, pa.Table]:
        """Operator state by table name, the rows of every task (or ``task``)
        with a ``task`` column first; only ``table`` when given."""
        by_table: dict[str, list[pa.Table]] = {}
        for loaded in self._loaded(checkpoint_id, task):
            for name, rows in loaded.state.items():
                if table is None or name == table:
                    tagged = rows.add_column(0, "task", pa.array([loaded.snapshot.task] * rows.num_rows, pa.string()))
                    by_table.setdefault(name, []).append(tagged)
        if table is not None and table not in by_table:
            raise SnapshotMissingError(
                f"checkpoint {checkpoint_id}: no state table {table!r}"
                + (f" in task {task}" if task else "")
                + f" (tables: {', '.join(sorted(self._table_names(checkpoint_id))) or 'none'})"
            )
        return {name: _concat(parts) for name, parts in sorted(by_table.items())}

    def channel_state(
        self, checkpoint_id: int, *, task: str | None = None, progress: Callable[[str], None] = lambda _: None
    ) -> ChannelState:
        """The checkpoint's channel state (see ``ChannelState``): copied records
        as stored, ranges read back from Kafka while it still holds them."""
        described: list[pa.Table] = []
        problems: list[str] = []
        for loaded in self._loaded(checkpoint_id, task):
            snapshot = loaded.snapshot
            lineage = Lineage.from_json(snapshot.metadata.get("lineage"))
            for name, (start, end) in sorted(snapshot.in_flight.items()):
                channel = ChannelId.parse(name)
                if name in loaded.channel_records:
                    records, held = loaded.channel_records[name], "copied"
                elif self.bootstrap is None:
                    problems.append(f"{snapshot.task} {name}: [{start}, {end}) kept as a range; no Kafka to read it")
                    continue
                else:
                    progress(f"reading {snapshot.task} {name} [{start}, {end}) from Kafka")
                    try:
                        records, held = read_range(self.bootstrap, channel, start, end), "kafka"
                    except KafkaUnavailableError as exc:
                        problems.append(f"{snapshot.task} {name}: {exc}")
                        continue
                records = records.select(RECORD_SCHEMA.names).cast(RECORD_SCHEMA)
                described.append(
                    classify_channel_records(
                        records, channel, snapshot.generation, lineage, task=snapshot.task, held=held
                    )
                )
        if described:
            records = pa.concat_tables(described)
        else:
            records = classify_channel_records(RECORD_SCHEMA.empty_table(), ChannelId("-", 0), 0, Lineage())
        # each channel decoded on its own: channels of different stages carry different columns
        rows = [channel_rows(part, problems) for part in described]
        rows = [r for r in rows if r.num_rows] or [channel_rows(records.slice(0, 0), problems)]
        try:
            decoded = pa.concat_tables(rows, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            problems.append(f"the channels' rows have types that do not combine ({exc}): read one task at a time")
            decoded = rows[0]
        return ChannelState(records, decoded, problems)

    def diff(self, a: int, b: int, *, table: str | None = None, sample: int = 10) -> list[TableDiff]:
        """How each task's state tables changed from checkpoint ``a`` to ``b``, by key."""
        before, after = self.state(a, table=table), self.state(b, table=table)
        diffs = []
        for name in sorted(set(before) | set(after)):
            old, new = before.get(name), after.get(name)
            template = new if new is not None else old
            # a table that names no keys is compared row by row (rows added and removed), a
            # row's occurrence among equal rows counting as part of it
            named = state_keys(template)
            keys = ("task", *(named or [c for c in template.column_names if c != "task"]))
            old = old if old is not None else template.schema.empty_table()
            new = new if new is not None else template.schema.empty_table()
            for task in sorted(self._tasks_with(a, name) | self._tasks_with(b, name)):
                before_rows = old.filter(pc.equal(old["task"], task))
                after_rows = new.filter(pc.equal(new["task"], task))
                if not named:
                    before_rows, after_rows = _numbered(before_rows), _numbered(after_rows)
                diff = _diff_table(
                    task, name, keys + (() if named else (_OCCURRENCE,)), before_rows, after_rows, sample
                )
                if not named:
                    diff = _unnumbered(diff)
                diffs.append(diff)
        return diffs

    def restore_plan(
        self, checkpoint_id: int | None = None, *, progress: Callable[[str], None] = lambda _: None
    ) -> RestorePlan:
        """What ``run --restore`` would do now: the checkpoint it picks
        (``checkpoint_id`` if it verifies, else the newest that does), the
        generation it starts and what every task loads and replays."""
        if checkpoint_id is not None:
            manifest, problems = self.store.verifier.verify(checkpoint_id)
            if problems:
                raise SnapshotMissingError(f"checkpoint {checkpoint_id} cannot be restored: {'; '.join(problems)}")
            skipped = []
        else:
            manifest, skipped = self.store.latest_verified()
        meta = self.store.read_job()
        generation = (meta.generation if meta else 0) + 1
        if manifest is None:
            return RestorePlan(self.job, None, skipped, generation, [])
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
        return RestorePlan(self.job, manifest.checkpoint_id, skipped, generation, tasks)

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
        if checkpoint_id is not None:
            manifest, problems = self.store.verifier.verify(checkpoint_id)
            if problems:
                raise SnapshotMissingError(f"checkpoint {checkpoint_id} cannot be restored: {'; '.join(problems)}")
        else:
            manifest, _ = self.store.latest_verified()
        if manifest is None:
            raise SnapshotMissingError(f"job {self.job}: no checkpoint verifies, nothing to rescale")
        meta = self.store.read_job()
        generation = (meta.generation if meta else 0) + 1
        old = scale_of(manifest, pipeline)
        new = target_scale(pipeline, old, parallelism, generation)
        loaded = {}
        for name in sorted(manifest.tasks):
            progress(f"loading task {name} of checkpoint {manifest.checkpoint_id}")
            loaded[name] = self.store.load_task(manifest.checkpoint_id, name)

        def ranges(channel: ChannelId, start: int, end: int) -> pa.Table:
            if self.bootstrap is None:
                raise KafkaUnavailableError(f"channel state of {channel} is a range in Kafka: no broker given")
            return read_range(self.bootstrap, channel, start, end)

        return plan_rescale(pipeline, manifest.checkpoint_id, loaded, old, new, generation, ranges)

    # -- helpers ------------------------------------------------------------

    def _loaded(self, checkpoint_id: int, task: str | None) -> Iterable[LoadedTask]:
        manifest = self.store.read_manifest(checkpoint_id)
        if task is not None and task not in manifest.tasks:
            raise SnapshotMissingError(
                f"checkpoint {checkpoint_id} has no task {task!r} (tasks: {', '.join(sorted(manifest.tasks))})"
            )
        for name in sorted(manifest.tasks):
            if task is None or name == task:
                yield self.store.load_task(checkpoint_id, name)

    def _tasks_with(self, checkpoint_id: int, table: str) -> set[str]:
        manifest = self.store.read_manifest(checkpoint_id)
        return {t for t, snapshot in manifest.tasks.items() if any(p.name == table for p in snapshot.state_parts)}

    def _table_names(self, checkpoint_id: int) -> set[str]:
        manifest = self.store.read_manifest(checkpoint_id)
        return {p.name for t in manifest.tasks.values() for p in t.state_parts}


def _detail(manifest: Manifest, problems: list[str]) -> CheckpointDetail:
    metrics = manifest.metrics
    per_task = metrics.get("tasks") or {}
    tasks = []
    for name, snapshot in sorted(manifest.tasks.items()):
        measured = {**snapshot.metadata, **(per_task.get(name) or {})}
        tasks.append(
            TaskDetail(
                task=name,
                kind=text_of(CheckpointKind, measured.get("kind", "")),
                first_barrier_s=measured.get("first_barrier_s"),
                alignment_s=measured.get("alignment_s"),
                sync_snapshot_s=measured.get("sync_snapshot_s"),
                async_snapshot_s=measured.get("async_snapshot_s"),
                held_bytes_max=measured.get("held_bytes_max"),
                state_tables={p.name: (p.rows, p.bytes) for p in snapshot.state_parts},
                in_flight=dict(snapshot.in_flight),
                copied_rows={p.name: p.rows for p in snapshot.channel_parts},
                positions=dict(snapshot.positions),
                watermarks={c: int(w) for c, w in (measured.get("watermarks") or {}).items()},
                restores=list(measured.get("lineage") or []),
                switch_reason=_switch_reason(measured),
                switched_after_ms=measured.get("switched_after_ms"),
            )
        )
    options = manifest.options
    try:
        ran_with = options_from_json(options)
        alignment, guarantee = ran_with.describe(), _GUARANTEE[ran_with.alignment]
    except ValueError:  # options that read as none: shown as they are
        alignment, guarantee = str(options.get("alignment", "")), str(options.get("guarantee", ""))
    return CheckpointDetail(
        job=manifest.job,
        checkpoint_id=manifest.checkpoint_id,
        generation=manifest.generation,
        created_at=manifest.created_at,
        alignment=alignment,
        in_flight_format=text_of(InFlightFormat, options.get("in_flight", "")),
        guarantee=guarantee,
        trigger_to_complete_s=metrics.get("trigger_to_complete_s"),
        ingress_barrier_offsets=dict(metrics.get("ingress_barrier_offsets") or {}),
        tasks=tasks,
        problems=list(problems),
    )


# what each alignment guarantees, as ``checkpoints show`` says it
_GUARANTEE = {
    Alignment.ALIGNED: "exactly-once",
    Alignment.UNALIGNED: "exactly-once (in-flight records are channel state, replayed on restore)",
    Alignment.AT_LEAST_ONCE: "at-least-once: no alignment, so replay after a restore may duplicate records",
}


def _switch_reason(measured: Mapping[str, Any]) -> str | None:
    """Why a task's aligned checkpoint turned unaligned (its ``Switch``), in
    words; an older manifest's words when its switch names none."""
    if measured.get("switch"):
        try:
            return parse_stored(Switch, measured["switch"]).value
        except ValueError:
            pass
    return measured.get("switch_reason")


_OCCURRENCE = "_occurrence"


def _numbered(rows: pa.Table) -> pa.Table:
    """``rows`` with each row's occurrence among equal rows (0, 1, ...)."""
    seen: dict[tuple, int] = {}
    numbers = []
    for row in zip(*(rows[c].to_pylist() for c in rows.column_names)):
        key = tuple(repr(v) for v in row)
        numbers.append(seen.get(key, 0))
        seen[key] = numbers[-1] + 1
    return rows.append_column(_OCCURRENCE, pa.array(numbers, pa.int64()))


def _unnumbered(diff: TableDiff) -> TableDiff:
    keys = tuple(k for k in diff.keys if k != _OCCURRENCE)
    sample = diff.sample.drop_columns([_OCCURRENCE]) if _OCCURRENCE in diff.sample.column_names else diff.sample
    return TableDiff(diff.task, diff.table, keys, diff.added, diff.removed, diff.changed, diff.unchanged, sample)


def _joinable(keys: pa.Table) -> pa.Table:
    """Key columns that match on null too (a join never matches nulls): as text,
    null as a marker no text value has."""
    columns = {}
    for name in keys.column_names:
        try:
            columns[name] = pc.fill_null(pc.cast(keys[name], pa.string()), "\x00null")
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            columns[name] = keys[name]
    return pa.table(columns)


def _diff_table(task: str, name: str, keys: tuple[str, ...], old: pa.Table, new: pa.Table, sample: int) -> TableDiff:
    """Keys added, removed, changed and unchanged from ``old`` to ``new``."""
    values = [c for c in new.column_names if c not in keys]
    old_keys = _joinable(old.select(list(keys))).append_column("_old", pa.array(range(old.num_rows), pa.int64()))
    new_keys = _joinable(new.select(list(keys))).append_column("_new", pa.array(range(new.num_rows), pa.int64()))
    joined = new_keys.join(old_keys, list(keys), join_type="full outer")
    in_old, in_new = joined["_old"], joined["_new"]
    added = pc.and_(pc.is_null(in_old), pc.is_valid(in_new))
    removed = pc.and_(pc.is_valid(in_old), pc.is_null(in_new))
    both = joined.filter(pc.and_(pc.is_valid(in_old), pc.is_valid(in_new)))
    changed_new: list[int] = []
    if both.num_rows and values:
        left = new.select(values).take(both["_new"])
        right = old.select([c for c in values if c in old.column_names]).take(both["_old"])
        differs = pa.array([False] * both.num_rows)
        for column in values:
            if column not in right.column_names:
                differs = pa.array([True] * both.num_rows)
                break
            same = pc.fill_null(pc.equal(left[column], right[column]), False)
            nulls = pc.and_(pc.is_null(left[column]), pc.is_null(right[column]))
            differs = pc.or_(differs, pc.invert(pc.or_(same, nulls)))
        changed_new = both["_new"].filter(differs).to_pylist()
    added_new = joined["_new"].filter(added).to_pylist()
    removed_old = joined["_old"].filter(removed).to_pylist()
    parts = []
    for change, table, index in (
        ("added", new, added_new),
        ("changed", new, changed_new),
        ("removed", old, removed_old),
    ):
        if index and len(parts) < sample:
            rows = table.take(pa.array(index[:sample], pa.int64()))
            parts.append(rows.add_column(0, "change", pa.array([change] * rows.num_rows, pa.string())))
    shown = (
        pa.concat_tables(parts, promote_options="permissive").slice(0, sample)
        if parts
        else new.schema.empty_table().add_column(0, "change", pa.array([], pa.string()))
    )
    return TableDiff(
        task,
        name,
        keys[1:],
        len(added_new),
        len(removed_old),
        len(changed_new),
        both.num_rows - len(changed_new),
        shown,
    )


def to_spark(spark, table: pa.Table, *, view: str | None = None):
    """``table`` as a Spark DataFrame (registered as temporary view ``view``
    when given), to be queried with Spark SQL."""
    frame = spark.createDataFrame(table.replace_schema_metadata(None))
    if view:
        frame.createOrReplaceTempView(view)
    return frame
