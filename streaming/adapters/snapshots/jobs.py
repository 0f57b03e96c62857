"""The job's generations: ``_JOB.json`` holds the current generation and
every generation start (from which checkpoint, when), the fresh start
(generation 0) included.  Written atomically,
by one coordinator per job."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pafs

from streaming.adapters.objects import ObjectFiles, StoreLocation
from streaming.adapters.snapshots.format import GenerationStart, JobMeta, now
from streaming.adapters.snapshots.layout import JOB, Layout, checkpoint_dir_name
from streaming.adapters.snapshots.signing import StoreSigner
from streaming.errors import SnapshotCorruptError

__all__ = ["JobHistory", "jobs_in"]

log = logging.getLogger(__name__)


def jobs_in(location: StoreLocation) -> list[str]:
    """The jobs with a history or checkpoints in ``location``, by name (none
    when its root does not exist)."""
    files = ObjectFiles(location, "snapshot store")
    jobs = []
    with files.io("listing its jobs"):
        for entry in files.fs.get_file_info(pafs.FileSelector(location.root, allow_not_found=True)):
            if entry.type != pafs.FileType.Directory:
                continue
            inside = files.fs.get_file_info(pafs.FileSelector(entry.path, allow_not_found=True))
            if any(i.base_name in (JOB, "checkpoints") for i in inside):
                jobs.append(unquote(entry.base_name))
    return sorted(jobs)


class JobHistory:
    def __init__(self, files: ObjectFiles, layout: Layout, job: str, signer: StoreSigner):
        self.files = files
        self.layout = layout
        self.job = job
        self.signer = signer

    def read(self) -> JobMeta | None:
        """The job's metadata, or None before its first generation."""
        path = self.layout.job_file
        data = self.files.read(path, "reading the job metadata")
        if data is None:
            return None
        data = self.signer.body(data, f"job {self.job}: {self.files.uri(path)}", "job")
        try:
            meta = JobMeta.from_json(data)
        except ValueError as exc:
            raise SnapshotCorruptError(f"job {self.job}: {self.files.uri(path)} is unreadable: {exc}") from exc
        return meta

    def write(self, meta: JobMeta) -> None:
        if meta.job != self.job:
            raise ValueError(f"job metadata of {meta.job!r} cannot be written for job {self.job!r}")
        with self.files.io("writing the job metadata"):
            self.files.write(self.layout.job_file, self.signer.sign(meta.to_json().encode(), "job"), atomic=True)

    def first_generation(self, scale: Mapping[str, Any] | None = None) -> None:
        """Record generation 0, a fresh start (at ``scale``, ``Scale`` as
        JSON): from now on the job is known, and a restart restores.  Once
        is enough: recorded already, nothing changes."""
        meta = self.read()
        if meta is not None and meta.generation == 0:
            return  # recorded already (a write that is tried again after the store answered late)
        if meta is not None:
            raise ValueError(f"job {self.job} is in generation {meta.generation}: it cannot start afresh")
        self.write(JobMeta(self.job, 0, (GenerationStart(0, None, now(), scale),)))

    def next_generation(self, start: GenerationStart) -> int:
        """Start the next generation as ``start`` says (its number and time
        are set here), record it and return its number."""
        meta = self.read() or JobMeta(self.job)
        generation = meta.generation + 1
        entry = dataclasses.replace(start, generation=generation, at=now())
        self.write(JobMeta(self.job, generation, (*meta.restores, entry)))
        from_checkpoint = entry.from_checkpoint
        log.debug(
            "job %s: generation %d starts from %s",
            self.job,
            generation,
            "scratch" if from_checkpoint is None else checkpoint_dir_name(from_checkpoint),
        )
        return generation
