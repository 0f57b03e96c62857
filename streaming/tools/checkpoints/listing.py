"""Listing a job's checkpoints (``spark-abs checkpoints list|verify``):
every checkpoint directory, complete or not, each verified, and the job's
current generation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from barriers.handler import CheckpointKind
from streaming.adapters.snapshots import SnapshotStore
from streaming.adapters.snapshots.format import text_of
from streaming.errors import SnapshotMissingError, SparkAbsError

__all__ = ["CheckpointList", "CheckpointRow"]


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint directory of a job, as ``checkpoints list`` shows it."""

    checkpoint_id: int
    complete: bool
    problems: tuple[str, ...] = ()  # why a restore could not use it (empty: it verifies)
    generation: int | None = None
    created_at: str = ""
    kinds: tuple[str, ...] = ()
    trigger_to_complete_s: float | None = None
    state_bytes: int = 0
    in_flight_offsets: int = 0

    @property
    def usable(self) -> bool:
        return self.complete and not self.problems


class CheckpointList:
    """The checkpoints of ``store``'s job, one row each, and whether they verify."""

    def __init__(self, store: SnapshotStore):
        self.store = store

    def rows(self, *, checksums: bool = True) -> list[CheckpointRow]:
        """Every checkpoint of the job, ascending, each verified."""
        rows = []
        complete = set(self.store.completed())
        for checkpoint_id in self.store.checkpoints():
            if checkpoint_id not in complete:
                rows.append(CheckpointRow(checkpoint_id, False, ("no manifest: in progress, or never completed",)))
                continue
            try:
                manifest = self.store.read_manifest(checkpoint_id)
                problems = tuple(self.store.verify(checkpoint_id, checksums=checksums))
            except (SnapshotMissingError, ValueError, SparkAbsError) as exc:
                rows.append(CheckpointRow(checkpoint_id, True, (str(exc),)))
                continue
            tasks = manifest.tasks.values()
            rows.append(
                CheckpointRow(
                    checkpoint_id,
                    True,
                    problems,
                    manifest.generation,
                    manifest.created_at,
                    tuple(text_of(CheckpointKind, k) for k in manifest.metrics.get("kinds", ())),
                    manifest.metrics.get("trigger_to_complete_s"),
                    sum(t.state_bytes for t in tasks),
                    sum(end - start for t in tasks for start, end in t.in_flight.values()),
                )
            )
        return rows

    def generation(self) -> int | None:
        """The job's current generation (None: the store has never seen the job)."""
        meta = self.store.read_job()
        if meta is not None:
            return meta.generation
        return 0 if self.store.checkpoints() else None  # a job of an older version wrote no job file in generation 0

    def verify(
        self,
        checkpoint_id: int | None = None,
        *,
        checksums: bool = True,
        progress: Callable[[str], None] = lambda _: None,
    ) -> dict[int, list[str]]:
        """Problems per complete checkpoint (``checkpoint_id``, or every one);
        an empty list means it verifies.  A checkpoint that is not complete
        raises SnapshotMissingError."""
        ids = [checkpoint_id] if checkpoint_id is not None else self.store.completed()
        results = {}
        for n, c in enumerate(ids, 1):
            progress(f"verifying checkpoint {c} ({n} of {len(ids)})")
            results[c] = self.store.verify(c, checksums=checksums)
        return results
