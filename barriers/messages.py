"""The protocol's messages: channel ids, checkpoint options, barriers (the
seeds' "markers") and cancellations, and their encoding as Kafka-header-friendly
``(str, bytes)`` pairs.

Decoding validates everything: a record whose headers claim to be a barrier
but are incomplete, malformed, of another job, written for another channel
than the one it was read from or (when the job signs its barriers) not signed
with the job's key is rejected with a ``BarrierRejected`` that says why.

A signed barrier is bound to its channel: the signature covers the
``abs.channel`` header, so a copy appended to another channel, ahead of the
barrier the upstream task writes there, is rejected instead of cutting the
channel where no task cut it.  Nothing here does I/O."""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, overload

from barriers.errors import BarrierRejected
from barriers.headers import (
    ALIGNMENT_HEADER,
    ALIGNMENT_TIMEOUT_HEADER,
    CHANNEL_HEADER,
    CHECKPOINT_HEADER,
    GENERATION_HEADER,
    HEADER_PREFIX,
    HELD_BUDGET_HEADER,
    IN_FLIGHT_HEADER,
    JOB_HEADER,
    KIND_HEADER,
    REASON_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
)

__all__ = [
    "ChannelId",
    "Alignment",
    "InFlightFormat",
    "CheckpointOptions",
    "Barrier",
    "CancelBarrier",
    "BarrierRejected",
    "is_control",
    "encode",
    "decode",
    "UNSIGNED",
    "Unsigned",
]


class Unsigned(enum.Enum):
    """What a writer or reader is given instead of a key when nothing is signed or verified, said
    explicitly (the simulator, unit tests, tools without the job's secret): no key is ever
    left out by default."""

    UNSIGNED = "unsigned"


UNSIGNED = Unsigned.UNSIGNED


def _key(key: bytes | Unsigned) -> bytes | None:
    """``key``'s bytes, or None for ``UNSIGNED``; a ``TypeError`` for anything else (None included)."""
    if isinstance(key, Unsigned):
        return None
    if not isinstance(key, bytes) or not key:
        raise TypeError("a key is the job's barrier key (bytes), or UNSIGNED said explicitly")
    return key


@dataclass(frozen=True, slots=True, order=True)
class ChannelId:
    """One input channel: a Kafka (topic, partition), FIFO as Chandy–Lamport needs."""

    topic: str
    partition: int

    def __post_init__(self) -> None:
        if not self.topic or ":" in self.topic:
            raise ValueError(f"channel topic {self.topic!r} must be non-empty and contain no ':'")
        if self.partition < 0:
            raise ValueError(f"channel {self.topic}: partition {self.partition} is negative")

    def __str__(self) -> str:
        return f"{self.topic}:{self.partition}"

    @classmethod
    def parse(cls, text: str) -> ChannelId:
        topic, sep, partition = str(text).rpartition(":")
        if not sep or not partition.isdigit():
            raise ValueError(f"channel {text!r} is not 'topic:partition'")
        return cls(topic, int(partition))


class Alignment(enum.Enum):
    """How a task lines up barrier n across its inputs (docs/architecture/index.md, "Modes")."""

    ALIGNED = "aligned"  # block each channel at its barrier until all came
    UNALIGNED = "unaligned"  # snapshot at the first barrier, in-flight records become channel state
    AT_LEAST_ONCE = "at-least-once"  # no blocking; replay may duplicate


class InFlightFormat(enum.Enum):
    """How unaligned channel state is kept."""

    RANGE = "range"  # the offset range only: Kafka keeps the records
    RECORDS = "records"  # a copy of the records in the snapshot


@dataclass(frozen=True, slots=True)
class CheckpointOptions:
    """Options a barrier carries, so every task handles checkpoint n the same way.

    Build them with the named constructors; ``alignment_timeout_ms`` and
    ``held_bytes_budget`` only make sense with ``ALIGNED`` (a checkpoint that
    passes either switches to unaligned)."""

    alignment: Alignment = Alignment.ALIGNED
    alignment_timeout_ms: int | None = None
    held_bytes_budget: int | None = None
    in_flight: InFlightFormat = InFlightFormat.RANGE

    def __post_init__(self) -> None:
        for name in ("alignment_timeout_ms", "held_bytes_budget"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.alignment is not Alignment.ALIGNED:
                raise ValueError(f"{name} applies to aligned checkpoints only, not {self.alignment.value}")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")

    @classmethod
    def aligned(cls) -> CheckpointOptions:
        return cls(Alignment.ALIGNED)

    @classmethod
    def unaligned(cls, in_flight: InFlightFormat = InFlightFormat.RANGE) -> CheckpointOptions:
        return cls(Alignment.UNALIGNED, in_flight=in_flight)

    @classmethod
    def aligned_with_timeout(
        cls,
        timeout_ms: int | None = None,
        held_bytes_budget: int | None = None,
        in_flight: InFlightFormat = InFlightFormat.RANGE,
    ) -> CheckpointOptions:
        if timeout_ms is None and held_bytes_budget is None:
            raise ValueError("aligned_with_timeout needs a timeout, a held-bytes budget or both")
        return cls(Alignment.ALIGNED, timeout_ms, held_bytes_budget, in_flight)

    @classmethod
    def at_least_once(cls) -> CheckpointOptions:
        return cls(Alignment.AT_LEAST_ONCE)

    @property
    def may_switch_to_unaligned(self) -> bool:
        return self.alignment_timeout_ms is not None or self.held_bytes_budget is not None

    def describe(self) -> str:
        text = self.alignment.value
        if self.may_switch_to_unaligned:
            limits = []
            if self.alignment_timeout_ms is not None:
                limits.append(f"{self.alignment_timeout_ms} ms")
            if self.held_bytes_budget is not None:
                limits.append(f"{self.held_bytes_budget} held bytes")
            text += f" (unaligned after {' or '.join(limits)})"
        return text


@dataclass(frozen=True, slots=True)
class Barrier:
    """Barrier n of one generation: everything before it on a channel belongs
    to checkpoint n, everything after it to later ones."""

    checkpoint_id: int
    generation: int = 0
    options: CheckpointOptions = field(default_factory=CheckpointOptions)
    timestamp_ms: int = 0
    job: str = ""

    def __post_init__(self) -> None:
        if self.checkpoint_id < 1:
            raise ValueError(f"checkpoint id must be positive, got {self.checkpoint_id}")
        if self.generation < 0:
            raise ValueError(f"generation must be non-negative, got {self.generation}")

    def with_options(self, options: CheckpointOptions) -> Barrier:
        return replace(self, options=options)

    def __str__(self) -> str:
        return f"barrier {self.checkpoint_id} (generation {self.generation}, {self.options.describe()})"


@dataclass(frozen=True, slots=True)
class CancelBarrier:
    """Checkpoint n is abandoned upstream; tasks stop waiting for it."""

    checkpoint_id: int
    generation: int = 0
    reason: str = ""
    job: str = ""

    def __str__(self) -> str:
        return f"cancellation of checkpoint {self.checkpoint_id} (generation {self.generation}): {self.reason}"


Headers = Iterable[tuple[str, bytes | None]]


def is_control(headers: Headers | Mapping[str, bytes | None] | None) -> bool:
    """Whether a record's headers mark it as a barrier or a cancellation."""
    items = headers.items() if isinstance(headers, Mapping) else (headers or ())
    return any(key == KIND_HEADER for key, _ in items)


def encode(
    message: Barrier | CancelBarrier, *, key: bytes | Unsigned, channel: ChannelId | None = None
) -> list[tuple[str, bytes]]:
    """The headers of the Kafka record that carries ``message`` on ``channel``;
    signed with ``key`` (HMAC-SHA256 over the other headers, the channel's
    included) unless it is ``UNSIGNED``.  A signed record names its channel:
    without one, a copy of it would verify on every channel of the job."""
    signing = _key(key)
    if isinstance(message, Barrier):
        fields: dict[str, str] = {
            KIND_HEADER: "barrier",
            CHECKPOINT_HEADER: str(message.checkpoint_id),
            GENERATION_HEADER: str(message.generation),
            JOB_HEADER: message.job,
            ALIGNMENT_HEADER: message.options.alignment.value,
            IN_FLIGHT_HEADER: message.options.in_flight.value,
            TIMESTAMP_HEADER: str(message.timestamp_ms),
        }
        if message.options.alignment_timeout_ms is not None:
            fields[ALIGNMENT_TIMEOUT_HEADER] = str(message.options.alignment_timeout_ms)
        if message.options.held_bytes_budget is not None:
            fields[HELD_BUDGET_HEADER] = str(message.options.held_bytes_budget)
    elif isinstance(message, CancelBarrier):
        fields = {
            KIND_HEADER: "cancel",
            CHECKPOINT_HEADER: str(message.checkpoint_id),
            GENERATION_HEADER: str(message.generation),
            JOB_HEADER: message.job,
            REASON_HEADER: message.reason,
        }
    else:
        raise TypeError(f"cannot encode {type(message).__name__} as a control record")
    if channel is not None:
        fields[CHANNEL_HEADER] = str(channel)
    elif signing is not None:
        raise ValueError(f"a signed {type(message).__name__} names the channel it is written to")
    headers = [(name, value.encode()) for name, value in fields.items()]
    if signing is not None:
        headers.append((SIGNATURE_HEADER, _sign(headers, signing).encode()))
    return headers


def decode(
    headers: Headers | Mapping[str, bytes | None],
    *,
    job: str | None = None,
    key: bytes | Unsigned,
    channel: ChannelId | None = None,
) -> Barrier | CancelBarrier:
    """The barrier or cancellation in ``headers``, read from ``channel``;
    ``BarrierRejected`` with the reason when they are not a valid one (for
    ``job``, written for ``channel``, signed with ``key``; ``UNSIGNED``:
    signatures are not checked).  With a key, a record that names no channel
    is rejected as well."""
    verifying = _key(key)
    items = list(headers.items() if isinstance(headers, Mapping) else headers)
    fields: dict[str, str] = {}
    for name, raw in items:
        if not name.startswith(HEADER_PREFIX):
            continue
        if name in fields:
            raise BarrierRejected(f"header {name} appears twice")
        try:
            fields[name] = (raw or b"").decode("utf-8")
        except UnicodeDecodeError:
            raise BarrierRejected(f"header {name} is not UTF-8") from None
    kind = fields.get(KIND_HEADER)
    if kind not in ("barrier", "cancel"):
        raise BarrierRejected(f"{KIND_HEADER} is {kind!r}, expected 'barrier' or 'cancel'")
    if verifying is not None:
        signature = fields.pop(SIGNATURE_HEADER, None)
        if signature is None:
            raise BarrierRejected("unsigned, but this job signs its barriers")
        unsigned = [(n, v or b"") for n, v in items if n.startswith(HEADER_PREFIX) and n != SIGNATURE_HEADER]
        # bytes on both sides: compare_digest refuses str that is not ASCII, and a writer chooses the header
        if not hmac.compare_digest(signature.encode(), _sign(unsigned, verifying).encode()):
            raise BarrierRejected("signature does not match the job's key")
    record_job = fields.get(JOB_HEADER, "")
    if job is not None and record_job != job:
        raise BarrierRejected(f"belongs to job {record_job!r}, not {job!r}")
    if channel is not None:
        named = fields.get(CHANNEL_HEADER)
        if named is None and verifying is not None:
            raise BarrierRejected(f"names no channel, but this job binds its barriers to theirs ({channel})")
        if named is not None and named != str(channel):
            raise BarrierRejected(f"written for channel {named!r}, read from {channel}: a copy, not this channel's")
    checkpoint_id = _integer(fields, CHECKPOINT_HEADER, minimum=1)
    generation = _integer(fields, GENERATION_HEADER, minimum=0)
    if kind == "cancel":
        return CancelBarrier(checkpoint_id, generation, fields.get(REASON_HEADER, ""), record_job)
    try:
        alignment = Alignment(fields.get(ALIGNMENT_HEADER))
        in_flight = InFlightFormat(fields.get(IN_FLIGHT_HEADER, InFlightFormat.RANGE.value))
    except ValueError as exc:
        raise BarrierRejected(f"bad options: {exc}") from None
    timeout = _integer(fields, ALIGNMENT_TIMEOUT_HEADER, minimum=0, required=False)
    budget = _integer(fields, HELD_BUDGET_HEADER, minimum=0, required=False)
    try:
        options = CheckpointOptions(alignment, timeout, budget, in_flight)
    except ValueError as exc:
        raise BarrierRejected(f"bad options: {exc}") from None
    timestamp = _integer(fields, TIMESTAMP_HEADER, minimum=0, required=False) or 0
    return Barrier(checkpoint_id, generation, options, timestamp, record_job)


@overload
def _integer(fields: Mapping[str, str], name: str, *, minimum: int, required: Literal[True] = True) -> int: ...


@overload
def _integer(fields: Mapping[str, str], name: str, *, minimum: int, required: Literal[False]) -> int | None: ...


def _integer(fields: Mapping[str, str], name: str, *, minimum: int, required: bool = True) -> int | None:
    text = fields.get(name)
    if text is None:
        if required:
            raise BarrierRejected(f"header {name} is missing")
        return None
    if not text.isascii() or not text.isdigit():
        raise BarrierRejected(f"header {name} is {text!r}, not a non-negative integer")
    value = int(text)
    if value < minimum:
        raise BarrierRejected(f"header {name} is {value}, below {minimum}")
    return value


def _sign(headers: Iterable[tuple[str, bytes]], key: bytes) -> str:
    """HMAC-SHA256 over the headers sorted by name, each name and value
    length-prefixed: no two sets of headers give the same input (a value
    holding a NUL included)."""
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for name, value in sorted(headers):
        for part in (name.encode(), value):
            digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()
