"""The data of ``spark-abs compare``: the workload its jobs run and every
checkpoint of every job (samples, runs, the restore at the end), as
``streaming.tools.compare.run`` records them and ``streaming.tools.compare.report``
shows them; a comparison is written to JSON and read back whole."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from barriers.coordinator import CheckpointStatus
from streaming.adapters.snapshots.format import stored_name
from streaming.tools.compare.workloads import Workload

__all__ = ["Sample", "Restore", "Run", "Comparison"]

# what the x axis of a workload's charts is
_AXES = {
    "backpressure": "per-record cost of the slow stage (ms)",
    "skew": "records partition 0 starts behind",
    "backlog": "backlog in front of the barriers (records per partition)",
    "money": "",
}


@dataclass(frozen=True)
class Sample:
    """One checkpoint of one job, over all its tasks (times: the slowest
    task; bytes and records: summed over tasks; held bytes: the most any held)."""

    checkpoint_id: int
    at_s: float  # its trigger, seconds after the measured part of the run began
    status: CheckpointStatus  # completed, aborted, or pending (still running when the run ended)
    duration_s: float  # trigger to complete; pending: how long it had run when the run ended
    reason: str = ""
    kinds: tuple[str, ...] = ()  # what the tasks' checkpoints turned out to be, by name (format.stored_name)
    first_barrier_s: float = 0.0
    alignment_s: float = 0.0
    held_bytes_max: int = 0
    in_flight_records: int = 0
    in_flight_bytes_copied: int = 0
    state_bytes: int = 0
    switches: tuple[str, ...] = ()  # per task that switched: "task: why (after N ms)"

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", CheckpointStatus(self.status))  # JSON has its name

    @classmethod
    def from_record(cls, record: Any, at_s: float, now: float) -> Sample:
        if record.status is CheckpointStatus.COMPLETED:
            duration = float(record.duration_s)
        else:
            duration = now - record.triggered_at
        tasks = record.tasks or {}

        def values(name: str) -> list[float]:
            return [float(getattr(t, name) or 0) for t in tasks.values()]

        switches = tuple(
            f"{name}: {t.switch}" + (f" after {t.switched_after_ms:.0f} ms" if t.switched_after_ms is not None else "")
            for name, t in sorted(tasks.items())
            if t.switch
        )
        return cls(
            checkpoint_id=record.checkpoint_id,
            at_s=at_s,
            status=record.status,
            duration_s=duration,
            reason=record.reason,
            kinds=tuple(stored_name(k) for k in record.kinds),
            first_barrier_s=max(values("first_barrier_s"), default=0.0),
            alignment_s=max(values("alignment_s"), default=0.0),
            held_bytes_max=int(max(values("held_bytes_max"), default=0)),
            in_flight_records=int(sum(values("in_flight_records_referenced"))),
            in_flight_bytes_copied=int(sum(values("in_flight_bytes_copied"))),
            state_bytes=int(sum(values("state_bytes"))),
            switches=switches,
        )


@dataclass(frozen=True)
class Restore:
    """A restore from the latest checkpoint at the end of the run."""

    checkpoint_id: int | None
    ready_s: float | None  # until every task's query ran again
    replayed_s: float | None  # until every task had processed its restored channel state (None: not in time)
    replay_records: int  # records of channel state the tasks read again (offset ranges)
    replayed_copies: int = 0  # records of copied channel state (replayed before "ready")


@dataclass
class Run:
    """One job: a variant at a workload point."""

    variant: str
    point: float
    job: str
    rate: float  # records per second fed to it (0: a fixed backlog)
    samples: list[Sample] = field(default_factory=list)
    produced: int = 0
    mean_record_bytes: float = 0.0
    records_per_s: float | None = None  # data records the first stage read per second, between checkpoints
    restore: Restore | None = None

    def durations(self, *, pending: bool = True) -> list[float]:
        """Checkpoint times: completed ones, and (``pending``) the ones still
        running at the end, at how long they had run (a lower bound)."""
        keep = (CheckpointStatus.COMPLETED, CheckpointStatus.PENDING) if pending else (CheckpointStatus.COMPLETED,)
        return [s.duration_s for s in self.samples if s.status in keep]

    def percentile(self, q: float) -> float | None:
        values = self.durations()
        return float(np.percentile(values, q)) if values else None

    def median(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.samples if s.status is CheckpointStatus.COMPLETED]
        return float(np.median(values)) if values else None

    def most(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.samples if s.status is CheckpointStatus.COMPLETED]
        return float(max(values)) if values else None

    def count(self, status: CheckpointStatus) -> int:
        return sum(1 for s in self.samples if s.status == status)

    @property
    def in_flight_bytes_referenced(self) -> float | None:
        """Median channel state kept as offset ranges, in bytes: its records
        times the mean size of the records fed to the job."""
        records = self.median("in_flight_records")
        return None if records is None else records * self.mean_record_bytes

    @property
    def switch_reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.samples:
            for entry in s.switches:
                why = entry.split(": ", 1)[1].split(" after ", 1)[0]
                counts[why] = counts.get(why, 0) + 1
        return counts


@dataclass
class Comparison:
    """Every checkpoint of every job of one comparison."""

    workload: Workload
    variants: list[str]
    runs: list[Run] = field(default_factory=list)
    started: str = ""
    seconds: float = 0.0

    @property
    def axis(self) -> str:
        return _AXES[self.workload.kind]

    @property
    def points(self) -> list[float]:
        return sorted({r.point for r in self.runs})

    def run(self, variant: str, point: float) -> Run | None:
        return next((r for r in self.runs if r.variant == variant and r.point == point), None)

    def ratio(self, variant: str, point: float, q: float = 50) -> float | None:
        """Checkpoint time percentile ``q`` of ``variant`` over the baseline's
        (the first variant), at the same point of the same run."""
        run, base = self.run(variant, point), self.run(self.variants[0], point)
        if run is None or base is None:
            return None
        mine, theirs = run.percentile(q), base.percentile(q)
        return None if mine is None or not theirs else mine / theirs

    def ratio_to(self, variant: str, other: str, point: float, q: float = 50) -> float | None:
        run, base = self.run(variant, point), self.run(other, point)
        if run is None or base is None:
            return None
        mine, theirs = run.percentile(q), base.percentile(q)
        return None if mine is None or not theirs else mine / theirs

    def to_json(self) -> str:
        return json.dumps(
            {
                "workload": asdict(self.workload),
                "variants": self.variants,
                "started": self.started,
                "seconds": self.seconds,
                "runs": [asdict(r) for r in self.runs],
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Comparison:
        data = json.loads(text)
        workload = data["workload"]
        for name in ("costs", "backlogs"):
            workload[name] = tuple(workload[name])
        runs = []
        for r in data["runs"]:
            samples = [
                Sample(**{**s, "kinds": tuple(s["kinds"]), "switches": tuple(s["switches"])}) for s in r.pop("samples")
            ]
            restore = Restore(**r.pop("restore")) if r.get("restore") else None
            r.pop("restore", None)
            runs.append(Run(**r, samples=samples, restore=restore))
        return cls(Workload(**workload), data["variants"], runs, data.get("started", ""), data.get("seconds", 0.0))
