"""What aligned and unaligned checkpoints cost, measured side by side.

One job per variant (and per workload point: a per-record cost, a backlog,
a skew) runs at the same time as every other on this machine, fed the same
records, so all of them share the machine's load and the ratios between
them are taken within one run.  Workloads (--workload):

  backpressure  (default) a slow stage (--costs ms per record, 1 and 10 by
                default: the workload of Flink's checkpointing-under-
                backpressure benchmark) under a continuous source at --load
                times what the stage can take (or --rate records/s) for
                --duration seconds; checkpoints every --interval seconds.
                The source is throttled while --buffer seconds of the
                stage's work wait unread in front of it, as Flink's network
                buffers throttle its sources (Kafka alone would let the
                backlog grow for ever), so every barrier has about that
                much in front of it.
  skew          the same, with partition 0 starting --skew records behind
                partition 1: aligned tasks hold the fast channel's records.
  backlog       rounds: a fixed backlog (--backlogs, records per partition)
                in front of one checkpoint triggered in every job at once.
  money         the demo's money pipeline (three stages, keyed and windowed
                state) under a continuous stream of transfers at --rate.

Variants (--variants): aligned, unaligned (channel state as offset ranges),
unaligned-records (channel state copied), aligned-timeout (--timeout-ms,
counted from the checkpoint's trigger), at-least-once.  The first is the
baseline of the ratios.

Per variant: checkpoint time (trigger to complete) p50/p90/p99, time from
the trigger to the task's snapshot ("first barrier"), alignment time, bytes
held while aligning, channel state (records referenced, bytes copied),
state bytes, records read per second, and, at the end, a restore from the
latest checkpoint: until every task runs again ("ready") and until every
task has processed its restored channel state again ("replayed").
Everything goes to --out (default $SPARK_ABS_HOME/runs/compare-<time>/):
comparison.json (every checkpoint of every job), the tables (tables.txt)
and three PNG charts, each with a legend that says how to read it."""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from barriers.coordinator import CheckpointStatus
from streaming.errors import ConfigError, SparkAbsError

__all__ = [
    "VARIANTS",
    "WORKLOADS",
    "Workload",
    "Sample",
    "Restore",
    "Run",
    "Comparison",
    "run_compare",
    "main",
]

# variant name -> JobSettings keyword arguments (aligned-timeout's timeout comes from --timeout-ms)
VARIANTS: Mapping[str, Mapping[str, object]] = {
    "aligned": {"mode": "aligned"},
    "unaligned": {"mode": "unaligned", "in_flight": "range"},
    "unaligned-records": {"mode": "unaligned", "in_flight": "records"},
    "aligned-timeout": {"mode": "aligned-timeout"},
    "at-least-once": {"mode": "at-least-once"},
}
WORKLOADS = ("backpressure", "skew", "backlog", "money")
_AXES = {
    "backpressure": "per-record cost of the slow stage (ms)",
    "skew": "records partition 0 starts behind",
    "backlog": "backlog in front of the barriers (records per partition)",
    "money": "",
}
_SLOW = "streaming.testing:slow_pipeline"
_MONEY = "streaming.tools.demo:pipeline"
# a slow task looks at control events at least this often (records per segment follow from the cost)
_SEGMENT_MS = 100
# the warm-up waits at most this much longer for every job's first checkpoint
_WARMUP_LIMIT_S = 60.0


@dataclass(frozen=True)
class Workload:
    """What the jobs run and how they are fed (see the module docstring)."""

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
            return _MONEY
        return f"{_SLOW}?ms_per_record={self.cost_ms(point):g}"

    def label(self, point: float) -> str:
        if self.kind == "backpressure":
            return f"{point:g} ms/record"
        if self.kind == "skew":
            return f"skew {point:g}"
        if self.kind == "backlog":
            return f"backlog {point:g}"
        return "money"


@dataclass(frozen=True)
class Sample:
    """One checkpoint of one job, over all its tasks (times: the slowest
    task; bytes and records: summed over tasks; held bytes: the most any held)."""

    checkpoint_id: int
    at_s: float  # its trigger, seconds after the measured part of the run began
    status: str  # completed, aborted, or pending (still running when the run ended)
    duration_s: float  # trigger to complete; pending: how long it had run when the run ended
    reason: str = ""
    kinds: tuple[str, ...] = ()
    first_barrier_s: float = 0.0
    alignment_s: float = 0.0
    held_bytes_max: int = 0
    in_flight_records: int = 0
    in_flight_bytes_copied: int = 0
    state_bytes: int = 0
    switches: tuple[str, ...] = ()  # per task that switched: "task: why (after N ms)"

    @classmethod
    def from_record(cls, record: Any, at_s: float, now: float) -> Sample:
        status = str(record.status)
        if record.status is CheckpointStatus.COMPLETED:
            duration = float(record.duration_s)
        else:
            duration = now - record.triggered_at
        tasks = record.tasks or {}

        def values(name: str) -> list[float]:
            return [float(t.get(name) or 0) for t in tasks.values()]

        switches = tuple(
            f"{name}: {t['switch']}"
            + (f" after {t['switched_after_ms']:.0f} ms" if t.get("switched_after_ms") is not None else "")
            for name, t in sorted(tasks.items())
            if t.get("switch")
        )
        return cls(
            checkpoint_id=record.checkpoint_id,
            at_s=at_s,
            status=status,
            duration_s=duration,
            reason=record.reason,
            kinds=tuple(record.kinds),
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
        keep = ("completed", "pending") if pending else ("completed",)
        return [s.duration_s for s in self.samples if s.status in keep]

    def percentile(self, q: float) -> float | None:
        values = self.durations()
        return float(np.percentile(values, q)) if values else None

    def median(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.samples if s.status == "completed"]
        return float(np.median(values)) if values else None

    def most(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.samples if s.status == "completed"]
        return float(max(values)) if values else None

    def count(self, status: str) -> int:
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


def check_variants(variants: Sequence[str]) -> None:
    """Fail at once, naming the option, on variants the comparison cannot run."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ConfigError(f"--variants {', '.join(unknown) or '(none)'}: use some of {', '.join(VARIANTS)}")
    if len(set(variants)) != len(variants):
        raise ConfigError(f"--variants {', '.join(variants)}: each at most once")


# --------------------------------------------------------------------------
# running it


@dataclass
class _Job:
    variant: str
    point: float
    runner: Any  # JobRunner
    run: Run
    topic: str
    partitions: int
    started_at: float = 0.0  # when the measured part began (monotonic)
    last_trigger: float = 0.0
    counted_from: int = 0  # checkpoints before this id were the warm-up
    label: str = ""  # "variant @ point", for progress lines

    @property
    def job_name(self) -> str:
        return self.run.job


def run_compare(
    connection,
    *,
    store_uri: str,
    workload: Workload = Workload(),
    variants: Sequence[str] = ("aligned", "unaligned", "aligned-timeout"),
    restore: bool = True,
    timeout_s: float = 600.0,
    say: Callable[[str], None] = print,
) -> Comparison:
    """Run the comparison on ``connection`` (see the module docstring): the
    variants side by side, one workload point after another."""
    check_variants(variants)
    stamp = uuid.uuid4().hex[:6]
    comparison = Comparison(workload, list(variants), started=time.strftime("%Y-%m-%d %H:%M:%S"))
    began = time.monotonic()
    points = workload.job_points
    for index, point in enumerate(points, start=1):
        if len(points) > 1:
            say(f"part {index}/{len(points)}: {workload.label(point)}")
        comparison.runs += _side_by_side(
            connection, store_uri, workload, variants, point, stamp, restore, began + timeout_s, say
        )
    comparison.seconds = time.monotonic() - began
    return comparison


def _side_by_side(
    connection,
    store_uri: str,
    workload: Workload,
    variants: Sequence[str],
    point: float,
    stamp: str,
    restore: bool,
    deadline: float,
    say: Callable[[str], None],
) -> list[Run]:
    """One job per variant at ``point``, all at once: started, fed, measured,
    restored, stopped.  The runs measured."""
    from streaming.api.settings import JobSettings
    from streaming.engine.runner import JobRunner

    jobs: list[_Job] = []
    runs: list[Run] = []
    feed = _Feed(connection.kafka_bootstrap, workload)
    try:
        for variant in variants:
            extra = dict(VARIANTS[variant])
            if variant == "aligned-timeout":
                extra["alignment_timeout_ms"] = workload.timeout_ms
            settings = JobSettings(
                store=store_uri,
                interval_s=workload.interval_s if workload.continuous else 3600,
                timeout_s=max(60.0, deadline - time.monotonic()),
                retain=2,
                max_segment_records=max(1, round(_SEGMENT_MS / workload.cost_ms(point))),
                **extra,
            )
            name = f"cmp-{variant}-{workload.label(point)}-{stamp}".replace(" ", "").replace("/", "-")
            label = f"{variant} @ {workload.label(point)}"
            runner = JobRunner(
                workload.pipeline_ref(point),
                settings,
                connection,
                job=name,
                # progress comes from the comparison; a job says what goes wrong or restores
                say=lambda line, label=label: None if line.startswith("checkpoint ") else say(f"{label}: {line}"),
            )
            ingress = runner.pipeline.ingress[0]
            run = Run(variant, point, name, workload.rate_of(point) if workload.continuous else 0.0)
            jobs.append(_Job(variant, point, runner, run, ingress.topic, ingress.partitions, label=label))
            if workload.continuous:
                runs.append(run)
        for job in jobs:
            job.runner.prepare()
        if workload.kind == "skew":
            say(f"partition 0 of every job starts {workload.skew} records behind partition 1")
            for job in jobs:
                feed.send(job, workload.skew, partitions=(0,))
            feed.flush()
        say(f"starting {len(jobs)} jobs side by side: {', '.join(variants)}")
        for job in jobs:
            job.runner.start()
        side = _SideBySide(jobs, feed, deadline, say)
        side.wait(lambda: all(j.runner.coordinator.all_ready for j in jobs), "the jobs' tasks to start", "starting")
        if workload.continuous:
            side.continuous(workload)
        else:
            runs += side.rounds(workload)
        for job in jobs:
            job.run.produced = feed.produced.get(job.job_name, 0)
            job.run.mean_record_bytes = feed.bytes.get(job.job_name, 0) / max(1, job.run.produced)
            job.run.records_per_s = _records_per_s(job) if workload.continuous else None
        if not workload.continuous:  # every round's records went into every job
            for run in runs:
                run.mean_record_bytes = next(j.run.mean_record_bytes for j in jobs if j.variant == run.variant)
        if restore:
            side.restore()
            if not workload.continuous:  # the restore follows the last round
                last = workload.points[-1]
                for job in jobs:
                    next(r for r in runs if r.variant == job.variant and r.point == last).restore = job.run.restore
    finally:
        feed.close()
        for job in jobs:
            job.runner.close()
    return runs


class _Feed:
    """The records every job gets: the same ones, in the same order."""

    def __init__(self, bootstrap: str, workload: Workload):
        from kafka import KafkaProducer

        self.workload = workload
        self.produced: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.sent: dict[tuple[str, int], int] = {}  # (job, partition) -> records
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
        self._transfers: list[dict] = []

    def send(self, job: _Job, count: int, partitions: Sequence[int] | None = None) -> None:
        """The next ``count`` records into ``job``'s topic, spread over
        ``partitions`` (default: all, in turn)."""
        name = job.job_name
        spread = list(partitions) if partitions is not None else list(range(job.partitions))
        for _ in range(count):
            index = self.produced.get(name, 0)
            partition = spread[index % len(spread)]
            value, key = self._record(partition, index)
            self._producer.send(job.topic, value=value, key=key, partition=partition)
            self.produced[name] = index + 1
            self.sent[name, partition] = self.sent.get((name, partition), 0) + 1
            self.bytes[name] = self.bytes.get(name, 0) + len(value)

    def _record(self, partition: int, index: int) -> tuple[bytes, bytes | None]:
        if self.workload.kind == "money":
            from streaming.tools.demo import STEP_MS

            rng = np.random.default_rng(index)
            source, target = rng.choice(self.workload.keys, 2, replace=False)
            transfer = {
                "id": index,
                "source": f"acct-{source:02d}",
                "target": f"acct-{target:02d}",
                "amount": int(rng.integers(1, 500)),
                "ts": index * STEP_MS,
            }
            return json.dumps(transfer).encode(), transfer["source"].encode()
        record = {"id": partition * 100_000_000 + index, "key": f"k{index % self.workload.keys}"}
        return json.dumps(record).encode(), None

    def flush(self) -> None:
        self._producer.flush(60)

    def close(self) -> None:
        self._producer.close()


class _SideBySide:
    """The jobs of a comparison, driven together: records fed at their rate,
    checkpoints triggered, control topics polled in turn, progress said."""

    def __init__(self, jobs: list[_Job], feed: _Feed, deadline: float, say: Callable[[str], None]):
        self.jobs = jobs
        self.feed = feed
        self.deadline = deadline
        self.say = say
        self._said = 0.0

    def wait(self, done: Callable[[], bool], what: str, phase: str, limit: float | None = None) -> bool:
        """Poll every job (briefly, so completion times stay sharp) until
        ``done``; False when ``limit`` (monotonic) passed first.  A worker
        that dies ends the comparison."""
        while not done():
            now = time.monotonic()
            if limit is not None and now > limit:
                return False
            if now > self.deadline:
                raise SparkAbsError(f"gave up waiting for {what}")
            self.poll()
            if now - self._said > 10:
                self._said = now
                self.say(f"{phase}: waiting for {what}")
        return True

    def poll(self) -> None:
        for job in self.jobs:
            dead = job.runner.supervisor.dead()
            if dead:
                raise SparkAbsError(
                    f"{job.run.job}: worker {dead[0].name} exited (log: {dead[0].log_path}):\n{dead[0].tail()}"
                )
            job.runner.coordinator.poll(0.01)

    # ---- continuous workloads

    def continuous(self, workload: Workload) -> None:
        """Feed and checkpoint every job; the measured part begins after the
        warm-up, once every job has completed a checkpoint (a slow variant's
        first checkpoint may take long), and lasts ``duration_s``."""
        self.say(
            f"feeding {self.jobs[0].run.rate:g} records/s into each job (throttled while {workload.buffer_s:g} s "
            f"of work wait unread), a checkpoint every {workload.interval_s:g} s in each; warm-up (not counted): "
            f"{workload.warmup_s:g} s and until every job completed a checkpoint"
        )
        start = time.monotonic()
        measuring = None  # when the measured part began
        give_up_warmup = start + workload.warmup_s + _WARMUP_LIMIT_S
        for job in self.jobs:
            job.last_trigger = start
        next_progress = start + 5
        while True:
            now = time.monotonic()
            if measuring is not None and now - measuring >= workload.duration_s:
                break
            if now > self.deadline:
                raise SparkAbsError("gave up: the comparison ran past its time limit")
            if measuring is None and now - start >= workload.warmup_s:
                warm = all(
                    any(r.status is CheckpointStatus.COMPLETED for r in j.runner.coordinator.records.values())
                    for j in self.jobs
                )
                if warm or now > give_up_warmup:
                    if not warm:
                        self.say(f"warm-up: not every job completed a checkpoint in {now - start:.0f} s; measuring")
                    measuring = now
                    for job in self.jobs:
                        job.started_at = now
                        job.counted_from = max(job.runner.coordinator.records, default=0) + 1
                    self.say(f"warm-up done after {now - start:.0f} s; measuring {workload.duration_s:g} s")
            for job in self.jobs:
                self._feed(job, workload, now - start)
            self.feed.flush()
            for job in self.jobs:
                coordinator = job.runner.coordinator
                if now - job.last_trigger >= workload.interval_s and coordinator.trigger() is not None:
                    job.last_trigger = now
            self.poll()
            if now >= next_progress:
                next_progress = now + 5
                self._progress(now - (measuring or start), workload.duration_s, measuring is not None)
        end = time.monotonic()
        for job in self.jobs:
            job.run.samples = self._samples(job, end)
        self.say("run done: " + ", ".join(f"{j.label}: {j.run.count('completed')} checkpoints" for j in self.jobs))

    def _feed(self, job: _Job, workload: Workload, elapsed: float) -> None:
        """Each partition gets its share of the rate, as long as fewer than
        the buffer's records wait in it unread (the task's progress events
        say how far it read): backpressure throttles the source."""
        room = workload.buffer_of(job.point, job.partitions)
        read = _read(job)
        for partition in range(job.partitions):
            sent = self.feed.sent.get((job.job_name, partition), 0)
            wanted = int(job.run.rate / job.partitions * elapsed) - sent
            waiting = sent - read.get(partition, 0)
            count = min(wanted, room - waiting)
            if count > 0:
                self.feed.send(job, count, partitions=(partition,))

    def _progress(self, elapsed: float, total: float, measuring: bool) -> None:
        parts = []
        for job in self.jobs:
            done = [r.duration_s for r in job.runner.coordinator.records.values() if r.duration_s is not None]
            last = f"{done[-1]:.2f} s" if done else "-"
            parts.append(f"{job.label} {len(done)} (last {last})")
        where = f"{elapsed:.0f}/{total:.0f} s, ETA {total - elapsed:.0f} s + restore" if measuring else "warm-up"
        self.say(f"{where}; checkpoints completed: " + "; ".join(parts))

    # ---- the fixed-backlog workload

    def rounds(self, workload: Workload) -> list[Run]:
        """One round per backlog: it goes into every job, then one checkpoint
        is triggered in all of them at once; a run per variant and backlog."""
        runs: list[Run] = []
        for job in self.jobs:
            job.started_at = time.monotonic()
        for round_, backlog in enumerate(workload.backlogs, start=1):
            self.say(f"round {round_}/{len(workload.backlogs)}: {backlog} records per partition, then a checkpoint")
            for job in self.jobs:
                self.feed.send(job, backlog * job.partitions)
            self.feed.flush()
            order = self.jobs[:: -1 if round_ % 2 == 0 else 1]  # who is triggered first alternates
            triggered = {id(j): j.runner.coordinator.trigger() for j in order}
            if any(b is None for b in triggered.values()):
                raise SparkAbsError("a checkpoint is still pending from before; cannot trigger the next")
            records = {id(j): j.runner.coordinator.records[triggered[id(j)].checkpoint_id] for j in self.jobs}
            self.wait(
                lambda records=records: all(r.status is not CheckpointStatus.PENDING for r in records.values()),
                f"round {round_}'s checkpoints",
                f"round {round_}",
            )
            now = time.monotonic()
            for job in self.jobs:
                record = records[id(job)]
                sample = Sample.from_record(record, record.triggered_at - job.started_at, now)
                runs.append(Run(job.variant, float(backlog), job.run.job, 0.0, [sample]))
                self.say(
                    f"round {round_}: {job.variant}: checkpoint {record.checkpoint_id} {record.status} in "
                    f"{sample.duration_s:.2f} s ({', '.join(sample.kinds)})"
                )
        return runs

    def _samples(self, job: _Job, now: float) -> list[Sample]:
        records = sorted(job.runner.coordinator.records.values(), key=lambda r: r.checkpoint_id)
        return [
            Sample.from_record(r, r.triggered_at - job.started_at, now)
            for r in records
            if r.checkpoint_id >= job.counted_from
        ]

    # ---- restore

    def restore(self, limit_s: float = 90.0) -> None:
        """Restore every job from its latest checkpoint (in place: the
        workers' Spark stays up) and time it."""
        self.say("restoring every job from its latest checkpoint (no new input meanwhile)")
        begun = {}
        for job in self.jobs:
            begun[id(job)] = time.monotonic()
            job.runner.restore("compare: restore from the latest checkpoint")
        limit = time.monotonic() + limit_s
        self.wait(lambda: all(j.runner.coordinator.all_ready for j in self.jobs), "the restored tasks", "restore")
        self.wait(
            lambda: all(j.runner.coordinator.all_replayed for j in self.jobs),
            "the restored channel state to be replayed",
            "restore",
            limit=limit,
        )
        for job in self.jobs:
            coordinator = job.runner.coordinator
            start = begun[id(job)]
            replayed = coordinator.all_replayed
            job.run.restore = Restore(
                checkpoint_id=job.runner.restores[-1].checkpoint_id,
                ready_s=max(coordinator.ready_at.values()) - start if coordinator.ready_at else None,
                replayed_s=max(coordinator.replayed_at.values()) - start if replayed else None,
                replay_records=sum(coordinator.replaying.values()),
            )
            self.say(
                f"{job.label}: restored checkpoint {job.run.restore.checkpoint_id}, ready in "
                f"{job.run.restore.ready_s:.1f} s, "
                + (
                    f"channel state ({job.run.restore.replay_records} records) replayed in "
                    f"{job.run.restore.replayed_s:.1f} s"
                    if replayed
                    else f"channel state not replayed within {limit_s:g} s"
                )
            )


def _read(job: _Job) -> dict[int, int]:
    """Per ingress partition: the data records the job's first stage has
    processed, from its tasks' latest progress events (barriers not counted)."""
    coordinator = job.runner.coordinator
    barriers: dict[str, list[int]] = {}
    for record in coordinator.records.values():
        for channel, offset in record.ingress_offsets.items():
            barriers.setdefault(channel, []).append(offset)
    read: dict[int, int] = {}
    prefix = f"{job.topic}:"
    for positions in coordinator.positions.values():
        for channel, position in positions.items():
            if channel.startswith(prefix):
                data = position - sum(1 for b in barriers.get(channel, ()) if b < position)
                read[int(channel[len(prefix) :])] = data
    return read


def _records_per_s(job: _Job) -> float | None:
    """Data records the first stage had read per second, between the first
    and the last completed checkpoint of the measured run (from the tasks'
    positions at their snapshots, barriers not counted)."""
    runner = job.runner
    records = sorted(runner.coordinator.records.values(), key=lambda r: r.checkpoint_id)
    barriers: dict[str, list[int]] = {}
    for r in records:
        for channel, offset in r.ingress_offsets.items():
            barriers.setdefault(channel, []).append(offset)
    ingress = {str(c) for c in runner.pipeline.ingress_channels()}

    def read(record) -> tuple[float, int] | None:
        total, when = 0, None
        for task in record.tasks.values():
            read_ingress = False
            for channel, position in task.get("positions", {}).items():
                if channel not in ingress:
                    continue
                read_ingress = True
                upto = task.get("in_flight", {}).get(channel, [position])[0]
                total += upto - sum(1 for b in barriers.get(channel, ()) if b < upto)
            if read_ingress and task.get("first_barrier_s") is not None:
                seen = record.triggered_at + float(task["first_barrier_s"])
                when = seen if when is None else max(when, seen)
        return None if when is None else (when, total)

    done = [read(r) for r in records if r.status is CheckpointStatus.COMPLETED and r.checkpoint_id >= job.counted_from]
    done = [d for d in done if d is not None]
    if len(done) < 2 or done[-1][0] <= done[0][0]:
        return None
    return (done[-1][1] - done[0][1]) / (done[-1][0] - done[0][0])


# --------------------------------------------------------------------------
# the command


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{option} {text}: comma-separated numbers") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-abs compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = Workload()
    parser.add_argument("--workload", default=defaults.kind, choices=WORKLOADS, help="what the jobs run (above)")
    parser.add_argument(
        "--variants",
        default="aligned,unaligned,aligned-timeout",
        help=f"comma-separated, the first is the baseline of the ratios; any of {', '.join(VARIANTS)} "
        f"(default aligned,unaligned,aligned-timeout)",
    )
    parser.add_argument(
        "--costs", default="1,10", help="ms per record of the slow stage; one job per cost (default 1,10)"
    )
    parser.add_argument(
        "--load", type=float, default=defaults.load, help="source rate ÷ what the slow stage can take (default 1.25)"
    )
    parser.add_argument("--rate", type=float, help="records (money: transfers) per second into each job")
    parser.add_argument(
        "--buffer",
        type=float,
        default=defaults.buffer_s,
        help="backpressure: the source waits while this many seconds of the stage's work are unread (default 1)",
    )
    parser.add_argument("--duration", type=float, default=defaults.duration_s, help="seconds measured (default 30)")
    parser.add_argument(
        "--interval", type=float, default=defaults.interval_s, help="seconds between checkpoints (default 1)"
    )
    parser.add_argument(
        "--warmup", type=float, default=defaults.warmup_s, help="seconds run before measuring (default 5)"
    )
    parser.add_argument(
        "--keys", type=int, default=defaults.keys, help="distinct keys (state size); money: accounts (default 7)"
    )
    parser.add_argument(
        "--skew", type=int, default=defaults.skew, help="skew: records partition 0 starts behind (default 3000)"
    )
    parser.add_argument(
        "--backlogs",
        default="500,1000,2000",
        help="backlog: records per partition in front of each round's barriers (default 500,1000,2000)",
    )
    parser.add_argument(
        "--timeout-ms",
        type=int,
        default=defaults.timeout_ms,
        help="aligned-timeout: ms after the trigger (default 200)",
    )
    parser.add_argument("--no-restore", action="store_true", help="skip the restore measured at the end")
    parser.add_argument("--store", help="snapshot store URI (default file://<home>/compare-store)")
    parser.add_argument("--out", help="directory for the JSON, tables and charts (default <home>/runs/compare-<time>)")
    args = parser.parse_args(argv)
    import os

    from streaming.api.config import Connection, default_home
    from streaming.local import LocalRuntime
    from streaming.tools import compare_report

    say = lambda line: print(f"[compare] {line}", flush=True)  # noqa: E731
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    check_variants(variants)
    workload = Workload(
        kind=args.workload,
        costs=_floats(args.costs, "--costs"),
        load=args.load,
        rate=args.rate,
        duration_s=args.duration,
        interval_s=args.interval,
        warmup_s=args.warmup,
        buffer_s=args.buffer,
        keys=args.keys,
        skew=args.skew,
        backlogs=tuple(int(b) for b in _floats(args.backlogs, "--backlogs")),
        timeout_ms=args.timeout_ms,
    )
    if workload.kind == "money" and args.keys == defaults.keys:
        workload = replace(workload, keys=10)
    out = Path(args.out) if args.out else default_home() / "runs" / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    connection = Connection.from_env(os.environ) or LocalRuntime(progress=say).up()
    store = args.store or f"file://{default_home() / 'compare-store'}"
    comparison = run_compare(
        connection, store_uri=store, workload=workload, variants=variants, restore=not args.no_restore, say=say
    )
    written = compare_report.write(comparison, out)
    print()
    compare_report.print_tables(comparison)
    print(f"\n{len(comparison.runs)} jobs, {comparison.seconds:.0f} s; written to {out}:")
    for path in written:
        print(f"  {path.name}")
    return 0
