"""Restore drills: ``spark-abs drill`` and ``run_drill``.

A drill runs a job (the money pipeline by default) as a real ``spark-abs
run`` process, on a workload produced while it runs, and injects failures at
moments drawn from a seed: after each, the job must restore by itself and
complete a checkpoint again.  At the end the job is drained (SIGUSR1 to
``spark-abs run``: it stops once every input record is processed and
committed), and great-expectations suites check the
committed output against a reference Spark computes in batch from the same
ingress topics, every checkpoint a coordinator reported complete, and the
dead letters (``streaming.tools.drill_checks``).  The report (Markdown, JSON
and GX's own results) goes to a directory; ``streaming.tools.drill_report``
writes it.

Failure kinds (``FailureKind``), each drawn in turn so that ``k`` failures
give every chosen kind ``k / kinds`` times (rounded):

- ``worker``: a worker process and its Spark JVM SIGKILLed, at a random
  moment or at a named fault point (``streaming.engine.faults``: mid-batch,
  during alignment, during upload, between the manifest and the sink's
  commit, during the restore itself), armed in the running worker through
  its fault file;
- ``runner``: the job runner (it hosts the coordinator) SIGKILLed; its
  workers must stop by themselves (the drill waits for that, and fails the
  drill if any outlives the bound), then ``spark-abs run`` starts again and
  restores;
- ``broker``: the local runtime's Kafka broker stopped for a few seconds and
  started again;
- ``store``: the local runtime's S3 server stopped for a few seconds (the
  store is ``s3://`` by default so it can be), so checkpoints decline until
  it is back;
- ``damage``: the runner SIGKILLed, the newest complete checkpoint damaged (a
  part deleted or a byte flipped), the runner started again: the restore
  must skip it for an older one that verifies.

Each failure waits for recovery (a checkpoint completes after it), which the
report times; ``--seed`` makes the plan (kinds, order, moments, fault points,
damage) the same again.  A user's pipeline is drilled with a workload they
name, ``module:function`` returning a ``DrillWorkload``."""

from __future__ import annotations

import enum
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from streaming.adapters.control import ControlTopic, Progress
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import Connection, default_home
from streaming.api.pipeline import Pipeline, load_pipeline
from streaming.api.settings import MODES, JobSettings, Mode
from streaming.engine import faults
from streaming.errors import ConfigError, SnapshotMissingError, SparkAbsError, parse_choice

__all__ = [
    "DrillReport",
    "DrillWorkload",
    "Failure",
    "FailureKind",
    "FailureOutcome",
    "InputRecord",
    "money_workload",
    "fault_pools",
    "job_processes",
    "job_worker_pids",
    "plan_failures",
    "run_drill",
]

log = logging.getLogger(__name__)


class FailureKind(enum.StrEnum):
    WORKER = "worker"
    RUNNER = "runner"
    BROKER = "broker"
    STORE = "store"
    DAMAGE = "damage"


KINDS = tuple(FailureKind)
# where a worker failure strikes: at a random moment, or at a fault point armed in the running worker
WORKER_MOMENTS = ("random", "mid_batch", "during_alignment", "during_upload", "before_sink_commit", "during_restore")
DAMAGES = ("delete a part", "flip a byte")
# how long the workers of a runner that was SIGKILLed may run on (they notice its pipe closed)
ORPHAN_BOUND_S = 60.0


@dataclass(frozen=True)
class Failure:
    """One planned failure: what, after how long, and its details."""

    index: int
    kind: FailureKind
    delay_s: float  # after the job recovered from the previous failure
    moment: str = ""  # worker: a WORKER_MOMENTS entry; damage: a DAMAGES entry
    task: str = ""  # worker at a fault point: the task armed
    outage_s: float = 0.0  # broker, store: how long the service is down

    def describe(self) -> str:
        if self.kind is FailureKind.WORKER:
            where = "at a random moment" if self.moment == "random" else f"at {self.moment} of {self.task}"
            return f"worker SIGKILLed {where}"
        if self.kind is FailureKind.RUNNER:
            return "job runner SIGKILLed, started again"
        if self.kind is FailureKind.DAMAGE:
            return f"runner SIGKILLed, newest checkpoint damaged ({self.moment}), runner started again"
        service = "Kafka broker" if self.kind is FailureKind.BROKER else "S3 server"
        return f"{service} down for {self.outage_s:.0f} s"


def fault_pools(pipeline: Pipeline, mode: Mode) -> dict[str, list[str]]:
    """The tasks where each fault point can strike: any task mid-batch, during
    an upload or a restore; a task with more than one input during alignment
    (aligned modes only); a sink task between the manifest and its commit."""
    tasks = pipeline.tasks()
    every = [t.name for t in tasks]
    aligned = mode in (Mode.ALIGNED, Mode.ALIGNED_TIMEOUT)
    aligning = [t.name for t in tasks if len(t.inputs) > 1] if aligned else []
    sinks = [t.name for t in tasks if pipeline.stage(t.stage).sink is not None]
    return {
        "mid_batch": every,
        "during_alignment": aligning,
        "during_upload": every,
        "before_sink_commit": sinks,
        "during_restore": every,
    }


def plan_failures(
    count: int,
    seed: int,
    kinds: Sequence[FailureKind],
    pools: Mapping[str, Sequence[str]],
    interval_s: float,
) -> list[Failure]:
    """``count`` failures drawn from ``seed``: the kinds in turn (shuffled);
    worker failures a random kill first, then the fault points with a task
    in ``pools`` (``fault_pools``) in turn (shuffled), each at a task drawn
    from its pool; delays of 0.2 to 2 checkpoint intervals."""
    if count < 0:
        raise ConfigError(f"failures must be 0 or more, got {count}")
    if not kinds:
        raise ConfigError("a drill needs at least one failure kind")
    rng = random.Random(seed)
    drawn = [kinds[i % len(kinds)] for i in range(count)]
    rng.shuffle(drawn)
    moments = [m for m in WORKER_MOMENTS if m != "random" and pools.get(m)]
    rng.shuffle(moments)
    moments.insert(0, "random")  # the first worker failure is a plain kill, the others walk the fault points
    plan, worker_failures = [], 0
    for index, kind in enumerate(drawn):
        delay = round(rng.uniform(0.2, 2.0) * interval_s, 2)
        if kind is FailureKind.WORKER:
            moment = moments[worker_failures % len(moments)]
            worker_failures += 1
            task = "" if moment == "random" else rng.choice(list(pools[moment]))
            plan.append(Failure(index, kind, delay, moment, task))
        elif kind is FailureKind.DAMAGE:
            plan.append(Failure(index, kind, delay, rng.choice(DAMAGES)))
        elif kind in (FailureKind.BROKER, FailureKind.STORE):
            plan.append(Failure(index, kind, delay, outage_s=round(rng.uniform(3.0, 8.0), 1)))
        else:
            plan.append(Failure(index, kind, delay))
    return plan


@dataclass
class FailureOutcome:
    """What happened after one failure."""

    failure: Failure
    at_s: float  # seconds into the drill when it was injected
    restored_from: list[int | None] = field(default_factory=list)  # per restore it caused (None: the beginning)
    damaged: int | None = None  # the checkpoint the drill damaged
    recovered_s: float | None = None  # injection -> the next checkpoint completed
    replayed: int | None = None  # ingress records processed again
    orphans_gone_s: float | None = None  # runner kills: until no worker of the job was left
    note: str = ""

    @property
    def recovered(self) -> bool:
        return self.recovered_s is not None


# ---- workloads


@dataclass(frozen=True)
class InputRecord:
    topic: str
    partition: int
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    key: bytes | None = None
    malformed: bool = False  # the pipeline must turn it into a dead letter


@dataclass(frozen=True)
class DrillWorkload:
    """What a drill feeds a pipeline and how it checks the output.

    ``records(pipeline, rng)`` yields input records without end (the drill
    sends them at its rate while failures go on); ``end(pipeline)`` the
    records that close the input; ``reference(spark, pipeline, bootstrap)``
    the expected output, computed in batch by Spark from the ingress topics,
    as a pandas frame with the ``keys`` and ``sums`` columns; and, when the
    pipeline conserves something, ``conserved(store, checkpoint_id,
    read_range)`` its total in a checkpoint (zero when conserved)."""

    records: Callable[[Pipeline, random.Random], Iterator[InputRecord]]
    end: Callable[[Pipeline], list[InputRecord]]
    reference: Callable[[Any, Pipeline, str], pd.DataFrame]
    keys: tuple[str, ...]
    sums: tuple[str, ...]
    conserved: Callable[[SnapshotStore, int, Callable], int] | None = None
    output: Callable[[Any], pd.DataFrame] | None = None  # committed output table -> frame (default: to_pandas)


def money_workload(*, accounts: int = 10, malformed_every: int = 997) -> DrillWorkload:
    """The money pipeline's workload: transfers between ``accounts`` accounts
    (event time 10 ms apart), one record in ``malformed_every`` not JSON."""
    from streaming.engine.watermarks import watermark_headers
    from streaming.tools import demo

    def records(pipeline: Pipeline, rng: random.Random) -> Iterator[InputRecord]:
        ingress = pipeline.ingress[0]
        names = [f"acct-{i:02d}" for i in range(accounts)]
        i = 0
        while True:
            partition = i % ingress.partitions
            if rng.randrange(malformed_every) == 0:
                yield InputRecord(ingress.topic, partition, b"{not json: %d" % i, malformed=True)
            source, target = rng.sample(names, 2)
            transfer = {"id": i, "source": source, "target": target, "amount": rng.randint(1, 500), "ts": i * 10}
            yield InputRecord(ingress.topic, partition, json.dumps(transfer).encode(), key=source.encode())
            i += 1

    def end(pipeline: Pipeline) -> list[InputRecord]:
        ingress = pipeline.ingress[0]
        headers = tuple(watermark_headers(demo.END_OF_INPUT))
        return [InputRecord(ingress.topic, p, b"", headers) for p in range(ingress.partitions)]

    def conserved(store: SnapshotStore, checkpoint_id: int, read_range: Callable) -> int:
        return demo.money_in_checkpoint(store, checkpoint_id, read_range).total

    return DrillWorkload(
        records, end, money_reference, ("account", "window_start"), ("net", "legs"), conserved, demo_output
    )


def demo_output(table) -> pd.DataFrame:
    from streaming.tools import demo

    return pd.DataFrame(demo.normalise(table), columns=["account", "window_start", "window_end", "net", "legs"])


def money_reference(spark, pipeline: Pipeline, bootstrap: str) -> pd.DataFrame:
    """The money pipeline's windows, computed in batch by Spark from the
    transfers topic: every JSON transfer's two legs, summed per account and
    one-second window (records that are not transfers are left out, as the
    pipeline sends them to the dead letters)."""
    from pyspark.sql import functions as F

    from streaming.tools import demo

    topic = pipeline.ingress[0].topic
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    schema = "id BIGINT, source STRING, target STRING, amount BIGINT, ts BIGINT"
    transfers = (
        raw.select(F.from_json(F.col("value").cast("string"), schema).alias("t"))
        .select("t.*")
        .where("id IS NOT NULL AND source IS NOT NULL AND target IS NOT NULL AND amount IS NOT NULL AND ts IS NOT NULL")
    )
    legs = transfers.select(F.col("source").alias("account"), (-F.col("amount")).alias("amount"), "ts").unionByName(
        transfers.select(F.col("target").alias("account"), "amount", "ts")
    )
    start = (F.floor(F.col("ts") / demo.WINDOW_MS) * demo.WINDOW_MS).cast("long")
    windows = (
        legs.groupBy("account", start.alias("window_start"))
        .agg(F.sum("amount").alias("net"), F.count("*").alias("legs"))
        .withColumn("window_end", F.col("window_start") + demo.WINDOW_MS)
        .select("account", "window_start", "window_end", "net", "legs")
    )
    return windows.toPandas()


def load_workload(ref: str | None) -> DrillWorkload:
    """``module:function`` returning a ``DrillWorkload``; None: the money workload."""
    if not ref:
        return money_workload()
    import importlib

    module_name, _, attribute = ref.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"workload {ref!r}: expected module:function")
    try:
        made = getattr(importlib.import_module(module_name), attribute)()
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"workload {ref!r} cannot be loaded: {exc}") from exc
    if not isinstance(made, DrillWorkload):
        raise ConfigError(f"workload {ref!r} returned {type(made).__name__}, not a DrillWorkload")
    return made


# ---- the processes of a job


def job_worker_pids(job: str) -> list[int]:
    """Worker processes of ``job`` that run on this machine (from /proc)."""
    return [pid for pid, (_, args) in _process_table().items() if _is_worker(args, job)]


def job_processes(job: str, groups: Iterable[int] = ()) -> list[int]:
    """Every process of ``job``'s workers: the workers (by their command
    line) and whatever runs in their process groups or in ``groups`` (the
    workers' Spark JVMs, which outlive a worker that died without stopping them)."""
    table = _process_table()
    groups = set(groups) | {pid for pid, (_, args) in table.items() if _is_worker(args, job)}
    return sorted(pid for pid, (group, _) in table.items() if group in groups)


def _process_table() -> dict[int, tuple[int, list[bytes]]]:
    """pid -> (process group, arguments) of every process we can see."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry.name)] = (group, args)
    return table


def _is_worker(args: list[bytes], job: str) -> bool:
    return b"streaming.engine.worker" in args and _follows(args, b"--job", job.encode())


def _follows(args: list[bytes], option: bytes, value: bytes) -> bool:
    return any(a == option and b == value for a, b in zip(args, args[1:]))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---- the drill


@dataclass
class DrillReport:
    job: str
    seed: int
    mode: Mode
    pipeline: str
    plan: list[Failure]
    outcomes: list[FailureOutcome]
    checks: list  # drill_checks.SuiteResult
    frames: dict[str, pd.DataFrame]
    produced: int
    malformed: int
    checkpoints: int
    seconds: float
    problems: list[str]  # what went wrong outside the expectations (a failure not recovered, an orphan)
    report_dir: Path | None = None

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.checks) and all(c.success for c in self.checks)


@dataclass
class _Watch:
    """How far the tasks of each generation read the ingress channels (their
    progress events on the control topic)."""

    ingress: frozenset[str]
    furthest: dict[int, dict[str, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, events) -> None:
        with self.lock:
            for event in events:
                if not isinstance(event, Progress):
                    continue
                reached = self.furthest.setdefault(event.generation, {})
                for channel, position in event.positions.items():
                    if channel in self.ingress:
                        reached[channel] = max(reached.get(channel, 0), position)

    def before(self, generation: int) -> dict[str, int]:
        """The furthest position on each ingress channel of the generations before ``generation``."""
        with self.lock:
            reached: dict[str, int] = {}
            for g, positions in self.furthest.items():
                if g < generation:
                    for channel, position in positions.items():
                        reached[channel] = max(reached.get(channel, 0), position)
            return reached


class Drill:
    """One drill (see the module docstring); ``run_drill`` is the way in."""

    def __init__(
        self,
        connection: Connection,
        *,
        pipeline: str,
        workload: DrillWorkload,
        failures: int,
        seed: int,
        kinds: Sequence[FailureKind],
        mode: Mode | str,
        interval_s: float,
        rate: float,
        store_uri: str,
        report_dir: Path,
        runtime=None,
        spark=None,
        recover_timeout_s: float = 180.0,
    ):
        self.connection = connection
        self.pipeline_ref = pipeline
        self.workload = workload
        self.seed = seed
        self.mode = parse_choice(Mode, mode, "mode")
        self.interval_s = interval_s
        self.rate = rate
        self.store_uri = store_uri
        self.report_dir = report_dir
        self.runtime = runtime
        self.spark = spark
        self.recover_timeout_s = recover_timeout_s
        self.job = f"drill-{seed}-{uuid.uuid4().hex[:6]}"
        self.pipeline = load_pipeline(pipeline, self.job)
        needs_runtime = {FailureKind.BROKER, FailureKind.STORE} & set(kinds)
        if needs_runtime and runtime is None:
            raise ConfigError(
                f"failure kinds {', '.join(sorted(needs_runtime))} stop services of the local runtime; "
                "this drill runs on another deployment (SPARK_ABS_* set): leave them out with --kinds"
            )
        if FailureKind.STORE in kinds and not store_uri.startswith("s3://"):
            raise ConfigError(f"failure kind store stops the S3 server; the store {store_uri} is not on it")
        self.plan = plan_failures(failures, seed, kinds, fault_pools(self.pipeline, self.mode), interval_s)
        self.store = SnapshotStore(open_store(store_uri, connection), self.job)
        self.log_dir = default_home() / "runs" / self.job
        self.report_dir.mkdir(parents=True, exist_ok=True)
        self.fault_file = self.report_dir / "faults"
        faults.arm(str(self.fault_file), [])
        self.runner: subprocess.Popen | None = None
        self.runner_log = self.report_dir / "runner.log"
        self.started = time.monotonic()
        self.problems: list[str] = []
        ingress = {f"{i.topic}:{p}" for i in self.pipeline.ingress for p in range(i.partitions)}
        self.watch = _Watch(frozenset(ingress))
        self._stop_feed = threading.Event()
        self._feed_error: BaseException | None = None
        self.produced = 0
        self.outcomes: list[FailureOutcome] = []
        self.malformed: list[tuple[str, int]] = []  # (channel, offset) of records made malformed

    # ---- progress

    def _log(self, line: str) -> None:
        log.info(f"[{time.monotonic() - self.started:6.1f} s] {line}")

    # ---- the job's processes

    def _start_runner(self, *extra: str) -> subprocess.Popen:
        command = [
            sys.executable,
            "-m",
            "streaming.tools.cli",
            "run",
            self.pipeline_ref,
            "--store",
            self.store_uri,
            "--job",
            self.job,
            "--mode",
            self.mode,
            "--interval",
            str(self.interval_s),
            # every checkpoint stays, so the drill can check that none was lost
            "--retain",
            "100000",
            # a fault during a restore makes two restores of one failure
            "--max-restores",
            str(2 * len(self.plan) + 10),
            *extra,
        ]
        env = {
            **os.environ,
            **self.connection.as_env(),
            faults.FILE_ENV: str(self.fault_file),
            "PYTHONUNBUFFERED": "1",
        }
        with open(self.runner_log, "ab") as log:
            log.write(f"\n--- {time.strftime('%H:%M:%S')} {' '.join(command[2:])}\n".encode())
            log.flush()
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _runner_alive(self) -> None:
        if self.runner is not None and self.runner.poll() is not None:
            raise SparkAbsError(
                f"the job runner exited with status {self.runner.returncode} during the drill; "
                f"see {self.runner_log}:\n{_tail(self.runner_log)}"
            )

    def _generation(self) -> int:
        meta = self._quietly(self.store.read_job)
        return meta.generation if meta else 0

    def _restores(self) -> list[dict]:
        meta = self._quietly(self.store.read_job)
        return list(meta.restores) if meta else []

    def _completed(self) -> list[int]:
        return self._quietly(self.store.completed) or []

    def _quietly(self, read: Callable[[], Any]) -> Any:
        """A read of the store that may fail while it is down (a store outage)."""
        try:
            return read()
        except SparkAbsError:
            return None

    def _wait(self, condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._runner_alive()
            if self._feed_error is not None:
                raise SparkAbsError(f"producing the workload failed: {self._feed_error}")
            if condition():
                return True
            time.sleep(poll_s)
        return False

    # ---- the workload

    def _feed(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=self.connection.kafka_bootstrap,
            acks="all",
            linger_ms=20,
            retries=1_000_000,  # a broker outage is one of the failures: keep trying until it is back
            request_timeout_ms=5_000,
            delivery_timeout_ms=600_000,
            max_block_ms=600_000,
        )
        rng = random.Random(self.seed)
        records = self.workload.records(self.pipeline, rng)
        sent = time.monotonic()
        pending = []
        try:
            while not self._stop_feed.is_set():
                record = next(records)
                future = producer.send(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    partition=record.partition,
                )
                if record.malformed:
                    pending.append((record, future))
                else:
                    self.produced += 1
                sent += 1.0 / self.rate
                pause = sent - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            for record in self.workload.end(self.pipeline):
                producer.send(
                    record.topic, value=record.value, headers=list(record.headers), partition=record.partition
                )
            producer.flush(600)
            for record, future in pending:
                metadata = future.get(timeout=60)
                self.malformed.append((f"{record.topic}:{record.partition}", metadata.offset))
        except BaseException as exc:  # noqa: BLE001 - reported by the drill's main loop
            self._feed_error = exc
        finally:
            producer.close()

    def _listen(self) -> None:
        control = None
        while not self._stop_feed.is_set() or control is None:
            try:
                if control is None:
                    control = ControlTopic(self.connection.kafka_bootstrap, self.job)
                self.watch.take(control.poll(0.5))
            except Exception:  # the broker may be down (a drill's outage): try again
                time.sleep(1.0)
            if self._stop_feed.is_set():
                break
        if control is not None:
            control.close()

    # ---- failures

    def _recover(self, outcome: FailureOutcome, t0: float, newest_before: int, generation_before: int) -> None:
        def recovered() -> bool:
            done = self._completed()
            return bool(done) and done[-1] > newest_before

        if self._wait(recovered, self.recover_timeout_s):
            outcome.recovered_s = round(time.monotonic() - t0, 2)
        else:
            self.problems.append(
                f"failure {outcome.failure.index + 1} ({outcome.failure.describe()}): no checkpoint completed "
                f"within {self.recover_timeout_s:.0f} s"
            )
        restores = [r for r in self._restores() if r["generation"] > generation_before]
        outcome.restored_from = [r.get("from_checkpoint") for r in restores]
        if restores:
            outcome.replayed = self._replayed(restores[-1]["generation"], restores[-1].get("from_checkpoint"))

    def _replayed(self, generation: int, checkpoint_id: int | None) -> int | None:
        """Ingress records read again by ``generation``: how far the generations
        before it read, less where its checkpoint resumes."""
        furthest = self.watch.before(generation)
        if not furthest:
            return None
        resume: dict[str, int] = {}
        if checkpoint_id is not None:
            manifest = self._quietly(lambda: self.store.read_manifest(checkpoint_id))
            if manifest is None:
                return None
            for snapshot in manifest.tasks.values():
                for channel, position in snapshot.positions.items():
                    if channel in self.watch.ingress:
                        resume[channel] = position
        return sum(max(0, position - resume.get(channel, 0)) for channel, position in furthest.items())

    def _kill_runner(self, outcome: FailureOutcome) -> None:
        """SIGKILL the runner; its workers and their JVMs must stop by themselves within ORPHAN_BOUND_S."""
        assert self.runner is not None
        groups = job_worker_pids(self.job)  # each worker leads its process group, its JVM in it
        self.runner.send_signal(signal.SIGKILL)
        self.runner.wait()
        killed = time.monotonic()
        deadline = killed + ORPHAN_BOUND_S
        while job_processes(self.job, groups) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = job_processes(self.job, groups)
        if not left:
            outcome.orphans_gone_s = round(time.monotonic() - killed, 2)
            self._log(f"  no process of the job left {outcome.orphans_gone_s:.1f} s after the runner died")
            return
        self.problems.append(
            f"failure {outcome.failure.index + 1}: processes {left} of the job outlived their runner by "
            f"{ORPHAN_BOUND_S:.0f} s"
        )
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _damage(self, outcome: FailureOutcome, rng: random.Random) -> None:
        done = self._completed()
        if not done:
            outcome.note = "no complete checkpoint to damage"
            return
        newest = done[-1]
        manifest = self.store.read_manifest(newest)
        parts = sorted(p.path for snap in manifest.tasks.values() for p in snap.parts)
        if not parts:
            outcome.note = f"checkpoint {newest} has no parts to damage"
            return
        path = self.store.layout.part(newest, rng.choice(parts))
        fs = self.store.location.filesystem
        if outcome.failure.moment == "delete a part":
            fs.delete_file(path)
        else:
            with fs.open_input_file(path) as f:
                raw = bytearray(f.read())
            raw[len(raw) // 2] ^= 0xFF
            with fs.open_output_stream(path) as f:
                f.write(bytes(raw))
        outcome.damaged = newest
        outcome.note = (
            f"{outcome.failure.moment} of checkpoint {newest}: {path.rsplit('/', 3)[-3]}/…/{path.rsplit('/', 1)[-1]}"
        )

    def _inject(self, failure: Failure, rng: random.Random) -> FailureOutcome:
        outcome = FailureOutcome(failure, round(time.monotonic() - self.started, 1))
        newest_before = max(self._completed() or [0])
        generation = self._generation()
        t0 = time.monotonic()
        kind = failure.kind
        if kind is FailureKind.WORKER:
            if failure.moment == "random":
                pids = job_worker_pids(self.job)
                if pids:
                    _kill_group(rng.choice(pids))
            else:
                target = generation + 1 if failure.moment == "during_restore" else generation
                faults.arm(str(self.fault_file), [f"{failure.task}:{failure.moment}:*:{target}"])
                if failure.moment == "during_restore":
                    pids = job_worker_pids(self.job)
                    if pids:
                        _kill_group(rng.choice(pids))  # the restore this causes is where the fault waits
                fired = self._wait(lambda: self._generation() > target, 60.0)
                faults.arm(str(self.fault_file), [])
                # recovery counts from the restore the fault caused
                t0 = time.monotonic()
                outcome.at_s = round(t0 - self.started, 1)
                newest_before = max(self._completed() or [0])
                if not fired:
                    outcome.note = f"{failure.moment} did not come within 60 s; killed at a random moment instead"
                    pids = job_worker_pids(self.job)
                    if pids:
                        _kill_group(rng.choice(pids))
        elif kind in (FailureKind.RUNNER, FailureKind.DAMAGE):
            self._kill_runner(outcome)
            if kind is FailureKind.DAMAGE:
                self._damage(outcome, rng)
            self.runner = self._start_runner()
        else:
            service = "kafka" if kind is FailureKind.BROKER else "s3"
            self.runtime.stop_service(service)
            time.sleep(failure.outage_s)
            self.runtime.up()
        self._recover(outcome, t0, newest_before, generation)
        if outcome.damaged is not None and outcome.restored_from:
            picked = outcome.restored_from[-1]
            if picked is not None and picked >= outcome.damaged:
                self.problems.append(
                    f"failure {failure.index + 1}: the restore used checkpoint {picked}, which the drill damaged"
                )
        return outcome

    # ---- the whole drill

    def run(self) -> DrillReport:
        from streaming.api.settings import JobSettings
        from streaming.engine.runner import JobRunner

        prepare = JobRunner(self.pipeline_ref, JobSettings(store=self.store_uri), self.connection, job=self.job)
        prepare.prepare()
        prepare.store.close()
        self._log(
            f"drill {self.job}: {len(self.plan)} failures from seed {self.seed} on {self.pipeline_ref} "
            f"({self.mode} checkpoints every {self.interval_s:g} s, {self.rate:g} records/s); report in {self.report_dir}"
        )
        feeder = threading.Thread(target=self._feed, name="drill-feed", daemon=True)
        listener = threading.Thread(target=self._listen, name="drill-control", daemon=True)
        feeder.start()
        listener.start()
        outcomes = self.outcomes
        rng = random.Random(self.seed + 1)
        try:
            self.runner = self._start_runner()
            if not self._wait(lambda: bool(self._completed()), self.recover_timeout_s):
                raise SparkAbsError(
                    f"the job completed no checkpoint within {self.recover_timeout_s:.0f} s; see {self.runner_log}"
                )
            self._log(f"job up: checkpoint {self._completed()[-1]} complete")
            for failure in self.plan:
                time.sleep(failure.delay_s)
                self._log(f"failure {failure.index + 1}/{len(self.plan)}: {failure.describe()}")
                outcome = self._inject(failure, rng)
                outcomes.append(outcome)
                self._log("  " + _outcome_line(outcome))
            self._stop_feed.set()
            feeder.join(600)
            self._log(f"input closed after {self.produced} records ({len(self.malformed)} malformed); draining the job")
            # the running job drains (SIGUSR1): no restart, no new generation
            self.runner.send_signal(signal.SIGUSR1)
            code = self.runner.wait(600)
            if code != 0:
                raise SparkAbsError(
                    f"draining the job failed (status {code}); see {self.runner_log}:\n{_tail(self.runner_log)}"
                )
            self.runner = None
            self._log("drained: every input record is processed and committed")
            frames, checks = self._check()
        finally:
            self._stop_feed.set()
            if self.runner is not None and self.runner.poll() is None:
                self.runner.send_signal(signal.SIGINT)
                try:
                    self.runner.wait(60)
                except subprocess.TimeoutExpired:
                    self.runner.kill()
            for pid in job_worker_pids(self.job):
                _kill_group(pid)
        report = DrillReport(
            self.job,
            self.seed,
            self.mode,
            self.pipeline_ref,
            self.plan,
            outcomes,
            checks,
            frames,
            self.produced,
            len(self.malformed),
            len(frames["checkpoints"]),
            round(time.monotonic() - self.started, 1),
            self.problems,
            self.report_dir,
        )
        self.store.close()
        return report

    # ---- the checks

    def _check(self) -> tuple[dict[str, pd.DataFrame], list]:
        import functools

        from streaming.adapters.kafka_io import read_range
        from streaming.adapters.sinks import read_committed_output, sink_location
        from streaming.api.settings import JobSettings
        from streaming.tools import drill_checks

        self._log("checking: the reference in batch with Spark, the output, every checkpoint, the dead letters")
        spark = self.spark
        if spark is None:
            from streaming.adapters.spark import spark_session
            from streaming.api.config import SparkSettings

            spark = spark_session(SparkSettings(master=self.connection.spark_master, app_name=f"{self.job}-reference"))
        reference = self.workload.reference(spark, self.pipeline, self.connection.kafka_bootstrap)
        table = read_committed_output(sink_location(JobSettings(store=self.store_uri), self.job, self.connection))
        to_frame = self.workload.output or (lambda t: t.to_pandas())
        output = to_frame(table) if table is not None else reference.iloc[0:0]
        joined = drill_checks.output_frame(output, reference, self.workload.keys)

        damaged = {o.damaged for o in self.outcomes if o.damaged is not None}
        rows = []

        def reader(channel, start: int, end: int):
            return read_range(self.connection.kafka_bootstrap, channel, start, end)

        for checkpoint_id in self._reported_complete():
            try:
                problems = self.store.verify(checkpoint_id)
            except SnapshotMissingError as exc:  # reported complete, and gone
                problems = [str(exc)]
            state = (
                "verifies"
                if not problems
                else ("damaged by the drill" if checkpoint_id in damaged else "; ".join(problems))
            )
            total = None
            if not problems and self.workload.conserved is not None:
                total = self.workload.conserved(self.store, checkpoint_id, reader)
            rows.append({"checkpoint": checkpoint_id, "state": state, "total": total})
        checkpoints = pd.DataFrame(rows, columns=["checkpoint", "state", "total"])
        letters = self._dead_letter_frame()
        frames = {"output": joined, "checkpoints": checkpoints, "dead_letters": letters}
        suites = {
            "output": (
                functools.partial(
                    drill_checks.output_suite,
                    expected_rows=len(reference),
                    keys=self.workload.keys,
                    sums=self.workload.sums,
                ),
                joined,
            ),
            "checkpoints": (
                functools.partial(drill_checks.checkpoint_suite, conserved=self.workload.conserved is not None),
                checkpoints,
            ),
            "dead_letters": (drill_checks.dead_letter_suite, letters),
        }
        index = {"output": self.workload.keys, "checkpoints": ["checkpoint"], "dead_letters": ["source", "offset"]}
        return frames, drill_checks.validate(suites, index)

    def _reported_complete(self) -> list[int]:
        """Every checkpoint a coordinator reported complete (its progress log), in order."""
        done = set()
        try:
            for line in (self.log_dir / "checkpoints.jsonl").read_text().splitlines():
                if line.strip():
                    done.add(int(json.loads(line)["checkpoint"]))
        except OSError:
            pass
        return sorted(done)

    def _dead_letter_frame(self) -> pd.DataFrame:
        from kafka import KafkaConsumer, TopicPartition

        from streaming.adapters.kafka_io import dead_letter_topic_name

        consumer = KafkaConsumer(
            bootstrap_servers=self.connection.kafka_bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000
        )
        tp = TopicPartition(dead_letter_topic_name(self.job), 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        seen: dict[tuple[str, int], list[str]] = {}
        for record in consumer:
            headers = {k: v.decode(errors="replace") for k, v in record.headers}
            source = (headers.get("spark-abs-source", ""), int(headers.get("spark-abs-source-offset", -1)))
            seen.setdefault(source, []).append(headers.get("spark-abs-reason", ""))
        consumer.close()
        rows = []
        for channel, offset in self.malformed:
            reasons = seen.get((channel, offset), [])
            rows.append(
                {
                    "source": channel,
                    "offset": offset,
                    "letters": len(reasons),
                    "reason": reasons[0] if reasons else None,
                }
            )
        return pd.DataFrame(rows, columns=["source", "offset", "letters", "reason"])


def _outcome_line(outcome: FailureOutcome) -> str:
    parts = []
    if outcome.restored_from:
        parts.append(
            "restored from "
            + ", then ".join("the beginning" if c is None else f"checkpoint {c}" for c in outcome.restored_from)
        )
    if outcome.recovered_s is not None:
        parts.append(f"a checkpoint completed {outcome.recovered_s:.1f} s after the failure")
    else:
        parts.append("NOT RECOVERED")
    if outcome.replayed is not None:
        parts.append(f"{outcome.replayed} input records replayed")
    if outcome.note:
        parts.append(outcome.note)
    return "; ".join(parts)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_drill(
    connection: Connection | None = None,
    *,
    pipeline: str = "streaming.tools.demo:pipeline",
    workload: DrillWorkload | str | None = None,
    failures: int = 10,
    seed: int = 1,
    kinds: Sequence[FailureKind | str] = KINDS,
    mode: Mode | str = Mode.ALIGNED,
    interval_s: float = 1.0,
    rate: float = 200.0,
    store_uri: str | None = None,
    report_dir: Path | None = None,
    runtime=None,
    spark=None,
) -> DrillReport:
    """Run a drill (see the module docstring) and write its report; the
    local runtime is started when no ``connection`` is given.  Its progress
    is logged (INFO)."""
    from streaming.tools import drill_report

    if connection is None:
        from streaming.local import LocalRuntime

        runtime = runtime or LocalRuntime(progress=log.info)
        connection = runtime.up()
    chosen = tuple(parse_choice(FailureKind, k, "failure kind") for k in kinds)
    store_uri = store_uri or f"s3://{connection.s3_bucket}/drills"
    report_dir = report_dir or default_home() / "drills" / time.strftime("%Y%m%d-%H%M%S")
    drill = Drill(
        connection,
        pipeline=pipeline,
        workload=workload if isinstance(workload, DrillWorkload) else load_workload(workload),
        failures=failures,
        seed=seed,
        kinds=chosen,
        mode=mode,
        interval_s=interval_s,
        rate=rate,
        store_uri=store_uri,
        report_dir=Path(report_dir),
        runtime=runtime,
        spark=spark,
    )
    report = drill.run()
    drill_report.write(report, Path(report_dir))
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    from streaming import console
    from streaming.tools import drill_report

    parser = argparse.ArgumentParser(
        prog="spark-abs drill", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--failures", type=int, default=10, help="failures to inject (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="draws the failures, moments and workload (default 1)")
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"comma-separated failure kinds, taken in turn (default all: {','.join(KINDS)})",
    )
    mode = JobSettings.default("mode")
    parser.add_argument("--mode", default=mode, choices=MODES, help=f"checkpoint mode (default {mode})")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints (default 1)")
    parser.add_argument("--rate", type=float, default=200.0, help="input records per second (default 200)")
    parser.add_argument(
        "--pipeline", default="streaming.tools.demo:pipeline", help="module:attribute (default the money pipeline)"
    )
    parser.add_argument(
        "--workload", help="module:function returning a DrillWorkload for --pipeline (default the money workload)"
    )
    parser.add_argument("--store", help="snapshot store URI (default s3://<local bucket>/drills)")
    parser.add_argument("--out", help="report directory (default <home>/drills/<time>)")
    args = parser.parse_args(argv)

    from streaming.local import LocalRuntime

    console.install("[drill] ")
    if os.getcwd() not in sys.path:  # the user's pipeline and workload modules
        sys.path.insert(0, os.getcwd())
    connection = Connection.from_env(os.environ)
    runtime = None
    if connection is None:
        runtime = LocalRuntime(progress=log.info)
        connection = runtime.up()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    out = Path(args.out) if args.out else default_home() / "drills" / time.strftime("%Y%m%d-%H%M%S")
    report = run_drill(
        connection,
        pipeline=args.pipeline,
        workload=args.workload,
        failures=args.failures,
        seed=args.seed,
        kinds=kinds,
        mode=args.mode,
        interval_s=args.interval,
        rate=args.rate,
        store_uri=args.store,
        report_dir=out,
        runtime=runtime,
    )
    print()
    print(drill_report.render(report))
    print(f"\nreport: {out / 'report.md'} (and report.json, gx-*.json, *.csv)")
    return 0 if report.passed else 1
