"""Deleting checkpoints: one at a time (manifest first), and the retention
rule that says which ones go (``plan_retention``), the one rule of the
coordinator's retention and of ``spark-abs checkpoints gc``.

A checkpoint kept keeps every earlier one whose parts its chains link to
(incremental checkpoints), complete or not.  The newest checkpoint that
verifies is kept however old it is: when the newest ``retain`` completions
do not verify, a restore still has it to fall back to."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from streaming.adapters.snapshots.layout import checkpoint_dir_name
from streaming.adapters.snapshots.reading import SnapshotReader
from streaming.errors import ConfigError, SnapshotCorruptError, SnapshotMissingError

__all__ = ["Retention", "RetentionPlan", "plan_retention"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """What retention deletes (``doomed``, ascending) and the checkpoints it
    keeps although they are older than the newest ``retain`` complete ones,
    each with why (``kept``)."""

    doomed: tuple[int, ...]
    kept: Mapping[int, str]


def plan_retention(
    checkpoints: Sequence[int],
    completed: Sequence[int],
    *,
    retain: int,
    verified: int | None,
    pinned: Iterable[int] = (),
    needs: Callable[[int], Iterable[int]] = lambda _: (),
) -> RetentionPlan:
    """Which of ``checkpoints`` (every checkpoint directory) retention
    deletes, given those of them that are ``completed`` (have a manifest).

    Kept are the newest ``retain`` complete checkpoints, the newest one that
    verifies (``verified``, None when none does), the ``pinned`` ones (the
    checkpoint the current generation started from), and every earlier
    checkpoint a kept complete one links to (``needs``: the earlier
    checkpoints a complete one's chains read), as well as anything newer
    than the newest complete checkpoint (it may be in progress).  Every other
    checkpoint goes, complete or not."""
    if retain < 1:
        raise ConfigError(f"retention keep must be at least 1, got {retain}")
    done = sorted(completed)
    if not done:
        return RetentionPlan((), {})
    newest = set(done[-retain:])
    why: dict[int, str] = {}
    if verified is not None:
        why[verified] = "a restore would pick it (the newest that verifies)"
    for checkpoint_id in pinned:
        why.setdefault(checkpoint_id, "the current generation started from it")
    links = {needed: holder for holder in sorted((newest | set(why)) & set(done)) for needed in needs(holder)}
    for needed, holder in links.items():
        why.setdefault(needed, f"checkpoint {holder} links to its parts")
    existing = [c for c in sorted(checkpoints) if c <= done[-1]]
    return RetentionPlan(
        doomed=tuple(c for c in existing if c not in newest and c not in why),
        kept={c: why[c] for c in existing if c not in newest and c in why},
    )


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

    def plan(self, keep: int, *, verified: int | None, pinned: Iterable[int] = ()) -> RetentionPlan:
        """``plan_retention`` on the store as it is now: its checkpoints, and
        the links of the kept ones as their manifests name them."""
        return plan_retention(
            self.reader.checkpoints(),
            self.reader.completed(),
            retain=keep,
            verified=verified,
            pinned=pinned,
            needs=self._needs,
        )

    def apply(self, keep: int, *, verified: int | None, pinned: Iterable[int] = ()) -> list[int]:
        """Delete what ``plan`` gives up; returns the deleted ids."""
        pinned = list(pinned)
        doomed = list(self.plan(keep, verified=verified, pinned=pinned).doomed)
        for checkpoint_id in doomed:
            self.delete(checkpoint_id)
        if doomed:
            log.debug(
                "retention (keep %d, verified %s, pinned %s): deleted %s",
                keep,
                verified,
                sorted(set(pinned)),
                ", ".join(checkpoint_dir_name(c) for c in doomed),
            )
        return doomed

    def _needs(self, checkpoint_id: int) -> Iterable[int]:
        """The earlier checkpoints complete ``checkpoint_id`` links to; none
        when its manifest cannot be read (it cannot be restored anyway)."""
        try:
            return self.reader.manifest(checkpoint_id).needs()
        except (SnapshotMissingError, SnapshotCorruptError):
            return ()
