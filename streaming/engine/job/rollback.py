"""What going back past completed checkpoints means for a job's Kafka
sinks, said on the console when a restore does it: their transactions for
those checkpoints cannot be taken back (``KafkaSink`` marks the epochs
superseded; ``read_kafka_output`` reads each result once)."""

from __future__ import annotations

import dataclasses
import logging

from streaming.adapters.snapshots import SnapshotStore
from streaming.api.pipeline import Pipeline, SinkKind
from streaming.errors import SparkAbsError

__all__ = ["completed_after", "warn_of_a_rollback"]


def warn_of_a_rollback(
    log: logging.Logger | logging.LoggerAdapter,
    pipeline: Pipeline,
    store: SnapshotStore,
    checkpoint_id: int | None,
    generation: int,
) -> None:
    """Say on the console, not only in a worker's log, what generation
    ``generation``'s going back to ``checkpoint_id`` past completed
    checkpoints of the job's line means for its Kafka sinks.  A checkpoint
    an earlier restore already left behind does not count (its epochs were
    superseded then); a store that cannot say is logged, never a failed
    restore."""
    sinks = [s.sink for s in pipeline.stages if s.sink is not None and s.sink.kind is SinkKind.KAFKA]
    topics = [sink.topic for sink in sinks if sink.topic]
    if not topics:
        return
    try:
        newer = completed_after(store, checkpoint_id or 0, generation)
    except (SparkAbsError, ValueError, OSError) as exc:
        log.warning("job %s: cannot tell whether this restore goes back past committed output: %s", pipeline.job, exc)
        return
    if not newer:
        return
    log.warning(
        "job %s: going back to %s, while checkpoint(s) up to %d completed: Kafka sink topic(s) %s may hold "
        "what was committed after it (a transaction cannot be taken back). The restored job writes those "
        "results again and marks the earlier epochs superseded in <topic>.commits: read_committed consumers "
        "see them twice; streaming.read_kafka_output, or skipping superseded epochs by the abs.epoch header, "
        "reads each result once (docs/operations/sinks.md)",
        pipeline.job,
        f"checkpoint {checkpoint_id}" if checkpoint_id else "the beginning",
        newer[-1],
        ", ".join(topics),
    )


def completed_after(store: SnapshotStore, checkpoint_id: int, generation: int) -> list[int]:
    """The completed checkpoints after ``checkpoint_id`` that the job's line
    still held before generation ``generation`` started: none an earlier
    generation's restore left behind."""
    meta = store.read_job()
    if meta is None:
        return [c for c in store.completed() if c > checkpoint_id]
    # the job's history as it stood before this generation: JobMeta.abandoned, the rule a restore picks by
    before = dataclasses.replace(meta, restores=tuple(r for r in meta.restores if r.generation != generation))
    return [
        c
        for c in store.completed()
        if c > checkpoint_id and before.abandoned(c, store.read_manifest(c).generation) is None
    ]
