"""What the jobs of a comparison run (``spark-abs compare --workload``) and
the variants they compare (``--variants``): plain values, read when the
command line is built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from barriers.messages import InFlightFormat
from streaming.api.settings import Mode
from streaming.errors import ConfigError

__all__ = ["WORKLOADS", "VARIANTS", "MONEY_PIPELINE", "Workload"]

WORKLOADS = ("backpressure", "skew", "backlog", "money")
_SLOW = "streaming.tools.compare.slow:slow_pipeline"
# the example pipeline of the money workload, by name (the library does not import the examples)
MONEY_PIPELINE = "money"

# variant name -> JobSettings keyword arguments (aligned-timeout's timeout comes from --timeout-ms)
VARIANTS: Mapping[str, Mapping[str, Any]] = {
    "aligned": {"mode": Mode.ALIGNED},
    "unaligned": {"mode": Mode.UNALIGNED, "in_flight": InFlightFormat.RANGE},
    "unaligned-records": {"mode": Mode.UNALIGNED, "in_flight": InFlightFormat.RECORDS},
    "aligned-timeout": {"mode": Mode.ALIGNED_TIMEOUT},
    "at-least-once": {"mode": Mode.AT_LEAST_ONCE},
}


@dataclass(frozen=True)
class Workload:
    """What the jobs run and how they are fed (see ``streaming.tools.compare.run``)."""

    kind: str = "backpressure"
    costs: tuple[float, ...] = (1.0, 10.0)  # ms per record of the slow stage (backlog, skew: the first)
    load: float = 1.25  # source rate as a multiple of what the slow stage can take
    rate: float | None = None  # records (money: transfers) per second; overrides load
    duration_s: float = 30.0
    interval_s: float = 1.0
    warmup_s: float = 5.0  # run, but not counted: Spark's first micro-batches
    # backpressure: the source stops while this many seconds of the stage's work wait in front
    # of it (Flink's network buffers do this; Kafka alone would let the backlog grow for ever)
    buffer_s: float = 1.0
    keys: int = 7  # distinct keys (the slow stage's state); money: accounts
    skew: int = 3000
    backlogs: tuple[int, ...] = (500, 1000, 2000)
    timeout_ms: int = 200

    def __post_init__(self) -> None:
        if self.kind not in WORKLOADS:
            raise ConfigError(f"--workload {self.kind}: use one of {', '.join(WORKLOADS)}")
        if not self.costs or any(not c > 0 for c in self.costs):
            raise ConfigError(f"--costs {self.costs}: one or more positive milliseconds per record")
        if len(set(self.costs)) != len(self.costs):
            raise ConfigError(f"--costs {self.costs}: each at most once")
        for name in ("load", "duration_s", "interval_s", "buffer_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.removesuffix('_s')} must be positive, got {getattr(self, name)}")
        if self.rate is not None and not self.rate > 0:
            raise ConfigError(f"--rate must be positive, got {self.rate}")
        if self.warmup_s < 0 or self.keys < 1 or self.skew < 0 or self.timeout_ms < 0:
            raise ConfigError("--warmup, --skew and --timeout-ms must not be negative and --keys at least 1")
        if not self.backlogs or any(b < 1 for b in self.backlogs):
            raise ConfigError(f"--backlogs {self.backlogs}: one or more counts, each at least 1")
        if self.kind == "money" and self.keys < 2:
            raise ConfigError("--keys (accounts) must be at least 2 for money: a transfer needs two")

    @property
    def continuous(self) -> bool:
        return self.kind != "backlog"

    @property
    def points(self) -> tuple[float, ...]:
        """The x axis: backlogs are rounds of the same jobs, every other point a job per variant."""
        if self.kind == "backlog":
            return tuple(float(b) for b in self.backlogs)
        return self.job_points

    @property
    def job_points(self) -> tuple[float, ...]:
        if self.kind == "backpressure":
            return self.costs
        if self.kind == "skew":
            return (float(self.skew),)
        return (0.0,)

    def cost_ms(self, point: float) -> float:
        return point if self.kind == "backpressure" else self.costs[0]

    def rate_of(self, point: float) -> float:
        """Records per second into each job at ``point`` (the slow stage takes
        1000 / cost records per second at best)."""
        if self.rate is not None:
            return self.rate
        if self.kind == "money":
            return 300.0
        return self.load * 1000.0 / self.cost_ms(point)

    def buffer_of(self, point: float, partitions: int) -> int:
        """Records that may wait unread in each partition before the source stops."""
        per_second = self.rate_of(point) if self.kind == "money" else 1000.0 / self.cost_ms(point)
        return max(1, round(self.buffer_s * per_second / partitions))

    def pipeline_ref(self, point: float) -> str:
        if self.kind == "money":
            return MONEY_PIPELINE
        return f"{_SLOW}?ms_per_record={self.cost_ms(point):g}"

    def label(self, point: float) -> str:
        if self.kind == "backpressure":
            return f"{point:g} ms/record"
        if self.kind == "skew":
            return f"skew {point:g}"
        if self.kind == "backlog":
            return f"backlog {point:g}"
        return "money"
