"""What every exactly-once sink shares: the two-phase commit at the end of
the pipeline (``TwoPhaseSink``), over a staging area in object storage
(``Staging``).

Epoch ``n`` of a sink task is the output it produced after barrier ``n-1`` and
up to barrier ``n``.  Phase one (``stage``) writes the epoch's output to a
staging area in object storage, immutable, before the task acknowledges
checkpoint ``n``.  Phase two (``commit``) runs when checkpoint ``n`` is complete
(its manifest exists) and makes the epoch visible, as each family does it
(``object_store``, ``kafka``, ``delta``).

A committed epoch leaves nothing staged, so what is staged is only what
waits for its checkpoint and a commit lists a handful of files, however long
the job runs.  Commits are idempotent (a committed epoch is recognised and
skipped), so ``recover(completed)`` after a restore simply commits every
staged epoch up to the restored checkpoint, which covers a crash between the
manifest and the sink's commit, and discards staged epochs after it: they
belong to the run that failed and the new generation writes them again.
Output committed after the restored checkpoint (a restore to an older, named
checkpoint, or past a newer one that failed to verify) is taken back where
the family can (``Recovery`` says what was and what could not be)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from barriers.messages import Unsigned
from streaming.adapters.objects import ObjectFiles, StoreLocation
from streaming.api.job_key import JobKey
from streaming.errors import SinkError, StoreError

__all__ = ["Recovery", "signing_key"]


def signing_key(key: JobKey | Unsigned, sink: str) -> JobKey | None:
    """What a ``sink`` (its kind, for the error) signs and verifies with: ``key``, or None for
    ``UNSIGNED``; a ``TypeError`` for anything else, None included (no sink is unsigned by default)."""
    if isinstance(key, Unsigned):
        return None
    if not isinstance(key, JobKey):
        raise TypeError(f"a {sink} sink's key is the job's key (JobKey), or UNSIGNED said explicitly")
    return key


log = logging.getLogger(__name__)


EPOCH_DIR = re.compile(r"epoch-(\d+)$")


def epoch_dir(epoch: int) -> str:
    return f"epoch-{epoch:012d}"


@dataclass(frozen=True, slots=True)
class Staging:
    """The staging area of one sink task: ``<root>/staging/epoch-<n>/<task>.parquet``."""

    location: StoreLocation
    task_id: str

    def path(self, epoch: int) -> str:
        return self.location.path("staging", epoch_dir(epoch), f"{self.task_id}.parquet")

    def write(self, epoch: int, table: pa.Table) -> str:
        path = self.path(epoch)
        try:
            ObjectFiles(self.location).write_parquet(path, table)
        except OSError as exc:
            raise StoreError(
                f"staging epoch {epoch} of sink task {self.task_id} at {self.location.uri} failed: {exc}"
            ) from exc
        return path

    def read(self, epoch: int) -> pa.Table:
        try:
            return pq.read_table(self.path(epoch), filesystem=self.location.filesystem)
        except (OSError, pa.ArrowInvalid) as exc:
            raise SinkError(
                f"staged output of epoch {epoch} for sink task {self.task_id} "
                f"is missing or unreadable at {self.path(epoch)}: {exc}"
            ) from exc

    def epochs(self) -> list[int]:
        """Epochs this task has staged output for."""
        selector = pafs.FileSelector(self.location.path("staging"), allow_not_found=True, recursive=True)
        found = []
        for info in self.location.filesystem.get_file_info(selector):
            match = EPOCH_DIR.search(info.path.rsplit("/", 1)[0])
            if match and info.type == pafs.FileType.File and info.path == self.path(int(match.group(1))):
                found.append(int(match.group(1)))
        return sorted(found)

    def staged(self, epoch: int) -> bool:
        return self.location.filesystem.get_file_info(self.path(epoch)).type == pafs.FileType.File

    def discard(self, epoch: int) -> None:
        self.location.filesystem.delete_file(self.path(epoch))

    def discard_if_staged(self, epoch: int) -> None:
        """What a commit leaves behind when it was cut short (S3's move is a copy then a delete)."""
        try:
            self.discard(epoch)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("sink task %s: staged epoch %d not removed: %s", self.task_id, epoch, exc)


class TwoPhaseSink:
    """Staging, idempotent commit and recovery; subclasses say how an epoch is
    made visible (``_publish``) and how to tell it already is (``_committed``)."""

    def __init__(self, staging: StoreLocation, task_id: str):
        self._staging = Staging(staging, task_id)
        self.task_id = task_id

    def stage(self, epoch: int, table: pa.Table) -> str:
        """Phase one: keep ``table`` as epoch ``epoch``'s output (not visible yet)."""
        path = self._staging.write(epoch, table)
        log.debug("sink task %s staged epoch %d (%d rows)", self.task_id, epoch, table.num_rows)
        return path

    def staged_epochs(self) -> list[int]:
        """Epochs staged and not committed yet, ascending."""
        return self._staging.epochs()

    def commit(self, epoch: int) -> bool:
        """Phase two, once checkpoint ``epoch`` is complete.  Returns False when
        the epoch was already committed (nothing is written twice)."""
        if self._committed(epoch) or (not self._staging.staged(epoch) and self._committed_elsewhere(epoch)):
            log.debug("sink task %s: epoch %d already committed", self.task_id, epoch)
            self._staging.discard_if_staged(epoch)
            return False
        self._publish(epoch)
        self._staging.discard_if_staged(epoch)
        log.debug("sink task %s committed epoch %d", self.task_id, epoch)
        return True

    def commit_through(self, completed_checkpoint: int) -> list[int]:
        """Commit every staged epoch up to ``completed_checkpoint`` (an epoch of
        an aborted checkpoint is committed with the next one that completes).
        Returns the epochs committed now."""
        return [epoch for epoch in self._staging.epochs() if epoch <= completed_checkpoint and self.commit(epoch)]

    def recover(self, completed_checkpoint: int) -> Recovery:
        """After a restore to ``completed_checkpoint``: take back what was
        committed after it (a restore to an older checkpoint, or past one that
        failed to verify: the new generation writes that output again), commit
        the staged epochs up to it and discard those after it."""
        retracted, kept = self._retract_after(completed_checkpoint)
        committed, discarded = [], []
        for epoch in self._staging.epochs():
            if epoch <= completed_checkpoint:
                if self.commit(epoch):
                    committed.append(epoch)
            else:
                self._staging.discard(epoch)
                discarded.append(epoch)
        return Recovery(committed, discarded, retracted, kept)

    def _retract_after(self, checkpoint: int) -> tuple[list[int], list[int]]:
        """Committed epochs after ``checkpoint``: (taken back, still visible)."""
        return [], []

    def _committed(self, epoch: int) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def _committed_elsewhere(self, epoch: int) -> bool:
        """Whether another instance committed ``epoch`` since this one looked
        (its staged file is gone: a commit removes it)."""
        return False

    def _publish(self, epoch: int) -> None:  # pragma: no cover - abstract
        """Make staged epoch ``epoch`` visible."""
        raise NotImplementedError


@dataclass(frozen=True)
class Recovery:
    """What ``recover`` did, by epoch: committed now (their checkpoint completed
    before the crash), discarded (staged by the run that failed), retracted
    (committed after the restored checkpoint, moved out of the output) and
    irrevocable (committed after it where nothing can take them back: a Kafka
    transaction; readers have them and the replay writes them again)."""

    committed: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    retracted: list[int] = field(default_factory=list)
    irrevocable: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.committed or self.discarded or self.retracted or self.irrevocable)
