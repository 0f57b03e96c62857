"""Checkpoints written into a store by hand, as a job's tasks would have taken them."""

from __future__ import annotations

from barriers.messages import CheckpointOptions
from streaming.adapters.snapshots import TaskParts
from streaming.adapters.snapshots.format import options_to_json

__all__ = ["write_checkpoint"]


def write_checkpoint(store, pipeline, checkpoint_id: int, generation: int, state=None, *, position: int = 0):
    """Checkpoint ``checkpoint_id`` of ``pipeline`` written into ``store`` (a
    ``SnapshotStore``) by hand, as its tasks would have taken it in
    ``generation``: ``state`` per task name (none by default), every input
    channel at ``position``, aligned.  Returns the manifest."""
    snapshots = {
        spec.name: store.write_task(
            checkpoint_id,
            generation,
            spec.name,
            TaskParts(
                state=(state or {}).get(spec.name, {}),
                positions={str(c): position for c in spec.inputs},
                metadata={"kind": "aligned", "watermarks": {}, "lineage": []},
            ),
        )
        for spec in pipeline.tasks()
    }
    options = options_to_json(CheckpointOptions.aligned())
    return store.write_manifest(checkpoint_id, generation, snapshots, options=options, metrics={"kinds": ["aligned"]})
