"""Writing a checkpoint: each task's parts (Parquet, sized and checksummed),
then its ``_TASK.json``, on the caller's thread or on upload threads; the
manifest last, in one atomic step."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from streaming.adapters.objects import ObjectFiles
from streaming.adapters.snapshots.format import LINK_KINDS, Manifest, PartInfo, StateLink, TaskSnapshot, now
from streaming.adapters.snapshots.layout import Layout, escape
from streaming.adapters.snapshots.signing import StoreSigner

__all__ = ["SnapshotWriter", "TaskParts", "ChainStep", "part_bytes"]

# A step of a state chain given to ``write_task``: a link already stored (an
# earlier checkpoint's), or a table to store now as a link of that kind.
ChainStep = StateLink | tuple[str, pa.Table]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskParts:
    """What one task's snapshot for one checkpoint holds, as the task gives it
    to ``write_task``: its state, where each input channel resumes, its
    channel state and free metadata.  Each mapping is copied (shallowly) when
    the parts are made, so the giver may reuse its dicts at once; the tables
    are Arrow's, immutable, and not copied."""

    # state table name -> the table, stored whole
    state: Mapping[str, pa.Table] = field(default_factory=dict)
    # input channel ("topic:partition") -> the offset to resume from
    positions: Mapping[str, int] = field(default_factory=dict)
    # channel -> its channel state as the offset range [start, end)
    in_flight: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # channel -> the records of its in-flight range, copied into the checkpoint (none: kept as the range only)
    channel_records: Mapping[str, pa.Table] = field(default_factory=dict)
    # free JSON: alignment kind, watermarks, timings
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # incremental checkpoints: state table name -> its chain, stored instead of the whole table
    # (a base first, then changes, oldest first)
    chains: Mapping[str, Sequence[ChainStep]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("state", "positions", "in_flight", "channel_records", "metadata"):
            object.__setattr__(self, name, dict(getattr(self, name)))
        object.__setattr__(self, "chains", {name: list(steps) for name, steps in self.chains.items()})


class SnapshotWriter:
    """Writes one job's task snapshots and manifests, and owns the upload
    threads of ``write_task_async``.  ``name`` is the store as an error about
    a closed writer names it."""

    def __init__(
        self, files: ObjectFiles, layout: Layout, job: str, signer: StoreSigner, *, upload_threads: int, name: str
    ):
        self.signer = signer
        self.files = files
        self.layout = layout
        self.job = job
        self._name = name
        self._upload_threads = upload_threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._closed = False

    def write_task(self, checkpoint_id: int, generation: int, task: str, parts: TaskParts) -> TaskSnapshot:
        """Store ``task``'s snapshot for ``checkpoint_id``: each state table and
        each channel's copied records as Parquet, then ``_TASK.json``.  Writing
        the same task again replaces what was there.

        ``parts.chains`` (an incremental checkpoint) gives state tables as
        chains instead: the links an earlier checkpoint stored, kept as they
        are, then the ``(kind, table)`` steps this one stores."""
        state, channel_records, chains = parts.state, parts.channel_records, parts.chains
        in_flight = {c: (int(r[0]), int(r[1])) for c, r in parts.in_flight.items()}
        _check_task(task, state, in_flight, channel_records)
        _check_chains(task, state, chains)
        started = time.monotonic()
        with self.files.io(f"writing checkpoint {checkpoint_id} task {task}"):
            self.files.clear(self.layout.task_dir(checkpoint_id, task))
            state_parts = tuple(
                self._write_part(checkpoint_id, task, "state", name, table) for name, table in state.items()
            )
            channel_parts = tuple(
                self._write_part(checkpoint_id, task, "channels", name, table)
                for name, table in channel_records.items()
            )
            state_chains = {
                name: tuple(
                    step
                    if isinstance(step, StateLink)
                    else StateLink(
                        checkpoint_id,
                        step[0],
                        self._store_part(checkpoint_id, Layout.link_relative(task, name, step[0], n), name, step[1]),
                    )
                    for n, step in enumerate(steps)
                )
                for name, steps in chains.items()
            }
            snapshot = TaskSnapshot(
                task=task,
                checkpoint_id=checkpoint_id,
                generation=generation,
                positions={c: int(o) for c, o in parts.positions.items()},
                in_flight=in_flight,
                state_parts=state_parts,
                channel_parts=channel_parts,
                metadata=dict(parts.metadata),
                state_chains=state_chains,
            )
            signed = self.signer.sign(snapshot.to_json().encode(), "task", str(checkpoint_id), task)
            self.files.write(self.layout.task_file(checkpoint_id, task), signed)
        log.debug(
            "chk-%d task %s: snapshot written (%d state parts, %d channel parts, %d bytes, %.3f s)",
            checkpoint_id,
            task,
            len(state_parts),
            len(channel_parts),
            sum(p.bytes for p in snapshot.parts),
            time.monotonic() - started,
        )
        return snapshot

    def write_task_async(
        self, checkpoint_id: int, generation: int, task: str, parts: TaskParts
    ) -> Future[TaskSnapshot]:
        """``write_task`` on a background thread, so the task keeps processing
        while its snapshot uploads.  Arrow tables are immutable, so the tables
        are not copied; ``parts`` holds its own copies of the mappings, so the
        caller may reuse its dicts at once.  The future raises what
        ``write_task`` would."""
        return self._executor().submit(self.write_task, checkpoint_id, generation, task, parts)

    def write_manifest(
        self,
        checkpoint_id: int,
        generation: int,
        task_snapshots: Mapping[str, TaskSnapshot],
        *,
        options: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> Manifest:
        """Complete ``checkpoint_id``: write its manifest, after every task's
        snapshot, in one atomic step."""
        for name, snap in task_snapshots.items():
            if snap.task != name or snap.checkpoint_id != checkpoint_id or snap.generation != generation:
                raise ValueError(
                    f"manifest of checkpoint {checkpoint_id} (generation {generation}): entry "
                    f"{name!r} is task {snap.task!r} of checkpoint {snap.checkpoint_id} "
                    f"(generation {snap.generation})"
                )
        manifest = Manifest(
            job=self.job,
            checkpoint_id=checkpoint_id,
            generation=generation,
            tasks=dict(task_snapshots),
            created_at=now(),
            options=dict(options or {}),
            metrics=dict(metrics or {}),
        )
        with self.files.io(f"writing the manifest of checkpoint {checkpoint_id}"):
            signed = self.signer.sign(manifest.to_json().encode(), "manifest", str(checkpoint_id))
            self.files.write(self.layout.manifest(checkpoint_id), signed, atomic=True)
        log.debug(
            "chk-%d: complete, manifest written (%d tasks, generation %d)",
            checkpoint_id,
            len(manifest.tasks),
            generation,
        )
        return manifest

    def _write_part(self, checkpoint_id: int, task: str, kind: str, name: str, table: pa.Table) -> PartInfo:
        return self._store_part(checkpoint_id, Layout.part_relative(task, kind, name), name, table)

    def _store_part(self, checkpoint_id: int, relative: str, name: str, table: pa.Table) -> PartInfo:
        data = part_bytes(table)  # serialised first, so the checksum covers exactly the bytes stored
        self.files.write(self.layout.part(checkpoint_id, relative), data)
        return PartInfo(
            name=name, path=relative, rows=table.num_rows, bytes=data.size, sha256=hashlib.sha256(data).hexdigest()
        )

    def close(self) -> None:
        """Wait for pending asynchronous writes and stop the upload threads."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._upload_threads, thread_name_prefix=f"snapshots-{self.job}")
            return self._pool


def part_bytes(table: pa.Table) -> pa.Buffer:
    """``table`` as a part is stored: Parquet, zstd.  State is mostly unique
    keys: dictionaries and statistics cost more than they save (a 100k-key
    table: a third of the time, an eighth of the bytes)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", use_dictionary=False, write_statistics=False)
    return sink.getvalue()


def _check_chains(task: str, state: Mapping[str, pa.Table], chains: Mapping[str, Sequence[ChainStep]]) -> None:
    """What ``write_task`` refuses of ``chains``, before anything of the task's
    earlier snapshot is removed: a table given whole and as a chain, a name
    that cannot be a file name, a chain that does not start with a base, a
    step that is no link and no (kind, table) pair of a known kind."""
    for name, steps in chains.items():
        escape(name, "table")
        if name in state:
            raise ValueError(f"state table {name!r} of task {task} is given whole and as a chain")
        for step in steps:
            if not isinstance(step, StateLink) and not (isinstance(step, tuple) and len(step) == 2):
                raise ValueError(f"chain step {step!r} of table {name!r} (task {task}) is no (kind, table) pair")
        kinds = [step.kind if isinstance(step, StateLink) else step[0] for step in steps]
        if not kinds or kinds[0] != "base" or "base" in kinds[1:]:
            raise ValueError(f"the chain of state table {name!r} of task {task} must start with its one base: {kinds}")
        for step in steps:
            if not isinstance(step, StateLink) and (step[0] not in LINK_KINDS or not isinstance(step[1], pa.Table)):
                raise ValueError(f"chain step {step[0]!r} of table {name!r} (task {task}) is no (kind, table) pair")


def _check_task(
    task: str,
    state: Mapping[str, pa.Table],
    in_flight: Mapping[str, tuple[int, int]],
    channel_records: Mapping[str, pa.Table],
) -> None:
    """What ``write_task`` refuses before it writes anything: an in-flight
    range that ends before it starts, records copied for a channel without
    one, a name that cannot be a file name, a table that is not Arrow."""
    for channel, (start, end) in in_flight.items():
        if end < start:
            raise ValueError(f"in-flight range of channel {channel} ends before it starts: [{start}, {end})")
    for channel in channel_records:
        if channel not in in_flight:
            raise ValueError(f"records copied for channel {channel} but no in-flight range is given for it")
    escape(task, "task")
    for kind, tables in (("table", state), ("channel", channel_records)):
        for name, table in tables.items():
            escape(name, kind)
            if not isinstance(table, pa.Table):
                raise TypeError(f"{kind} {name!r} of task {task} must be a pyarrow.Table, got {type(table).__name__}")
