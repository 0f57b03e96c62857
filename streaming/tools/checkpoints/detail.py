"""One checkpoint in words (``spark-abs checkpoints show``): what each task's
checkpoint turned out to be, its timings, state tables, in-flight channels
and watermarks, read from the manifest."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from barriers.handler import CheckpointKind, Switch
from barriers.messages import Alignment, InFlightFormat
from streaming.adapters.snapshots import Manifest, TaskCheckpointMetrics, TaskSnapshot
from streaming.adapters.snapshots.format import BARRIER_PATH, options_from_json, parse_stored, text_of

__all__ = ["CheckpointDetail", "TaskDetail", "checkpoint_detail"]


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
    # the barrier's path, seconds since the trigger: its first barrier appended to its channel,
    # Spark began the micro-batch carrying it, the task received that batch; forwarded, acked
    path: dict[str, float] = field(default_factory=dict)
    # incremental checkpoints: per table, what this checkpoint stored ("base", or the changes it
    # linked) and the checkpoints whose parts its chain reads; state_tables then count what it stored
    chains: dict[str, str] = field(default_factory=dict)

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
        out = asdict(self)
        for task in out["tasks"]:
            if not task["path"]:  # a checkpoint from before barrier paths were recorded reads as it did
                del task["path"]
            if not task["chains"]:  # full snapshots read as they did
                del task["chains"]
        return out


def checkpoint_detail(manifest: Manifest, problems: list[str]) -> CheckpointDetail:
    """``manifest`` in words, with the ``problems`` that keep it from being restored."""
    metrics = manifest.metrics
    per_task = metrics.get("tasks") or {}
    tasks = []
    for name, snapshot in sorted(manifest.tasks.items()):
        # what the task wrote with its snapshot, and what the manifest keeps of it and of its upload
        stored = {**snapshot.metadata, **(per_task.get(name) or {})}
        measured = TaskCheckpointMetrics.from_json(stored)
        tasks.append(
            TaskDetail(
                task=name,
                kind=text_of(CheckpointKind, measured.kind),
                first_barrier_s=measured.first_barrier_s,
                alignment_s=measured.alignment_s,
                sync_snapshot_s=measured.sync_snapshot_s,
                async_snapshot_s=measured.async_snapshot_s,
                held_bytes_max=measured.held_bytes_max,
                state_tables=_stored_tables(snapshot),
                in_flight=dict(snapshot.in_flight),
                copied_rows={p.name: p.rows for p in snapshot.channel_parts},
                positions=dict(snapshot.positions),
                watermarks={c: int(w) for c, w in (stored.get("watermarks") or {}).items()},
                restores=list(stored.get("lineage") or []),
                switch_reason=_switch_reason(measured.switch, stored.get("switch_reason")),
                switched_after_ms=measured.switched_after_ms,
                path={name: measured.barrier_path[name] for name in BARRIER_PATH if name in measured.barrier_path},
                chains={name: _chain_text(snapshot, chain) for name, chain in snapshot.state_chains.items()},
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


def _switch_reason(switch: str | None, words: str | None) -> str | None:
    """Why a task's aligned checkpoint turned unaligned (its ``Switch``), in
    words; an older manifest's ``words`` when its switch names none."""
    if switch:
        try:
            return parse_stored(Switch, switch).value
        except ValueError:
            pass
    return words


def _stored_tables(snapshot: TaskSnapshot) -> dict[str, tuple[int, int]]:
    """``{table: (rows, bytes)}`` this checkpoint stored: whole tables, and of
    a chain only its own links (the rows it put in and the keys it took out)."""
    tables = {p.name: (p.rows, p.bytes) for p in snapshot.state_parts}
    for name, chain in snapshot.state_chains.items():
        own = [link.part for link in chain if link.checkpoint_id == snapshot.checkpoint_id]
        tables[name] = (sum(p.rows for p in own), sum(p.bytes for p in own))
    return tables


def _chain_text(snapshot: TaskSnapshot, chain: tuple) -> str:
    """How a checkpoint holds a chained table: ``base``, or the changes it
    linked on the chain of an earlier base."""
    if all(link.checkpoint_id == snapshot.checkpoint_id for link in chain):
        return "base"
    earlier = sorted({link.checkpoint_id for link in chain} - {snapshot.checkpoint_id})
    own = sum(link.checkpoint_id == snapshot.checkpoint_id for link in chain)
    return f"changes ({own} link{'s' if own != 1 else ''}) on the base of checkpoint {earlier[0]}, {len(earlier)} checkpoint(s) read"
