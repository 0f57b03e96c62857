"""A job's checkpointing settings: one frozen dataclass with commented
defaults, validated when built (a conflicting option is named), and the one
place that turns them into ``CheckpointOptions``."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from barriers.messages import CheckpointOptions, InFlightFormat
from streaming.errors import ConfigError, parse_choice

__all__ = [
    "KAFKA_SINK_CLIENTS",
    "JobSettings",
    "check_store_uri",
    "DECODED_BATCH_BYTES",
    "Mode",
    "MODES",
    "StateSnapshots",
    "STATE_SNAPSHOTS",
    "IN_FLIGHT_FORMATS",
    "WORKER_GROUPINGS",
    "RECORD_ERRORS",
    "skip_range",
]


class Mode(enum.StrEnum):
    """A job's checkpoint mode (docs/architecture/index.md, "Modes")."""

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    ALIGNED_TIMEOUT = "aligned-timeout"
    AT_LEAST_ONCE = "at-least-once"


class StateSnapshots(enum.StrEnum):
    """What a checkpoint stores of the operator state (docs/architecture/checkpoints.md, "Keyed state and incremental checkpoints")."""

    FULL = "full"
    INCREMENTAL = "incremental"


MODES = tuple(m.value for m in Mode)
STATE_SNAPSHOTS = tuple(s.value for s in StateSnapshots)
IN_FLIGHT_FORMATS = tuple(f.value for f in InFlightFormat)
# how a job's tasks are spread over worker processes (streaming.engine.job.groups.worker_groups)
WORKER_GROUPINGS = ("one", "per-stage")
# which client writes a Kafka sink's transactions (JobSettings.kafka_sink_client)
KAFKA_SINK_CLIENTS = ("java", "python")
# what one Arrow record a stage writes to an internal topic takes at most once read
# (streaming.adapters.serde.codec.encode_batches): the least max_decoded_bytes may be
DECODED_BATCH_BYTES = 16 << 20
# what a record the stage's code raises on does (JobSettings.record_errors)
RECORD_ERRORS = ("isolate", "fail")


def skip_range(spec: str) -> tuple[str, int, int, int]:
    """``topic:partition:first-last`` (``JobSettings.skip_records``) as its
    topic, partition, first and last offsets; a ``ConfigError`` saying the
    form otherwise."""
    topic, _, rest = str(spec).rpartition(":")
    topic, _, partition = topic.rpartition(":")
    first, dash, last = rest.partition("-")
    if not (topic and partition.isdigit() and first.isdigit() and dash and last.isdigit() and int(first) <= int(last)):
        raise ConfigError(
            f"skip_records {spec!r}: give topic:partition:first-last, the first and last offsets of the records "
            "to skip into the dead letters (e.g. orders:0:1200-1399)"
        )
    return topic, int(partition), int(first), int(last)


@dataclass(frozen=True, slots=True)
class JobSettings:
    # where snapshots (and the object-store sink) live: file:///dir or s3://bucket/prefix
    store: str
    # aligned | unaligned | aligned-timeout | at-least-once (a Mode, or its name)
    mode: Mode = Mode.ALIGNED
    # aligned-timeout: switch to unaligned once this long has passed since the trigger ...
    alignment_timeout_ms: int | None = None
    # ... or once the held records pass this many bytes
    held_bytes_budget: int | None = None
    # unaligned channel state: "range" (offsets; Kafka keeps the records) or "records" (a copy)
    in_flight: InFlightFormat = InFlightFormat.RANGE
    # seconds between checkpoint triggers
    interval_s: float = 2.0
    # a checkpoint not complete after this long is aborted
    timeout_s: float = 60.0
    # completed checkpoints kept in the store (and the earlier ones whose parts they link to)
    retain: int = 3
    # what a checkpoint stores of the state: "full" (every table whole) or "incremental" (what
    # changed since the task's previous checkpoint, linked to a base stored whole ...
    state_snapshots: StateSnapshots = StateSnapshots.FULL
    # ... every this many checkpoints, or sooner once the changes outweigh the base)
    base_every: int = 10
    # bytes of keyed-state rows a worker process keeps in memory; past it the largest
    # chunks spill to memory-mapped files under $SPARK_ABS_HOME/spill (None: no limit;
    # see operators.state.StateMemory)
    state_memory_bytes: int | None = None
    # checkpoints pending at once
    max_concurrent: int = 1
    # records per stage query micro-batch (Spark's maxOffsetsPerTrigger); large, so a
    # backlog is read in few Spark micro-batches (tasks still take control events
    # between segments of a batch, and spill held records past a memory budget)
    max_records_per_batch: int = 200_000
    # modes unaligned and aligned-timeout: how long a task processes records between
    # two looks at control events (an unaligned snapshot, an alignment timeout):
    # about how long a barrier's announcement waits behind a micro-batch.  A task
    # learns what its operator takes per record and processes runs of as many
    # records as fit (see streaming.engine.task.segments.SegmentPace) ...
    segment_ms: float = 40.0
    # ... and never more than this many records per run
    max_segment_records: int = 50_000
    # how often a stage query looks for new records
    trigger_interval: str = "300 milliseconds"
    # a worker none of whose tasks is heard this long while the control topic works (a frozen
    # or stuck process, or a remote group gone silent) is taken for dead and the job restores;
    # a remote worker that hears no lease this long stops its tasks
    heartbeat_timeout_s: float = 15.0
    # how long a send to Kafka may take, retries included (the producers' delivery.timeout.ms):
    # a task whose records Kafka has not taken by then fails, and its worker with it
    delivery_timeout_s: float = 120.0
    # consecutive failed checkpoints (aborted: expired, declined, not triggered) a job takes
    # before it restores from its latest checkpoint, as Flink's tolerable failed checkpoints
    tolerable_failed_checkpoints: int = 3
    # the most bytes one Arrow record of an internal topic may take once decompressed, read
    # from its metadata before anything is decompressed: a record over it (a decompression
    # bomb) goes to the dead letters with the reason.  The stages write records of at most
    # DECODED_BATCH_BYTES (16 MiB), so this is at least that
    max_decoded_bytes: int = 64 << 20
    # which client writes a Kafka sink's transactions: "java", Kafka's own (kafka-clients 4.4,
    # in a small JVM per sink task), on the broker's transaction protocol (the second,
    # KIP-890, on Kafka 4.0 and later); "python", kafka-python in the worker, which speaks
    # only the first (the broker keeps it for such clients)
    kafka_sink_client: str = "java"
    # what a record the stage's code raises on does (streaming.engine.task.record_errors):
    # "isolate", the record to the dead letters with the exception and the rest processed as if
    # it had not been there; "fail", the job stops naming it
    record_errors: str = "isolate"
    # the brake: the job stops once a task set aside more than this many records in one
    # checkpoint interval ...
    max_isolated_records: int = 1000
    # ... or more than this share of the records it processed in it (from the tenth one on)
    max_isolated_share: float = 0.5
    # records an operator decided to skip into the dead letters, each "topic:partition:first-last"
    # (spark-abs run --skip-records): a restore past records that fail a task every time
    skip_records: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.store:
            raise ConfigError("store: give a file:// or s3:// URI for snapshots")
        check_store_uri(self.store)
        object.__setattr__(self, "mode", parse_choice(Mode, self.mode, "mode"))
        object.__setattr__(self, "in_flight", parse_choice(InFlightFormat, self.in_flight, "in_flight"))
        object.__setattr__(
            self, "state_snapshots", parse_choice(StateSnapshots, self.state_snapshots, "state_snapshots")
        )
        if self.mode is Mode.ALIGNED_TIMEOUT and self.alignment_timeout_ms is None and self.held_bytes_budget is None:
            raise ConfigError("mode aligned-timeout needs alignment_timeout_ms, held_bytes_budget or both")
        if self.mode is not Mode.ALIGNED_TIMEOUT and (
            self.alignment_timeout_ms is not None or self.held_bytes_budget is not None
        ):
            raise ConfigError(
                f"alignment_timeout_ms and held_bytes_budget apply to mode aligned-timeout, not {self.mode}"
            )
        if self.kafka_sink_client not in KAFKA_SINK_CLIENTS:
            raise ConfigError(
                f"kafka_sink_client {self.kafka_sink_client!r}: use one of {', '.join(KAFKA_SINK_CLIENTS)}"
            )
        for name in ("interval_s", "timeout_s", "heartbeat_timeout_s", "delivery_timeout_s", "segment_ms"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ConfigError(f"{name} must be positive and finite, got {getattr(self, name)}")
        for name in ("retain", "max_concurrent", "max_records_per_batch", "max_segment_records", "base_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.tolerable_failed_checkpoints < 0:
            raise ConfigError(
                f"tolerable_failed_checkpoints must be 0 or more, got {self.tolerable_failed_checkpoints}"
            )
        if self.max_decoded_bytes < DECODED_BATCH_BYTES:
            raise ConfigError(
                f"max_decoded_bytes must be at least {DECODED_BATCH_BYTES} (what a stage writes in one Arrow "
                f"record), got {self.max_decoded_bytes}"
            )
        if self.record_errors not in RECORD_ERRORS:
            raise ConfigError(f"record_errors {self.record_errors!r}: use {' or '.join(map(repr, RECORD_ERRORS))}")
        if self.max_isolated_records < 0:
            raise ConfigError(f"max_isolated_records must be 0 or more, got {self.max_isolated_records}")
        if not 0 < self.max_isolated_share <= 1:
            raise ConfigError(f"max_isolated_share must be more than 0 and at most 1, got {self.max_isolated_share}")
        object.__setattr__(self, "skip_records", tuple(self.skip_records))
        for spec in self.skip_records:
            skip_range(spec)
        if self.state_memory_bytes is not None and self.state_memory_bytes < 1:
            raise ConfigError(
                f"state_memory_bytes must be at least 1 (or None: no limit), got {self.state_memory_bytes}"
            )
        if self.max_concurrent > 1 and self.mode is not Mode.UNALIGNED:
            raise ConfigError(
                f"max_concurrent={self.max_concurrent}: only unaligned checkpoints can overlap (mode is {self.mode})"
            )

    @property
    def options(self) -> CheckpointOptions:
        if self.mode is Mode.UNALIGNED:
            return CheckpointOptions.unaligned(self.in_flight)
        if self.mode is Mode.ALIGNED_TIMEOUT:
            return CheckpointOptions.aligned_with_timeout(
                self.alignment_timeout_ms, self.held_bytes_budget, self.in_flight
            )
        if self.mode is Mode.AT_LEAST_ONCE:
            return CheckpointOptions.at_least_once()
        return CheckpointOptions.aligned()

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data.update(mode=self.mode.value, in_flight=self.in_flight.value, state_snapshots=self.state_snapshots.value)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of setting ``name``: what a command-line option that
        sets it takes when not given (and says it takes)."""
        return {f.name: f.default for f in dataclasses.fields(cls)}[name]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown job settings: {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> JobSettings:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"job settings are not JSON: {exc}") from exc
        return cls.from_dict(data)


def check_store_uri(uri: str) -> None:
    """A ``ConfigError`` saying what to give instead, for a store URI that
    cannot mean what its writer meant: ``file://name`` reads ``name`` as a
    host and would be the current directory."""
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
        meant = f"{parsed.netloc}{parsed.path}"
        raise ConfigError(
            f"store {uri!r}: after file:// comes a host, so {parsed.netloc!r} is not read as a directory; "
            f"give an absolute path with three slashes (file:///path/to/{meant}) or a plain path ({meant})"
        )
