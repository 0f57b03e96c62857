"""Running a user's pipeline from the command line, and looking at its
checkpoints: ``spark-abs run`` and ``spark-abs checkpoints``.

``run`` starts a job (or restarts it from its latest complete checkpoint that
verifies, when the store already knows the job, or from a named one with
``--restore N``: a restore drill), takes checkpoints on its interval and
restores by itself when a worker dies, until ``--for`` seconds passed or
Ctrl-C.  ``checkpoints`` lists what a restore could use: every checkpoint in
the store, whether it is complete and verifies, and which one a restore
would pick."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from barriers.coordinator import CheckpointStatus
from streaming.adapters.snapshots import SnapshotStore
from streaming.errors import SnapshotMissingError

__all__ = ["CheckpointRow", "checkpoint_rows", "render_checkpoints", "run_job"]


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint directory of a job, as ``checkpoints`` shows it."""

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


def checkpoint_rows(store: SnapshotStore, *, checksums: bool = True) -> list[CheckpointRow]:
    """Every checkpoint of the store's job, ascending, each verified."""
    rows = []
    complete = set(store.completed())
    for checkpoint_id in store.checkpoints():
        if checkpoint_id not in complete:
            rows.append(CheckpointRow(checkpoint_id, False, ("no manifest: never completed",)))
            continue
        try:
            manifest = store.read_manifest(checkpoint_id)
            problems = tuple(store.verify(checkpoint_id, checksums=checksums))
        except (SnapshotMissingError, ValueError) as exc:
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
                tuple(manifest.metrics.get("kinds", ())),
                manifest.metrics.get("trigger_to_complete_s"),
                sum(p.bytes for t in tasks for p in t.state_parts),
                sum(end - start for t in tasks for start, end in t.in_flight.values()),
            )
        )
    return rows


def render_checkpoints(job: str, rows: list[CheckpointRow], generation: int | None) -> str:
    if not rows:
        return f"job {job}: no checkpoints in the store" + ("" if generation is None else f" (generation {generation})")
    pick = max((r.checkpoint_id for r in rows if r.usable), default=None)
    header = (
        f"{'checkpoint':>10}  {'gen':>3}  {'created (UTC)':<20} {'seconds':>7}  {'state bytes':>11}  "
        f"{'in flight':>9}  {'kinds':<24} verifies"
    )
    lines = [f"job {job}" + ("" if generation is None else f", generation {generation}"), "", header, "-" * len(header)]
    for r in rows:
        seconds = f"{r.trigger_to_complete_s:7.2f}" if r.trigger_to_complete_s is not None else f"{'-':>7}"
        verdict = "yes" if r.usable else "NO: " + "; ".join(r.problems)
        if r.checkpoint_id == pick:
            verdict += "   <- a restore picks this one"
        gen = f"{r.generation:>3}" if r.generation is not None else f"{'-':>3}"
        lines.append(
            f"{r.checkpoint_id:>10}  {gen}  {r.created_at[:19]:<20} {seconds}  {r.state_bytes:>11}  "
            f"{r.in_flight_offsets:>9}  {', '.join(r.kinds):<24} {verdict}"
        )
    if pick is None:
        lines.append("\nno checkpoint verifies: a restore would start from the beginning")
    return "\n".join(lines)


def run_job(
    runner,
    *,
    restore: int | None = None,
    seconds: float | None = None,
    checkpoints: int | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """Start ``runner`` (a ``JobRunner``; from checkpoint ``restore`` when
    given) and drive it until ``seconds`` passed once all its tasks are up,
    or ``checkpoints`` checkpoints completed, whichever comes first (neither:
    until Ctrl-C); then stop its workers."""
    started = time.monotonic()
    deadline = None
    try:
        runner.start(restore=restore)
        say(
            f"job {runner.job}: {len(runner.groups)} worker process(es) starting, generation {runner.generation}"
            + " (Ctrl-C stops it)"
        )
        while deadline is None or time.monotonic() < deadline:
            runner.step()
            if (
                checkpoints is not None
                and sum(r.status == CheckpointStatus.COMPLETED for r in runner.checkpoints()) >= checkpoints
            ):
                break
            if deadline is None and runner.coordinator.all_ready:
                say(
                    f"all tasks ready after {time.monotonic() - started:.1f} s; checkpoints every "
                    f"{runner.settings.interval_s:g} s" + ("" if seconds is None else f", for {seconds:g} s")
                )
                deadline = float("inf") if seconds is None else time.monotonic() + seconds
    except KeyboardInterrupt:
        say("stopping (Ctrl-C)")
    finally:
        runner.close()
    done = [r for r in runner.checkpoints() if r.status == CheckpointStatus.COMPLETED]
    say(
        f"stopped; {len(done)} checkpoint(s) completed in this run"
        + (f", the last {done[-1].checkpoint_id}" if done else "")
    )
