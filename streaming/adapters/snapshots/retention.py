"""Deleting checkpoints: one at a time (manifest first), and the retention
policy that says which ones go.  A checkpoint kept keeps every earlier one
whose parts its chains link to (incremental checkpoints), complete or not."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from streaming.adapters.snapshots.layout import checkpoint_dir_name
from streaming.adapters.snapshots.reading import SnapshotReader
from streaming.errors import ConfigError, SnapshotCorruptError, SnapshotMissingError

__all__ = ["Retention"]

log = logging.getLogger(__name__)


class Retention:
    """Deletes one job's checkpoints, found through ``reader``."""

    def __init__(self, reader: SnapshotReader):
        self.reader = reader

    def delete(self, checkpoint_id: int) -> None:
        """Remove checkpoint ``checkpoint_id`` (manifest first, so an interrupted
        delete leaves an incomplete checkpoint, never a complete broken one).
        A checkpoint that does not exist is not an error."""
        files, layout = self.reader.files, self.reader.layout
        with files.io(f"deleting checkpoint {checkpoint_id}"):
            try:
                files.fs.delete_file(layout.manifest(checkpoint_id))
            except FileNotFoundError:
                pass
            files.clear(layout.checkpoint_dir(checkpoint_id), remove=True)
        log.debug("chk-%d: deleted", checkpoint_id)

    def needed_by(self, kept: Iterable[int]) -> dict[int, int]:
        """The earlier checkpoints the complete ones of ``kept`` link to, each
        with the newest checkpoint that needs it.  A manifest that cannot be
        read needs nothing (that checkpoint cannot be restored anyway)."""
        needed: dict[int, int] = {}
        for checkpoint_id in sorted(kept):
            try:
                needs = self.reader.manifest(checkpoint_id).needs()
            except (SnapshotMissingError, SnapshotCorruptError):
                continue
            needed.update(dict.fromkeys(needs, checkpoint_id))
        return needed

    def apply(self, keep: int, pinned: Iterable[int] = ()) -> list[int]:
        """Delete completed checkpoints older than the newest ``keep`` and
        incomplete ones older than the newest completed.  Pinned ids, the
        checkpoints these link to, and anything newer than the newest
        completed checkpoint (possibly in progress) are never touched.
        Returns the deleted ids."""
        if keep < 1:
            raise ConfigError(f"retention keep must be at least 1, got {keep}")
        done = self.reader.completed()
        if not done:
            return []
        kept = set(done[-keep:]) | set(pinned)
        kept |= set(self.needed_by(kept & set(done)))
        doomed = [c for c in self.reader.checkpoints() if c < done[-1] and c not in kept]
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
