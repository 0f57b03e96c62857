"""The object-store sink: a commit moves the staged file to
``<root>/output/epoch-<n>/<task>.parquet`` (a rename on a local filesystem, a
server-side copy then a delete on S3); one object per (epoch, task), so it
appears whole or not at all.  Output committed after a restored checkpoint
is taken back (moved to ``<root>/retracted/``).  ``read_committed_output``
reads what is committed."""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from streaming.adapters.objects import StoreLocation, list_files
from streaming.adapters.sinks.base import EPOCH_DIR, TwoPhaseSink, epoch_dir
from streaming.errors import SinkError, StoreError

__all__ = ["ObjectStoreSink", "read_committed_output"]

log = logging.getLogger(__name__)


class ObjectStoreSink(TwoPhaseSink):
    """Parquet per epoch and task under ``<root>/output``, visible only after the
    checkpoint that closes the epoch completes."""

    def __init__(self, location: StoreLocation, task_id: str):
        super().__init__(location, task_id)
        self._location = location

    def output_path(self, epoch: int) -> str:
        return self._location.path("output", epoch_dir(epoch), f"{self.task_id}.parquet")

    def _committed(self, epoch: int) -> bool:
        fs = self._location.filesystem
        return fs.get_file_info(self.output_path(epoch)).type == pafs.FileType.File

    def _retract_after(self, checkpoint: int) -> tuple[list[int], list[int]]:
        """Move this task's committed epochs after ``checkpoint`` from
        ``output/`` to ``retracted/``, where readers of the output do not look."""
        fs = self._location.filesystem
        retracted = []
        try:
            for info in fs.get_file_info(pafs.FileSelector(self._location.path("output"), allow_not_found=True)):
                match = EPOCH_DIR.search(info.path)
                if not match or int(match.group(1)) <= checkpoint:
                    continue
                epoch = int(match.group(1))
                if not self._committed(epoch):
                    continue
                fs.create_dir(self._location.path("retracted", epoch_dir(epoch)))
                retracted_path = self._location.path("retracted", epoch_dir(epoch), f"{self.task_id}.parquet")
                fs.move(self.output_path(epoch), retracted_path)
                if isinstance(fs, pafs.LocalFileSystem):  # a rename keeps the old time; gc's grace counts from now
                    os.utime(retracted_path)
                log.warning(
                    "sink task %s: epoch %d was committed after checkpoint %d, the restored one; "
                    "moved to retracted/ (the new generation writes it again)",
                    self.task_id,
                    epoch,
                    checkpoint,
                )
                retracted.append(epoch)
        except OSError as exc:
            raise StoreError(
                f"sink task {self.task_id}: taking back output committed after checkpoint {checkpoint} failed: {exc}"
            ) from exc
        return sorted(retracted), []

    def _publish(self, epoch: int) -> None:
        staged = self._staging.path(epoch)
        fs = self._location.filesystem
        if not self._staging.staged(epoch):
            raise SinkError(
                f"staged output of epoch {epoch} for sink task {self.task_id} is missing or unreadable at {staged}"
            )
        try:
            fs.create_dir(self._location.path("output", epoch_dir(epoch)))
            fs.move(staged, self.output_path(epoch))
        except OSError as exc:
            raise StoreError(f"committing epoch {epoch} of sink task {self.task_id} failed: {exc}") from exc


def read_committed_output(location: StoreLocation) -> pa.Table | None:
    """Every committed epoch of an ``ObjectStoreSink`` in epoch order (then task
    order), or None when nothing is committed yet."""
    fs = location.filesystem
    files = [i.path for i in list_files(fs, location.path("output")) if i.path.endswith(".parquet")]
    if not files:
        return None
    return pa.concat_tables([pq.read_table(p, filesystem=fs) for p in files], promote_options="default")
