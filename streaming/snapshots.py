"""The snapshot store: where each task's part of a checkpoint is kept, and the
manifest that makes a checkpoint complete.

A task writes its operator state (and, in unaligned mode, a copy of its
in-flight records) when it takes its snapshot for checkpoint ``n``; the
coordinator writes the manifest once every task has acknowledged.  Object
storage is reached through ``pyarrow.fs`` (``file://`` or ``s3://``, see
``streaming.store``)::

    <root>/<job>/checkpoints/chk-<n>/<task>/state/<table>.parquet      operator state tables
    <root>/<job>/checkpoints/chk-<n>/<task>/channels/<channel>.parquet in-flight records (optional)
    <root>/<job>/checkpoints/chk-<n>/<task>/_TASK.json                 task metadata, after its parts
    <root>/<job>/checkpoints/chk-<n>/_MANIFEST.json                    written last, by the coordinator
    <root>/<job>/_JOB.json                                             generation and restore history

``<n>`` is zero-padded to 8 digits (``chk-00000012``) so listings sort.  Job,
task, table and channel names are percent-encoded into file names
(``transfers:0`` -> ``transfers%3A0``); JSON keeps the original names.

Write order is the contract: parts, then ``_TASK.json``, then
``_MANIFEST.json``.  Only a checkpoint with a manifest is complete; anything
else is in progress or was abandoned.  Every part is Parquet whose size and
SHA-256 (of exactly the stored bytes) are recorded in ``_TASK.json`` and in the
manifest, so a restore can tell a damaged checkpoint and fall back to an older
one (``latest_verified``).  The manifest and ``_JOB.json`` appear atomically: a
rename on a local filesystem, a single PUT on S3.

Every ``OSError`` from the filesystem becomes a ``StoreError`` naming the store
URI; a missing checkpoint or task raises ``SnapshotMissingError`` and damaged
content ``SnapshotCorruptError``, each naming the checkpoint, task and part.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar
from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from streaming.errors import ConfigError, StoreError
from streaming.store import StoreLocation

__all__ = [
    "FORMAT_VERSION",
    "SnapshotMissingError",
    "SnapshotCorruptError",
    "PartInfo",
    "TaskSnapshot",
    "Manifest",
    "LoadedTask",
    "JobMeta",
    "SnapshotStore",
    "checkpoint_dir_name",
]

log = logging.getLogger(__name__)

# Version of the JSON written to _TASK.json, _MANIFEST.json and _JOB.json.
FORMAT_VERSION = 1

_MANIFEST = "_MANIFEST.json"
_TASK = "_TASK.json"
_JOB = "_JOB.json"
_CHK_DIR = re.compile(r"chk-(\d+)$")
_HASH_CHUNK = 8 << 20

T = TypeVar("T")


class SnapshotMissingError(StoreError):
    """The checkpoint, its manifest or the task's snapshot does not exist."""


class SnapshotCorruptError(StoreError):
    """A manifest, task file or part exists but is unreadable, or its size or
    checksum differs from what was recorded."""


def checkpoint_dir_name(checkpoint_id: int) -> str:
    """``chk-00000012``: the directory of checkpoint 12."""
    return f"chk-{checkpoint_id:08d}"


def _escape(name: str, what: str) -> str:
    if not isinstance(name, str) or name in ("", ".", ".."):
        raise ValueError(f"{what} name {name!r} cannot be used as a file name")
    return quote(name, safe="")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _check_version(data: Mapping[str, Any]) -> None:
    version = data.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"format_version {version!r} is not readable by this version "
                         f"(reads up to {FORMAT_VERSION})")


def _parsed(what: str, parse: Callable[[], T]) -> T:
    """Run ``parse`` and turn any sign of malformed data into one ValueError."""
    try:
        return parse()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"malformed {what}: {detail}") from exc


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One stored Parquet file: the table or channel it holds, its path relative
    to the checkpoint directory, and what it must look like when read back."""

    name: str
    path: str
    rows: int
    bytes: int
    sha256: str

    def _to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "rows": self.rows, "bytes": self.bytes,
                "sha256": self.sha256}

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> PartInfo:
        return cls(str(data["name"]), str(data["path"]), int(data["rows"]), int(data["bytes"]),
                   str(data["sha256"]))


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    """What one task recorded for one checkpoint.

    ``positions`` maps each input channel (``"topic:partition"``) to the offset
    to resume from; ``in_flight`` maps a channel to its channel state as the
    offset range ``[start, end)``, whose records may also be copied into
    ``channel_parts``.  ``metadata`` is free JSON (alignment kind, timings)."""

    task: str
    checkpoint_id: int
    generation: int
    positions: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, tuple[int, int]] = field(default_factory=dict)
    state_parts: tuple[PartInfo, ...] = ()
    channel_parts: tuple[PartInfo, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def parts(self) -> tuple[PartInfo, ...]:
        return self.state_parts + self.channel_parts

    def to_json(self) -> str:
        return json.dumps({"format_version": FORMAT_VERSION, **self._to_dict()}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> TaskSnapshot:
        """Raises ValueError when ``text`` is not a task snapshot."""
        data = json.loads(text)

        def parse() -> TaskSnapshot:
            _check_version(data)
            return cls._from_dict(data)

        return _parsed("task snapshot", parse)

    def _to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "checkpoint_id": self.checkpoint_id,
            "generation": self.generation,
            "positions": dict(self.positions),
            "in_flight": {c: list(r) for c, r in self.in_flight.items()},
            "state_parts": [p._to_dict() for p in self.state_parts],
            "channel_parts": [p._to_dict() for p in self.channel_parts],
            "metadata": self.metadata,
        }

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> TaskSnapshot:
        in_flight = {}
        for channel, (start, end) in data.get("in_flight", {}).items():
            in_flight[str(channel)] = (int(start), int(end))
        return cls(
            task=str(data["task"]),
            checkpoint_id=int(data["checkpoint_id"]),
            generation=int(data["generation"]),
            positions={str(c): int(o) for c, o in data.get("positions", {}).items()},
            in_flight=in_flight,
            state_parts=tuple(PartInfo._from_dict(p) for p in data.get("state_parts", [])),
            channel_parts=tuple(PartInfo._from_dict(p) for p in data.get("channel_parts", [])),
            metadata=dict(data.get("metadata", {})),
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """A completed checkpoint: every task's snapshot, the options it ran with
    and the coordinator's metrics.  ``created_at`` is ISO 8601, UTC."""

    job: str
    checkpoint_id: int
    generation: int
    tasks: dict[str, TaskSnapshot]
    created_at: str
    options: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps({
            "format_version": self.format_version,
            "job": self.job,
            "checkpoint_id": self.checkpoint_id,
            "generation": self.generation,
            "created_at": self.created_at,
            "options": self.options,
            "metrics": self.metrics,
            "tasks": {name: snap._to_dict() for name, snap in self.tasks.items()},
        }, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Raises ValueError when ``text`` is not a manifest."""
        data = json.loads(text)

        def parse() -> Manifest:
            _check_version(data)
            tasks = {str(name): TaskSnapshot._from_dict(snap) for name, snap in data["tasks"].items()}
            manifest = cls(job=str(data["job"]), checkpoint_id=int(data["checkpoint_id"]),
                           generation=int(data["generation"]), tasks=tasks,
                           created_at=str(data["created_at"]), options=dict(data.get("options", {})),
                           metrics=dict(data.get("metrics", {})),
                           format_version=int(data.get("format_version", FORMAT_VERSION)))
            for name, snap in tasks.items():
                if snap.task != name or snap.checkpoint_id != manifest.checkpoint_id:
                    raise ValueError(f"entry {name!r} is task {snap.task!r} of checkpoint {snap.checkpoint_id}")
            return manifest

        return _parsed("manifest", parse)


@dataclass(frozen=True, slots=True)
class LoadedTask:
    """A task's snapshot read back, every part checked against its checksum."""

    snapshot: TaskSnapshot
    state: dict[str, pa.Table]
    channel_records: dict[str, pa.Table]


@dataclass(frozen=True, slots=True)
class JobMeta:
    """The job's current generation (0 = never started) and every generation
    start: ``{"generation", "from_checkpoint" (None = from scratch), "at"}``."""

    job: str
    generation: int = 0
    restores: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> str:
        return json.dumps({"format_version": FORMAT_VERSION, "job": self.job, "generation": self.generation,
                           "restores": list(self.restores)}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobMeta:
        """Raises ValueError when ``text`` is not job metadata."""
        data = json.loads(text)

        def parse() -> JobMeta:
            _check_version(data)
            return cls(str(data["job"]), int(data["generation"]),
                       tuple(dict(r) for r in data.get("restores", [])))

        return _parsed("job metadata", parse)


class SnapshotStore:
    """Checkpoints of one job in one ``StoreLocation``.

    Tasks call ``write_task`` (or ``write_task_async``), the coordinator
    ``write_manifest``, ``apply_retention`` and the job-metadata methods, a
    restore ``latest_verified`` and ``load_task``.  One coordinator per job
    writes the manifest and ``_JOB.json``; task writes may run in parallel."""

    def __init__(self, location: StoreLocation, job: str, *, upload_threads: int = 4):
        try:
            self._job_dir = location.path(_escape(job, "job"))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if upload_threads < 1:
            raise ConfigError(f"upload_threads must be at least 1, got {upload_threads}")
        self.location = location
        self.job = job
        self._fs = location.filesystem
        self._local = self._fs.type_name == "local"
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

    def write_task(self, checkpoint_id: int, generation: int, task: str, state: Mapping[str, pa.Table], *,
                   positions: Mapping[str, int], in_flight: Mapping[str, tuple[int, int]] | None = None,
                   channel_records: Mapping[str, pa.Table] | None = None,
                   metadata: Mapping[str, Any] | None = None) -> TaskSnapshot:
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
        _escape(task, "task")
        for kind, tables in (("table", state), ("channel", channel_records)):
            for name, table in tables.items():
                _escape(name, kind)
                if not isinstance(table, pa.Table):
                    raise TypeError(f"{kind} {name!r} of task {task} must be a pyarrow.Table, "
                                    f"got {type(table).__name__}")
        task_dir = self._task_dir(checkpoint_id, task)
        started = time.monotonic()
        with self._io(f"writing checkpoint {checkpoint_id} task {task}"):
            self._clear(task_dir)
            state_parts = tuple(self._write_part(checkpoint_id, task, "state", name, table)
                                for name, table in state.items())
            channel_parts = tuple(self._write_part(checkpoint_id, task, "channels", name, table)
                                  for name, table in channel_records.items())
            snapshot = TaskSnapshot(task=task, checkpoint_id=checkpoint_id, generation=generation,
                                    positions={c: int(o) for c, o in positions.items()}, in_flight=in_flight,
                                    state_parts=state_parts, channel_parts=channel_parts,
                                    metadata=dict(metadata or {}))
            self._write_bytes(f"{task_dir}/{_TASK}", snapshot.to_json().encode())
        log.info("chk-%d task %s: snapshot written (%d state parts, %d channel parts, %d bytes, %.3f s)",
                 checkpoint_id, task, len(state_parts), len(channel_parts),
                 sum(p.bytes for p in snapshot.parts), time.monotonic() - started)
        return snapshot

    def write_task_async(self, checkpoint_id: int, generation: int, task: str, state: Mapping[str, pa.Table],
                         *, positions: Mapping[str, int], in_flight: Mapping[str, tuple[int, int]] | None = None,
                         channel_records: Mapping[str, pa.Table] | None = None,
                         metadata: Mapping[str, Any] | None = None) -> Future[TaskSnapshot]:
        """``write_task`` on a background thread, so the task keeps processing
        while its snapshot uploads.  Arrow tables are immutable, so the tables
        are not copied; the mappings holding them are (shallowly), so the caller
        may reuse its dicts at once.  The future raises what ``write_task`` would."""
        pool = self._executor()
        return pool.submit(self.write_task, checkpoint_id, generation, task, dict(state),
                           positions=dict(positions), in_flight=dict(in_flight or {}),
                           channel_records=dict(channel_records or {}), metadata=dict(metadata or {}))

    def write_manifest(self, checkpoint_id: int, generation: int, task_snapshots: Mapping[str, TaskSnapshot],
                       *, options: Mapping[str, Any] | None = None,
                       metrics: Mapping[str, Any] | None = None) -> Manifest:
        """Complete ``checkpoint_id``: write its manifest, after every task's
        snapshot, in one atomic step."""
        for name, snap in task_snapshots.items():
            if snap.task != name or snap.checkpoint_id != checkpoint_id or snap.generation != generation:
                raise ValueError(f"manifest of checkpoint {checkpoint_id} (generation {generation}): entry "
                                 f"{name!r} is task {snap.task!r} of checkpoint {snap.checkpoint_id} "
                                 f"(generation {snap.generation})")
        manifest = Manifest(job=self.job, checkpoint_id=checkpoint_id, generation=generation,
                            tasks=dict(task_snapshots), created_at=_now(), options=dict(options or {}),
                            metrics=dict(metrics or {}))
        with self._io(f"writing the manifest of checkpoint {checkpoint_id}"):
            self._write_bytes(self._manifest_path(checkpoint_id), manifest.to_json().encode(), atomic=True)
        log.info("chk-%d: complete, manifest written (%d tasks, generation %d)",
                 checkpoint_id, len(manifest.tasks), generation)
        return manifest

    # -- listing and reading -------------------------------------------------

    def checkpoints(self) -> list[int]:
        """Every checkpoint directory, complete or not, ascending."""
        selector = pafs.FileSelector(self._checkpoints_dir(), allow_not_found=True)
        with self._io("listing checkpoints"):
            infos = self._fs.get_file_info(selector)
        found = []
        for info in infos:
            match = _CHK_DIR.fullmatch(info.base_name)
            if match and info.type == pafs.FileType.Directory:
                found.append(int(match.group(1)))
        return sorted(found)

    def completed(self) -> list[int]:
        """Checkpoints that have a manifest, ascending."""
        ids = self.checkpoints()
        if not ids:
            return []
        with self._io("listing completed checkpoints"):
            infos = self._fs.get_file_info([self._manifest_path(c) for c in ids])
        return [c for c, info in zip(ids, infos) if info.type == pafs.FileType.File]

    def read_manifest(self, checkpoint_id: int) -> Manifest:
        path = self._manifest_path(checkpoint_id)
        data = self._read_bytes(path, f"reading the manifest of checkpoint {checkpoint_id}")
        if data is None:
            raise SnapshotMissingError(f"checkpoint {checkpoint_id} of job {self.job} is not complete: "
                                       f"{self._why_missing(checkpoint_id, _MANIFEST)}")
        try:
            manifest = Manifest.from_json(data)
            if manifest.checkpoint_id != checkpoint_id or manifest.job != self.job:
                raise ValueError(f"it belongs to checkpoint {manifest.checkpoint_id} of job {manifest.job}")
        except ValueError as exc:
            raise SnapshotCorruptError(f"checkpoint {checkpoint_id}: manifest {self._uri(path)} "
                                       f"is unreadable: {exc}") from exc
        return manifest

    def verify(self, checkpoint_id: int, *, checksums: bool = True) -> list[str]:
        """Problems that make ``checkpoint_id`` unusable for a restore: unreadable
        manifest, missing or differing ``_TASK.json``, missing part, size or
        (with ``checksums``, which reads every part) checksum mismatch.  Empty
        when the checkpoint is good.  Raises SnapshotMissingError when it has no
        manifest."""
        return self._verify(checkpoint_id, checksums)[1]

    def load_task(self, checkpoint_id: int, task: str) -> LoadedTask:
        """``task``'s snapshot in ``checkpoint_id`` with all its tables, each part
        checked against its recorded size and checksum.  Does not require the
        checkpoint to be complete: pick it with ``latest_verified``."""
        snapshot = self._read_task(checkpoint_id, task)
        if snapshot is None:
            task_file = f"{_escape(task, 'task')}/{_TASK}"
            raise SnapshotMissingError(f"checkpoint {checkpoint_id} has no snapshot of task {task}: "
                                       f"{self._why_missing(checkpoint_id, task_file)}")
        state = {p.name: self._read_part(checkpoint_id, task, p) for p in snapshot.state_parts}
        channels = {p.name: self._read_part(checkpoint_id, task, p) for p in snapshot.channel_parts}
        log.info("chk-%d task %s: snapshot loaded (%d state parts, %d channel parts)",
                 checkpoint_id, task, len(state), len(channels))
        return LoadedTask(snapshot, state, channels)

    def latest_verified(self, exclude: Iterable[int] = (), *,
                        checksums: bool = True) -> tuple[Manifest | None, list[tuple[int, list[str]]]]:
        """The newest complete checkpoint that verifies (None if none does) and
        the newer ones skipped on the way, each with its problems.  Ids in
        ``exclude`` are passed over without being checked or reported."""
        excluded = set(exclude)
        skipped: list[tuple[int, list[str]]] = []
        for checkpoint_id in reversed(self.completed()):
            if checkpoint_id in excluded:
                continue
            try:
                manifest, problems = self._verify(checkpoint_id, checksums)
            except SnapshotMissingError as exc:  # deleted since the listing
                manifest, problems = None, [str(exc)]
            if manifest is not None and not problems:
                if skipped:
                    log.warning("chk-%d: falling back to it, newer checkpoints skipped: %s", checkpoint_id,
                                ", ".join(checkpoint_dir_name(c) for c, _ in skipped))
                return manifest, skipped
            log.warning("chk-%d skipped: %s", checkpoint_id, "; ".join(problems))
            skipped.append((checkpoint_id, problems))
        return None, skipped

    # -- deleting ------------------------------------------------------------

    def delete(self, checkpoint_id: int) -> None:
        """Remove checkpoint ``checkpoint_id`` (manifest first, so an interrupted
        delete leaves an incomplete checkpoint, never a complete broken one).
        A checkpoint that does not exist is not an error."""
        with self._io(f"deleting checkpoint {checkpoint_id}"):
            try:
                self._fs.delete_file(self._manifest_path(checkpoint_id))
            except FileNotFoundError:
                pass
            self._clear(self._checkpoint_dir(checkpoint_id), remove=True)
        log.info("chk-%d: deleted", checkpoint_id)

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
            log.info("retention (keep %d, pinned %s): deleted %s", keep, sorted(set(pinned)),
                     ", ".join(checkpoint_dir_name(c) for c in doomed))
        return doomed

    # -- job metadata --------------------------------------------------------

    def read_job(self) -> JobMeta | None:
        """The job's metadata, or None before its first generation."""
        path = f"{self._job_dir}/{_JOB}"
        data = self._read_bytes(path, "reading the job metadata")
        if data is None:
            return None
        try:
            meta = JobMeta.from_json(data)
        except ValueError as exc:
            raise SnapshotCorruptError(f"job {self.job}: {self._uri(path)} is unreadable: {exc}") from exc
        return meta

    def write_job(self, meta: JobMeta) -> None:
        if meta.job != self.job:
            raise ValueError(f"job metadata of {meta.job!r} cannot be written for job {self.job!r}")
        with self._io("writing the job metadata"):
            self._write_bytes(f"{self._job_dir}/{_JOB}", meta.to_json().encode(), atomic=True)

    def next_generation(self, from_checkpoint: int | None) -> int:
        """Start the next generation, restored from ``from_checkpoint`` (None =
        from scratch), record it in ``_JOB.json`` and return its number."""
        meta = self.read_job() or JobMeta(self.job)
        generation = meta.generation + 1
        entry = {"generation": generation, "from_checkpoint": from_checkpoint, "at": _now()}
        self.write_job(JobMeta(self.job, generation, (*meta.restores, entry)))
        log.info("job %s: generation %d starts from %s", self.job, generation,
                 "scratch" if from_checkpoint is None else checkpoint_dir_name(from_checkpoint))
        return generation

    def close(self) -> None:
        """Wait for pending asynchronous writes and stop the upload threads."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # -- internals -----------------------------------------------------------

    def _checkpoints_dir(self) -> str:
        return f"{self._job_dir}/checkpoints"

    def _checkpoint_dir(self, checkpoint_id: int) -> str:
        return f"{self._checkpoints_dir()}/{checkpoint_dir_name(checkpoint_id)}"

    def _manifest_path(self, checkpoint_id: int) -> str:
        return f"{self._checkpoint_dir(checkpoint_id)}/{_MANIFEST}"

    def _task_dir(self, checkpoint_id: int, task: str) -> str:
        return f"{self._checkpoint_dir(checkpoint_id)}/{_escape(task, 'task')}"

    def _uri(self, path: str) -> str:
        scheme = "file://" if self._local else "s3://"
        return f"{scheme}{path}"

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._upload_threads, thread_name_prefix=f"snapshots-{self.job}")
            return self._pool

    @contextmanager
    def _io(self, what: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise StoreError(f"snapshot store {self.location.uri}: {what} failed: {exc}") from exc

    def _clear(self, path: str, *, remove: bool = False) -> None:
        """Delete everything under ``path`` (and ``path`` itself with ``remove``);
        a missing ``path`` is fine.  Callers hold ``_io``.  On S3, files go one
        by one before their directories: servers that keep real directories
        (versitygw's POSIX backend) reject a batch delete naming a directory
        before its contents."""
        if self._local:
            try:
                if remove:
                    self._fs.delete_dir(path)
                else:
                    self._fs.delete_dir_contents(path, missing_dir_ok=True)
            except FileNotFoundError:
                pass
            return
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        found = self._fs.get_file_info(selector)
        for info in found:
            if info.type == pafs.FileType.File:
                self._fs.delete_file(info.path)
        if remove and (found or self._fs.get_file_info(path).type == pafs.FileType.Directory):
            self._fs.delete_dir(path)

    def _write_bytes(self, path: str, data: bytes | pa.Buffer, *, atomic: bool = False) -> None:
        """Callers hold ``_io``.  ``atomic``: readers see the old file or the new
        one, never a part (rename locally; one PUT on S3 is atomic anyway)."""
        if self._local:
            self._fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        target = f"{path}.tmp-{uuid.uuid4().hex}" if atomic and self._local else path
        with self._fs.open_output_stream(target) as out:
            out.write(data)
        if target != path:
            self._fs.move(target, path)

    def _read_bytes(self, path: str, what: str) -> bytes | None:
        """The whole file, or None when it does not exist."""
        with self._io(what):
            try:
                with self._fs.open_input_stream(path) as stream:
                    return stream.read()
            except FileNotFoundError:
                return None

    def _write_part(self, checkpoint_id: int, task: str, kind: str, name: str, table: pa.Table) -> PartInfo:
        # Serialise first so the checksum covers exactly the bytes stored.
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue()
        what = "channel" if kind == "channels" else "table"
        rel = f"{_escape(task, 'task')}/{kind}/{_escape(name, what)}.parquet"
        self._write_bytes(f"{self._checkpoint_dir(checkpoint_id)}/{rel}", data)
        return PartInfo(name=name, path=rel, rows=table.num_rows, bytes=data.size,
                        sha256=hashlib.sha256(data).hexdigest())

    def _read_part(self, checkpoint_id: int, task: str, part: PartInfo) -> pa.Table:
        where = f"checkpoint {checkpoint_id} task {task} part {part.name!r} ({part.path})"
        data = self._read_bytes(f"{self._checkpoint_dir(checkpoint_id)}/{part.path}", f"reading {where}")
        if data is None:
            raise SnapshotCorruptError(f"{where} is missing")
        if len(data) != part.bytes:
            raise SnapshotCorruptError(f"{where} has {len(data)} bytes, {part.bytes} were written")
        digest = hashlib.sha256(data).hexdigest()
        if digest != part.sha256:
            raise SnapshotCorruptError(f"{where} checksum mismatch: sha256 {digest}, "
                                       f"{part.sha256} was written")
        try:
            table = pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as exc:
            raise SnapshotCorruptError(f"{where} is not readable Parquet: {exc}") from exc
        if table.num_rows != part.rows:
            raise SnapshotCorruptError(f"{where} has {table.num_rows} rows, {part.rows} were written")
        return table

    def _read_task(self, checkpoint_id: int, task: str) -> TaskSnapshot | None:
        path = f"{self._task_dir(checkpoint_id, task)}/{_TASK}"
        data = self._read_bytes(path, f"reading checkpoint {checkpoint_id} task {task}")
        if data is None:
            return None
        try:
            snapshot = TaskSnapshot.from_json(data)
            if snapshot.task != task or snapshot.checkpoint_id != checkpoint_id:
                raise ValueError(f"it belongs to task {snapshot.task} of checkpoint {snapshot.checkpoint_id}")
        except ValueError as exc:
            raise SnapshotCorruptError(f"checkpoint {checkpoint_id} task {task}: {self._uri(path)} "
                                       f"is unreadable: {exc}") from exc
        return snapshot

    def _why_missing(self, checkpoint_id: int, rel: str) -> str:
        if checkpoint_id in self.checkpoints():
            return f"{self._uri(self._checkpoint_dir(checkpoint_id))}/{rel} does not exist"
        return f"{self._uri(self._checkpoint_dir(checkpoint_id))} does not exist"

    def _verify(self, checkpoint_id: int, checksums: bool) -> tuple[Manifest | None, list[str]]:
        try:
            manifest = self.read_manifest(checkpoint_id)
        except SnapshotCorruptError as exc:
            return None, [str(exc)]
        problems = []
        for task, recorded in manifest.tasks.items():
            prefix = f"{checkpoint_dir_name(checkpoint_id)} task {task}"
            try:
                written = self._read_task(checkpoint_id, task)
            except SnapshotCorruptError as exc:
                problems.append(str(exc))
            else:
                if written is None:
                    problems.append(f"{prefix}: {_TASK} is missing")
                elif written != recorded:
                    problems.append(f"{prefix}: {_TASK} differs from the manifest")
            problems.extend(f"{prefix}: {problem}"
                            for problem in self._check_parts(checkpoint_id, recorded.parts, checksums))
        return manifest, problems

    def _check_parts(self, checkpoint_id: int, parts: tuple[PartInfo, ...], checksums: bool) -> list[str]:
        if not parts:
            return []
        base = self._checkpoint_dir(checkpoint_id)
        problems = []
        with self._io(f"verifying checkpoint {checkpoint_id}"):
            infos = self._fs.get_file_info([f"{base}/{p.path}" for p in parts])
            for part, info in zip(parts, infos):
                label = f"part {part.name!r} ({part.path})"
                if info.type != pafs.FileType.File:
                    problems.append(f"{label} is missing")
                elif info.size != part.bytes:
                    problems.append(f"{label} size mismatch: {info.size} bytes, {part.bytes} were written")
                elif checksums:
                    digest = hashlib.sha256()
                    with self._fs.open_input_stream(info.path) as stream:
                        while chunk := stream.read(_HASH_CHUNK):
                            digest.update(chunk)
                    if digest.hexdigest() != part.sha256:
                        problems.append(f"{label} checksum mismatch: sha256 {digest.hexdigest()}, "
                                        f"{part.sha256} was written")
        return problems
