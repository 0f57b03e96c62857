"""The asynchronous phase of a task's snapshot: off the processing thread,
copy the in-flight records (unaligned checkpoints that keep a copy, and
ranges that time retention may delete before the checkpoint is superseded,
``kafka_retention``), stage the sink epoch, write the snapshot to the
store, then acknowledge on the control topic with the snapshot's metadata
and the task's metrics.  When any step fails the task declines the
checkpoint and goes on processing.

A sink epoch that could not be staged (the store was down) is not lost: its
rows are staged with the next epoch, by the next upload (uploads of a task
run one at a time, in order), so no later checkpoint completes without them;
an epoch staged whose snapshot then failed is committed with the next
checkpoint that completes (``TwoPhaseSink.commit_through``).

With incremental snapshots (``Incremental``) the task's state is stored as
chains: a checkpoint that takes the whole state writes it as a new base; one
that takes only the changes since the task's previous snapshot links them
after the chains that snapshot wrote.  Changes whose previous snapshot was
never written (its upload failed, or it was aborted before it uploaded)
cannot be linked to anything: that checkpoint is declined and the next one
takes a base."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from barriers.failures import CheckpointFailure
from barriers.handler import TaskCheckpoint
from barriers.lineage import Lineage
from barriers.messages import ChannelId, InFlightFormat
from operators.base import LaterTables, gathered
from operators.state import StateChanges, current_memory
from streaming.adapters.kafka.control.events import Ack, Decline
from streaming.adapters.snapshots.format import TaskCheckpointMetrics, TaskSnapshot, stored_name
from streaming.adapters.snapshots.writing import TaskParts
from streaming.engine import faults
from streaming.engine.kafka_retention import AtRisk
from streaming.engine.task.replay import ReplayRest
from streaming.errors import TaskError

__all__ = ["SnapshotUploader", "TakenSnapshot", "Incremental"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Incremental:
    """Incremental snapshots: each checkpoint stores what changed since the
    task's previous one, on a base stored whole at a task's first
    checkpoint, every ``base_every`` checkpoints, once the changes stored
    since the base outweigh it, and after a checkpoint whose changes could
    not be stored."""

    base_every: int = 10


@dataclass(frozen=True)
class TakenSnapshot:
    """What a task took at its snapshot of checkpoint n (the synchronous
    phase): the operator's state, the sink epoch's rows, how long taking them
    took, when, the most bytes held while aligning before it, and each input
    channel's watermark (taken with the state: an unaligned snapshot's
    in-flight records must move them again after a restore).

    With incremental snapshots, ``changes`` (not None) holds what changed in
    each table since the task's snapshot of checkpoint ``since``, and
    ``state`` is empty; ``state`` holds the whole state otherwise (a base),
    each table as the operator's ``snapshot_later()`` gave it (a table, or a
    function the upload calls to gather it)."""

    state: LaterTables
    epoch: list[pa.Table]
    sync_snapshot_s: float
    snapshot_wall: float
    held_bytes_max: int
    watermarks: dict[ChannelId, int] = field(default_factory=dict)
    # wall clock: where the checkpoint's first barrier got when (TaskController.barrier_path)
    barrier_path: dict[str, float] = field(default_factory=dict)
    changes: dict[str, StateChanges] | None = None
    since: int | None = None
    # copied channel state a restore gave the task that it had not processed at the snapshot,
    # by channel (``streaming.engine.task.replay``): copied into this checkpoint's channel state too
    replay_rest: dict[ChannelId, ReplayRest] = field(default_factory=dict)


class SnapshotUploader:
    """Uploads the snapshots of task ``task`` (generation ``generation``) one
    at a time on ``executor`` (its own thread when None) through the task's
    ``io`` (a ``TaskIO``), counting ``acknowledged`` and ``declined``."""

    def __init__(
        self,
        task: str,
        generation: int,
        io: Any,
        lineage: Lineage,
        counters: collections.Counter,
        *,
        copy_in_flight: bool = False,
        executor: concurrent.futures.Executor | None = None,
        incremental: Incremental | None = None,
    ):
        self.task = task
        self.generation = generation
        self.io = io
        self.lineage = lineage
        self.counters = counters
        # copy unaligned channel state into the snapshot even when the barrier asks for ranges
        self.copy_in_flight = copy_in_flight
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"upload-{task}")
        self._own_executor = executor is None
        self._pending: list[concurrent.futures.Future] = []
        # sink output of epochs whose staging failed: staged with the next epoch (only the upload thread uses it)
        self._unstaged: list[pa.Table] = []
        self.incremental = incremental
        # incremental: the snapshot this task wrote last (what the next changes link to; None: take a base),
        # how many snapshots of changes since its base and their bytes, and the base's bytes
        self._previous: TaskSnapshot | None = None
        self._links = self._link_bytes = self._base_bytes = 0

    def wants_base(self) -> bool:
        """Whether the next snapshot should take the whole state (incremental
        snapshots; read on the task's thread, so it may lag an upload)."""
        if self.incremental is None:
            return True
        return (
            self._previous is None
            or self._links + 1 >= self.incremental.base_every
            or self._link_bytes > self._base_bytes
        )

    def submit(self, checkpoint: TaskCheckpoint, taken: TakenSnapshot) -> None:
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._executor.submit(self._upload_and_ack, checkpoint, taken))

    def wait(self, timeout_s: float) -> None:
        concurrent.futures.wait(list(self._pending), timeout=timeout_s)

    def close(self) -> None:
        if self._own_executor:
            self._executor.shutdown(wait=True)

    def _copy_in_flight(
        self,
        checkpoint: TaskCheckpoint,
        at_risk: Mapping[ChannelId, AtRisk],
        replay_rest: Mapping[ChannelId, ReplayRest] | None = None,
    ) -> dict[str, pa.Table]:
        """The in-flight records of the checkpoint, read straight from Kafka in
        bulk (not by waiting for processing to reach them): every channel's
        when the checkpoint keeps copies, otherwise those ``at_risk`` of
        retention (``_at_risk``).  A channel whose restored copied channel
        state the task had not all processed (``replay_rest``) is copied
        too: those records, then Kafka's from where the query resumed it."""
        read_range: Callable[[ChannelId, int, int], pa.Table] | None = self.io.read_range
        rest = replay_rest or {}
        copied = {
            c: r for c, r in checkpoint.in_flight.items() if self._copies_all(checkpoint) or c in at_risk or c in rest
        }
        if not copied or (read_range is None and not rest):
            return {}
        faults.point(self.task, "during_copy", checkpoint.checkpoint_id)
        records = {}
        for channel, (start, end) in copied.items():
            parts = []
            if channel in rest:
                parts.append(rest[channel].records)
                start = max(start, rest[channel].kafka_from)
            if start < end or not parts:
                if read_range is None:
                    raise TaskError(f"{self.task}: cannot read {channel} [{start}, {end}) for its channel state")
                parts.append(read_range(channel, start, end))
            records[str(channel)] = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
        return records

    def _copies_all(self, checkpoint: TaskCheckpoint) -> bool:
        return checkpoint.barrier.options.in_flight is InFlightFormat.RECORDS or self.copy_in_flight

    def _at_risk(self, checkpoint: TaskCheckpoint) -> dict[ChannelId, AtRisk]:
        """The offsets a restore from this checkpoint reads Kafka from (a
        range's start, or the position) that time retention may delete
        before the checkpoint is superseded (``io.retention_risk``: one
        query per topic), each said in a warning: a range is copied into
        the checkpoint instead; a position is where the task is behind."""
        watch = self.io.retention_risk
        if watch is None:
            return {}
        ranges = {} if self._copies_all(checkpoint) else checkpoint.in_flight
        wanted = {c: ranges[c][0] if c in ranges else p for c, p in checkpoint.positions.items()}
        try:
            risky = dict(watch(wanted))
        except Exception as exc:  # Kafka did not answer: the checkpoint goes on as it would have
            log.warning("%s: checkpoint %d: retention not checked: %s", self.task, checkpoint.checkpoint_id, exc)
            return {}
        for channel, risk in sorted(risky.items()):
            if channel in ranges:
                start, end = ranges[channel]
                log.warning(
                    "%s: checkpoint %d: %s: retention (retention.ms %d) may delete offset %d before a later "
                    "checkpoint supersedes this one; copying its channel state [%d, %d) into the checkpoint",
                    self.task,
                    checkpoint.checkpoint_id,
                    channel,
                    risk.retention_ms,
                    start,
                    start,
                    end,
                )
            else:
                log.warning(
                    "%s: checkpoint %d: %s: retention (retention.ms %d) may delete offset %d, where a restore "
                    "from this checkpoint resumes, before a later checkpoint supersedes it: the task is that far "
                    "behind, and such a restore would fail (offsets gone)",
                    self.task,
                    checkpoint.checkpoint_id,
                    channel,
                    risk.retention_ms,
                    risk.offset,
                )
        return risky

    def _upload_and_ack(self, checkpoint: TaskCheckpoint, taken: TakenSnapshot) -> None:
        checkpoint_id = checkpoint.checkpoint_id
        began = time.perf_counter()
        # the epoch's sink output waits here until it is staged: whatever fails first (the
        # channel-state copy from Kafka, the staging, the store) declines the checkpoint and
        # the rows go with the next epoch, whose checkpoint cannot complete without them
        self._unstaged += taken.epoch
        try:
            at_risk = self._at_risk(checkpoint)
            copied = self._copy_in_flight(checkpoint, at_risk, taken.replay_rest)
            if self.io.stage_epoch is not None:
                epoch = self._unstaged
                table = pa.concat_tables(epoch, promote_options="default") if epoch else pa.table({})
                self.io.stage_epoch(checkpoint_id, table)
                self._unstaged = []
            state, chains = self._state_to_write(checkpoint_id, taken)
            measured = self._measured(checkpoint, taken, copied, at_risk)
            parts = TaskParts(
                state=state,
                positions={str(c): p for c, p in checkpoint.positions.items()},
                in_flight={str(c): r for c, r in checkpoint.in_flight.items()},
                channel_records=copied,
                metadata={
                    "watermarks": {str(c): w for c, w in taken.watermarks.items()},
                    # which records of older generations in the ranges are channel state
                    "lineage": self.lineage.to_json(),
                    **measured.to_json(),
                },
                chains=chains or {},
            )
            snapshot = self.io.write_snapshot(checkpoint_id, self.generation, self.task, parts)
            self._wrote(snapshot, taken)
            upload_s = time.perf_counter() - began
        except Exception as exc:  # the store, Kafka or the sink staging failed: decline, keep running
            log.warning("%s: checkpoint %d: snapshot upload failed, declining: %s", self.task, checkpoint_id, exc)
            self._previous = None  # what was written last is not what the next changes follow
            self.counters["declined"] += 1
            self.io.publish(
                Decline(
                    checkpoint_id=checkpoint_id,
                    task=self.task,
                    generation=self.generation,
                    reason=CheckpointFailure.STORE_FAILURE,
                    detail=str(exc),
                )
            )
            return
        self.io.publish(
            Ack(
                checkpoint_id=checkpoint_id,
                task=self.task,
                generation=self.generation,
                snapshot=snapshot,
                metrics=dataclasses.replace(
                    measured,
                    async_snapshot_s=upload_s,
                    state_bytes=snapshot.state_bytes,
                    # trigger -> this ack sent
                    barrier_path=_path(measured.barrier_path, acked=_since_trigger(checkpoint, time.time())),
                ),
            )
        )
        self.counters["acknowledged"] += 1

    def _state_to_write(
        self, checkpoint_id: int, taken: TakenSnapshot
    ) -> tuple[dict[str, pa.Table], dict[str, list[Any]] | None]:
        """The state tables to store whole, and (incremental snapshots) the
        chains to store instead: a base of each table, or the previous
        snapshot's chains with this checkpoint's changes linked on."""
        if self.incremental is None:
            return gathered(taken.state), None
        if taken.changes is None:
            return {}, {name: [("base", table)] for name, table in gathered(taken.state).items()}
        previous = self._previous
        if previous is None or previous.checkpoint_id != taken.since:
            written = "nothing yet" if previous is None else f"checkpoint {previous.checkpoint_id}"
            raise _ChainBroken(
                f"its state changes follow checkpoint {taken.since}, but the task's last snapshot written is "
                f"{written}; the next checkpoint stores the whole state"
            )
        chains: dict[str, list[Any]] = {}
        for name, changes in taken.changes.items():
            if changes.full:
                chains[name] = [("base", changes.upserts)]
            elif name not in previous.state_chains:
                raise _ChainBroken(f"state table {name!r} has no chain in checkpoint {previous.checkpoint_id}")
            else:
                chains[name] = [
                    *previous.state_chains[name],
                    *([("removed", changes.removed)] if changes.removed.num_rows else []),
                    *([("upserts", changes.upserts)] if changes.upserts.num_rows else []),
                ]
        return {}, chains

    def _wrote(self, snapshot: TaskSnapshot, taken: TakenSnapshot) -> None:
        """Keep count of the chains' links and bytes (incremental snapshots)."""
        if self.incremental is None:
            return
        if taken.changes is None:
            self._links, self._link_bytes, self._base_bytes = 0, 0, snapshot.state_bytes
        else:
            self._links, self._link_bytes = self._links + 1, self._link_bytes + snapshot.state_bytes
        self._previous = snapshot

    def _measured(
        self,
        checkpoint: TaskCheckpoint,
        taken: TakenSnapshot,
        copied: dict[str, pa.Table],
        at_risk: Mapping[ChannelId, AtRisk],
    ) -> TaskCheckpointMetrics:
        """What the task measured of this checkpoint, kept with its snapshot (and in the manifest)."""
        wall = taken.snapshot_wall
        return TaskCheckpointMetrics(
            kind=stored_name(checkpoint.kind),
            first_barrier_s=max(
                0.0, wall - (checkpoint.snapshot_at - checkpoint.started_at) - checkpoint.barrier.timestamp_ms / 1000
            )
            if checkpoint.barrier.timestamp_ms
            else None,
            alignment_s=checkpoint.alignment_duration,
            # trigger -> the first barrier appended to its channel, Spark began the micro-batch that
            # carried it, the task received that batch; -> the barrier forwarded downstream
            barrier_path=_path(
                {}, **{name: _since_trigger(checkpoint, wall) for name, wall in taken.barrier_path.items()}
            ),
            switch=stored_name(checkpoint.switch) if checkpoint.switch else None,
            switched_after_ms=checkpoint.switched_after_ms,
            sync_snapshot_s=taken.sync_snapshot_s,
            held_bytes_max=taken.held_bytes_max,
            in_flight_records_referenced=sum(e - s for s, e in checkpoint.in_flight.values()),
            in_flight_records_copied=sum(t.num_rows for t in copied.values()),
            in_flight_bytes_copied=sum(t.nbytes for t in copied.values()),
            # a range there was copied; a position is where the task is behind
            retention_at_risk={str(c): risk.offset for c, risk in sorted(at_risk.items())},
            state_spilled_bytes=memory.spilled_bytes if (memory := current_memory()) else None,
        )


def _path(path: Mapping[str, float], **more: float | None) -> dict[str, float]:
    """``path`` with the points of ``more`` that have a time."""
    return {**path, **{name: seconds for name, seconds in more.items() if seconds is not None}}


class _ChainBroken(Exception):
    """Changes that cannot be linked to the task's last written snapshot."""


def _since_trigger(checkpoint: TaskCheckpoint, wall: float) -> float | None:
    """Seconds from the checkpoint's trigger (its barrier's timestamp) to ``wall``."""
    if not checkpoint.barrier.timestamp_ms:
        return None
    return round(wall - checkpoint.barrier.timestamp_ms / 1000, 4)
