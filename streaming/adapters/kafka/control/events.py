"""The control topic's messages: one frozen dataclass per kind
(``ControlKind``), each a ``ControlEvent`` encoded and decoded here and
nowhere else:

- ``trigger``: the coordinator injected barrier n; the ingress offsets it got
  and the barrier's fields (an unaligned task may snapshot on it), unsigned:
  the event's own signature vouches for them, and a barrier's signature here
  would be one any reader of the topic could copy onto a channel;
- ``announce``: a task forwarded barrier n; the offsets on its outputs;
- ``ready``: a task's query runs (the coordinator triggers once all are);
  ``replaying``: records of restored channel state it has still to read;
  ``endpoint``: where its worker process serves its metrics;
- ``replayed``: a restored task has processed its channel state again;
- ``progress``: a task's position on each input channel, twice a second (lag),
  numbered: the runner's sign that the task's process is alive;
- ``ack`` / ``decline``: a task's snapshot is uploaded, or it cannot take one;
- ``complete`` / ``abort``: the coordinator's verdict on checkpoint n (an
  abort with the checkpoints failed in a row and how many the job tolerates);
- ``committed``: a sink task made epoch n visible;
- ``lease``: the runner is alive, and which worker runs each remote group in
  which generation (``streaming.engine.remote.membership``);
- ``heartbeat``: a remote worker (``spark-abs worker``) is alive, answering
  the lease of the runner it follows.

Progress events, leases and heartbeats, the events that say their sender is
alive, are numbered by their sender from 1; a reader takes only a number
higher than the last it read from that sender as news, so a copy appended
again by someone who can write to the topic keeps no one alive.

Every event but the heartbeat carries the generation it belongs to
(``belongs_to``); readers ignore other generations.  How events are signed
is ``signing``'s business, how they travel ``transport``'s."""

from __future__ import annotations

import copy
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from barriers.failures import CheckpointFailure
from barriers.messages import UNSIGNED, Barrier, encode
from streaming.adapters.snapshots.format import TaskCheckpointMetrics, TaskSnapshot
from streaming.errors import ConfigError, parse_choice

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
    "announced_barrier",
]


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
    """A task's next offset on each input channel, the records it processed,
    and those its stage's code raised on, set aside (``set_aside``).  It is
    how the runner knows the task's process is alive: ``sequence`` counts a
    task's progress events up from 1 in its generation, and only a higher
    one than the runner read last is news (a copy appended again is not)."""

    kind = ControlKind.PROGRESS
    task: str
    generation: int
    positions: Mapping[str, int] = field(default_factory=dict)
    records: int = 0
    set_aside: int = 0
    sequence: int = 0


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
    # counts the runner's publications of leases up from 1: a copy of an earlier one, appended again
    # by someone who can write to the topic, is not taken for news
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
    # counts this incarnation's heartbeats up from 1: a copy of an earlier one is not taken for news
    sequence: int = 0
    # the incarnation of the runner whose lease the worker follows ("" before it heard one): a runner
    # takes only heartbeats that answer it, so old ones appended again after it restarted are no news
    runner: str = ""


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
    "set_aside": (int, 0),
    "tolerable_failed_checkpoints": (_optional_int, None),
}


_FIELDS: dict[ControlKind, dict[str, tuple[Callable[[Any], Any], Any]]] = {
    kind: {f.name: _READERS[f.name] for f in fields(cls) if f.name != "offset"} for kind, cls in _KINDS.items()
}


_FIELDS[ControlKind.ABORT]["reason"] = (_failure(CheckpointFailure.USER), CheckpointFailure.USER)


_FIELDS[ControlKind.ABORT]["detail"] = (str, "aborted by the coordinator")


def announced_barrier(barrier: Barrier) -> dict[str, str]:
    """``barrier``'s fields as JSON-friendly text, for the ``trigger`` and
    ``announce`` events (``barrier_headers`` is the way back): unsigned and
    bound to no channel, so nothing in an event verifies as a barrier on a
    channel of the job."""
    return {name: value.decode() for name, value in encode(barrier, key=UNSIGNED)}
