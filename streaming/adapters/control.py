"""The job's control topic: how the coordinator and the tasks talk.

One partition, so every reader sees the events in one order.  Events are
JSON, one frozen dataclass per kind (``ControlKind``), each a ``ControlEvent``
encoded and decoded here and nowhere else:

- ``trigger``: the coordinator injected barrier n; the ingress offsets it got
  and the barrier's headers (an unaligned task may snapshot on it);
- ``announce``: a task forwarded barrier n; the offsets on its outputs;
- ``ready``: a task's query runs (the coordinator triggers once all are);
  ``replaying``: records of restored channel state it has still to read;
  ``endpoint``: where its worker process serves its metrics;
- ``replayed``: a restored task has processed its channel state again;
- ``progress``: a task's position on each input channel, twice a second (lag);
- ``ack`` / ``decline``: a task's snapshot is uploaded, or it cannot take one;
- ``complete`` / ``abort``: the coordinator's verdict on checkpoint n (an
  abort with the checkpoints failed in a row and how many the job tolerates);
- ``committed``: a sink task made epoch n visible;
- ``lease``: the runner is alive, and which worker runs each remote group in
  which generation (``streaming.engine.remote.membership``);
- ``heartbeat``: a remote worker (``spark-abs worker``) is alive.

Every event but the heartbeat carries the generation it belongs to
(``belongs_to``); readers ignore other generations.

Every event is signed with the job's key (``streaming.api.job_key``): an
HMAC over the topic and the event's bytes, in the record's ``abs.sig``
header.  A reader acts on no event it cannot verify: unsigned, wrongly
signed and malformed records are skipped, logged with their offset and
reason, and counted (``ControlTopic.rejected``, and a metric by the engine)."""

from __future__ import annotations

import collections
import copy
import enum
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from barriers.failures import CheckpointFailure
from streaming.adapters import kafka_clients
from streaming.adapters.kafka_admin import admin_client, create_topic
from streaming.adapters.kafka_io import DELIVERY_BOUND_S, close_producer, patiently, producer
from streaming.adapters.records import Headers
from streaming.adapters.snapshots.format import TaskCheckpointMetrics, TaskSnapshot
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.errors import ConfigError, KafkaUnavailableError, parse_choice

__all__ = [
    "ControlKind",
    "ControlEvent",
    "Ready",
    "Replayed",
    "Progress",
    "Trigger",
    "Announce",
    "Ack",
    "Decline",
    "Complete",
    "Abort",
    "Committed",
    "Lease",
    "Heartbeat",
    "ControlTopic",
    "control_topic_name",
    "control_jobs",
    "send_event",
    "announced_barrier",
    "SIGNATURE_HEADER",
    "verified_event",
    "RejectedEvent",
]

log = logging.getLogger(__name__)

# the header that carries an event's signature
SIGNATURE_HEADER = "abs.sig"
# the rejected records of a kind a reader logs one by one, before it logs every hundredth
LOGGED_REJECTIONS = 5


# a job's control topic: spark-abs.<job>.control
_CONTROL_TOPIC = ("spark-abs.", ".control")


def control_topic_name(job: str) -> str:
    prefix, suffix = _CONTROL_TOPIC
    return f"{prefix}{job}{suffix}"


def control_jobs(kafka: KafkaAccess) -> list[str]:
    """The jobs with a control topic on ``kafka`` (each started once there), by name."""
    admin = admin_client(kafka)
    try:
        topics = admin.list_topics()
    except KafkaError as exc:
        raise KafkaUnavailableError(f"listing the topics failed: {exc}") from exc
    finally:
        admin.close()
    prefix, suffix = _CONTROL_TOPIC
    return sorted(t[len(prefix) : -len(suffix)] for t in topics if t.startswith(prefix) and t.endswith(suffix))


class ControlKind(enum.StrEnum):
    """What a control event says (see the module docstring)."""

    READY = "ready"
    REPLAYED = "replayed"
    PROGRESS = "progress"
    TRIGGER = "trigger"
    ANNOUNCE = "announce"
    ACK = "ack"
    DECLINE = "decline"
    COMPLETE = "complete"
    ABORT = "abort"
    COMMITTED = "committed"
    LEASE = "lease"
    HEARTBEAT = "heartbeat"

    @classmethod
    def parse(cls, value: object) -> ControlKind:
        """The kind named ``value``; a ``ConfigError`` naming the known ones otherwise."""
        return parse_choice(cls, value, "control event kind")


# ---------------------------------------------------------------- the events
#
# On the wire every event is one JSON object: ``kind``, ``checkpoint_id`` (0
# when the event is about none), ``task`` (the sender: a task, "" for the
# coordinator, the runner for a lease, the group for a heartbeat) and
# ``payload`` (every other field, the generation among them).  Each kind is a
# frozen dataclass below; ``_FIELDS`` says how each payload field is read
# back.  Nothing outside this module reads a payload.


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _str_to_int(value: object) -> dict[str, int]:
    return {str(k): int(v) for k, v in dict(value or {}).items()}  # type: ignore[call-overload]


def _str_to_str(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(value or {}).items()}  # type: ignore[call-overload]


def _mapping(value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a JSON object, got {value!r}")
    return dict(value)


def _wire(value: Any) -> Any:
    """A field's value as JSON: failures by name, a snapshot and its metrics
    as their stored JSON, mappings as objects, sequences as lists."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, TaskSnapshot):
        return value.as_json()
    if isinstance(value, TaskCheckpointMetrics):
        return value.to_json()
    if isinstance(value, Mapping):
        return {str(k): _wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_wire(v) for v in value]
    return value


_REQUIRED = object()


@dataclass(frozen=True, slots=True)
class ControlEvent:
    """One message on the job's control topic: a subclass per ``ControlKind``
    (see the module docstring).  ``offset`` is the event's position on the
    topic, set when it is read."""

    kind: ClassVar[ControlKind]
    # the field that travels as the envelope's ``task`` (the sender)
    _sender: ClassVar[str] = "task"
    offset: int = field(default=-1, kw_only=True, compare=False, repr=False)

    def belongs_to(self, generation: int | None) -> bool:
        """Whether the event is of ``generation`` (a heartbeat is of none)."""
        return getattr(self, "generation", None) == generation

    def encode(self) -> bytes:
        envelope = {"checkpoint_id", self._sender, "offset"}
        payload = {f.name: _wire(getattr(self, f.name)) for f in fields(self) if f.name not in envelope}
        return json.dumps(
            {
                "kind": self.kind.value,
                "checkpoint_id": getattr(self, "checkpoint_id", 0),
                "task": getattr(self, self._sender, ""),
                "payload": payload,
            },
            sort_keys=True,
        ).encode()

    @staticmethod
    def decode(data: bytes, offset: int = -1) -> ControlEvent:
        """The event ``data`` encodes; a ValueError with the reason for
        anything that is not a well-formed control event."""
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"control message is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or not isinstance(raw.get("checkpoint_id"), int):
            raise ValueError("control message lacks an integer checkpoint_id")
        try:
            kind = ControlKind.parse(raw.get("kind"))
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        cls = _KINDS[kind]
        sender = str(raw.get("task", ""))
        payload = raw.get("payload") or {}
        values: dict[str, Any] = {}
        try:
            if not isinstance(payload, dict):
                raise TypeError(f"payload is not a JSON object: {payload!r}")
            for name, (read, default) in _FIELDS[kind].items():
                if name == "checkpoint_id":
                    values[name] = raw["checkpoint_id"]
                elif name == cls._sender:
                    values[name] = sender
                elif payload.get(name) is not None:
                    values[name] = read(payload[name])
                elif default is _REQUIRED:
                    raise KeyError(name)
                else:
                    values[name] = copy.copy(default)
            return cls(**values, offset=offset)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed {kind.value} from {sender!r}: {exc!r}") from exc


class _Announcement:
    """A barrier's position and headers, as the trigger and announce events carry them."""

    __slots__ = ()
    barrier: Mapping[str, str]

    def barrier_headers(self) -> list[tuple[str, bytes]]:
        """The barrier's headers (``announced_barrier`` the other way)."""
        return [(name, str(value).encode()) for name, value in self.barrier.items()]


@dataclass(frozen=True, slots=True)
class Ready(ControlEvent):
    """A task's query runs (the coordinator triggers once all do);
    ``replaying``: records of restored channel state it has still to read;
    ``endpoint``: where its worker process serves its metrics (host:port, ""
    when it serves none)."""

    kind = ControlKind.READY
    task: str
    generation: int
    replaying: int = 0
    endpoint: str = ""


@dataclass(frozen=True, slots=True)
class Replayed(ControlEvent):
    """A restored task processed the channel state of ``checkpoint_id`` again."""

    kind = ControlKind.REPLAYED
    task: str
    generation: int
    checkpoint_id: int = 0
    records: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Progress(ControlEvent):
    """A task's next offset on each input channel, and the records it processed."""

    kind = ControlKind.PROGRESS
    task: str
    generation: int
    positions: Mapping[str, int] = field(default_factory=dict)
    records: int = 0


@dataclass(frozen=True, slots=True)
class Trigger(_Announcement, ControlEvent):
    """The coordinator injected barrier ``checkpoint_id``: the offset each
    ingress channel gave it, and its headers."""

    kind = ControlKind.TRIGGER
    checkpoint_id: int
    generation: int
    offsets: Mapping[str, int] = field(default_factory=dict)
    barrier: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Announce(_Announcement, ControlEvent):
    """A task forwarded barrier ``checkpoint_id``: its offset on each output channel."""

    kind = ControlKind.ANNOUNCE
    checkpoint_id: int
    task: str
    generation: int
    barrier: Mapping[str, str] = field(default_factory=dict)
    offsets: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Ack(ControlEvent):
    """A task's snapshot of ``checkpoint_id`` is uploaded: its metadata (the
    ``TaskSnapshot`` the coordinator writes into the manifest; None only in
    an acknowledgement that carries none, which cannot complete a
    checkpoint) and what the task measured of it."""

    kind = ControlKind.ACK
    checkpoint_id: int
    task: str
    generation: int
    snapshot: TaskSnapshot | None = None
    metrics: TaskCheckpointMetrics = field(default_factory=TaskCheckpointMetrics)


@dataclass(frozen=True, slots=True)
class Decline(ControlEvent):
    """A task cannot take its snapshot of ``checkpoint_id``."""

    kind = ControlKind.DECLINE
    checkpoint_id: int
    task: str
    generation: int
    reason: CheckpointFailure = CheckpointFailure.DECLINED
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Complete(ControlEvent):
    """Checkpoint ``checkpoint_id`` is complete: sinks commit its epoch."""

    kind = ControlKind.COMPLETE
    checkpoint_id: int
    generation: int


@dataclass(frozen=True, slots=True)
class Abort(ControlEvent):
    """The coordinator gave checkpoint ``checkpoint_id`` up: every task lets
    it go.  It says how many checkpoints have failed in a row, this one
    included when it counts (``streaming.engine.job.liveness``), and how many
    the job tolerates before it restores (None: an older runner's abort)."""

    kind = ControlKind.ABORT
    checkpoint_id: int
    generation: int
    reason: CheckpointFailure = CheckpointFailure.USER
    detail: str = "aborted by the coordinator"
    task: str = ""
    failed_in_a_row: int | None = None
    tolerable_failed_checkpoints: int | None = None


@dataclass(frozen=True, slots=True)
class Committed(ControlEvent):
    """A sink task made its epochs through ``checkpoint_id`` visible."""

    kind = ControlKind.COMMITTED
    checkpoint_id: int
    task: str
    generation: int
    epochs: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Lease(ControlEvent):
    """What the runner tells remote workers (``streaming.engine.remote.membership``):
    the generation and the checkpoint it starts from, the pipeline, the job's
    settings and scale, each remote group's tasks and the incarnation that is
    its member."""

    kind = ControlKind.LEASE
    _sender = "runner"
    runner: str
    generation: int
    checkpoint: int | None
    pipeline: str
    job: str
    settings: str  # JobSettings as JSON
    scale: Mapping[str, Any] | None  # the job's Scale when other than declared
    groups: Mapping[str, list[str]]  # remote group -> its tasks
    members: Mapping[str, str]  # remote group -> the incarnation running it in this generation
    timeout_s: float
    ended: bool = False  # the runner stopped: members stop their tasks now
    note: str = ""  # why a lease names no members (a pause), for the workers' messages
    # counts the runner's publications of leases up: a copy of an earlier one, appended again
    # by someone who can write to the topic, is not taken for news (0: not counted)
    sequence: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat(ControlEvent):
    """A remote worker (``spark-abs worker``) is alive: its group,
    incarnation and host, and the generation its tasks run in (None while idle)."""

    kind = ControlKind.HEARTBEAT
    _sender = "group"
    group: str
    incarnation: str
    host: str
    running: int | None
    # counts this incarnation's heartbeats up: a copy of an earlier one is not taken for news
    sequence: int = 0


def _failure(default: CheckpointFailure) -> Callable[[object], CheckpointFailure]:
    return lambda name: CheckpointFailure.parse(name, default)


_KINDS: dict[ControlKind, type[ControlEvent]] = {
    cls.kind: cls
    for cls in (
        Ready,
        Replayed,
        Progress,
        Trigger,
        Announce,
        Ack,
        Decline,
        Complete,
        Abort,
        Committed,
        Lease,
        Heartbeat,
    )
}

# how each field of each kind is read back: (conversion, default or _REQUIRED)
_READERS: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "task": (str, ""),
    "checkpoint_id": (int, 0),
    "generation": (int, _REQUIRED),
    "replaying": (int, 0),
    "endpoint": (str, ""),
    "records": (int, 0),
    "seconds": (float, 0.0),
    "positions": (_str_to_int, {}),
    "offsets": (_str_to_int, {}),
    "barrier": (_str_to_str, {}),
    "snapshot": (TaskSnapshot.from_json_object, None),
    "metrics": (TaskCheckpointMetrics.from_json, TaskCheckpointMetrics()),
    "reason": (_failure(CheckpointFailure.DECLINED), CheckpointFailure.DECLINED),
    "detail": (str, ""),
    "epochs": (lambda v: tuple(int(e) for e in v), ()),
    "runner": (str, ""),
    "checkpoint": (_optional_int, None),
    "pipeline": (str, _REQUIRED),
    "job": (str, _REQUIRED),
    "settings": (str, _REQUIRED),
    "scale": (_mapping, None),
    "groups": (lambda v: {str(g): [str(t) for t in tasks] for g, tasks in _mapping(v).items()}, _REQUIRED),
    "members": (_str_to_str, {}),
    "timeout_s": (float, _REQUIRED),
    "ended": (bool, False),
    "note": (str, ""),
    "sequence": (int, 0),
    "group": (str, ""),
    "incarnation": (str, _REQUIRED),
    "host": (str, "?"),
    "running": (_optional_int, None),
    "failed_in_a_row": (_optional_int, None),
    "tolerable_failed_checkpoints": (_optional_int, None),
}
_FIELDS: dict[ControlKind, dict[str, tuple[Callable[[Any], Any], Any]]] = {
    kind: {f.name: _READERS[f.name] for f in fields(cls) if f.name != "offset"} for kind, cls in _KINDS.items()
}
_FIELDS[ControlKind.ABORT]["reason"] = (_failure(CheckpointFailure.USER), CheckpointFailure.USER)
_FIELDS[ControlKind.ABORT]["detail"] = (str, "aborted by the coordinator")


def send_event(
    producer: KafkaProducer,
    topic: str,
    event: ControlEvent,
    key: JobKey,
    timeout_s: float = DELIVERY_BOUND_S,
    what: str | None = None,
) -> int:
    """Send ``event``, signed with ``key``, to the control topic ``topic``
    on ``producer`` and wait until Kafka has it: while the broker is
    unreachable, up to ``timeout_s``, saying so (``kafka_io.patiently``);
    then a ``KafkaUnavailableError`` naming ``what`` (by default the event's
    kind and checkpoint).  Returns its offset."""
    checkpoint_id = getattr(event, "checkpoint_id", None)
    what = what or (
        f"{event.kind.value} of checkpoint {checkpoint_id}" if checkpoint_id else f"a {event.kind.value} event"
    )
    value = event.encode()
    signature = key.sign(topic.encode(), value).encode()
    try:
        future = producer.send(topic, value=value, headers=[(SIGNATURE_HEADER, signature)], partition=0)
    except KafkaError as exc:
        raise KafkaUnavailableError(f"publishing {what} failed: {exc}") from exc
    return patiently(future.get, what, timeout_s).offset


class RejectedEvent(ValueError):
    """A record of the control topic that no reader may act on: ``kind`` is
    ``unsigned``, ``signature`` (wrongly signed) or ``malformed``."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


def verified_event(
    topic: str, key: JobKey, value: bytes | None, headers: Headers | None, offset: int = -1
) -> ControlEvent:
    """The event a record of the control topic ``topic`` carries, once its
    signature is verified with ``key``; a ``RejectedEvent`` with the reason
    for anything else."""
    signatures = [v for n, v in headers or () if n == SIGNATURE_HEADER]
    if not signatures:
        raise RejectedEvent("unsigned", f"unsigned (no {SIGNATURE_HEADER} header): not written by job {key.job}")
    if len(signatures) > 1 or not key.verify(signatures[0], topic.encode(), value or b""):
        raise RejectedEvent("signature", f"the signature does not match job {key.job}'s key")
    try:
        return ControlEvent.decode(value or b"", offset)
    except ValueError as exc:  # signed, but not an event this version reads
        raise RejectedEvent("malformed", str(exc)) from exc


class ControlTopic:
    """The job's control topic: one partition, so every reader sees events in
    one order.  ``publish`` is synchronous (returns the event's offset);
    ``poll`` returns the events after the last one read that verify with
    the job's key, skipping (and logging, and counting in ``rejected``, by
    reason, and through ``on_rejected``) the others."""

    def __init__(
        self,
        kafka: KafkaAccess,
        job: str,
        key: JobKey,
        *,
        start_at: int = 0,
        delivery_timeout_s: float = DELIVERY_BOUND_S,
        on_rejected: Callable[[str], None] | None = None,
    ):
        if key.job != job:
            raise ConfigError(f"the control topic of job {job} needs that job's key, not job {key.job}'s")
        self.topic = control_topic_name(job)
        self.key = key
        self.delivery_timeout_s = delivery_timeout_s
        self.rejected: collections.Counter[str] = collections.Counter()
        self._on_rejected = on_rejected
        create_topic(kafka, self.topic, 1)
        self._producer = producer(kafka, delivery_timeout_s=delivery_timeout_s)
        try:
            self._consumer = kafka_clients.consumer(
                kafka, enable_auto_commit=False, client_id=f"spark-abs-control-{job}"
            )
        except KafkaUnavailableError:  # kafka_clients said why
            close_producer(self._producer, f"control topic {self.topic}")
            raise
        self._tp = TopicPartition(self.topic, 0)
        self._consumer.assign([self._tp])
        self._consumer.seek(self._tp, start_at)

    def seek_to_end(self) -> int:
        """Skip everything published so far; returns the position."""
        try:
            end = self._consumer.end_offsets([self._tp])[self._tp]
        except KafkaError as exc:
            raise KafkaUnavailableError(f"cannot find the end of the control topic {self.topic}: {exc}") from exc
        self._consumer.seek(self._tp, end)
        return end

    def publish(self, event: ControlEvent, timeout_s: float | None = None) -> int:
        """Send ``event`` and wait until Kafka has it (``send_event``), at most
        ``timeout_s`` (default: the delivery timeout)."""
        return send_event(
            self._producer, self.topic, event, self.key, self.delivery_timeout_s if timeout_s is None else timeout_s
        )

    def poll(self, timeout_s: float = 0.0) -> list[ControlEvent]:
        events = []
        for records in self._consumer.poll(timeout_ms=int(timeout_s * 1000)).values():
            for record in records:
                try:
                    events.append(verified_event(self.topic, self.key, record.value, record.headers, record.offset))
                except RejectedEvent as rejected:
                    self._reject(record.offset, rejected)
        return events

    def _reject(self, offset: int, rejected: RejectedEvent) -> None:
        self.rejected[rejected.kind] += 1
        if self._on_rejected is not None:
            self._on_rejected(rejected.kind)
        count = self.rejected[rejected.kind]
        # a flood of forged records is not a flood of log lines: the first few, then every hundredth
        if count <= LOGGED_REJECTIONS or count % 100 == 0:
            log.warning(
                "control topic %s offset %d: rejected: %s (%d %s so far%s)",
                self.topic,
                offset,
                rejected,
                count,
                rejected.kind,
                "; every hundredth is logged from here on" if count == LOGGED_REJECTIONS else "",
            )

    def wait_for(self, predicate: Callable[[ControlEvent], bool], timeout_s: float) -> list[ControlEvent]:
        """Poll until an event satisfies ``predicate``; return all events read."""
        seen: list[ControlEvent] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = self.poll(0.2)
            seen.extend(batch)
            if any(predicate(e) for e in batch):
                return seen
        return seen

    def close(self) -> None:
        close_producer(self._producer, f"control topic {self.topic}")
        self._consumer.close()


def announced_barrier(headers: Headers) -> dict[str, str]:
    """A barrier's headers as JSON-friendly text, for the ``trigger`` and
    ``announce`` events; ``announced_headers`` is the way back."""
    return {name: value.decode() for name, value in headers}
