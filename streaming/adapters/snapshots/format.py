"""The JSON documents of a checkpoint: what each task recorded
(``_TASK.json``), the manifest that completes it (``_MANIFEST.json``) and the
job's generations (``_JOB.json``), each versioned; malformed text is one
ValueError that says what is wrong.

What the protocol decided is stored by name, never as the sentence a person
reads: an enum member as its name in lower case (``stored_name``:
``timed_out_to_unaligned``, ``late_barrier``), checkpoint options as their
fields (``options_to_json``); ``text_of`` gives back the words.  Documents
written before (their values: "aligned, unaligned after the alignment
timeout", options as ``CheckpointOptions.describe()`` text) read back the
same (``parse_stored``, ``options_from_json``)."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyarrow as pa

from barriers.messages import Alignment, CheckpointOptions, InFlightFormat
from streaming.adapters.snapshots.layout import check_part_path

__all__ = [
    "FORMAT_VERSION",
    "PartInfo",
    "StateLink",
    "LINK_KINDS",
    "TaskSnapshot",
    "TaskCheckpointMetrics",
    "BARRIER_PATH",
    "Manifest",
    "LoadedTask",
    "JobMeta",
    "GenerationStart",
    "now",
    "stored_name",
    "parse_stored",
    "text_of",
    "options_to_json",
    "options_from_json",
    "options_as_stored",
]

# Version of the JSON written to _TASK.json, _MANIFEST.json and _JOB.json:
# 2 when a task's state is kept as chains (incremental checkpoints), which a
# reader of version 1 would take for no state at all; 1 otherwise.
FORMAT_VERSION = 2
_PLAIN_VERSION = 1

# what a link of a state chain holds: the whole table, rows put in, keys taken out
LINK_KINDS = ("base", "upserts", "removed")

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _check_version(data: Mapping[str, Any]) -> None:
    version = data.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"format_version {version!r} is not readable by this version (reads up to {FORMAT_VERSION})")


def _parsed(what: str, parse: Callable[[], T]) -> T:
    """Run ``parse`` and turn any sign of malformed data into one ValueError."""
    try:
        return parse()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"malformed {what}: {detail}") from exc


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One stored Parquet file: the table or channel it holds, its path relative
    to the checkpoint directory, and what it must look like when read back."""

    name: str
    path: str
    rows: int
    bytes: int
    sha256: str

    def _to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> PartInfo:
        return cls(str(data["name"]), str(data["path"]), int(data["rows"]), int(data["bytes"]), str(data["sha256"]))


@dataclass(frozen=True, slots=True)
class StateLink:
    """One link of a state table's chain (an incremental checkpoint): a part
    stored in checkpoint ``checkpoint_id``'s directory that holds the whole
    table (``base``), rows that replace or add their keys' rows
    (``upserts``), or the key columns of keys taken out (``removed``)."""

    checkpoint_id: int
    kind: str
    part: PartInfo

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise ValueError(f"state link kind {self.kind!r} is not one of {', '.join(LINK_KINDS)}")

    def _to_dict(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "kind": self.kind, "part": self.part._to_dict()}

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> StateLink:
        return cls(int(data["checkpoint_id"]), str(data["kind"]), PartInfo._from_dict(data["part"]))


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    """What one task recorded for one checkpoint.

    ``positions`` maps each input channel (``"topic:partition"``) to the offset
    to resume from; ``in_flight`` maps a channel to its channel state as the
    offset range ``[start, end)``, whose records may also be copied into
    ``channel_parts``.  ``metadata`` is free JSON (alignment kind, timings).

    A full snapshot keeps each state table in ``state_parts``; an
    incremental one keeps each as a chain in ``state_chains``: a base, then
    the changes of each checkpoint after it, oldest first, parts of earlier
    checkpoints included (``files()`` names every part a restore reads)."""

    task: str
    checkpoint_id: int
    generation: int
    positions: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, tuple[int, int]] = field(default_factory=dict)
    state_parts: tuple[PartInfo, ...] = ()
    channel_parts: tuple[PartInfo, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    state_chains: dict[str, tuple[StateLink, ...]] = field(default_factory=dict)

    @property
    def parts(self) -> tuple[PartInfo, ...]:
        """The parts this checkpoint wrote (in its own directory)."""
        return self._own_state_parts() + self.channel_parts

    @property
    def state_bytes(self) -> int:
        """Bytes of state this checkpoint stored (a chain's earlier links not counted)."""
        return sum(p.bytes for p in self._own_state_parts())

    @property
    def state_kind(self) -> str:
        """``full`` (every table whole), ``base`` (every chain starts here) or
        ``changes`` (some chain links to earlier checkpoints)."""
        if not self.state_chains:
            return "full"
        return "changes" if self.needs() else "base"

    def files(self) -> tuple[tuple[int, PartInfo], ...]:
        """Every part a restore of this task reads, with the checkpoint whose
        directory holds it (earlier checkpoints' for a chain's older links)."""
        chained = tuple((link.checkpoint_id, link.part) for chain in self.state_chains.values() for link in chain)
        own = tuple((self.checkpoint_id, part) for part in self.state_parts + self.channel_parts)
        return own + chained

    def needs(self) -> set[int]:
        """The earlier checkpoints whose parts this one reads."""
        return {link.checkpoint_id for chain in self.state_chains.values() for link in chain} - {self.checkpoint_id}

    @property
    def state_tables(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.state_parts) + tuple(self.state_chains)

    @property
    def version(self) -> int:
        return FORMAT_VERSION if self.state_chains else _PLAIN_VERSION

    def _own_state_parts(self) -> tuple[PartInfo, ...]:
        """Whole tables, and the links of chains this checkpoint wrote."""
        links = (
            link.part
            for chain in self.state_chains.values()
            for link in chain
            if link.checkpoint_id == self.checkpoint_id
        )
        return self.state_parts + tuple(links)

    def to_json(self) -> str:
        return json.dumps(self.as_json(), indent=2, sort_keys=True)

    def as_json(self) -> dict[str, Any]:
        """The snapshot as a JSON object (``to_json`` writes it; an acknowledgement carries it)."""
        return {"format_version": self.version, **self._to_dict()}

    @classmethod
    def from_json(cls, text: str | bytes) -> TaskSnapshot:
        """Raises ValueError when ``text`` is not a task snapshot."""
        return cls.from_json_object(json.loads(text))

    @classmethod
    def from_json_object(cls, data: Any) -> TaskSnapshot:
        """``as_json``'s way back; a ValueError when ``data`` is not a task snapshot."""

        def parse() -> TaskSnapshot:
            if not isinstance(data, Mapping):
                raise TypeError(f"expected a JSON object, got {data!r}")
            _check_version(data)
            return cls._from_dict(data)

        return _parsed("task snapshot", parse)

    def _to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "checkpoint_id": self.checkpoint_id,
            "generation": self.generation,
            "positions": dict(self.positions),
            "in_flight": {c: list(r) for c, r in self.in_flight.items()},
            "state_parts": [p._to_dict() for p in self.state_parts],
            "channel_parts": [p._to_dict() for p in self.channel_parts],
            "metadata": self.metadata,
            **(
                {"state_chains": {n: [link._to_dict() for link in chain] for n, chain in self.state_chains.items()}}
                if self.state_chains
                else {}
            ),
        }

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> TaskSnapshot:
        in_flight = {}
        for channel, (start, end) in data.get("in_flight", {}).items():
            in_flight[str(channel)] = (int(start), int(end))
        snapshot = cls(
            task=str(data["task"]),
            checkpoint_id=int(data["checkpoint_id"]),
            generation=int(data["generation"]),
            positions={str(c): int(o) for c, o in data.get("positions", {}).items()},
            in_flight=in_flight,
            state_parts=tuple(PartInfo._from_dict(p) for p in data.get("state_parts", [])),
            channel_parts=tuple(PartInfo._from_dict(p) for p in data.get("channel_parts", [])),
            metadata=dict(data.get("metadata", {})),
            state_chains={
                str(name): tuple(StateLink._from_dict(link) for link in chain)
                for name, chain in data.get("state_chains", {}).items()
            },
        )
        # what a restore reads is the layout's own: every part inside its checkpoint's directory
        links = tuple(link.part for chain in snapshot.state_chains.values() for link in chain)
        for kind, parts in (("state", snapshot.state_parts + links), ("channels", snapshot.channel_parts)):
            for part in parts:
                check_part_path(snapshot.task, kind, part.path)
        return snapshot


# where a checkpoint's first barrier got, in order, timed from the trigger: appended to its ingress
# channel, Spark began the micro-batch that carried it, the task received that batch, forwarded it
# downstream, acknowledged the snapshot
BARRIER_PATH = ("appended", "batch_began", "handed", "forwarded", "acked")


@dataclass(frozen=True, slots=True)
class TaskCheckpointMetrics:
    """What one task measured of one checkpoint: taken with its snapshot
    (kept in ``TaskSnapshot.metadata``), then what the upload measured
    (``async_snapshot_s``, ``state_bytes``, the ``acked`` point of the
    barrier's path); the acknowledgement carries it, the manifest keeps it
    per task (``metrics["tasks"]``) and the coordinator's record has it.

    Stored as flat JSON (``to_json``: the barrier's path as ``<point>_s``,
    enum members by their stored names); ``from_json`` reads what any
    version wrote, a snapshot's whole metadata included, ignoring what it
    does not know and leaving what is missing None."""

    kind: str = ""  # a CheckpointKind's stored name
    first_barrier_s: float | None = None  # trigger -> this task saw checkpoint n (first barrier or announcement)
    alignment_s: float | None = None
    # point of BARRIER_PATH -> seconds since the trigger
    barrier_path: Mapping[str, float] = field(default_factory=dict)
    switch: str | None = None  # an aligned checkpoint that turned unaligned: why (a Switch's stored name)
    switched_after_ms: float | None = None  # ... and when, since the trigger
    sync_snapshot_s: float | None = None
    held_bytes_max: int | None = None
    in_flight_records_referenced: int | None = None
    in_flight_records_copied: int | None = None
    in_flight_bytes_copied: int | None = None
    # channel -> offset a restore reads from that time retention may delete before the checkpoint is superseded
    retention_at_risk: Mapping[str, int] = field(default_factory=dict)
    state_spilled_bytes: int | None = None  # keyed-state rows the worker spilled so far (a memory budget only)
    async_snapshot_s: float | None = None
    state_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        values = {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if name not in ("barrier_path", "retention_at_risk")
        }
        return {
            **values,
            **{f"{point}_s": seconds for point, seconds in self.barrier_path.items()},
            "retention_at_risk": dict(self.retention_at_risk),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskCheckpointMetrics:
        """A ValueError when ``data`` is not a JSON object or a value is not of its field's kind."""
        if not isinstance(data, Mapping):
            raise ValueError(f"task checkpoint metrics: expected a JSON object, got {data!r}")

        def number(name: str, kind: Callable[[Any], T]) -> T | None:
            value = data.get(name)
            return None if value is None else kind(value)

        def parse() -> TaskCheckpointMetrics:
            return cls(
                kind=str(data.get("kind") or ""),
                first_barrier_s=number("first_barrier_s", float),
                alignment_s=number("alignment_s", float),
                barrier_path={p: float(data[f"{p}_s"]) for p in BARRIER_PATH if data.get(f"{p}_s") is not None},
                switch=None if data.get("switch") is None else str(data["switch"]),
                switched_after_ms=number("switched_after_ms", float),
                sync_snapshot_s=number("sync_snapshot_s", float),
                held_bytes_max=number("held_bytes_max", int),
                in_flight_records_referenced=number("in_flight_records_referenced", int),
                in_flight_records_copied=number("in_flight_records_copied", int),
                in_flight_bytes_copied=number("in_flight_bytes_copied", int),
                retention_at_risk={str(c): int(o) for c, o in (data.get("retention_at_risk") or {}).items()},
                state_spilled_bytes=number("state_spilled_bytes", int),
                async_snapshot_s=number("async_snapshot_s", float),
                state_bytes=number("state_bytes", int),
            )

        return _parsed("task checkpoint metrics", parse)


@dataclass(frozen=True, slots=True)
class Manifest:
    """A completed checkpoint: every task's snapshot, the options it ran with
    and the coordinator's metrics.  ``created_at`` is ISO 8601, UTC."""

    job: str
    checkpoint_id: int
    generation: int
    tasks: dict[str, TaskSnapshot]
    created_at: str
    options: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    format_version: int = _PLAIN_VERSION

    def needs(self) -> set[int]:
        """The earlier checkpoints whose parts a restore of this one reads."""
        return set().union(*(snap.needs() for snap in self.tasks.values()))

    def to_json(self) -> str:
        version = max([self.format_version, *(snap.version for snap in self.tasks.values())])
        return json.dumps(
            {
                "format_version": version,
                "job": self.job,
                "checkpoint_id": self.checkpoint_id,
                "generation": self.generation,
                "created_at": self.created_at,
                "options": self.options,
                "metrics": self.metrics,
                "tasks": {name: snap._to_dict() for name, snap in self.tasks.items()},
            },
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Raises ValueError when ``text`` is not a manifest."""
        data = json.loads(text)

        def parse() -> Manifest:
            _check_version(data)
            tasks = {str(name): TaskSnapshot._from_dict(snap) for name, snap in data["tasks"].items()}
            manifest = cls(
                job=str(data["job"]),
                checkpoint_id=int(data["checkpoint_id"]),
                generation=int(data["generation"]),
                tasks=tasks,
                created_at=str(data["created_at"]),
                options=dict(data.get("options", {})),
                metrics=dict(data.get("metrics", {})),
                format_version=int(data.get("format_version", _PLAIN_VERSION)),
            )
            for name, snap in tasks.items():
                if snap.task != name or snap.checkpoint_id != manifest.checkpoint_id:
                    raise ValueError(f"entry {name!r} is task {snap.task!r} of checkpoint {snap.checkpoint_id}")
            return manifest

        return _parsed("manifest", parse)


@dataclass(frozen=True, slots=True)
class LoadedTask:
    """A task's snapshot read back, every part checked against its checksum."""

    snapshot: TaskSnapshot
    state: dict[str, pa.Table]
    channel_records: dict[str, pa.Table]


@dataclass(frozen=True, slots=True)
class GenerationStart:
    """One generation's start as ``_JOB.json`` records it: from which
    checkpoint (None: from the beginning), when (ISO 8601, UTC), at which
    scale (``Scale`` as JSON), why the job restored (a cause's stored name;
    None for the fresh start, generation 0, and in what older versions
    wrote), and, when the restore wrote a checkpoint again, which one it
    rescaled or carried into a changed pipeline.  ``from_json`` reads what
    any version wrote."""

    generation: int
    from_checkpoint: int | None = None
    at: str = ""
    scale: Mapping[str, Any] | None = None
    cause: str | None = None
    rescaled_from: int | None = None
    changed_from: int | None = None

    def to_json(self) -> dict[str, Any]:
        optional: dict[str, Any] = {"scale": self.scale, "cause": self.cause}
        optional |= {"rescaled_from": self.rescaled_from, "changed_from": self.changed_from}
        return {
            "generation": self.generation,
            "from_checkpoint": self.from_checkpoint,
            "at": self.at,
            **{name: value for name, value in optional.items() if value is not None},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GenerationStart:
        def optional_int(name: str) -> int | None:
            return None if data.get(name) is None else int(data[name])

        return cls(
            generation=int(data.get("generation", 0)),
            from_checkpoint=optional_int("from_checkpoint"),
            at=str(data.get("at") or ""),
            scale=dict(data["scale"]) if data.get("scale") else None,
            cause=None if data.get("cause") is None else str(data["cause"]),
            rescaled_from=optional_int("rescaled_from"),
            changed_from=optional_int("changed_from"),
        )


@dataclass(frozen=True, slots=True)
class JobMeta:
    """The job's current generation and every generation start, the fresh
    one (0) first (``GenerationStart``)."""

    job: str
    generation: int = 0
    restores: tuple[GenerationStart, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "format_version": FORMAT_VERSION,
                "job": self.job,
                "generation": self.generation,
                "restores": [entry.to_json() for entry in self.restores],
            },
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> JobMeta:
        """Raises ValueError when ``text`` is not job metadata."""
        data = json.loads(text)

        def parse() -> JobMeta:
            _check_version(data)
            restores = tuple(GenerationStart.from_json(r) for r in data.get("restores", []))
            return cls(str(data["job"]), int(data["generation"]), restores)

        return _parsed("job metadata", parse)

    def abandoned(self, checkpoint_id: int, generation: int) -> str | None:
        """Why checkpoint ``checkpoint_id``, taken by ``generation``, is off
        the job's line (None: it is on it): a later generation started from
        an older checkpoint, or from the beginning, so what this one holds
        was replaced (its sink epochs discarded, its input read again).
        A restore that took it would bring back a history the job left."""
        for entry in self.restores:
            later, source = entry.generation, entry.from_checkpoint
            if later > generation and (source is None or source < checkpoint_id):
                start = "the beginning" if source is None else f"checkpoint {source}"
                return f"abandoned: generation {later} started from {start}, before it"
        return None


# ---- names, as the documents store them


def stored_name(member: enum.Enum) -> str:
    """How a document names ``member``: its name in lower case
    (``CheckpointKind.TIMED_OUT_TO_UNALIGNED`` -> ``timed_out_to_unaligned``)."""
    return member.name.lower()


def parse_stored(kind: type[E], text: object) -> E:
    """The member of ``kind`` that ``text`` names: as stored (``stored_name``,
    any case) or as documents written before names were stored spell it (the
    member's value, e.g. "aligned, unaligned after the alignment timeout").
    A ValueError naming the stored names otherwise."""
    if isinstance(text, kind):
        return text
    member = kind.__members__.get(str(text).upper())
    if member is not None:
        return member
    try:
        return kind(text)
    except ValueError:
        names = ", ".join(stored_name(m) for m in kind)
        raise ValueError(f"{text!r} is not a {kind.__name__} (one of {names})") from None


def text_of(kind: type[enum.Enum], stored: object) -> str:
    """What a person reads for the member of ``kind`` that ``stored`` names
    (``parse_stored``): its value; text that names none, as it is."""
    try:
        return parse_stored(kind, stored).value
    except ValueError:
        return str(stored)


def options_to_json(options: CheckpointOptions) -> dict[str, Any]:
    """The options a checkpoint ran with, as a manifest and a progress line store them."""
    return {
        "alignment": stored_name(options.alignment),
        "alignment_timeout_ms": options.alignment_timeout_ms,
        "held_bytes_budget": options.held_bytes_budget,
        "in_flight": stored_name(options.in_flight),
    }


def options_from_json(stored: Mapping[str, Any]) -> CheckpointOptions:
    """The options ``options_to_json`` stored, or those of a manifest written
    before, whose ``alignment`` is ``CheckpointOptions.describe()`` text such
    as "aligned (unaligned after 200 ms or 1000000 held bytes)".  A ValueError
    when they are neither."""
    if "alignment" not in stored:
        raise ValueError("no alignment in the checkpoint's options")
    timeout, budget = stored.get("alignment_timeout_ms"), stored.get("held_bytes_budget")
    alignment, older, limits = str(stored["alignment"]).partition(" (unaligned after ")
    if older:
        if not limits.endswith(")"):
            raise ValueError(f"alignment {stored['alignment']!r} does not read as options")
        for limit in limits[:-1].split(" or "):
            number, _, unit = limit.partition(" ")
            if unit == "ms":
                timeout = int(number)
            elif unit == "held bytes":
                budget = int(number)
            else:
                raise ValueError(f"alignment {stored['alignment']!r}: {limit!r} is no limit")
    return CheckpointOptions(
        parse_stored(Alignment, alignment),
        None if timeout is None else int(timeout),
        None if budget is None else int(budget),
        parse_stored(InFlightFormat, stored.get("in_flight", stored_name(InFlightFormat.RANGE))),
    )


def options_as_stored(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Options another manifest stored, as ``options_to_json`` stores them (an
    older manifest's text becomes names); options that read as none are
    copied as they are."""
    try:
        return options_to_json(options_from_json(stored))
    except ValueError:
        return dict(stored)
