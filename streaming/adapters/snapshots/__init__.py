"""The snapshot store: where each task's part of a checkpoint is kept, and the
manifest that makes a checkpoint complete.

A task writes its operator state (and, in unaligned mode, a copy of its
in-flight records) when it takes its snapshot for checkpoint ``n``; the
coordinator writes the manifest once every task has acknowledged.  Object
storage is reached through ``pyarrow.fs`` (``file://`` or ``s3://``, see
``streaming.adapters.objects``)::

    <root>/<job>/checkpoints/chk-<n>/<task>/state/<table>.parquet      operator state tables
    <root>/<job>/checkpoints/chk-<n>/<task>/channels/<channel>.parquet in-flight records (optional)
    <root>/<job>/checkpoints/chk-<n>/<task>/_TASK.json                 task metadata, after its parts
    <root>/<job>/checkpoints/chk-<n>/_MANIFEST.json                    written last, by the coordinator
    <root>/<job>/_JOB.json                                             generation and restore history

``<n>`` is zero-padded to 8 digits (``chk-00000012``) so listings sort.  Job,
task, table and channel names are percent-encoded into file names
(``transfers:0`` -> ``transfers%3A0``); JSON keeps the original names.

A part's path, as ``_TASK.json`` and the manifest record it, is relative to
its checkpoint's directory and one the layout writes (``<task>/state/...``
or ``<task>/channels/...``, ``layout.check_part_path``); a document naming
any other path (``..``, absolute, a scheme, another task's directory) is
corrupt, so what a restore reads stays inside the checkpoint.

Write order is the contract: parts, then ``_TASK.json``, then
``_MANIFEST.json``.  Only a checkpoint with a manifest is complete; anything
else is in progress or was abandoned.  Every part is Parquet whose size and
SHA-256 (of exactly the stored bytes) are recorded in ``_TASK.json`` and in the
manifest, so a restore can tell a damaged checkpoint and fall back to an older
one (``latest_verified``).  The manifest and ``_JOB.json`` appear atomically: a
rename on a local filesystem, a single PUT on S3.

``_JOB.json``, the manifests and every ``_TASK.json`` are signed with the
job's store key (``signing``): one a writer of the store edited, wrote or
copied from another place does not verify, so its checkpoint is corrupt (a
restore falls back past it) or, for ``_JOB.json``, the job stops with the
reason.

Every ``OSError`` from the filesystem becomes a ``StoreError`` naming the store
URI; a missing checkpoint or task raises ``SnapshotMissingError`` and damaged
content ``SnapshotCorruptError``, each naming the checkpoint, task and part.

The package: ``layout`` (where each file lives), ``format`` (the JSON
documents), ``reading`` (listing and reading back, every part checked),
``writing`` (task parts, ``_TASK.json``, the manifest), ``verify`` (whether
a checkpoint can be restored, which one a restore picks, and the newest that
verifies, remembered), ``retention`` (deleting checkpoints, and which ones
go: ``plan_retention``, the one rule of the coordinator and of ``checkpoints
gc``), ``jobs`` (generations and restore history), ``signing`` (the job
files' signatures) and ``store`` (the ``SnapshotStore``: one handle to the
rest).
"""

from streaming.adapters.snapshots.format import (
    FORMAT_VERSION,
    JobMeta,
    LoadedTask,
    Manifest,
    PartInfo,
    TaskCheckpointMetrics,
    TaskSnapshot,
)
from streaming.adapters.snapshots.layout import checkpoint_dir_name
from streaming.adapters.snapshots.signing import UNSIGNED
from streaming.adapters.snapshots.store import SnapshotStore
from streaming.adapters.snapshots.writing import TaskParts

__all__ = [
    "FORMAT_VERSION",
    "PartInfo",
    "TaskSnapshot",
    "TaskCheckpointMetrics",
    "Manifest",
    "LoadedTask",
    "JobMeta",
    "SnapshotStore",
    "TaskParts",
    "UNSIGNED",
    "checkpoint_dir_name",
]
