"""Helpers for tests of pipelines built with spark-abs (and for its own tests)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

__all__ = [
    "LineCollector",
    "assert_eventually",
    "broken_money_pipeline",
    "changing_pipeline",
    "write_checkpoint",
    "drill_workload",
    "slow_pipeline",
    "money_job",
    "MoneyJob",
    "RemoteWorkerProcess",
    "Scrape",
    "scrape",
    "EVENTS",
    "SLOW_SECONDS_PER_RECORD",
]

T = TypeVar("T")


def assert_eventually(fn: Callable[[], T], expected: T, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Poll ``fn`` until it returns ``expected``; after ``timeout`` seconds fail
    with the last value seen (or the last exception raised)."""
    deadline = time.monotonic() + timeout
    last: object = "<not called>"
    while True:
        try:
            last = fn()
            if last == expected:
                return last
        except Exception as exc:  # keep polling; report it if it is the last thing seen
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"expected {expected!r} within {timeout:.1f} s; last seen: {last!r}")
        time.sleep(interval)


EVENTS = pa.schema([("id", pa.int64()), ("key", pa.string())])
SLOW_SECONDS_PER_RECORD = 0.002


class _Slowly:
    """Sleeps ``seconds`` per record (a picklable callable: a stage's operator
    factory may be sent to Spark's executors)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch: pa.Table) -> pa.Table:
        time.sleep(self.seconds * batch.num_rows)
        return batch


def slow_pipeline(job: str = "slow", ms_per_record: float = SLOW_SECONDS_PER_RECORD * 1000):
    """A deliberately slow stage over a two-partition topic ``<job>.events``
    (``ms_per_record`` per record, 2 by default), counting events per key into
    an object-store sink: a backlog in front of a barrier takes it a while.
    ``streaming.testing:slow_pipeline?ms_per_record=10`` picks the cost."""
    from operators import Chain, KeyedAggregate, count, map_batches
    from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

    if isinstance(ms_per_record, bool) or not isinstance(ms_per_record, int | float) or not ms_per_record >= 0:
        raise ValueError(f"ms_per_record must be a non-negative number, got {ms_per_record!r}")
    slowly = _Slowly(ms_per_record / 1000)
    return Pipeline(
        job,
        (Ingress(f"{job}.events", 2, EVENTS),),
        (
            Stage(
                "slow",
                (f"{job}.events",),
                lambda: Chain(map_batches(slowly, name="slowly"), KeyedAggregate("key", {"n": count()})),
                sink=Sink(),
            ),
        ),
    )


def bad_spark_pipeline(job: str = "bad-spark"):
    """A stage whose Spark SQL reads a column its input does not have: the
    pipeline passes its checks, and its workers stop on the error when they
    start (it is the pipeline's, so no restore can fix it)."""
    from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

    events = f"{job}.events"
    return Pipeline(
        job,
        (Ingress(events, 1, EVENTS),),
        (Stage("clean", (events,), spark="SELECT _position, nope FROM {input}", sink=Sink()),),
    )


class _Break:
    """Loses (``lose``) or doubles (``duplicate``) every transfer whose id is
    ``every - 1`` modulo ``every``: the deliberate bug a drill must catch."""

    def __init__(self, broken: str, every: int):
        if broken not in ("lose", "duplicate"):
            raise ValueError(f"broken must be 'lose' or 'duplicate', got {broken!r}")
        self.broken = broken
        self.every = every

    def __call__(self, batch: pa.Table) -> pa.Table:
        hit = pa.array(batch["id"].to_numpy(zero_copy_only=False) % self.every == self.every - 1)
        if self.broken == "lose":
            return batch.filter(pa.compute.invert(hit))
        return pa.concat_tables([batch, batch.filter(hit)])


def broken_money_pipeline(job: str = "broken-money", broken: str = "lose", every: int = 500):
    """The demo's money pipeline with a bug in its first stage: it loses
    (``broken=lose``) or writes twice (``broken=duplicate``) one transfer in
    ``every``.  ``spark-abs drill --pipeline
    'streaming.testing:broken_money_pipeline?broken=duplicate'`` must fail,
    naming the expectation the output misses."""
    import dataclasses

    from operators import Chain, map_batches
    from streaming.api.pipeline import Pipeline
    from streaming.tools import demo
    from streaming.tools.money import transfer_legs

    bug = _Break(broken, every)
    good = demo.pipeline(job)
    legs = dataclasses.replace(
        good.stages[0], operator=lambda: Chain(map_batches(bug, name=f"{broken}-bug"), transfer_legs())
    )
    return Pipeline(good.job, good.ingress, (legs, *good.stages[1:]))


def drill_workload():
    """The broken money pipelines' drill workload: the money pipeline's
    (``streaming.tools.demo.drill_workload``), whose reference they miss."""
    from streaming.tools import demo

    return demo.drill_workload()


class _Seen:
    """Passes its rows on unchanged and counts them per ``key`` (its state,
    table ``state``: key, seen)."""

    def __init__(self) -> None:
        from operators import KeyedAggregate, count

        self._counts = KeyedAggregate("key", {"seen": count()})

    def process(self, batch: pa.Table) -> pa.Table:
        self._counts.process(batch)
        return batch

    def snapshot(self) -> dict[str, pa.Table]:
        return self._counts.snapshot()

    def restore(self, state) -> None:
        self._counts.restore(state)


CHANGING_SHAPES = ("base", "added", "replaced", "schema")


def changing_pipeline(job: str = "changing", shape: str = "base"):
    """One job's pipeline as its code changes (docs/operations/changing-a-pipeline.md),
    over a one-partition topic ``<job>.events`` (``EVENTS``): ``base`` is
    ``clean`` (rows as they are) then ``counts`` (events per key, into an
    object-store sink); ``added`` puts ``seen`` between them (rows as they
    are, counted per key in its state); ``replaced`` puts ``audit`` (the same
    operator) there instead; ``schema`` gives ``counts`` another state
    schema (a maximum too).  ``streaming.testing:changing_pipeline?shape=added``."""
    from operators import KeyedAggregate, count, max_
    from operators.stateless import Passthrough
    from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

    if shape not in CHANGING_SHAPES:
        raise ValueError(f"shape must be one of {', '.join(CHANGING_SHAPES)}, got {shape!r}")
    events = f"{job}.events"
    aggregations = {"n": count(), "top": max_("id")} if shape == "schema" else {"n": count()}
    clean = Stage("clean", (events,), Passthrough, key="key")
    middle = {"added": "seen", "replaced": "audit"}.get(shape)
    counts = Stage("counts", (middle or "clean",), lambda: KeyedAggregate("key", aggregations), sink=Sink())
    stages = (clean, Stage(middle, ("clean",), _Seen, key="key"), counts) if middle else (clean, counts)
    return Pipeline(job, (Ingress(events, 1, EVENTS),), stages)


def write_checkpoint(store, pipeline, checkpoint_id: int, generation: int, state=None, *, position: int = 0):
    """Checkpoint ``checkpoint_id`` of ``pipeline`` written into ``store`` (a
    ``SnapshotStore``) by hand, as its tasks would have taken it in
    ``generation``: ``state`` per task name (none by default), every input
    channel at ``position``, aligned.  Returns the manifest."""
    from barriers.messages import CheckpointOptions
    from streaming.adapters.snapshots.format import options_to_json

    snapshots = {
        spec.name: store.write_task(
            checkpoint_id,
            generation,
            spec.name,
            (state or {}).get(spec.name, {}),
            positions={str(c): position for c in spec.inputs},
            metadata={"kind": "aligned", "watermarks": {}, "lineage": []},
        )
        for spec in pipeline.tasks()
    }
    options = options_to_json(CheckpointOptions.aligned())
    return store.write_manifest(checkpoint_id, generation, snapshots, options=options, metrics={"kinds": ["aligned"]})


class LineCollector(logging.Handler):
    """Keeps what the library logs (INFO and up, the ``streaming`` loggers:
    what ``spark-abs run`` prints) as lines in ``lines``, from ``attach``
    until ``detach``."""

    def __init__(self, lines: list[str] | None = None, logger: str = "streaming"):
        super().__init__(logging.INFO)
        self.lines: list[str] = [] if lines is None else lines
        self._logger = logging.getLogger(logger)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def attach(self) -> LineCollector:
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def detach(self) -> None:
        self._logger.removeHandler(self)


@dataclass
class MoneyJob:
    """A money-pipeline job whose every completed checkpoint is counted
    (``money``: balances plus legs in flight, which must add up to zero)."""

    runner: Any  # a streaming.engine.runner.JobRunner
    store: Any  # a SnapshotStore on the job's checkpoints
    money: list = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def count(self, checkpoint_id: int) -> None:
        """Count checkpoint ``checkpoint_id`` too (one the coordinator did not complete, e.g. a rescaled one)."""
        from streaming.tools import demo

        bootstrap = self.runner.connection.kafka_bootstrap
        self.money.append(demo.money_in_checkpoint(self.store, checkpoint_id, _range_reader(bootstrap)))


def _range_reader(bootstrap: str):
    from streaming.adapters.kafka_io import read_range

    return lambda channel, start, end: read_range(bootstrap, channel, start, end)


def money_job(pipeline_ref: str, settings, connection, job: str, **runner_options) -> MoneyJob:
    """A ``JobRunner`` for ``pipeline_ref`` (a money pipeline) whose
    completed checkpoints are counted as they complete, its lines kept."""
    from streaming.adapters.objects import open_store
    from streaming.adapters.snapshots import SnapshotStore
    from streaming.engine.runner import JobRunner

    store = SnapshotStore(open_store(settings.store, connection), job)
    holder: list[MoneyJob] = []
    lines = LineCollector().attach().lines
    runner = JobRunner(
        pipeline_ref,
        settings,
        connection,
        job=job,
        on_complete=lambda cid: holder[0].count(cid),
        **runner_options,
    )
    holder.append(MoneyJob(runner, store, lines=lines))
    return holder[0]


class RemoteWorkerProcess:
    """A `spark-abs worker --job JOB --group GROUP` process in a session of its
    own, as a host's process manager would start it, its output in ``log_path``."""

    def __init__(self, job: str, group: str, connection, log_path: Path):
        self.group, self.log_path = group, log_path
        with open(log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "streaming.tools.cli", "worker", "--job", job, "--group", group],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **connection.as_env(), "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )

    def said(self, text: str) -> bool:
        return text in self.log_path.read_text(errors="replace")

    def lines(self) -> list[str]:
        """What spark-abs itself said (Spark's own log lines left out)."""
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if "[spark-abs]" in line]

    def kill(self) -> None:
        """SIGKILL the worker and its Spark driver JVM."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def terminate(self) -> None:
        """SIGTERM: the worker stops its tasks and its Spark application, then exits."""
        self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, and the exit status once it stopped (None: it did not, and was killed)."""
        self.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


class Scrape(dict):
    """The samples of one scrape of a metrics endpoint: (name, labels as
    sorted pairs) -> value."""

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(value for (sample, pairs), value in self.items() if sample == name and wanted <= set(pairs))


def scrape(url: str, timeout: float = 5.0) -> Scrape:
    """What a Prometheus endpoint (``http://host:port/metrics``) serves now."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    return Scrape(
        ((sample.name, tuple(sorted(sample.labels.items()))), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
