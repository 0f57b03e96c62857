"""Listing a job's checkpoints and reading them back: manifests, task files
and parts, each part checked against its recorded size, checksum and row
count, so damaged content is a ``SnapshotCorruptError`` naming the
checkpoint, task and part, never a wrong restore.  A state table kept as a
chain (incremental checkpoints) is read as its base with each later link
applied in order, so whoever loads a task gets whole tables either way."""

from __future__ import annotations

import hashlib
import logging

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from operators.state import apply_chain, stored_keys
from streaming.adapters.objects import ObjectFiles
from streaming.adapters.snapshots.format import LoadedTask, Manifest, PartInfo, StateLink, TaskSnapshot
from streaming.adapters.snapshots.layout import CHECKPOINT_DIR, MANIFEST, TASK, Layout, escape
from streaming.adapters.snapshots.signing import StoreSigner
from streaming.errors import SnapshotCorruptError, SnapshotMissingError

__all__ = ["SnapshotReader"]

log = logging.getLogger(__name__)


class SnapshotReader:
    """Reads the checkpoints of job ``job`` laid out by ``layout`` in
    ``files``; ``signer`` verifies each manifest and ``_TASK.json``."""

    def __init__(self, files: ObjectFiles, layout: Layout, job: str, signer: StoreSigner):
        self.files = files
        self.layout = layout
        self.job = job
        self.signer = signer

    def checkpoints(self) -> list[int]:
        """Every checkpoint directory, complete or not, ascending."""
        selector = pafs.FileSelector(self.layout.checkpoints_dir, allow_not_found=True)
        with self.files.io("listing checkpoints"):
            infos = self.files.fs.get_file_info(selector)
        found = []
        for info in infos:
            match = CHECKPOINT_DIR.fullmatch(info.base_name)
            if match and info.type == pafs.FileType.Directory:
                found.append(int(match.group(1)))
        return sorted(found)

    def completed(self) -> list[int]:
        """Checkpoints that have a manifest, ascending."""
        ids = self.checkpoints()
        if not ids:
            return []
        with self.files.io("listing completed checkpoints"):
            infos = self.files.fs.get_file_info([self.layout.manifest(c) for c in ids])
        return [c for c, info in zip(ids, infos) if info.type == pafs.FileType.File]

    def manifest(self, checkpoint_id: int) -> Manifest:
        path = self.layout.manifest(checkpoint_id)
        data = self.files.read(path, f"reading the manifest of checkpoint {checkpoint_id}")
        if data is None:
            raise SnapshotMissingError(
                f"checkpoint {checkpoint_id} of job {self.job} is not complete: "
                f"{self.why_missing(checkpoint_id, MANIFEST)}"
            )
        data = self.signer.body(
            data, f"checkpoint {checkpoint_id}: manifest {self.files.uri(path)}", "manifest", str(checkpoint_id)
        )
        try:
            manifest = Manifest.from_json(data)
            if manifest.checkpoint_id != checkpoint_id or manifest.job != self.job:
                raise ValueError(f"it belongs to checkpoint {manifest.checkpoint_id} of job {manifest.job}")
        except ValueError as exc:
            raise SnapshotCorruptError(
                f"checkpoint {checkpoint_id}: manifest {self.files.uri(path)} is unreadable: {exc}"
            ) from exc
        return manifest

    def task(self, checkpoint_id: int, task: str) -> TaskSnapshot | None:
        """``task``'s ``_TASK.json`` in ``checkpoint_id``, or None when it does not exist."""
        path = self.layout.task_file(checkpoint_id, task)
        data = self.files.read(path, f"reading checkpoint {checkpoint_id} task {task}")
        if data is None:
            return None
        data = self.signer.body(
            data, f"checkpoint {checkpoint_id} task {task}: {self.files.uri(path)}", "task", str(checkpoint_id), task
        )
        try:
            snapshot = TaskSnapshot.from_json(data)
            if snapshot.task != task or snapshot.checkpoint_id != checkpoint_id:
                raise ValueError(f"it belongs to task {snapshot.task} of checkpoint {snapshot.checkpoint_id}")
        except ValueError as exc:
            raise SnapshotCorruptError(
                f"checkpoint {checkpoint_id} task {task}: {self.files.uri(path)} is unreadable: {exc}"
            ) from exc
        return snapshot

    def required_task(self, checkpoint_id: int, task: str) -> TaskSnapshot:
        snapshot = self.task(checkpoint_id, task)
        if snapshot is None:
            task_file = f"{escape(task, 'task')}/{TASK}"
            raise SnapshotMissingError(
                f"checkpoint {checkpoint_id} has no snapshot of task {task}: "
                f"{self.why_missing(checkpoint_id, task_file)}"
            )
        return snapshot

    def part(self, checkpoint_id: int, task: str, part: PartInfo) -> pa.Table:
        where = f"checkpoint {checkpoint_id} task {task} part {part.name!r} ({part.path})"
        data = self.files.read(self.layout.part(checkpoint_id, part.path), f"reading {where}")
        if data is None:
            raise SnapshotCorruptError(f"{where} is missing")
        if len(data) != part.bytes:
            raise SnapshotCorruptError(f"{where} has {len(data)} bytes, {part.bytes} were written")
        digest = hashlib.sha256(data).hexdigest()
        if digest != part.sha256:
            raise SnapshotCorruptError(f"{where} checksum mismatch: sha256 {digest}, {part.sha256} was written")
        try:
            with pq.ParquetFile(pa.BufferReader(_arrow_owned(data))) as parquet:
                table = parquet.read()
        except (pa.ArrowException, OSError) as exc:
            raise SnapshotCorruptError(f"{where} is not readable Parquet: {exc}") from exc
        if table.num_rows != part.rows:
            raise SnapshotCorruptError(f"{where} has {table.num_rows} rows, {part.rows} were written")
        return table

    def load_task(self, checkpoint_id: int, task: str) -> LoadedTask:
        """``task``'s snapshot in ``checkpoint_id`` with all its tables, each part
        checked against its recorded size and checksum."""
        snapshot = self.required_task(checkpoint_id, task)
        state = {p.name: self.part(checkpoint_id, task, p) for p in snapshot.state_parts}
        state.update(
            (name, self.chain(checkpoint_id, task, name, chain)) for name, chain in snapshot.state_chains.items()
        )
        channels = {p.name: self.part(checkpoint_id, task, p) for p in snapshot.channel_parts}
        log.debug(
            "chk-%d task %s: snapshot loaded (%d state parts, %d channel parts)",
            checkpoint_id,
            task,
            len(state),
            len(channels),
        )
        return LoadedTask(snapshot, state, channels)

    def chain(self, checkpoint_id: int, task: str, name: str, chain: tuple[StateLink, ...]) -> pa.Table:
        """State table ``name`` of ``task`` in ``checkpoint_id``: its chain's base
        with every later link applied, oldest first (``apply_chain``)."""
        where = f"checkpoint {checkpoint_id} task {task} table {name!r}"
        if not chain or chain[0].kind != "base" or any(link.kind == "base" for link in chain[1:]):
            raise SnapshotCorruptError(f"{where}: its chain does not start with its one base")
        base = self.part(chain[0].checkpoint_id, task, chain[0].part)
        links = [(link.kind, self.part(link.checkpoint_id, task, link.part)) for link in chain[1:]]
        keys = next(filter(None, map(stored_keys, [base, *(rows for _, rows in links)])), None)
        if not links:
            return base
        if keys is None:
            raise SnapshotCorruptError(f"{where}: its chain names no key columns, so its links cannot be applied")
        try:
            return apply_chain(base, links, keys)
        except (pa.ArrowException, KeyError) as exc:
            raise SnapshotCorruptError(f"{where}: the links of its chain do not apply to its base: {exc}") from exc

    def why_missing(self, checkpoint_id: int, relative: str) -> str:
        directory = self.files.uri(self.layout.checkpoint_dir(checkpoint_id))
        if checkpoint_id in self.checkpoints():
            return f"{directory}/{relative} does not exist"
        return f"{directory} does not exist"


def _arrow_owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory Arrow owns.  Parquet decodes columns on
    Arrow's threads, and one of them may release its reader after ``read``
    returned: were the reader's buffer the Python ``bytes``, that release
    takes the GIL, and in a process that is exiting it aborts it ("terminate
    called without an active exception", from ``arrow::py::PyBuffer``'s
    destructor), after a command had printed all it had to say."""
    out = pa.BufferOutputStream()
    out.write(data)
    return out.getvalue()
