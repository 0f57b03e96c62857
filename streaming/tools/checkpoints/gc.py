"""Garbage collection of a job's store: ``spark-abs checkpoints gc [--dry-run]``.

``plan_gc`` lists, file by file with its size and reason, what may go:

- **retention**: the coordinator's rule (``SnapshotStore.retention_plan``):
  complete checkpoints older than the newest ``retain``, and incomplete ones
  (no manifest) older than the newest complete checkpoint; never the
  checkpoint a restore would pick (the newest that verifies), nor the one
  the job's current generation started from, nor one a kept checkpoint
  links to, nor anything newer than the newest complete checkpoint (it may
  be in progress);
- **orphans**: files inside a kept complete checkpoint that its manifest does
  not name (a task directory no task acknowledged, a part no snapshot lists);
- **committed staging**: a sink epoch still staged although its output is
  committed (a commit cut short between S3's copy and its delete); a staged
  epoch waiting for its checkpoint is kept;
- **retracted output** older than ``grace_s``: output a restore took back
  (``<sink>/retracted/``) is kept a while for a person to look at, then goes.

``apply_gc`` removes exactly the files of a plan (manifests first, so an
interrupted collection leaves incomplete checkpoints, never a complete
broken one) and nothing else; the dry run is the plan printed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from streaming.adapters.objects import StoreLocation, list_files
from streaming.adapters.snapshots import SnapshotStore, checkpoint_dir_name
from streaming.adapters.snapshots.layout import MANIFEST
from streaming.errors import ConfigError

__all__ = ["Garbage", "GcPlan", "plan_gc", "apply_gc"]

_EPOCH = re.compile(r"epoch-(\d+)$")


@dataclass(frozen=True)
class Garbage:
    """One file that may go: its path in the store's filesystem, size and why."""

    path: str
    bytes: int
    reason: str


@dataclass
class GcPlan:
    """What a collection removes (``garbage``) and what it keeps that a person
    might expect to go, with why (``kept``)."""

    garbage: list[Garbage] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(g.bytes for g in self.garbage)

    def by_reason(self) -> dict[str, tuple[int, int]]:
        """``{reason: (files, bytes)}``."""
        summary: dict[str, tuple[int, int]] = {}
        for g in self.garbage:
            files, size = summary.get(g.reason, (0, 0))
            summary[g.reason] = (files + 1, size + g.bytes)
        return summary


def plan_gc(
    store: SnapshotStore,
    sink: StoreLocation | None,
    *,
    retain: int,
    grace_s: float,
    now: float | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> GcPlan:
    """What may go from ``store`` (and the job's sink location ``sink``)."""
    if retain < 1:
        raise ConfigError(f"--retain must be at least 1, got {retain}")
    if grace_s < 0:
        raise ConfigError(f"--grace must not be negative, got {grace_s:g}")
    now = time.time() if now is None else now
    plan = GcPlan()
    fs, layout = store.files.fs, store.layout
    all_ids, done = store.checkpoints(), store.completed()
    meta = store.read_job()
    started_from = meta.restores[-1].from_checkpoint if meta and meta.restores else None
    if done:
        progress(f"verifying checkpoints to find the one a restore would pick ({len(done)} complete)")
    retention = store.retention_plan(retain, pinned=[] if started_from is None else [started_from])
    plan.kept += [
        f"{checkpoint_dir_name(c)}: older than the newest {retain}, kept: {why}" for c, why in retention.kept.items()
    ]
    doomed = set(retention.doomed)
    for checkpoint_id in all_ids:
        if checkpoint_id in doomed:
            reason = f"retention (keep {retain})" if checkpoint_id in done else "incomplete, older than a complete one"
            files = list_files(fs, layout.checkpoint_dir(checkpoint_id))
            files.sort(key=lambda i: (i.base_name != MANIFEST, i.path))
            plan.garbage += [Garbage(i.path, i.size, reason) for i in files]
        elif checkpoint_id in done:
            plan.garbage += _orphans(store, checkpoint_id)
    newest = done[-1] if done else None
    if sink is not None:
        _sink_garbage(sink, plan, newest, now, grace_s)
    return plan


def _orphans(store: SnapshotStore, checkpoint_id: int) -> list[Garbage]:
    """Files of a complete checkpoint its manifest does not name."""
    layout = store.layout
    manifest = store.read_manifest(checkpoint_id)
    named = {layout.manifest(checkpoint_id)}
    for task, snapshot in manifest.tasks.items():
        named.add(layout.task_file(checkpoint_id, task))
        named.update(layout.part(holder, p.path) for holder, p in snapshot.files() if holder == checkpoint_id)
    return [
        Garbage(i.path, i.size, "orphan: not in the manifest")
        for i in list_files(store.files.fs, layout.checkpoint_dir(checkpoint_id))
        if i.path not in named
    ]


def _sink_garbage(sink: StoreLocation, plan: GcPlan, newest: int | None, now: float, grace_s: float) -> None:
    fs = sink.filesystem
    committed = {_relative(sink, i.path, "output") for i in list_files(fs, sink.path("output"))}
    waiting = 0
    for info in list_files(fs, sink.path("staging")):
        relative = _relative(sink, info.path, "staging")
        if relative in committed:
            plan.garbage.append(Garbage(info.path, info.size, "staged copy of committed sink output"))
        else:
            waiting += 1
    if waiting:
        plan.kept.append(
            f"{waiting} staged sink epoch file(s): waiting for their checkpoint"
            + ("" if newest is None else f" (a restore to {newest} or earlier commits or discards them)")
        )
    old = [i for i in list_files(fs, sink.path("retracted")) if i.mtime is None or i.mtime.timestamp() < now - grace_s]
    plan.garbage += [Garbage(i.path, i.size, f"retracted sink output older than {grace_s:g} s") for i in old]


def _relative(sink: StoreLocation, path: str, area: str) -> str:
    """``epoch-<n>/<task>.parquet`` of a sink file under ``area``."""
    return path[len(sink.path(area)) + 1 :]


def apply_gc(store: SnapshotStore, plan: GcPlan) -> list[Garbage]:
    """Remove the files of ``plan`` (manifests first); returns those removed
    (a file already gone is skipped).  A checkpoint directory the plan
    emptied goes too."""
    fs = store.files.fs
    removed = []
    ordered = sorted(plan.garbage, key=lambda g: not g.path.endswith(f"/{MANIFEST}"))
    with store.files.io("collecting garbage"):
        for item in ordered:
            try:
                fs.delete_file(item.path)
            except FileNotFoundError:
                continue
            removed.append(item)
        touched = {store.layout.checkpoint_dir(c) for c in store.checkpoints()}
        touched = {d for d in touched if any(g.path.startswith(d + "/") for g in removed)}
        for directory in sorted(touched):
            if not list_files(fs, directory):
                fs.delete_dir(directory)
    return removed
