"""The checkpoint tools' results as tables of plain values, one function
per table: ``spark-abs checkpoints`` and ``spark-abs state`` print them
(``streaming.tools.views`` draws them with rich) and ``spark-abs ui`` shows
them (``streaming.tools.ui.app``, as HTML), so a terminal and a browser show the
same rows.

A ``Table`` holds what a cell shows (numbers and text; None for nothing to
show); a part of a page is a ``Table`` or a paragraph of text."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from streaming.adapters.snapshots.format import GenerationStart, JobMeta
from streaming.api.pipeline import Scale
from streaming.engine.restore.service import RESTORE_CAUSES
from streaming.errors import ConfigError
from streaming.tools.checkpoints.inspection import CheckpointDetail, CheckpointRow

__all__ = [
    "Table",
    "Part",
    "byte_size",
    "seconds",
    "restore_pick",
    "checkpoint_table",
    "detail_parts",
    "path_table",
    "sample",
    "state_parts",
    "channel_parts",
    "generation_table",
]


@dataclass(frozen=True)
class Table:
    """Rows under named columns, a title above them; ``right``: the columns
    of numbers (aligned right)."""

    title: str | None
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    right: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[str] = ()
    ) -> Table:
        return cls(title, tuple(columns), tuple(tuple(row) for row in rows), tuple(right))


# a part of a page: a table, or text (lines joined by newlines)
Part = Table | str


def byte_size(n: float) -> str:
    """``n`` bytes in B, kB, MB or GB (powers of 1000), for a person to read."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def seconds(value: float | None) -> str:
    """Seconds to the millisecond, ``-`` for none."""
    return "-" if value is None else f"{value:.3f}"


# ---- the checkpoints of a job (checkpoints list)


def restore_pick(rows: Sequence[CheckpointRow]) -> int | None:
    """The checkpoint a restore picks: the newest that verifies."""
    return max((r.checkpoint_id for r in rows if r.usable), default=None)


def checkpoint_table(
    job: str, rows: Sequence[CheckpointRow], generation: int | None, *, inline: int = 50
) -> tuple[Table, list[str]]:
    """Every checkpoint, whether it verifies and the one a restore picks;
    problems longer than ``inline`` characters go below the table (the
    second value, one line each)."""
    pick = restore_pick(rows)
    body, below = [], []
    for r in rows:
        problems = "; ".join(r.problems)
        if r.usable:
            verdict = "yes"
        elif len(problems) <= inline:
            verdict = f"NO: {problems}"
        else:
            verdict = f"NO: {len(r.problems)} problem(s), below"
            below += [f"checkpoint {r.checkpoint_id}: {p}" for p in r.problems]
        if r.checkpoint_id == pick:
            verdict += "   <- a restore picks this one"
        body.append(
            (
                r.checkpoint_id,
                r.generation,
                r.created_at[:19] or None,
                None if r.trigger_to_complete_s is None else f"{r.trigger_to_complete_s:.2f}",
                r.state_bytes,
                r.in_flight_offsets,
                ", ".join(r.kinds) or None,
                verdict,
            )
        )
    title = f"job {job}" + ("" if generation is None else f", generation {generation}")
    columns = ("checkpoint", "gen", "created (UTC)", "seconds", "state bytes", "in flight", "kinds", "verifies")
    table = Table.of(title, columns, body, right=("checkpoint", "gen", "seconds", "state bytes", "in flight"))
    return table, below


# ---- one checkpoint (checkpoints show)


def detail_parts(detail: CheckpointDetail) -> list[Part]:
    """A checkpoint's detail: what it is and whether it verifies, its tasks,
    the barrier's path through them, the tasks that turned unaligned, its
    state tables, its channels and the restores its generation descends from."""
    parts: list[Part] = ["\n".join(_detail_head(detail)), _task_table(detail)]
    path = path_table(detail)
    if path is not None:
        parts.append(path)
    switches = _switches(detail)
    if switches:
        parts.append("\n".join(switches))
    parts += [_state_table(detail), _channel_table(detail)]
    lineage = _lineage(detail)
    if lineage:
        parts.append("lineage (the restores this generation descends from):\n  " + "\n  ".join(lineage))
    return parts


def _detail_head(detail: CheckpointDetail) -> list[str]:
    verdict = "verifies" if not detail.problems else "DOES NOT VERIFY: " + "; ".join(detail.problems)
    head = [
        f"checkpoint {detail.checkpoint_id} of job {detail.job}: generation {detail.generation}, "
        f"completed {detail.created_at}, {verdict}",
        f"mode {detail.alignment} ({detail.guarantee}), in-flight data kept as {detail.in_flight_format}; "
        f"trigger to complete {seconds(detail.trigger_to_complete_s)} s",
    ]
    if detail.ingress_barrier_offsets:
        offsets = ", ".join(f"{c}@{o}" for c, o in sorted(detail.ingress_barrier_offsets.items()))
        head.append(f"barriers injected at {offsets}")
    return head


def _task_table(detail: CheckpointDetail) -> Table:
    return Table.of(
        "tasks (seconds: trigger to first barrier, alignment, synchronous and asynchronous snapshot)",
        ("task", "checkpoint taken", "first barrier", "alignment", "sync", "async", "held max", "state", "in flight"),
        (
            (
                t.task,
                t.kind or None,
                seconds(t.first_barrier_s),
                seconds(t.alignment_s),
                seconds(t.sync_snapshot_s),
                seconds(t.async_snapshot_s),
                None if t.held_bytes_max is None else byte_size(t.held_bytes_max),
                byte_size(t.state_bytes),
                sum(b - a for a, b in t.in_flight.values()),
            )
            for t in detail.tasks
        ),
        right=("first barrier", "alignment", "sync", "async", "held max", "state", "in flight"),
    )


# the barrier path's steps, in order (the task's ``path``, and ``first_barrier_s``), as its table names them
PATH_COLUMNS = {
    "appended": "appended",
    "batch_began": "Spark batch",
    "handed": "handed",
    "first_barrier": "seen",
    "forwarded": "forwarded",
    "acked": "acked",
}


def path_table(detail: CheckpointDetail) -> Table | None:
    """Where each task's first barrier was when, in seconds since the
    trigger; None for a checkpoint taken before paths were recorded."""
    if not any(t.path for t in detail.tasks):
        return None
    columns = tuple(PATH_COLUMNS.values())
    return Table.of(
        "barrier path (seconds since the trigger: the first barrier appended to its channel, the Spark "
        "micro-batch carrying it began, handed to the task, seen by the task, forwarded downstream, acked)",
        ("task", *columns),
        (
            (
                t.task,
                *(seconds(t.first_barrier_s if step == "first_barrier" else t.path.get(step)) for step in PATH_COLUMNS),
            )
            for t in detail.tasks
        ),
        right=columns,
    )


def _switches(detail: CheckpointDetail) -> list[str]:
    return [
        f"{t.task} turned unaligned"
        + (f" {t.switched_after_ms:.0f} ms after the trigger" if t.switched_after_ms is not None else "")
        + f": {t.switch_reason}"
        for t in detail.tasks
        if t.switch_reason
    ]


def _state_table(detail: CheckpointDetail) -> Table:
    if not any(t.chains for t in detail.tasks):
        return Table.of(
            "state tables",
            ("task", "table", "rows", "bytes"),
            ((t.task, name, rows, size) for t in detail.tasks for name, (rows, size) in sorted(t.state_tables.items())),
            right=("rows", "bytes"),
        )
    return Table.of(
        "state tables (incremental: rows and bytes this checkpoint stored; a restore reads its chain)",
        ("task", "table", "stored", "rows", "bytes"),
        (
            (t.task, name, t.chains.get(name, "whole"), rows, size)
            for t in detail.tasks
            for name, (rows, size) in sorted(t.state_tables.items())
        ),
        right=("rows", "bytes"),
    )


def _channel_table(detail: CheckpointDetail) -> Table:
    return Table.of(
        "channels (position: where the task resumes; in flight: unaligned channel state, as an offset range "
        "and the records copied of it)",
        ("task", "channel", "position", "in flight", "copied", "watermark"),
        (
            (
                t.task,
                channel,
                position,
                f"[{t.in_flight[channel][0]}, {t.in_flight[channel][1]})" if channel in t.in_flight else None,
                t.copied_rows.get(channel),
                t.watermarks.get(channel),
            )
            for t in detail.tasks
            for channel, position in sorted(t.positions.items())
        ),
        right=("position", "copied", "watermark"),
    )


def _lineage(detail: CheckpointDetail) -> list[str]:
    return [
        f"{t.task}: restored as " + ", ".join(f"generation {g} at {len(p)} channel position(s)" for g, p in t.restores)
        for t in detail.tasks
        if t.restores
    ]


# ---- operator and channel state (spark-abs state)


def sample(title: str, table: pa.Table, rows: int, drop: Sequence[str] = ()) -> Table:
    """The first ``rows`` rows of ``table`` (without the columns ``drop``),
    long bytes and nested values cut short."""
    shown = table.drop_columns([c for c in drop if c in table.column_names]).slice(0, rows)
    body = [tuple(_cell(v) for v in row.values()) for row in shown.to_pylist()]
    return Table.of(title, shown.column_names, body)


def _cell(value: object) -> object:
    if isinstance(value, bytes):
        text = value[:40].decode("utf-8", "replace")
        return text + ("..." if len(value) > 40 else "")
    if isinstance(value, list | dict):
        return json.dumps(value, default=str)[:60]
    return value


def state_parts(tables: dict[str, pa.Table], rows: int) -> list[Part]:
    """Each state table: its row count and a sample of ``rows`` rows."""
    if not tables:
        return ["no state tables"]
    return [
        sample(f"table {name}: {table.num_rows} rows (first {min(rows, table.num_rows)})", table, rows)
        for name, table in tables.items()
    ]


def channel_parts(records: pa.Table, decoded: pa.Table, problems: list[str], rows: int) -> list[Part]:
    """Channel state: records per task and channel (how they are held, how
    many are stale), a sample of the records and of the rows they carry,
    and the problems met reading them."""
    summary: dict[tuple[str, str, str], list[int]] = {}
    for task, channel, held, stale, kind in zip(
        *(records[c].to_pylist() for c in ("task", "channel", "held", "stale", "kind"))
    ):
        counts = summary.setdefault((task, channel, held), [0, 0, 0])
        counts[0] += 1
        counts[1] += bool(stale)
        counts[2] += kind == "data" and not stale
    parts: list[Part] = [
        Table.of(
            f"channel state: {records.num_rows} records, {decoded.num_rows} rows "
            "(held: copied into the checkpoint, or read back from Kafka by offset range)",
            ("task", "channel", "held", "records", "stale", "data records"),
            ((*key, *counts) for key, counts in sorted(summary.items())),
            right=("records", "stale", "data records"),
        )
    ]
    if records.num_rows:
        title = f"records (first {min(rows, records.num_rows)})"
        parts.append(sample(title, records, rows, drop=("key", "headers", "timestamp")))
    if decoded.num_rows:
        parts.append(sample(f"rows they carry (first {min(rows, decoded.num_rows)})", decoded, rows))
    parts += [f"problem: {p}" for p in problems]
    return parts


# ---- the job's generations (_JOB.json)


def generation_table(meta: JobMeta | None) -> Table:
    """Every generation of the job, as the store records its start: when,
    from which checkpoint (a rescale or a changed pipeline: which checkpoint
    it wrote again), at
    which scale, and why the job restored."""
    body = []
    for entry in meta.restores if meta else ():
        source = entry.from_checkpoint
        if entry.generation == 0:
            start = "fresh start"
        elif source is None:
            start = "restored from the beginning (no checkpoint verified)"
        elif entry.rescaled_from is not None:
            start = f"restored from checkpoint {source}, checkpoint {entry.rescaled_from} rescaled"
        elif entry.changed_from is not None:
            start = f"restored from checkpoint {source}, checkpoint {entry.changed_from} into a changed pipeline"
        else:
            start = f"restored from checkpoint {source}"
        # none: recorded by an older version
        cause = RESTORE_CAUSES.get(entry.cause, entry.cause) if entry.cause is not None else None
        body.append((entry.generation, entry.at[:19] or None, start, _scale(entry), cause))
    title = "generations" if meta is None else f"generations (the job runs generation {meta.generation})"
    columns = ("generation", "started (UTC)", "start", "tasks per stage", "why")
    return Table.of(title, columns, body, right=("generation",))


def _scale(entry: GenerationStart) -> str | None:
    """The tasks per stage a generation ran with, when its entry records them."""
    if not entry.scale:
        return None
    try:
        return Scale.from_json(entry.scale).describe()
    except ConfigError:
        return str(entry.scale)
