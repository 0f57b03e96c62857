"""What aligned and unaligned checkpoints cost, measured side by side: the
jobs of a comparison (``run_compare``), run at the same time on this
machine, fed the same records (``spark-abs compare``, ``streaming.tools.cli.compare``,
says what it runs and measures)."""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from barriers.coordinator import CheckpointStatus
from barriers.handler import CheckpointKind
from streaming.adapters.snapshots.format import text_of
from streaming.api.config import KafkaAccess
from streaming.api.pipeline import pipeline_module
from streaming.api.settings import JobSettings, Mode
from streaming.errors import ConfigError, SparkAbsError
from streaming.tools.compare.model import Comparison, Restore, Run, Sample
from streaming.tools.compare.workloads import MONEY_PIPELINE, VARIANTS, Workload
from streaming.waits import Deadline

__all__ = ["VARIANTS", "run_compare", "check_variants"]

log = logging.getLogger(__name__)

# the warm-up waits at most this much longer for every job's first checkpoint
_WARMUP_LIMIT_S = 60.0


@functools.cache
def _money_step_ms() -> int:
    """The money pipeline's milliseconds of event time between transfers (its module's ``STEP_MS``)."""
    return int(pipeline_module(MONEY_PIPELINE).STEP_MS)


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
    workload: Workload = Workload(),  # noqa: B008 - a frozen dataclass
    variants: Sequence[str] = ("aligned", "unaligned", "aligned-timeout"),
    restore: bool = True,
    timeout_s: float = 600.0,
) -> Comparison:
    """Run the comparison on ``connection`` (see the module docstring): the
    variants side by side, one workload point after another.  Its progress
    is logged (INFO)."""
    check_variants(variants)
    stamp = uuid.uuid4().hex[:6]
    comparison = Comparison(workload, list(variants), started=time.strftime("%Y-%m-%d %H:%M:%S"))
    began = time.monotonic()
    deadline = Deadline(timeout_s)
    points = workload.job_points
    for index, point in enumerate(points, start=1):
        if len(points) > 1:
            log.info(f"part {index}/{len(points)}: {workload.label(point)}")
        comparison.runs += _side_by_side(connection, store_uri, workload, variants, point, stamp, restore, deadline)
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
    deadline: Deadline,
) -> list[Run]:
    """One job per variant at ``point``, all at once: started, fed, measured,
    restored, stopped.  The runs measured."""
    jobs: list[_Job] = []
    runs: list[Run] = []
    feed = _Feed(connection.kafka, workload)
    labels = _JobLabels().attach()
    try:
        for variant in variants:
            jobs.append(_new_job(connection, store_uri, workload, variant, point, stamp, deadline))
            if workload.continuous:
                runs.append(jobs[-1].run)
        _prepare(jobs, feed, workload)
        log.info(f"starting {len(jobs)} jobs side by side: {', '.join(variants)}")
        labels.update({job.runner.job: job.label for job in jobs})
        for job in jobs:
            job.runner.start()
        side = _SideBySide(jobs, feed, deadline)
        side.wait(lambda: all(j.runner.coordinator.all_ready for j in jobs), "the jobs' tasks to start", "starting")
        if workload.continuous:
            side.continuous(workload)
        else:
            runs += side.rounds(workload)
        _count_records(jobs, runs, feed, workload)
        if restore:
            _restore(side, runs, workload)
    finally:
        feed.close()
        for job in jobs:
            job.runner.close()
        labels.detach()
    return runs


def _new_job(
    connection, store_uri: str, workload: Workload, variant: str, point: float, stamp: str, deadline: Deadline
) -> _Job:
    """The job of ``variant`` at ``point`` (its runner made, not started)."""
    from streaming.engine.job.runner import JobRunner

    extra = dict(VARIANTS[variant])
    if extra["mode"] is Mode.ALIGNED_TIMEOUT:
        extra["alignment_timeout_ms"] = workload.timeout_ms
    settings = JobSettings(
        store=store_uri,
        interval_s=workload.interval_s if workload.continuous else 3600,
        timeout_s=max(60.0, deadline.left()),
        retain=2,
        **extra,
    )
    name = f"cmp-{variant}-{workload.label(point)}-{stamp}".replace(" ", "").replace("/", "-")
    label = f"{variant} @ {workload.label(point)}"
    runner = JobRunner(workload.pipeline_ref(point), settings, connection, job=name)
    ingress = runner.pipeline.ingress[0]
    run = Run(variant, point, name, workload.rate_of(point) if workload.continuous else 0.0)
    return _Job(variant, point, runner, run, ingress.topic, ingress.partitions, label=label)


def _prepare(jobs: list[_Job], feed: _Feed, workload: Workload) -> None:
    """Every job's topics; the skew workload's head start of partition 1 fed."""
    for job in jobs:
        job.runner.prepare()
    if workload.kind == "skew":
        log.info(f"partition 0 of every job starts {workload.skew} records behind partition 1")
        for job in jobs:
            feed.send(job, workload.skew, partitions=(0,))
        feed.flush()


def _count_records(jobs: list[_Job], runs: list[Run], feed: _Feed, workload: Workload) -> None:
    """Records produced, their mean size and the rate read, per run."""
    for job in jobs:
        job.run.produced = feed.produced.get(job.job_name, 0)
        job.run.mean_record_bytes = feed.bytes.get(job.job_name, 0) / max(1, job.run.produced)
        job.run.records_per_s = _records_per_s(job) if workload.continuous else None
    if not workload.continuous:  # every round's records went into every job
        for run in runs:
            run.mean_record_bytes = next(j.run.mean_record_bytes for j in jobs if j.variant == run.variant)


def _restore(side: _SideBySide, runs: list[Run], workload: Workload) -> None:
    """Restore every job and time it; with rounds, the restore goes with the last round's runs."""
    side.restore()
    if not workload.continuous:  # the restore follows the last round
        last = workload.points[-1]
        for job in side.jobs:
            next(r for r in runs if r.variant == job.variant and r.point == last).restore = job.run.restore


class _JobLabels(logging.Filter, dict):
    """Job name -> label: a line a job logs (``record.job``, the runner's)
    starts with its label, so the lines of jobs side by side can be told apart."""

    def attach(self) -> _JobLabels:
        for handler in logging.getLogger("streaming").handlers:
            handler.addFilter(self)
        return self

    def detach(self) -> None:
        for handler in logging.getLogger("streaming").handlers:
            handler.removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        label = self.get(getattr(record, "job", None))
        if label is not None and not getattr(record, "labelled", False):
            record.msg, record.labelled = f"{label}: {record.msg}", True
        return True


class _Feed:
    """The records every job gets: the same ones, in the same order."""

    def __init__(self, kafka: KafkaAccess, workload: Workload):
        from streaming.adapters.kafka import clients as kafka_clients

        self.workload = workload
        self.produced: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.sent: dict[tuple[str, int], int] = {}  # (job, partition) -> records
        self._producer = kafka_clients.raw_producer(kafka, linger_ms=10)
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
            step_ms = _money_step_ms()
            rng = np.random.default_rng(index)
            source, target = rng.choice(self.workload.keys, 2, replace=False)
            transfer: dict[str, Any] = {
                "id": index,
                "source": f"acct-{source:02d}",
                "target": f"acct-{target:02d}",
                "amount": int(rng.integers(1, 500)),
                "ts": index * step_ms,
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

    def __init__(self, jobs: list[_Job], feed: _Feed, deadline: Deadline):
        self.jobs = jobs
        self.feed = feed
        self.deadline = deadline
        self._said = 0.0

    def wait(self, done: Callable[[], bool], what: str, phase: str, limit: Deadline | None = None) -> bool:
        """Poll every job (briefly, so completion times stay sharp) until
        ``done``; False when ``limit`` passed first.  A worker that dies ends
        the comparison."""
        while not done():
            now = time.monotonic()
            if limit is not None and limit.passed():
                return False
            if self.deadline.passed():
                raise SparkAbsError(f"gave up waiting for {what}")
            self.poll()
            if now - self._said > 10:
                self._said = now
                log.info(f"{phase}: waiting for {what}")
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
        log.info(
            f"feeding {self.jobs[0].run.rate:g} records/s into each job (throttled while {workload.buffer_s:g} s "
            f"of work wait unread), a checkpoint every {workload.interval_s:g} s in each; warm-up (not counted): "
            f"{workload.warmup_s:g} s and until every job completed a checkpoint"
        )
        start = time.monotonic()
        measuring = None  # when the measured part began
        give_up_warmup = Deadline(workload.warmup_s + _WARMUP_LIMIT_S)
        for job in self.jobs:
            job.last_trigger = start
        next_progress = start + 5
        while True:
            now = time.monotonic()
            if measuring is not None and now - measuring >= workload.duration_s:
                break
            if self.deadline.passed():
                raise SparkAbsError("gave up: the comparison ran past its time limit")
            if measuring is None and now - start >= workload.warmup_s:
                warm = all(
                    any(r.status is CheckpointStatus.COMPLETED for r in j.runner.coordinator.records.values())
                    for j in self.jobs
                )
                if warm or give_up_warmup.passed():
                    if not warm:
                        log.info(f"warm-up: not every job completed a checkpoint in {now - start:.0f} s; measuring")
                    measuring = now
                    for job in self.jobs:
                        job.started_at = now
                        job.counted_from = max(job.runner.coordinator.records, default=0) + 1
                    log.info(f"warm-up done after {now - start:.0f} s; measuring {workload.duration_s:g} s")
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
        log.info(
            "run done: "
            + ", ".join(f"{j.label}: {j.run.count(CheckpointStatus.COMPLETED)} checkpoints" for j in self.jobs)
        )

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
        log.info(f"{where}; checkpoints completed: " + "; ".join(parts))

    # ---- the fixed-backlog workload

    def rounds(self, workload: Workload) -> list[Run]:
        """One round per backlog: it goes into every job, then one checkpoint
        is triggered in all of them at once; a run per variant and backlog."""
        runs: list[Run] = []
        for job in self.jobs:
            job.started_at = time.monotonic()
        for round_, backlog in enumerate(workload.backlogs, start=1):
            log.info(f"round {round_}/{len(workload.backlogs)}: {backlog} records per partition, then a checkpoint")
            for job in self.jobs:
                self.feed.send(job, backlog * job.partitions)
            self.feed.flush()
            order = self.jobs[:: -1 if round_ % 2 == 0 else 1]  # who is triggered first alternates
            triggered = {id(j): j.runner.coordinator.trigger() for j in order}
            if any(b is None for b in triggered.values()):
                raise SparkAbsError("a checkpoint is still pending from before; cannot trigger the next")
            records = {id(j): j.runner.coordinator.records[triggered[id(j)].checkpoint_id] for j in self.jobs}

            def settled(records: dict[int, Any] = records) -> bool:
                return all(r.status is not CheckpointStatus.PENDING for r in records.values())

            self.wait(settled, f"round {round_}'s checkpoints", f"round {round_}")
            now = time.monotonic()
            for job in self.jobs:
                record = records[id(job)]
                sample = Sample.from_record(record, record.triggered_at - job.started_at, now)
                runs.append(Run(job.variant, float(backlog), job.run.job, 0.0, [sample]))
                log.info(
                    f"round {round_}: {job.variant}: checkpoint {record.checkpoint_id} {record.status} in "
                    f"{sample.duration_s:.2f} s ({', '.join(text_of(CheckpointKind, k) for k in sample.kinds)})"
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
        log.info("restoring every job from its latest checkpoint (no new input meanwhile)")
        begun = {}
        for job in self.jobs:
            begun[id(job)] = time.monotonic()
            job.runner.restore("compare: restore from the latest checkpoint")
        limit = Deadline(limit_s)
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
            log.info(
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
        for name, snapshot in record.snapshots.items():
            read_ingress = False
            for channel, position in snapshot.positions.items():
                if channel not in ingress:
                    continue
                read_ingress = True
                upto = snapshot.in_flight.get(channel, (position,))[0]
                total += upto - sum(1 for b in barriers.get(channel, ()) if b < upto)
            first_barrier_s = record.tasks[name].first_barrier_s
            if read_ingress and first_barrier_s is not None:
                seen = record.triggered_at + first_barrier_s
                when = seen if when is None else max(when, seen)
        return None if when is None else (when, total)

    reads = [read(r) for r in records if r.status is CheckpointStatus.COMPLETED and r.checkpoint_id >= job.counted_from]
    done = [d for d in reads if d is not None]
    if len(done) < 2 or done[-1][0] <= done[0][0]:
        return None
    return (done[-1][1] - done[0][1]) / (done[-1][0] - done[0][0])


# --------------------------------------------------------------------------
# the command
