"""Every error ``streaming/`` raises on purpose: one base class, one named
subclass for each thing that can go wrong, each with a message a person can
act on.  The CLI prints them as one line (no traceback).  The protocol
(``barriers.errors``) and the operators (``operators.errors``) have their own
bases; see docs/architecture/invariants.md, "Errors and names"."""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Sequence
from typing import TypeVar

__all__ = [
    "names_like",
    "SparkAbsError",
    "ConfigError",
    "ToolMissingError",
    "ArtifactResolutionError",
    "PortInUseError",
    "ServiceStartError",
    "RuntimeNotRunningError",
    "KafkaUnavailableError",
    "KafkaAccessError",
    "ChannelQueryError",
    "TaskError",
    "RecordErrorsStop",
    "RecordsFailed",
    "failed_at",
    "PIPELINE_ERRORS",
    "isolatable",
    "StoreError",
    "SnapshotMissingError",
    "SnapshotCorruptError",
    "SinkError",
    "SinkFencedError",
    "CompletionError",
    "ManifestNotWritten",
    "ProgressNotLogged",
    "RetentionFailed",
    "RescaleError",
    "PipelineChangeError",
    "JobFailed",
    "OffsetsGoneError",
    "SmokeFailure",
    "parse_choice",
]

E = TypeVar("E", bound=enum.Enum)


def parse_choice(kind: type[E], value: object, what: str) -> E:
    """The member of ``kind`` that ``value`` is or names; otherwise a
    ``ConfigError`` that names ``what`` and the choices.  The one way a kind,
    mode or status given as text becomes its enum."""
    try:
        return kind(value)
    except ValueError:
        choices = [repr(k.value) for k in kind]
        listed = " or ".join(choices) if len(choices) == 2 else "one of " + ", ".join(choices)
        raise ConfigError(f"{what} {value!r}: use {listed}") from None


def names_like(name: str, names: Sequence[str], what: str, *, listed: int = 8) -> str:
    """What an error about ``name`` says of the ``names`` there are (``what``:
    "jobs in the store"): the ones spelt like it first, then all of them,
    or their count when there are more than ``listed``."""
    if not names:
        return f"there are no {what}"
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    meant = f"did you mean {' or '.join(repr(n) for n in close)}? " if close else ""
    if len(names) <= listed:
        return f"{meant}{what}: {', '.join(names)}"
    return f"{meant}{len(names)} {what}, the first: {', '.join(names[:listed])}, ..."


class SparkAbsError(Exception):
    """Base of every error spark-abs raises on purpose; the CLI prints its message
    without a traceback."""


# ---- configuration and the local runtime


class ConfigError(SparkAbsError, ValueError):
    """A setting is missing, malformed or conflicts with another; the message names it."""


class ToolMissingError(SparkAbsError):
    """A program the local runtime needs (java, mvn, go) is not on PATH."""


class ArtifactResolutionError(SparkAbsError):
    """Maven or the Go module proxy could not deliver an artifact (registry
    unreachable, version not published, build failed)."""


class PortInUseError(SparkAbsError):
    """A port the runtime was told to use is taken by another process."""


class ServiceStartError(SparkAbsError):
    """A local service exited or did not become ready in time; carries its log tail."""


class RuntimeNotRunningError(SparkAbsError):
    """No connection file: the local runtime was never started (or was purged)."""


# ---- Kafka and Spark


class KafkaUnavailableError(SparkAbsError):
    """No broker answered at the configured kafka address, or it refused
    an operation (a topic, a send, a read of an offset range)."""


class KafkaAccessError(KafkaUnavailableError):
    """Kafka answered but refused this client: no or wrong credentials, a
    certificate it does not trust, or a principal without the rights an
    operation needs.  The message names what to set or grant, never a secret."""


class ChannelQueryError(SparkAbsError):
    """The stage's streaming query failed or did not finish in time."""


class TaskError(SparkAbsError):
    """A stage task cannot go on (held records that Kafka no longer gives
    back); its query fails and the job restores."""


class RecordsFailed(TaskError):
    """A task failed processing a run of records of one channel: which task,
    where (``channel``, offsets ``first`` to ``last``) and on what.  Its
    message is what ``failed_at`` reads back from a worker's log: the runner
    stops a job that fails at the same place restore after restore."""

    def __init__(self, task: str, channel: str, first: int, last: int, error: str):
        super().__init__(f"task {task} failed on {channel} offsets {first}..{last}: {error}")
        self.task, self.channel, self.first, self.last, self.error = task, channel, first, last, error


_FAILED_AT = re.compile(r"task (\S+) failed on (\S+):(\d+) offsets (\d+)\.\.(\d+): (.*)")


def failed_at(text: str) -> tuple[str, str, int, int, str] | None:
    """The last ``RecordsFailed`` said in ``text`` (a worker's last words):
    its task, channel, first and last offsets and error; None when none is."""
    found = _FAILED_AT.findall(text)
    if not found:
        return None
    task, topic, partition, first, last, error = found[-1]
    return task, f"{topic}:{partition}", int(first), int(last), error.strip()


class RecordErrorsStop(SparkAbsError):
    """Records a stage's code raises on stop the job: its ``record_errors``
    is ``"fail"``, or more were set aside in one checkpoint interval than
    its brake allows (``streaming.engine.task.record_errors``).  A restore would
    meet the same records: the job stops, naming them."""


# errors in the pipeline itself (its configuration, its code on its records): every restore would
# meet them again, so a worker stopping on one stops the job (``EXIT_PIPELINE_ERROR``)
PIPELINE_ERRORS: tuple[type[SparkAbsError], ...] = (ConfigError, RecordErrorsStop)


def isolatable(error: BaseException) -> bool:
    """Whether ``error``, raised by a stage's code on a run of records, may be
    a record's doing (``streaming.engine.task.record_errors``): not a
    ``MemoryError``, nor an error of the engine's own (``SparkAbsError``)."""
    return isinstance(error, Exception) and not isinstance(error, (MemoryError, SparkAbsError))


# ---- object storage: snapshots and sinks


class StoreError(SparkAbsError):
    """The snapshot or output store is unreachable or refused an operation."""


class SnapshotMissingError(StoreError):
    """The checkpoint, its manifest or the task's snapshot does not exist."""


class SnapshotCorruptError(StoreError):
    """A manifest, task file or part exists but is unreadable, or its size or
    checksum differs from what was recorded."""


class SinkError(SparkAbsError):
    """A sink could not stage or commit an epoch."""


class SinkFencedError(SinkError):
    """Another instance of the same sink task took over (a newer generation):
    this one must stop writing."""


# ---- completing a checkpoint: the steps of ``CheckpointCompletion.complete`` that can fail


class CompletionError(SparkAbsError):
    """A step of completing a checkpoint failed."""


class ManifestNotWritten(CompletionError):
    """Step 1: the tasks' acknowledgements did not make a manifest, or the
    store did not take it.  The checkpoint is aborted; the job goes on."""


class ProgressNotLogged(CompletionError):
    """Step 7: the completed checkpoint's progress line could not be
    appended to its file.  The checkpoint stays complete."""


class RetentionFailed(CompletionError):
    """Step 9: the store did not delete what retention gives up.  The next
    completed checkpoint tries again."""


# ---- jobs and tools


class RescaleError(ConfigError):
    """A checkpoint cannot be restored into the task counts asked for (a
    stage's state says nothing of how it divides, or follows partitions)."""


class LeaseRefused(ConfigError):
    """A remote worker was offered a lease for another job or pipeline than
    the one its operator named on its command line: it runs nothing."""


class PipelineChangeError(ConfigError):
    """A checkpoint cannot be restored into the pipeline as its code now
    declares it (a stage removed, a state schema changed, an edge whose
    channel state cannot be handed over); the message names every problem."""


class JobFailed(SparkAbsError):
    """The job cannot go on (a worker fails again and again, or never starts)."""


class OffsetsGoneError(JobFailed):
    """A checkpoint needs Kafka records that retention or ``DeleteRecords``
    removed (each channel named, with the offset needed and the partition's
    earliest): it cannot be restored exactly.  A restore skips it for an
    older one; when none can be restored, the job stops with this error
    rather than start from the beginning, which Kafka no longer holds either."""


class SmokeFailure(SparkAbsError):
    """The smoke pipeline read back something other than what it wrote."""
