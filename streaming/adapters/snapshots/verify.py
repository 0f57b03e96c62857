"""Whether a checkpoint can be restored, and which one a restore picks: the
manifest reads, every task's ``_TASK.json`` is there and equals the
manifest's entry, and every part a restore reads exists with its recorded
size (and, with ``checksums``, its SHA-256), the parts of earlier
checkpoints an incremental one's chains link to included.  ``NewestVerified``
remembers the newest checkpoint that verifies, for retention to keep."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable

import pyarrow.fs as pafs

from streaming.adapters.snapshots.format import JobMeta, Manifest, PartInfo
from streaming.adapters.snapshots.layout import TASK, checkpoint_dir_name
from streaming.adapters.snapshots.reading import SnapshotReader
from streaming.errors import SnapshotCorruptError, SnapshotMissingError

__all__ = ["NewestVerified", "Verifier"]

log = logging.getLogger(__name__)

_HASH_CHUNK = 8 << 20


class Verifier:
    def __init__(self, reader: SnapshotReader):
        self.reader = reader

    def verify(self, checkpoint_id: int, *, checksums: bool = True) -> tuple[Manifest | None, list[str]]:
        """The manifest (None when it is unreadable) and the problems that make
        ``checkpoint_id`` unusable for a restore (empty when it is good).
        Raises SnapshotMissingError when it has no manifest."""
        try:
            manifest = self.reader.manifest(checkpoint_id)
        except SnapshotCorruptError as exc:
            return None, [str(exc)]
        problems = []
        for task, recorded in manifest.tasks.items():
            prefix = f"{checkpoint_dir_name(checkpoint_id)} task {task}"
            try:
                written = self.reader.task(checkpoint_id, task)
            except SnapshotCorruptError as exc:
                problems.append(str(exc))
            else:
                if written is None:
                    problems.append(f"{prefix}: {TASK} is missing")
                elif written != recorded:
                    problems.append(f"{prefix}: {TASK} differs from the manifest")
            problems.extend(
                f"{prefix}: {problem}" for problem in self._check_parts(checkpoint_id, recorded.files(), checksums)
            )
        return manifest, problems

    def latest_verified(
        self, exclude: Iterable[int] = (), *, checksums: bool = True, job: JobMeta | None = None
    ) -> tuple[Manifest | None, list[tuple[int, list[str]]]]:
        """The newest complete checkpoint that verifies (None if none does) and
        the newer ones skipped on the way, each with its problems.  Ids in
        ``exclude`` are passed over without being checked or reported; with
        the ``job``'s generations, a checkpoint a later generation left
        behind (``JobMeta.abandoned``) is skipped too."""
        excluded = set(exclude)
        skipped: list[tuple[int, list[str]]] = []
        for checkpoint_id in reversed(self.reader.completed()):
            if checkpoint_id in excluded:
                continue
            try:
                manifest, problems = self.verify(checkpoint_id, checksums=checksums)
            except SnapshotMissingError as exc:  # deleted since the listing
                manifest, problems = None, [str(exc)]
            if manifest is not None and not problems and job is not None:
                why = job.abandoned(checkpoint_id, manifest.generation)
                problems = [why] if why else []
            if manifest is not None and not problems:
                if skipped:
                    log.warning(
                        "chk-%d: falling back to it, newer checkpoints skipped: %s",
                        checkpoint_id,
                        ", ".join(checkpoint_dir_name(c) for c, _ in skipped),
                    )
                return manifest, skipped
            log.warning("chk-%d skipped: %s", checkpoint_id, "; ".join(problems))
            skipped.append((checkpoint_id, problems))
        return None, skipped

    def _check_parts(self, checkpoint_id: int, parts: tuple[tuple[int, PartInfo], ...], checksums: bool) -> list[str]:
        if not parts:
            return []
        files, layout = self.reader.files, self.reader.layout
        problems = []
        with files.io(f"verifying checkpoint {checkpoint_id}"):
            infos = files.fs.get_file_info([layout.part(holder, p.path) for holder, p in parts])
            for (holder, part), info in zip(parts, infos):
                label = f"part {part.name!r} ({part.path})"
                if holder != checkpoint_id:
                    label = f"part {part.name!r} ({checkpoint_dir_name(holder)}/{part.path}, a link of its chain)"
                if info.type != pafs.FileType.File:
                    problems.append(f"{label} is missing")
                elif info.size != part.bytes:
                    problems.append(f"{label} size mismatch: {info.size} bytes, {part.bytes} were written")
                elif checksums:
                    digest = hashlib.sha256()
                    with files.fs.open_input_stream(info.path) as stream:
                        while chunk := stream.read(_HASH_CHUNK):
                            digest.update(chunk)
                    if digest.hexdigest() != part.sha256:
                        problems.append(
                            f"{label} checksum mismatch: sha256 {digest.hexdigest()}, {part.sha256} was written"
                        )
        return problems


class NewestVerified:
    """The newest complete checkpoint that verifies as a restore verifies it
    (checksums and the job's line included, ``Verifier.latest_verified``),
    remembered, so that retention can keep it at every completion without
    verifying every checkpoint each time: ``find`` verifies only the
    complete checkpoints newer than those it saw before, newest first, until
    one verifies.  ``job`` reads the job's metadata; ``forget`` starts over
    (a new generation changes which checkpoints are on the job's line)."""

    def __init__(self, verifier: Verifier, job: Callable[[], JobMeta | None]):
        self.verifier = verifier
        self.job = job
        # the newest checkpoint found to verify, and the newest complete one looked at so far
        self.known: int | None = None
        self.seen: int | None = None

    def find(self, keep: int | None = None) -> int | None:
        """The newest complete checkpoint that verifies (None: none does).
        One found before stays the answer until a newer one verifies or it is
        deleted; a newer one that did not verify is not verified again.
        With ``keep`` (retention's count), one found before is the answer as
        long as it is among the newest ``keep``: retention keeps it anyway,
        and no newer one is read back to verify it (a completion then costs
        no verification, only every ``keep``-th does)."""
        done = self.verifier.reader.completed()
        if self.known is not None and self.known not in done:
            self.forget()
        if keep is not None and self.known is not None and self.known in done[-keep:]:
            return self.known
        seen = self.seen
        if not done or (seen is not None and done[-1] <= seen):
            return self.known
        older = [] if seen is None else [c for c in done if c <= seen]
        manifest, _ = self.verifier.latest_verified(older, job=self.job())
        if manifest is not None:
            self.known = manifest.checkpoint_id
        self.seen = done[-1]
        return self.known

    def forget(self) -> None:
        """Verify from the newest complete checkpoint again at the next ``find``."""
        self.known = self.seen = None
