"""Driving a running job from outside its loop: run it until everything now
in its ingress topics is processed and committed (``run --drain``, the demo,
tests and benchmarks), ask whether that has happened, and kill one of its
workers (drills, the demo).  Each works on a ``JobRunner`` through its
public surface only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from barriers.messages import CheckpointOptions
from streaming.adapters.kafka.admin import end_offsets
from streaming.engine.job.coordinator import CheckpointRecord
from streaming.errors import JobFailed, SparkAbsError
from streaming.waits import poll_until

if TYPE_CHECKING:
    from streaming.engine.job.runner import JobRunner

__all__ = ["committed_through", "ingress_end_offsets", "kill_worker", "run_until_caught_up"]


def ingress_end_offsets(runner: JobRunner) -> dict[str, int]:
    """The end of every ingress channel of the job now (``topic:partition`` -> offset)."""
    offsets = {}
    for ingress in runner.pipeline.ingress:
        for partition, offset in end_offsets(runner.connection.kafka, ingress.topic, ingress.partitions).items():
            offsets[f"{ingress.topic}:{partition}"] = offset
    return offsets


def committed_through(runner: JobRunner, target: Mapping[str, int]) -> CheckpointRecord | None:
    """A completed checkpoint of the current generation whose ingress
    barriers lie at or after ``target`` (``ingress_end_offsets`` taken
    earlier), with no channel state and committed by every sink: everything
    up to ``target`` is processed and its output visible.  None while there is none."""
    coordinator = runner.require_started()
    for record in coordinator.completed():
        covers = all(record.ingress_offsets.get(c, -1) >= o for c, o in target.items())
        if covers and record.in_flight == 0 and coordinator.sink_tasks <= record.committed:
            return record
    return None


def run_until_caught_up(runner: JobRunner, timeout_s: float = 300.0) -> CheckpointRecord:
    """Step ``runner`` until a checkpoint whose barriers come after everything
    now in the ingress topics is complete with no channel state (so all of it
    was processed, not only recorded in flight) and every sink committed it.
    Checkpoints triggered meanwhile are aligned: like a stop-with-savepoint,
    they drain the channels."""
    target = ingress_end_offsets(runner)

    def stepped() -> CheckpointRecord | None:
        runner.step(options=CheckpointOptions.aligned())
        return committed_through(runner, target)

    return poll_until(  # a step waits on the control topic itself: no pause between steps
        stepped,
        timeout_s,
        f"job {runner.job}: input up to {target} committed",
        every_s=0.0,
        error=lambda message: JobFailed(
            f"job {runner.job}: input up to {target} not committed within {timeout_s:.0f} s"
        ),
    )


def kill_worker(runner: JobRunner, name: str) -> None:
    """SIGKILL the local worker named ``name``, or running the task or stage
    ``name`` (a drill): the runner's next ``step`` restores.  A remote
    group's worker runs on its own host and is refused."""
    for group, tasks in runner.layout.groups.items():
        if group not in runner.layout.remote_names:
            continue
        if name == group or any(t == name or t.rsplit("-", 1)[0] == name for t in tasks):
            raise SparkAbsError(f"{name!r} runs in remote worker group {group}: kill its process on its host")
    runner.supervisor.kill(name)
