"""``SnapshotStore``: one job's checkpoints in one ``StoreLocation``, one
handle to the parts that do the work: writing (``SnapshotWriter``: task
parts, then ``_TASK.json``; the manifest last), reading (``SnapshotReader``),
verification (``Verifier``; ``NewestVerified`` remembers the newest
checkpoint that verifies, for retention), deleting and retention
(``Retention``) and the job's generations (``JobHistory``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from streaming.adapters.objects import ObjectFiles, StoreLocation
from streaming.adapters.snapshots.format import GenerationStart, JobMeta, LoadedTask, Manifest, TaskSnapshot
from streaming.adapters.snapshots.jobs import JobHistory
from streaming.adapters.snapshots.layout import Layout
from streaming.adapters.snapshots.reading import SnapshotReader
from streaming.adapters.snapshots.retention import Retention, RetentionPlan
from streaming.adapters.snapshots.signing import UNSIGNED, StoreSigner, Unsigned
from streaming.adapters.snapshots.verify import NewestVerified, Verifier
from streaming.adapters.snapshots.writing import SnapshotWriter, TaskParts
from streaming.errors import ConfigError

__all__ = ["SnapshotStore"]


class SnapshotStore:
    """Checkpoints of one job in one ``StoreLocation``.

    Tasks call ``write_task`` (or ``write_task_async``), the coordinator
    ``write_manifest``, ``apply_retention`` and the job-metadata methods, a
    restore ``latest_verified`` and ``load_task``, ``checkpoints gc``
    ``retention_plan``.  One coordinator per job writes the manifest and
    ``_JOB.json``; task writes may run in parallel.

    One job: the store's handle.  Each method hands its work to one of the
    parts, which the constructor builds on one ``ObjectFiles`` and ``Layout``.

    ``key``: the job's store key (``JobKey.store_key``), which signs and verifies
    ``_JOB.json``, the manifests and every ``_TASK.json``, bound to this store's
    place (``streaming.adapters.snapshots.signing``).  Every runner and worker
    passes it; ``UNSIGNED`` (nothing signed, nothing verified), said explicitly,
    is for unit tests, the simulator, and tools without the job's secret."""

    def __init__(self, location: StoreLocation, job: str, *, key: bytes | Unsigned, upload_threads: int = 4):
        try:
            self.layout = Layout(location, job)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if upload_threads < 1:
            raise ConfigError(f"upload_threads must be at least 1, got {upload_threads}")
        self.location = location
        self.job = job
        self.signed = key is not UNSIGNED  # the job's files are signed and verified
        self.files = ObjectFiles(location, "snapshot store")
        # location.uri is canonical (open_store: a resolved directory, or bucket/prefix)
        signer = StoreSigner(job, key, location.uri)
        self.reader = SnapshotReader(self.files, self.layout, job, signer)
        self.verifier = Verifier(self.reader)
        self.history = JobHistory(self.files, self.layout, job, signer)
        self.writer = SnapshotWriter(
            self.files, self.layout, job, signer, upload_threads=upload_threads, name=repr(self)
        )
        self.retention = Retention(self.reader)
        self.newest_verified = NewestVerified(self.verifier, self.read_job)

    def __repr__(self) -> str:
        return f"SnapshotStore({self.location.uri!r}, job={self.job!r})"

    def __enter__(self) -> SnapshotStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------

    def write_task(self, checkpoint_id: int, generation: int, task: str, parts: TaskParts) -> TaskSnapshot:
        """Store ``task``'s snapshot for ``checkpoint_id``: each state table and
        each channel's copied records as Parquet, then ``_TASK.json``.  Writing
        the same task again replaces what was there.  ``parts.chains``: state
        tables as chains (``SnapshotWriter.write_task``)."""
        return self.writer.write_task(checkpoint_id, generation, task, parts)

    def write_task_async(
        self, checkpoint_id: int, generation: int, task: str, parts: TaskParts
    ) -> Future[TaskSnapshot]:
        """``write_task`` on a background thread, so the task keeps processing
        while its snapshot uploads (``SnapshotWriter.write_task_async``).  The
        future raises what ``write_task`` would."""
        return self.writer.write_task_async(checkpoint_id, generation, task, parts)

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
        return self.writer.write_manifest(checkpoint_id, generation, task_snapshots, options=options, metrics=metrics)

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
        return self.reader.load_task(checkpoint_id, task)

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
        """The newest complete checkpoint that verifies and is on the job's
        line (None if none is) and the newer ones skipped on the way, each
        with its problems: a checkpoint a later generation left behind when
        it started from an older one (``JobMeta.abandoned``) is skipped."""
        return self.verifier.latest_verified(exclude, checksums=checksums, job=self.read_job())

    # -- deleting ------------------------------------------------------------

    def delete(self, checkpoint_id: int) -> None:
        """Remove checkpoint ``checkpoint_id`` (manifest first, so an interrupted
        delete leaves an incomplete checkpoint, never a complete broken one).
        A checkpoint that does not exist is not an error."""
        self.retention.delete(checkpoint_id)

    def retention_plan(self, keep: int, pinned: Iterable[int] = ()) -> RetentionPlan:
        """What retention would delete now (``retention.plan_retention``):
        completed checkpoints older than the newest ``keep`` and incomplete
        ones older than the newest completed, but never the newest that
        verifies (``newest_verified``: each complete checkpoint is verified
        once, newest first, until one does), the ``pinned`` ones, what a kept
        one links to, or anything newer than the newest completed checkpoint
        (possibly in progress)."""
        return self.retention.plan(keep, verified=self.newest_verified.find(), pinned=pinned)

    def apply_retention(self, keep: int, pinned: Iterable[int] = ()) -> list[int]:
        """Delete what ``retention_plan`` gives up; returns the deleted ids.
        The checkpoint known to verify is looked for again only once it is
        no longer among the newest ``keep`` (``NewestVerified.find``)."""
        return self.retention.apply(keep, verified=self.newest_verified.find(keep), pinned=pinned)

    # -- job metadata --------------------------------------------------------

    def read_job(self) -> JobMeta | None:
        """The job's metadata, or None before its first generation."""
        return self.history.read()

    def write_job(self, meta: JobMeta) -> None:
        self.history.write(meta)
        self.newest_verified.forget()  # the job's line may have changed

    def first_generation(self, scale: Mapping[str, Any] | None = None) -> None:
        """Record the job's fresh start, generation 0, at ``scale``, in ``_JOB.json``."""
        self.history.first_generation(scale)

    def next_generation(
        self,
        from_checkpoint: int | None,
        *,
        scale: Mapping[str, Any] | None = None,
        cause: str | None = None,
        rescaled_from: int | None = None,
        changed_from: int | None = None,
    ) -> int:
        """Start the next generation, restored from ``from_checkpoint`` (None =
        from scratch) at ``scale`` because of ``cause`` (a checkpoint written
        again names the one it was ``rescaled_from`` or ``changed_from``),
        record it in ``_JOB.json`` and return its number."""
        start = GenerationStart(0, from_checkpoint, "", scale, cause, rescaled_from, changed_from)
        generation = self.history.next_generation(start)
        self.newest_verified.forget()  # checkpoints a restore left behind are off the job's line
        return generation

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Wait for pending asynchronous writes and stop the upload threads."""
        self.writer.close()
