"""Single benchmark runs: a spark-abs job on a workload (start-up, then
throughput from all tasks ready to everything committed, and the time of
every checkpoint taken meanwhile), the native query in its own process, and
the demo at steady state.  Each returns a ``Run``; ``__main__`` alternates
them and takes the ratios."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from barriers.coordinator import CheckpointStatus
from benchmarks.profiles import Sampler, summarise
from benchmarks.workloads import TOPIC_ENV
from streaming.adapters.sinks.factory import sink_location
from streaming.adapters.sinks.object_store import read_committed_output
from streaming.api.config import Connection, KafkaAccess
from streaming.api.settings import JobSettings
from streaming.engine.job.operations import committed_through, ingress_end_offsets, kill_worker
from streaming.engine.job.runner import JobRunner, RunOptions
from streaming.engine.worker.worker import HANDED_PER_RECORD
from streaming.errors import SparkAbsError

__all__ = ["Run", "AbsJob", "RunStorage", "abs_run", "native_run", "demo_run", "percentile"]

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    """One run of one variant in one round."""

    variant: str
    round: int
    startup_s: float
    seconds: float = 0.0
    records: int = 0
    checkpoints_s: list[float] = field(default_factory=list)
    verified: bool = False
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "records_per_s": self.records_per_s}


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by nearest rank, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _wait_ready(runner: JobRunner, deadline: float) -> None:
    while not runner.coordinator.all_ready:
        if time.monotonic() > deadline:
            raise SparkAbsError(f"{runner.job}: tasks not ready in time")
        runner.step(trigger=False)


@dataclass(frozen=True, slots=True)
class AbsJob:
    """A spark-abs job as a benchmark runs it: the pipeline, the topic it
    reads whole and what its committed output must hold, how it
    checkpoints and how many tasks each stage has."""

    # the pipeline, as "module:attr"
    pipeline: str
    # the workload's topic, every record already in it
    topic: str
    # what the committed output must hold: its records, keys and sum
    expected: Mapping[str, int]
    # seconds between checkpoints (None: one, triggered when all tasks are ready, so its barriers follow the whole input)
    interval_s: float | None = None
    # JobSettings fields besides store, interval_s and timeout_s (mode, state_snapshots, ...)
    settings: Mapping[str, object] = field(default_factory=dict)
    # tasks per stage (None: the pipeline's own)
    parallelism: Mapping[str, int] | None = None
    # the run fails when its input is not committed this long after it started (also each checkpoint's timeout)
    timeout_s: float = 900.0


@dataclass(frozen=True, slots=True)
class RunStorage:
    """Where a benchmark's spark-abs runs write: each job's snapshots (its
    sink's output beside them), its processes' logs and, when profiled,
    py-spy's samples and Spark's event logs."""

    # the jobs' snapshot store: file:///dir or s3://bucket/prefix
    store: str
    # a directory per job under it, for its processes' logs
    log_dir: Path
    # a directory per variant and round under it for the profiles (None: not profiled)
    profile_dir: Path | None = None


def abs_run(connection: Connection, variant: str, round_: int, spec: AbsJob, storage: RunStorage) -> Run:
    """Run ``spec.pipeline`` over everything in ``spec.topic``: checkpoints
    every ``spec.interval_s`` (None: one, triggered when all tasks are ready,
    so its barriers follow the whole input) until one that covers the input
    is complete and committed.  With ``storage.profile_dir``, py-spy samples
    every worker process from when its tasks are ready to the end, and Spark
    writes its event log there (``spark_task_metrics`` sums its tasks)."""
    interval_s, timeout_s, expected = spec.interval_s, spec.timeout_s, spec.expected
    log_dir, profile_dir = storage.log_dir, storage.profile_dir
    os.environ[TOPIC_ENV] = spec.topic
    job = f"bench-{variant.replace('.', '_')}-{uuid.uuid4().hex[:6]}"  # job names: letters, digits, - and _
    job_settings = JobSettings(store=storage.store, interval_s=interval_s or 3600, timeout_s=timeout_s, **spec.settings)
    event_logs = _event_logs(profile_dir, variant, round_)
    runner = JobRunner(
        spec.pipeline,
        job_settings,
        connection,
        job=job,
        options=RunOptions(
            log_dir=log_dir / job,
            parallelism=spec.parallelism or {},
            worker_env=_event_log_env(event_logs) if event_logs is not None else {},
        ),
    )
    deadline = time.monotonic() + timeout_s
    began = time.monotonic()
    try:
        runner.start()
        _wait_ready(runner, deadline)
        ready = time.monotonic()
        sampler = None
        if profile_dir is not None:
            sampler = Sampler(
                {n: w.process.pid for n, w in runner.workers.items()}, profile_dir / f"{variant}-r{round_}"
            )
        target = ingress_end_offsets(runner)
        if interval_s is None:
            runner.coordinator.trigger()
        processed = _Processed(runner, target)
        while committed_through(runner, target) is None and not processed():
            if time.monotonic() > deadline:
                raise SparkAbsError(f"{job}: input not committed within {timeout_s:.0f} s")
            runner.step(trigger=interval_s is not None)
        finished = time.monotonic()
        completed = [r for r in runner.checkpoints() if r.status == CheckpointStatus.COMPLETED]
        durations = [r.duration_s for r in completed]
        # the state each checkpoint stored (all tasks): whole tables, or an incremental one's changes
        stored = [sum(t.state_bytes or 0 for t in r.tasks.values()) for r in completed]
        if sampler is not None:
            for stacks in sampler.stop().values():
                stacks.with_suffix(".txt").write_text(summarise(stacks))
    finally:
        runner.close()
    run = Run(variant, round_, ready - began, finished - ready, int(expected["records"]), durations)
    output = read_committed_output(sink_location(job_settings, job, connection))
    run.verified, run.detail = _verify(output, expected)
    run.detail["handed_bytes_per_record"] = handed_per_record(log_dir / job)
    run.detail["state_bytes"] = stored
    if event_logs is not None:
        run.detail["spark_tasks"] = spark_task_metrics(event_logs)
    return run


def _event_logs(profile_dir: Path | None, variant: str, round_: int) -> Path | None:
    """Where a profiled run's Spark writes its event log (None: not profiled)."""
    return None if profile_dir is None else profile_dir / f"{variant}-r{round_}" / "spark-events"


def _event_log_env(directory: Path) -> dict[str, str]:
    """The environment that makes a worker's Spark write its event log to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.resolve().as_uri(),
        # one plain JSON-lines file per application (Spark 4 rolls and compresses by default)
        "spark.eventLog.rolling.enabled": "false",
        "spark.eventLog.compress": "false",
    }
    return {"PYSPARK_SUBMIT_ARGS": " ".join(f"--conf {k}={v}" for k, v in conf.items()) + " pyspark-shell"}


def spark_task_metrics(directory: Path) -> dict[str, float] | None:
    """Spark's task metrics of a run, summed over the event logs of its
    applications in ``directory``: tasks, executor run and CPU seconds,
    records read from Kafka, and the bytes of task results sent to the
    driver (what a micro-batch's ``toArrow`` collects)."""
    totals = {"tasks": 0, "executor_run_s": 0.0, "executor_cpu_s": 0.0, "records_read": 0, "result_bytes": 0}
    found = False
    # a worker stopped by a signal leaves its log ``.inprogress``: read all the same
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        found = True
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerTaskEnd"' not in line:
                continue
            metrics = json.loads(line).get("Task Metrics") or {}
            totals["tasks"] += 1
            totals["executor_run_s"] += metrics.get("Executor Run Time", 0) / 1000
            totals["executor_cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
            totals["records_read"] += (metrics.get("Input Metrics") or {}).get("Records Read", 0)
            totals["result_bytes"] += metrics.get("Result Size", 0)
    return totals if found else None


def handed_per_record(logs: Path) -> float | None:
    """The bytes Spark handed to Python per Kafka record read, over every
    stage query of a run (the workers log it when a query stops)."""
    records = handed = 0.0
    pattern = re.compile(rf"(\d+) records read, ([\d.]+) {re.escape(HANDED_PER_RECORD)}")
    for path in sorted(logs.glob("*.log")):
        for match in pattern.finditer(path.read_text(errors="replace")):
            records += int(match.group(1))
            handed += int(match.group(1)) * float(match.group(2))
    return handed / records if records else None


class _Processed:
    """Whether a completed, committed checkpoint shows every input record up to
    ``target`` processed: on every ingress channel its task had read up to
    ``target`` when it took its snapshot (its channel state starts there, or
    it has none) and no other channel holds channel state.

    ``committed_through`` also asks for no channel state on the ingress
    channels; under unaligned checkpoints every half second the barriers of
    the checkpoints before are often still unread when the next one is
    announced, so its channel state is those few control records, never
    zero, and a run would wait for a lucky checkpoint long after its input
    was done (the first full runs did, for tens of seconds)."""

    def __init__(self, runner: JobRunner, target: Mapping[str, int]):
        self.runner, self.target = runner, dict(target)
        self.seen: set[int] = set()

    def __call__(self) -> bool:
        coordinator = self.runner.coordinator
        for record in coordinator.completed():
            if record.checkpoint_id in self.seen or not coordinator.sink_tasks <= record.committed:
                continue
            self.seen.add(record.checkpoint_id)
            tasks = self.runner.store.read_manifest(record.checkpoint_id).tasks.values()
            # where each task was when it took its snapshot: the start of its channel
            # state on a channel, else where it resumes (after the barrier)
            reached = {c: p for t in tasks for c, p in t.positions.items()}
            reached.update({c: r[0] for t in tasks for c, r in t.in_flight.items() if r[1] > r[0]})
            internal = [r for t in tasks for c, r in t.in_flight.items() if c not in self.target and r[1] > r[0]]
            if not internal and all(reached.get(c, -1) >= o for c, o in self.target.items()):
                return True
        return False


def _verify(output, expected: Mapping[str, int]) -> tuple[bool, dict[str, object]]:
    """Whether the committed updates end in the expected totals (the last
    update of a key has its highest count)."""
    if output is None:
        return False, {"output": "nothing committed"}
    final = output.group_by("k").aggregate([("n", "max"), ("sum", "max")])
    got = {
        "records": int(pc.sum(final["n_max"]).as_py() or 0),
        "keys": final.num_rows,
        "sum": int(pc.sum(final["sum_max"]).as_py() or 0),
    }
    return got == dict(expected), {"output": got}


def native_run(
    variant: str,
    round_: int,
    *,
    topic: str,
    state_store: str,
    expected: Mapping[str, int],
    profile_dir: Path | None = None,
    max_offsets_per_trigger: int | None = None,
) -> Run:
    """The native query in a process of its own (see ``benchmarks.native``),
    in micro-batches of at most ``max_offsets_per_trigger`` records (None:
    one of everything); with ``profile_dir``, Spark writes its event log
    there."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    event_logs = _event_logs(profile_dir, variant, round_)
    if event_logs is not None:
        env.update(_event_log_env(event_logs))
    with tempfile.TemporaryDirectory(prefix="bench-native-") as out:
        began = time.monotonic()
        done = subprocess.run(
            [
                *(sys.executable, "-m", "benchmarks.native", "--topic", topic, "--state-store", state_store),
                *("--out", out),
                *(("--max-offsets-per-trigger", str(max_offsets_per_trigger)) if max_offsets_per_trigger else ()),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        wall = time.monotonic() - began
    if done.returncode != 0:
        raise SparkAbsError(f"native query ({state_store}) failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    got = {k: result[k] for k in ("records", "keys", "sum")}
    run = Run(variant, round_, result["startup_s"], result["seconds"], int(expected["records"]))
    run.verified, run.detail = got == dict(expected), {"output": got, "wall_s": wall}
    if event_logs is not None:
        run.detail["spark_tasks"] = spark_task_metrics(event_logs)
    return run


def demo_run(
    connection: Connection,
    round_: int,
    *,
    store: str,
    seconds: float,
    rate: int,
    log_dir: Path,
    settings: Mapping[str, object] | None = None,
) -> Run:
    """The demo's three stages with checkpoints every second while transfers
    arrive at ``rate`` per second for ``seconds``; then the worker running
    ``accounts`` killed (by default the job's only one) and the time until
    every task is ready again (a new JVM for that worker, a restore in place
    for any other)."""
    from spark_abs_examples import money

    job = f"bench-demo-{uuid.uuid4().hex[:6]}"
    job_settings = JobSettings(store=store, interval_s=1.0, retain=5, **dict(settings or {}))
    runner = JobRunner(
        "spark_abs_examples.money:pipeline",
        job_settings,
        connection,
        job=job,
        options=RunOptions(log_dir=log_dir / job),
    )
    topic = runner.pipeline.ingress[0].topic
    partitions = runner.pipeline.ingress[0].partitions
    stop = threading.Event()
    deadline = time.monotonic() + seconds + 600

    def feed() -> None:
        # one producer, the transfers made up front: the feeder should cost the machine little
        from streaming.adapters.kafka import clients as kafka_clients

        transfers = money.make_transfers(int(rate * (seconds + 600)), seed=7)
        producer = kafka_clients.raw_producer(connection.kafka, acks="all", linger_ms=20)
        produced = 0
        began = time.monotonic()
        try:
            while not stop.is_set() and produced < len(transfers):
                due = min(len(transfers), int((time.monotonic() - began) * rate))
                for transfer in transfers[produced:due]:
                    producer.send(
                        topic,
                        value=json.dumps(transfer).encode(),
                        key=transfer["source"].encode(),
                        partition=transfer["id"] % partitions,
                    )
                produced = due
                time.sleep(0.1)
        finally:
            producer.close(5)

    began = time.monotonic()
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        runner.start()
        _wait_ready(runner, deadline)
        ready = time.monotonic()
        feeder.start()
        while time.monotonic() < ready + seconds:
            runner.step()
        completed = [r.duration_s for r in runner.checkpoints() if r.status == CheckpointStatus.COMPLETED]
        steady = completed[1:]  # the first one pays for every query's first micro-batch
        killed = time.monotonic()
        kill_worker(runner, "accounts")
        while not runner.restores:
            runner.step(trigger=False)
        _wait_ready(runner, deadline)
        restored = time.monotonic() - killed
    finally:
        stop.set()
        runner.close()
    run = Run("demo", round_, ready - began, seconds, 0, steady, verified=bool(steady))
    run.detail = {
        "restore_ready_s": restored,
        "checkpoints": len(steady),
        "p50_s": percentile(steady, 0.5),
        "p99_s": percentile(steady, 0.99),
        "median_s": statistics.median(steady) if steady else None,
    }
    log.info(
        f"demo: {len(steady)} steady-state checkpoints, p50 {run.detail['p50_s']}, restore ready in {restored:.1f} s"
    )
    return run


# the peers' environments (``make bench`` makes them) and their scripts
PEERS = {
    "flink-sql": (".venv-flink", "benchmarks/peers/flink_count.py"),
    "quix": (".venv-quix", "benchmarks/peers/quix_count.py"),
}
FLINK_KAFKA = ("org.apache.flink", "flink-sql-connector-kafka", "5.0.0-2.2")


def peer_available(variant: str) -> bool:
    return (ROOT / PEERS[variant][0] / "bin" / "python").exists()


def flink_connector(cache_dir: Path) -> Path:
    """Flink's Kafka SQL connector (one shaded jar), from Maven Central once."""
    from streaming.adapters.spark.jars import Artifact, resolve_jars

    jars = resolve_jars("flink-sql-kafka", [Artifact(*FLINK_KAFKA)], cache_dir)
    return next(j for j in jars if j.name.startswith(FLINK_KAFKA[1]))


def peer_run(
    variant: str, round_: int, *, kafka: KafkaAccess, topic: str, expected: Mapping[str, int], cache_dir: Path
) -> Run:
    """A peer over the whole topic, in its own environment: the updates it
    commits to a topic of its own are checked, and its throughput runs from
    its first output record to its last (when the broker appended each; its
    start-up is launch to first output)."""
    from streaming.adapters.kafka.admin import create_topic

    env, script = PEERS[variant]
    out = f"{topic}-{variant}-{uuid.uuid4().hex[:6]}"
    # the broker stamps each record when it appends it (a peer may pass its input's time on)
    create_topic(kafka, out, 2, config={"message.timestamp.type": "LogAppendTime"})
    command = [str(ROOT / env / "bin" / "python"), str(ROOT / script), "--bootstrap", kafka.servers, "--topic", topic]
    command += ["--out", out]
    command += (
        ["--jar", str(flink_connector(cache_dir))]
        if variant == "flink-sql"
        else ["--records", str(expected["records"])]
    )
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SparkAbsError(f"{variant} failed (exit {done.returncode}):\n{tail}")
    output, first, last = _committed_updates(kafka, out)
    run = Run(variant, round_, max(0.0, first - launched), seconds=last - first, records=int(expected["records"]))
    run.verified, run.detail = _verify(output, expected)
    return run


def _committed_updates(kafka: KafkaAccess, topic: str) -> tuple[pa.Table | None, float, float]:
    """Every committed ``{"k", "n", "sum"}`` update on ``topic`` and the
    times of the first and last (seconds since the epoch)."""
    from kafka import TopicPartition

    from streaming.adapters.kafka import clients as kafka_clients

    consumer = kafka_clients.consumer(kafka, isolation_level="read_committed", enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        rows, times = [], []
        deadline = time.monotonic() + 300
        while any(consumer.position(p) < ends[p] for p in partitions) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    if record.value:
                        rows.append(json.loads(record.value))
                        times.append(record.timestamp / 1000)
    finally:
        consumer.close()
    if not rows:
        return None, 0.0, 0.0
    table = pa.Table.from_pylist(rows).select(["k", "n", "sum"])
    return table, min(times), max(times)
