"""What the checkpoint commands print: rich tables of the
``streaming.tools.checkpoints`` and ``streaming.tools.gc`` results, one
function per view, each returning the lines as text (so a test reads what a
person sees).  ``titled_table``, ``as_text`` and ``byte_size`` are what the
compare and drill reports draw their tables with too."""

from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Iterable, Sequence

import pyarrow as pa
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from streaming.engine.rescale import RescalePlan
from streaming.tools.checkpoints import CheckpointDetail, CheckpointRow, RestorePlan, TableDiff
from streaming.tools.gc import GcPlan

__all__ = [
    "as_text",
    "titled_table",
    "byte_size",
    "render_checkpoints",
    "render_detail",
    "render_state",
    "render_diff",
    "render_verify",
    "render_gc",
    "render_restore_plan",
    "render_rescale_plan",
]


def as_text(*renderables: object) -> str:
    """The renderables as plain text, as wide as the terminal (or 200 columns when piped)."""
    width = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else 200
    console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    for index, item in enumerate(renderables):
        if index and isinstance(item, Group):  # a titled table: a blank line before it
            console.print()
        console.print(item)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())


def titled_table(
    title: str | None, columns: Sequence[str], rows: Iterable[Sequence[object]], right: Sequence[str] = ()
):
    """A table with a plain header rule; its title (as wide as the screen, not
    the table) above it."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row))
    return Group(Text(title), table) if title else Group(table)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def byte_size(n: float) -> str:
    """``n`` bytes in B, kB, MB or GB (powers of 1000), for a person to read."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def render_checkpoints(job: str, rows: list[CheckpointRow], generation: int | None) -> str:
    if not rows:
        return f"job {job}: no checkpoints in the store" + ("" if generation is None else f" (generation {generation})")
    pick = max((r.checkpoint_id for r in rows if r.usable), default=None)
    body, below = [], []
    for r in rows:
        problems = "; ".join(r.problems)
        if r.usable:
            verdict = "yes"
        elif len(problems) <= 50:
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
    text = as_text(
        titled_table(title, columns, body, right=("checkpoint", "gen", "seconds", "state bytes", "in flight"))
    )
    if below:
        text += "\n\n" + "\n".join(below)
    if pick is None:
        text += "\n\nno checkpoint verifies: a restore would start from the beginning"
    return text


def render_detail(detail: CheckpointDetail) -> str:
    """A checkpoint's detail as text: what it is and whether it verifies, its
    tasks, the tasks that turned unaligned, its state tables, its channels
    and the restores its generation descends from."""
    switches = _switches(detail)
    lineage = _lineage(detail)
    parts: list[object] = ["\n".join(_detail_head(detail)), _task_table(detail)]
    if any(t.path for t in detail.tasks):  # older checkpoints did not record it
        parts.append(_path_table(detail))
    if switches:
        parts.append("\n".join(switches))
    parts += [_state_table(detail), _channel_table(detail)]
    if lineage:
        parts.append("lineage (the restores this generation descends from):\n  " + "\n  ".join(lineage))
    return as_text(*parts)


def _detail_head(detail: CheckpointDetail) -> list[str]:
    verdict = "verifies" if not detail.problems else "DOES NOT VERIFY: " + "; ".join(detail.problems)
    head = [
        f"checkpoint {detail.checkpoint_id} of job {detail.job}: generation {detail.generation}, "
        f"completed {detail.created_at}, {verdict}",
        f"mode {detail.alignment} ({detail.guarantee}), in-flight data kept as {detail.in_flight_format}; "
        f"trigger to complete {_s(detail.trigger_to_complete_s)} s",
    ]
    if detail.ingress_barrier_offsets:
        offsets = ", ".join(f"{c}@{o}" for c, o in sorted(detail.ingress_barrier_offsets.items()))
        head.append(f"barriers injected at {offsets}")
    return head


def _task_table(detail: CheckpointDetail) -> Group:
    return titled_table(
        "tasks (seconds: trigger to first barrier, alignment, synchronous and asynchronous snapshot)",
        ("task", "checkpoint taken", "first barrier", "alignment", "sync", "async", "held max", "state", "in flight"),
        (
            (
                t.task,
                t.kind or None,
                _s(t.first_barrier_s),
                _s(t.alignment_s),
                _s(t.sync_snapshot_s),
                _s(t.async_snapshot_s),
                None if t.held_bytes_max is None else byte_size(t.held_bytes_max),
                byte_size(t.state_bytes),
                sum(b - a for a, b in t.in_flight.values()),
            )
            for t in detail.tasks
        ),
        right=("first barrier", "alignment", "sync", "async", "held max", "state", "in flight"),
    )


def _path_table(detail: CheckpointDetail) -> Group:
    """Where each task's first barrier was when, in seconds since the trigger."""
    columns = tuple(_PATH_COLUMNS.values())
    return titled_table(
        "barrier path (seconds since the trigger: the first barrier appended to its channel, the Spark "
        "micro-batch carrying it began, handed to the task, seen by the task, forwarded downstream, acked)",
        ("task", *columns),
        (
            (
                t.task,
                *(_s(t.first_barrier_s if step == "first_barrier" else t.path.get(step)) for step in _PATH_COLUMNS),
            )
            for t in detail.tasks
        ),
        right=columns,
    )


# the barrier path's steps, in order (the task's ``path``, and ``first_barrier_s``), as its table names them
_PATH_COLUMNS = {
    "appended": "appended",
    "batch_began": "Spark batch",
    "handed": "handed",
    "first_barrier": "seen",
    "forwarded": "forwarded",
    "acked": "acked",
}


def _switches(detail: CheckpointDetail) -> list[str]:
    return [
        f"{t.task} turned unaligned"
        + (f" {t.switched_after_ms:.0f} ms after the trigger" if t.switched_after_ms is not None else "")
        + f": {t.switch_reason}"
        for t in detail.tasks
        if t.switch_reason
    ]


def _state_table(detail: CheckpointDetail) -> Group:
    if not any(t.chains for t in detail.tasks):
        return titled_table(
            "state tables",
            ("task", "table", "rows", "bytes"),
            ((t.task, name, rows, size) for t in detail.tasks for name, (rows, size) in sorted(t.state_tables.items())),
            right=("rows", "bytes"),
        )
    return titled_table(
        "state tables (incremental: rows and bytes this checkpoint stored; a restore reads its chain)",
        ("task", "table", "stored", "rows", "bytes"),
        (
            (t.task, name, t.chains.get(name, "whole"), rows, size)
            for t in detail.tasks
            for name, (rows, size) in sorted(t.state_tables.items())
        ),
        right=("rows", "bytes"),
    )


def _channel_table(detail: CheckpointDetail) -> Group:
    return titled_table(
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


def _sample(title: str, table: pa.Table, rows: int, drop: Sequence[str] = ()) -> Group:
    shown = table.drop_columns([c for c in drop if c in table.column_names]).slice(0, rows)
    body = [tuple(_cell(v) for v in row.values()) for row in shown.to_pylist()]
    return titled_table(title, shown.column_names, body)


def _cell(value: object) -> object:
    if isinstance(value, bytes):
        text = value[:40].decode("utf-8", "replace")
        return text + ("..." if len(value) > 40 else "")
    if isinstance(value, list | dict):
        return json.dumps(value, default=str)[:60]
    return value


def render_state(tables: dict[str, pa.Table], rows: int) -> str:
    """Each state table: its row count and a sample of ``rows`` rows."""
    if not tables:
        return "no state tables"
    parts: list[object] = []
    for name, table in tables.items():
        parts.append(_sample(f"table {name}: {table.num_rows} rows (first {min(rows, table.num_rows)})", table, rows))
    return as_text(*parts)


def render_channels(records: pa.Table, decoded: pa.Table, problems: list[str], rows: int) -> str:
    """Channel state: records per task and channel (how they are held, how
    many are stale), a sample of the records and of the rows they carry."""
    summary: dict[tuple[str, str, str], list[int]] = {}
    for task, channel, held, stale, kind in zip(
        *(records[c].to_pylist() for c in ("task", "channel", "held", "stale", "kind"))
    ):
        counts = summary.setdefault((task, channel, held), [0, 0, 0])
        counts[0] += 1
        counts[1] += bool(stale)
        counts[2] += kind == "data" and not stale
    parts: list[object] = [
        titled_table(
            f"channel state: {records.num_rows} records, {decoded.num_rows} rows "
            "(held: copied into the checkpoint, or read back from Kafka by offset range)",
            ("task", "channel", "held", "records", "stale", "data records"),
            ((*key, *counts) for key, counts in sorted(summary.items())),
            right=("records", "stale", "data records"),
        )
    ]
    if records.num_rows:
        title = f"records (first {min(rows, records.num_rows)})"
        parts.append(_sample(title, records, rows, drop=("key", "headers", "timestamp")))
    if decoded.num_rows:
        parts.append(_sample(f"rows they carry (first {min(rows, decoded.num_rows)})", decoded, rows))
    parts += [f"problem: {p}" for p in problems]
    return as_text(*parts)


def render_diff(a: int, b: int, diffs: list[TableDiff], rows: int) -> str:
    if not diffs:
        return f"checkpoints {a} and {b} hold no state tables"
    parts: list[object] = [
        titled_table(
            f"state changes from checkpoint {a} to {b}, by key",
            ("task", "table", "keys", "added", "removed", "changed", "unchanged"),
            ((d.task, d.table, ", ".join(d.keys), d.added, d.removed, d.changed, d.unchanged) for d in diffs),
            right=("added", "removed", "changed", "unchanged"),
        )
    ]
    for d in diffs:
        if d.sample.num_rows:
            parts.append(_sample(f"{d.task} {d.table} (first {min(rows, d.sample.num_rows)} changes)", d.sample, rows))
    return as_text(*parts)


def render_verify(job: str, results: dict[int, list[str]]) -> str:
    if not results:
        return f"job {job}: no complete checkpoint to verify"
    body = []
    for checkpoint_id, problems in sorted(results.items()):
        if not problems:
            body.append((checkpoint_id, "ok"))
        for problem in problems:
            body.append((checkpoint_id, problem))
    bad = sum(bool(p) for p in results.values())
    title = f"job {job}: {len(results) - bad} of {len(results)} checkpoint(s) verify (every part, size and checksum)"
    return as_text(titled_table(title, ("checkpoint", "result"), body, right=("checkpoint",)))


def render_gc(plan: GcPlan, *, dry_run: bool, rows: int = 30) -> str:
    verb = "would remove" if dry_run else "removed"
    if not plan.garbage:
        text = "nothing to collect"
    else:
        summary = titled_table(
            f"{verb} {len(plan.garbage)} file(s), {byte_size(plan.bytes)}",
            ("reason", "files", "bytes"),
            ((reason, files, byte_size(size)) for reason, (files, size) in sorted(plan.by_reason().items())),
            right=("files", "bytes"),
        )
        listing = titled_table(
            None if len(plan.garbage) <= rows else f"first {rows} of {len(plan.garbage)}",
            ("file", "bytes", "reason"),
            ((g.path, g.bytes, g.reason) for g in plan.garbage[:rows]),
            right=("bytes",),
        )
        text = as_text(summary, listing)
    if plan.kept:
        text += "\n\nkept:\n  " + "\n  ".join(plan.kept)
    return text


def render_restore_plan(plan: RestorePlan) -> str:
    lines = []
    for checkpoint_id, problems in plan.skipped:
        lines.append(f"checkpoint {checkpoint_id} skipped: {'; '.join(problems)}")
    if plan.checkpoint_id is None:
        lines.append(
            f"job {plan.job}: no checkpoint verifies; a restore starts generation {plan.generation} "
            "from the beginning of every input"
        )
        return "\n".join(lines)
    lines.append(
        f"job {plan.job}: a restore picks checkpoint {plan.checkpoint_id} and starts generation {plan.generation}"
    )
    table = titled_table(
        "what each task loads and replays (replayed: copied channel state, before anything the query reads; "
        "re-read: ranges the query reads again from Kafka)",
        ("task", "state rows", "replayed records", "re-read ranges", "query starts at"),
        (
            (
                t.task,
                ", ".join(f"{name} {rows}" for name, rows in sorted(t.state_rows.items())) or None,
                ", ".join(f"{c} {n}" for c, n in sorted(t.replayed_records.items())) or None,
                ", ".join(f"{c} [{a}, {b})" for c, (a, b) in sorted(t.reread_ranges.items())) or None,
                ", ".join(f"{c}@{o}" for c, o in t.query_start.items()) or None,
            )
            for t in plan.tasks
        ),
    )
    return "\n".join(lines) + "\n" + as_text(table)


def render_rescale_plan(plan: RescalePlan) -> str:
    """A rescale as ``restore --dry-run --parallelism`` shows it: the scale
    before and after, the new topics, and each new task's state, channels
    and re-routed channel state."""
    old_topics = set(plan.old.topics.values())
    lines = [
        f"checkpoint {plan.source}: {plan.old.describe()} -> {plan.new.describe()} (generation {plan.generation})",
        *(
            f"  new topic {topic} ({plan.pipeline.internal_topics()[topic]} partition(s)) for the output of {stage}"
            for stage, topic in sorted(plan.new.topics.items())
            if topic not in old_topics
        ),
        f"  {plan.rerouted_rows} rows of unaligned channel state routed again by key"
        + (f"; {len(plan.undecodable)} records that do not decode go to the dead letters" if plan.undecodable else ""),
    ]
    rerouted = {c: sum(t.num_rows for t in ts) for c, ts in plan.rerouted.items()}
    table = titled_table(
        "each task of the new scale (channels: the input channels it reads; re-routed: rows of the old "
        "topics' channel state it reads first; watermark from: the lowest its channels start from)",
        ("task", "state rows", "channels", "re-routed rows", "watermark from"),
        (
            (
                name,
                ", ".join(f"{t} {rows.num_rows}" for t, rows in sorted(task.state.items())) or None,
                len(task.positions),
                sum(rerouted.get(c, 0) for c in task.positions) or None,
                min(task.watermarks.values()) if task.watermarks else None,
            )
            for name, task in sorted(plan.tasks.items())
        ),
        right=("channels", "re-routed rows", "watermark from"),
    )
    return "\n".join(lines) + "\n" + as_text(table)
