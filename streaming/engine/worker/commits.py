"""A worker's sink commits: when the control topic says checkpoint n is
complete, each of the worker's sink tasks makes its epochs through n
visible (phase two of ``streaming.adapters.sinks.base``) and says so
(``committed``) — but only once the store holds n's manifest, so a sink
commits only what a restore could start from.  While the store is away
the commit waits for it (``store_patiently``) rather than fail the worker."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from streaming.adapters.kafka.control.events import Committed, Complete, ControlEvent
from streaming.adapters.objects import store_patiently
from streaming.adapters.snapshots import SnapshotStore
from streaming.engine import faults
from streaming.engine.worker.wiring import RunningTask
from streaming.errors import SnapshotCorruptError, SnapshotMissingError

__all__ = ["CheckpointCommits"]

# named as the worker's: its lines are the worker's (run as __main__, the worker names its logger so too)
log = logging.getLogger("streaming.engine.worker.worker")


class CheckpointCommits:
    """The commits of the checkpoint ``complete`` names: ``commit`` each
    sink task of the worker (generation ``generation``) in turn; the store
    (``store()``) asked once whether it holds the manifest."""

    def __init__(
        self,
        complete: Complete,
        generation: int,
        store: Callable[[], SnapshotStore],
        publish: Callable[[ControlEvent], object],
    ):
        self.checkpoint_id = complete.checkpoint_id
        self.generation = generation
        self._store = store
        self._publish = publish
        self._in_store: bool | None = None  # whether the store holds the manifest: read once

    def commit(self, running: RunningTask) -> None:
        """``running``'s sink commits its epochs through the checkpoint and says so."""
        if running.sink is None or not self.in_store():
            return
        checkpoint_id = self.checkpoint_id
        faults.point(running.task.spec.name, "before_sink_commit", checkpoint_id)
        # the store may be down for a while (an outage): wait for it rather than die and restore
        committed = store_patiently(
            functools.partial(running.sink.commit_through, checkpoint_id),
            f"committing epochs through {checkpoint_id}",
        )
        self._publish(
            Committed(
                checkpoint_id=checkpoint_id,
                task=running.task.spec.name,
                generation=self.generation,
                epochs=tuple(committed),
            )
        )

    def in_store(self) -> bool:
        """Whether the store holds the manifest of the checkpoint: a sink
        commits only what a restore could start from."""
        if self._in_store is None:
            self._in_store = self._read_manifest()
        return self._in_store

    def _read_manifest(self) -> bool:
        checkpoint_id = self.checkpoint_id
        try:
            # the store may be away a while (an outage): wait for it, as the commit does
            store_patiently(
                functools.partial(self._store().read_manifest, checkpoint_id),
                f"reading the manifest of checkpoint {checkpoint_id}",
            )
        except (SnapshotMissingError, SnapshotCorruptError) as exc:
            log.warning(
                f"checkpoint {checkpoint_id}: complete, says the control topic, but the store has no "
                f"readable manifest of it ({exc}): the sinks commit nothing for it"
            )
            return False
        return True
