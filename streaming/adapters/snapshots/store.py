"""``SnapshotStore``: one job's checkpoints in one ``StoreLocation``.  It
writes (task parts, then ``_TASK.json``; the manifest last), deletes and
applies retention itself, and gives one handle to reading
(``SnapshotReader``), verification (``Verifier``) and the job's generations
(``JobHistory``)."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from streaming.adapters.objects import ObjectFiles, StoreLocation
from streaming.adapters.snapshots.format import JobMeta, LoadedTask, Manifest, PartInfo, TaskSnapshot, now
from streaming.adapters.snapshots.jobs import JobHistory
from streaming.adapters.snapshots.layout import Layout, checkpoint_dir_name, escape
from streaming.adapters.snapshots.reading import SnapshotReader
from streaming.adapters.snapshots.verify import Verifier
from streaming.errors import ConfigError

__all__ = ["SnapshotStore"]

log = logging.getLogger(__name__)


class SnapshotStore:
    """Checkpoints of one job in one ``StoreLocation``.

    Tasks call ``write_task`` (or ``write_task_async``), the coordinator
    ``write_manifest``, ``apply_retention`` and the job-metadata methods, a
    restore ``latest_verified`` and ``load_task``.  One coordinator per job
    writes the manifest and ``_JOB.json``; task writes may run in parallel."""

    def __init__(self, location: StoreLocation, job: str, *, upload_threads: int = 4):
        try:
            self.layout = Layout(location, job)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if upload_threads < 1:
            raise ConfigError(f"upload_threads must be at least 1, got {upload_threads}")
        self.location = location
        self.job = job
        self.files = ObjectFiles(location, "snapshot store")
        self.reader = SnapshotReader(self.files, self.layout, job)
        self.verifier = Verifier(self.reader)
        self.history = JobHistory(self.files, self.layout, job)
        self._upload_threads = upload_threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"SnapshotStore({self.location.uri!r}, job={self.job!r})"

    def __enter__(self) -> SnapshotStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------

    def write_task(
        self,
        checkpoint_id: int,
        generation: int,
        task: str,
        state: Mapping[str, pa.Table],
        *,
        positions: Mapping[str, int],
        in_flight: Mapping[str, tuple[int, int]] | None = None,
        channel_records: Mapping[str, pa.Table] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> TaskSnapshot:
        """Store ``task``'s snapshot for ``checkpoint_id``: each state table and
        each channel's copied records as Parquet, then ``_TASK.json``.  Writing
        the same task again replaces what was there."""
        in_flight = {c: (int(r[0]), int(r[1])) for c, r in (in_flight or {}).items()}
        channel_records = dict(channel_records or {})
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
                    raise TypeError(
                        f"{kind} {name!r} of task {task} must be a pyarrow.Table, got {type(table).__name__}"
                    )
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
            snapshot = TaskSnapshot(
                task=task,
                checkpoint_id=checkpoint_id,
                generation=generation,
                positions={c: int(o) for c, o in positions.items()},
                in_flight=in_flight,
                state_parts=state_parts,
                channel_parts=channel_parts,
                metadata=dict(metadata or {}),
            )
            self.files.write(self.layout.task_file(checkpoint_id, task), snapshot.to_json().encode())
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
        self,
        checkpoint_id: int,
        generation: int,
        task: str,
        state: Mapping[str, pa.Table],
        *,
        positions: Mapping[str, int],
        in_flight: Mapping[str, tuple[int, int]] | None = None,
        channel_records: Mapping[str, pa.Table] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Future[TaskSnapshot]:
        """``write_task`` on a background thread, so the task keeps processing
        while its snapshot uploads.  Arrow tables are immutable, so the tables
        are not copied; the mappings holding them are (shallowly), so the caller
        may reuse its dicts at once.  The future raises what ``write_task`` would."""
        pool = self._executor()
        return pool.submit(
            self.write_task,
            checkpoint_id,
            generation,
            task,
            dict(state),
            positions=dict(positions),
            in_flight=dict(in_flight or {}),
            channel_records=dict(channel_records or {}),
            metadata=dict(metadata or {}),
        )

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
            self.files.write(self.layout.manifest(checkpoint_id), manifest.to_json().encode(), atomic=True)
        log.debug(
            "chk-%d: complete, manifest written (%d tasks, generation %d)",
            checkpoint_id,
            len(manifest.tasks),
            generation,
        )
        return manifest

    def _write_part(self, checkpoint_id: int, task: str, kind: str, name: str, table: pa.Table) -> PartInfo:
        # Serialise first so the checksum covers exactly the bytes stored.
        sink = pa.BufferOutputStream()
        # state is mostly unique keys: dictionaries and statistics cost more than
        # they save (a 100k-key table: a third of the time, an eighth of the bytes)
        pq.write_table(table, sink, compression="zstd", use_dictionary=False, write_statistics=False)
        data = sink.getvalue()
        relative = Layout.part_relative(task, kind, name)
        self.files.write(self.layout.part(checkpoint_id, relative), data)
        return PartInfo(
            name=name, path=relative, rows=table.num_rows, bytes=data.size, sha256=hashlib.sha256(data).hexdigest()
        )

    # -- listing, reading and verifying ---------------------------------------

    def checkpoints(self) -> list[int]:
        """Every checkpoint directory, complete or not, ascending."""
        return self.reader.checkpoints()

    def completed(self) -> list[int]:
        """Checkpoints that have a manifest, ascending."""
        return self.reader.completed()

    def read_manifest(self, checkpoint_id: int) -> Manifest:
        return self.reader.manifest(checkpoint_id)

    def load_task(self, checkpoint_id: int, task: str) -> LoadedTask:
        """``task``'s snapshot in ``checkpoint_id`` with all its tables, each part
        checked against its recorded size and checksum.  Does not require the
        checkpoint to be complete: pick it with ``latest_verified``."""
        snapshot = self.reader.required_task(checkpoint_id, task)
        state = {p.name: self.reader.part(checkpoint_id, task, p) for p in snapshot.state_parts}
        channels = {p.name: self.reader.part(checkpoint_id, task, p) for p in snapshot.channel_parts}
        log.debug(
            "chk-%d task %s: snapshot loaded (%d state parts, %d channel parts)",
            checkpoint_id,
            task,
            len(state),
            len(channels),
        )
        return LoadedTask(snapshot, state, channels)

    def verify(self, checkpoint_id: int, *, checksums: bool = True) -> list[str]:
        """Problems that make ``checkpoint_id`` unusable for a restore: unreadable
        manifest, missing or differing ``_TASK.json``, missing part, size or
        (with ``checksums``, which reads every part) checksum mismatch.  Empty
        when the checkpoint is good.  Raises SnapshotMissingError when it has no
        manifest."""
        return self.verifier.verify(checkpoint_id, checksums=checksums)[1]

    def latest_verified(
        self, exclude: Iterable[int] = (), *, checksums: bool = True
    ) -> tuple[Manifest | None, list[tuple[int, list[str]]]]:
        """The newest complete checkpoint that verifies (None if none does) and
        the newer ones skipped on the way, each with its problems."""
        return self.verifier.latest_verified(exclude, checksums=checksums)

    # -- deleting ------------------------------------------------------------

    def delete(self, checkpoint_id: int) -> None:
        """Remove checkpoint ``checkpoint_id`` (manifest first, so an interrupted
        delete leaves an incomplete checkpoint, never a complete broken one).
        A checkpoint that does not exist is not an error."""
        with self.files.io(f"deleting checkpoint {checkpoint_id}"):
            try:
                self.files.fs.delete_file(self.layout.manifest(checkpoint_id))
            except FileNotFoundError:
                pass
            self.files.clear(self.layout.checkpoint_dir(checkpoint_id), remove=True)
        log.debug("chk-%d: deleted", checkpoint_id)

    def apply_retention(self, keep: int, pinned: Iterable[int] = ()) -> list[int]:
        """Delete completed checkpoints older than the newest ``keep`` and
        incomplete ones older than the newest completed.  Pinned ids and
        anything newer than the newest completed checkpoint (possibly in
        progress) are never touched.  Returns the deleted ids."""
        if keep < 1:
            raise ConfigError(f"retention keep must be at least 1, got {keep}")
        done = self.completed()
        if not done:
            return []
        kept = set(done[-keep:]) | set(pinned)
        doomed = [c for c in self.checkpoints() if c < done[-1] and c not in kept]
        for checkpoint_id in doomed:
            self.delete(checkpoint_id)
        if doomed:
            log.debug(
                "retention (keep %d, pinned %s): deleted %s",
                keep,
                sorted(set(pinned)),
                ", ".join(checkpoint_dir_name(c) for c in doomed),
            )
        return doomed

    # -- job metadata --------------------------------------------------------

    def read_job(self) -> JobMeta | None:
        """The job's metadata, or None before its first generation."""
        return self.history.read()

    def write_job(self, meta: JobMeta) -> None:
        self.history.write(meta)

    def first_generation(self, **details: Any) -> None:
        """Record the job's fresh start, generation 0, in ``_JOB.json`` (with ``details``)."""
        self.history.first_generation(**details)

    def next_generation(self, from_checkpoint: int | None, **details: Any) -> int:
        """Start the next generation, restored from ``from_checkpoint`` (None =
        from scratch), record it in ``_JOB.json`` (with ``details``) and return its number."""
        return self.history.next_generation(from_checkpoint, **details)

    # -- lifecycle -----------------------------------------------------------

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
                raise RuntimeError(f"{self!r} is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._upload_threads, thread_name_prefix=f"snapshots-{self.job}")
            return self._pool
