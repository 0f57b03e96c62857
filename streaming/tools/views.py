"""What the checkpoint commands print: rich tables of the
``streaming.tools.checkpoints.inspection`` and ``streaming.tools.checkpoints.gc`` results, one
function per view, each returning the lines as text (so a test reads what a
person sees); the rows of those ``spark-abs ui`` shows too come from
``streaming.tools.tables``.  ``titled_table``, ``as_text`` and ``byte_size`` are what the
compare and drill reports draw their tables with too."""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Iterable, Sequence

import pyarrow as pa
from rich import box
from rich.console import Console, Group
from rich.table import Table as RichTable
from rich.text import Text

from streaming.engine.restore.changes import PipelineChange
from streaming.engine.restore.rescale import RescalePlan
from streaming.tools.checkpoints.gc import GcPlan
from streaming.tools.checkpoints.inspection import CheckpointDetail, CheckpointRow, RestorePreview, TableDiff
from streaming.tools.tables import (
    Part,
    Table,
    byte_size,
    channel_parts,
    checkpoint_table,
    detail_parts,
    restore_pick,
    sample,
    state_parts,
)

__all__ = [
    "as_text",
    "titled_table",
    "byte_size",
    "drawn",
    "render_checkpoints",
    "render_detail",
    "render_state",
    "render_channels",
    "render_diff",
    "render_verify",
    "render_gc",
    "render_restore_plan",
    "render_rescale_plan",
    "render_pipeline_change",
]


def as_text(*renderables: object) -> str:
    """The renderables as plain text, as wide as the terminal (or 200 columns when piped)."""
    width = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else 200
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False)
    for index, item in enumerate(renderables):
        if index and isinstance(item, Group):  # a titled table: a blank line before it
            console.print()
        console.print(item)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def titled_table(
    title: str | None, columns: Sequence[str], rows: Iterable[Sequence[object]], right: Sequence[str] = ()
):
    """A table with a plain header rule; its title (as wide as the screen, not
    the table) above it."""
    table = RichTable(box=box.SIMPLE_HEAD, show_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row))
    return Group(Text(title), table) if title else Group(table)


def drawn(t: Table) -> Group:
    """A ``tables.Table`` drawn as ``titled_table`` draws it."""
    return titled_table(t.title, t.columns, t.rows, t.right)


def _drawn(parts: list[Part]) -> str:
    return as_text(*(part if isinstance(part, str) else drawn(part) for part in parts))


def render_checkpoints(job: str, rows: list[CheckpointRow], generation: int | None) -> str:
    if not rows:
        return f"job {job}: no checkpoints in the store" + ("" if generation is None else f" (generation {generation})")
    listing, below = checkpoint_table(job, rows, generation)
    text = as_text(drawn(listing))
    if below:
        text += "\n\n" + "\n".join(below)
    if restore_pick(rows) is None:
        text += "\n\nno checkpoint verifies: a restore would start from the beginning"
    return text


def render_detail(detail: CheckpointDetail) -> str:
    """A checkpoint's detail as text (``tables.detail_parts``)."""
    return _drawn(detail_parts(detail))


def render_state(tables: dict[str, pa.Table], rows: int) -> str:
    """Each state table: its row count and a sample of ``rows`` rows."""
    return _drawn(state_parts(tables, rows))


def render_channels(records: pa.Table, decoded: pa.Table, problems: list[str], rows: int) -> str:
    """Channel state: records per task and channel (how they are held, how
    many are stale), a sample of the records and of the rows they carry."""
    return _drawn(channel_parts(records, decoded, problems, rows))


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
            parts.append(
                drawn(sample(f"{d.task} {d.table} (first {min(rows, d.sample.num_rows)} changes)", d.sample, rows))
            )
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


def render_restore_plan(plan: RestorePreview) -> str:
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


def render_pipeline_change(change: PipelineChange) -> str:
    """A restore into the pipeline as its code now declares it, as
    ``restore --dry-run --pipeline`` shows it: each stage's fate and what
    the restore does about it (or why it is refused), and the new topics."""
    job = change.pipeline.job
    if not change.changed:
        head = f"checkpoint {change.source}: pipeline {job} has the checkpoint's stages, inputs and state schemas"
    else:
        head = (
            f"checkpoint {change.source} into the changed pipeline {job}: written as a new checkpoint, "
            f"restored in generation {change.generation}"
        )
    lines = [head]
    # the topics this restore names after its generation, which it reads from their beginning
    new_topics = {t for t in change.scale.topics.values() if t.endswith(f".g{change.generation}")}
    lines += [
        f"  new topic {topic} ({change.pipeline.internal_topics()[topic]} partition(s)) for the output of {stage}"
        for stage, topic in sorted(change.scale.topics.items())
        if topic in new_topics
    ]
    table = titled_table(
        "each stage, matched by name (tasks: as the restore runs them)",
        ("stage", "change", "tasks", "what the restore does"),
        (
            (
                s.stage,
                s.change,
                change.scale.parallelism.get(s.stage),
                f"REFUSED: {s.refusal}" if s.refusal else s.action,
            )
            for s in change.stages
        ),
        right=("tasks",),
    )
    refused = len(change.refusals)
    tail = f"the restore would be refused ({refused} stage(s))" if refused else "nothing is refused"
    return "\n".join(lines) + "\n" + as_text(table) + "\n" + tail
