"""Building a worker's task for a generation: where it starts (its snapshot
of the restored checkpoint, ``restore.start.plan_start``), its sink recovered to
that checkpoint, its ``TaskIO`` on the worker's clients, and whether it
copies in-flight records rather than keep their offset ranges.  The task
comes back recovered (``StageTask.recover``), with the offsets its stage
query starts its channels at; the worker runs it (``streaming.engine.worker.worker``)."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from barriers.messages import ChannelId, InFlightFormat
from operators.state import StateMemory, use_memory
from streaming.adapters.kafka.admin import OffsetsAtTime
from streaming.adapters.kafka.control.transport import ControlTopic
from streaming.adapters.kafka.dead_letters import DeadLetterTopic
from streaming.adapters.kafka.producer import CheckedSends, append_markers
from streaming.adapters.kafka.ranges import read_range, retention_ms
from streaming.adapters.serde.schema_registry import current_registry, use_connection_registry
from streaming.adapters.sinks.delta import DeltaSink
from streaming.adapters.sinks.factory import open_sink, sink_key, sink_location
from streaming.adapters.sinks.kafka import KafkaSink, kafka_records, registered_avro
from streaming.adapters.sinks.object_store import ObjectStoreSink
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import Connection, default_home
from streaming.api.pipeline import Pipeline, Sink, Stage, TaskSpec
from streaming.api.settings import JobSettings, Mode, StateSnapshots, skip_range
from streaming.engine import faults
from streaming.engine.kafka_retention import RetentionWatch, relied_on_ms
from streaming.engine.restore.start import plan_start
from streaming.engine.task.stage_task import StageTask, TaskIO, TaskOptions
from streaming.engine.task.uploads import Incremental

__all__ = ["WorkerClients", "RunningTask", "TaskFactory", "segment_budget_ms"]

# the modes whose checkpoints a task may take on an announcement, between two runs of a micro-batch
_ANNOUNCED = (Mode.UNALIGNED, Mode.ALIGNED_TIMEOUT)


def segment_budget_ms(settings: JobSettings) -> float | None:
    """The time budget of a task's runs (``SegmentPace``): ``segment_ms`` in
    the modes whose checkpoints are announced; None (runs cut by records
    only) in the others, whose barriers come with the data, between runs
    anyway, and where smaller runs only cost calls of the operator."""
    return settings.segment_ms if settings.mode in _ANNOUNCED else None


log = logging.getLogger(__name__)


@dataclass
class RunningTask:
    """A task a worker runs, and its stage's sink (None for a stage without one)."""

    task: StageTask
    sink: ObjectStoreSink | KafkaSink | DeltaSink | None


@dataclass(frozen=True)
class WorkerClients:
    """What a worker's tasks share: its Kafka ``producer``, the job's
    ``control`` topic, the ``dead_letters`` producer, and ``store()``, the
    snapshot store it uses when asked (a remote worker's changes with its
    runner's settings)."""

    producer: CheckedSends
    control: ControlTopic
    dead_letters: DeadLetterTopic
    store: Callable[[], SnapshotStore]


class TaskFactory:
    """Builds the tasks of ``pipeline`` for ``generation``, from checkpoint
    ``restore`` (None: from the beginning), on a worker's ``clients``;
    ``prepare`` is how each stage with Spark code prepares records read in
    Python."""

    def __init__(
        self,
        pipeline: Pipeline,
        settings: JobSettings,
        connection: Connection,
        clients: WorkerClients,
        *,
        generation: int,
        restore: int | None,
        prepare: Mapping[str, Callable[[pa.Table], pa.Table]] | None = None,
    ):
        self.pipeline = pipeline
        self.settings = settings
        self.connection = connection
        self.generation = generation
        self.restore = restore
        self.producer = clients.producer
        self.control = clients.control
        self.dead_letters = clients.dead_letters
        self.store = clients.store
        # per stage with Spark code: Kafka records read in Python, prepared by it
        self.prepare = dict(prepare or {})
        # sinks opened ahead, side by side (``open_sinks``), by task
        self._opened: dict[str, ObjectStoreSink | KafkaSink | DeltaSink] = {}
        # the states of this generation's tasks share the budget (those of the last one are gone)
        memory = None
        if settings.state_memory_bytes is not None:
            spill = default_home() / "spill" / pipeline.job / f"{os.getpid()}-g{generation or 0}"
            memory = StateMemory(spill, settings.state_memory_bytes)
        previous = use_memory(memory)
        if previous is not None:
            previous.close()
        # where Avro ingress with registry=True finds its writers' schemas
        use_connection_registry(connection)

    def open_sinks(self, names: list[str]) -> None:
        """The sinks of tasks ``names``, opened and recovered side by side
        (a Kafka sink starts a JVM for its transactions: about a second
        each); ``build`` takes them.  When one fails, the others are closed
        and its error raised."""
        wanted = [(n, self.pipeline.stage(self.pipeline.task(n).stage).sink) for n in names]
        declared = {n: sink for n, sink in wanted if sink is not None and n not in self._opened}
        if len(declared) < 2:
            return
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, len(declared))) as pool:
            futures = {n: pool.submit(self._open_sink, n, sink) for n, sink in declared.items()}
        failed: BaseException | None = None
        for name, future in futures.items():
            try:
                self._opened[name] = future.result()
            except BaseException as exc:
                failed = failed or exc
        if failed is not None:
            for sink in self._opened.values():
                getattr(sink, "close", lambda: None)()
            self._opened.clear()
            raise failed

    def build(self, name: str) -> tuple[RunningTask, dict[ChannelId, int]]:
        """Task ``name``, recovered, and the offsets its channels start at."""
        spec = self.pipeline.task(name)
        stage = self.pipeline.stage(spec.stage)
        loaded = None
        if self.restore:
            loaded = self.store().load_task(self.restore, name)
            faults.point(name, "during_restore", self.restore)
        plan = plan_start(self.generation, self.restore, loaded)
        sink = self._opened.pop(name, None)
        if sink is None and stage.sink is not None:
            sink = self._open_sink(name, stage.sink)
        try:
            return self._running(name, spec, stage, plan, sink)
        except BaseException:
            if sink is not None:  # a task that does not start leaves no sink open (a Kafka sink's JVM)
                getattr(sink, "close", lambda: None)()
            raise

    def _running(
        self, name: str, spec: TaskSpec, stage: Stage, plan: Any, sink: Any
    ) -> tuple[RunningTask, dict[ChannelId, int]]:
        # each input topic's retention.ms, read once for the task
        kept = {topic: retention_ms(self.connection.kafka, topic) for topic in sorted({c.topic for c in spec.inputs})}
        task = StageTask(
            self.pipeline,
            spec,
            self._task_io(name, stage, sink, kept),
            start=plan.start,
            options=TaskOptions(
                max_concurrent=self.settings.max_concurrent,
                copy_in_flight=self._must_copy(spec, kept),
                max_segment_records=self.settings.max_segment_records,
                max_decoded_bytes=self.settings.max_decoded_bytes,
                record_errors=self.settings.record_errors,
                max_isolated_records=self.settings.max_isolated_records,
                max_isolated_share=self.settings.max_isolated_share,
                skip_records=tuple(
                    (ChannelId(topic, partition), first, last)
                    for topic, partition, first, last in map(skip_range, self.settings.skip_records)
                ),
                segment_ms=segment_budget_ms(self.settings),
                incremental=Incremental(self.settings.base_every)
                if self.settings.state_snapshots is StateSnapshots.INCREMENTAL
                else None,
                job_key=self.control.key.barriers,
            ),
        )
        task.recover()
        return RunningTask(task, sink), dict(plan.query_start)

    def _open_sink(self, name: str, declared: Sink) -> ObjectStoreSink | KafkaSink | DeltaSink:
        """The stage's sink (``declared``), recovered to the restored checkpoint
        (staged epochs up to it committed, later ones discarded, later output
        taken back)."""
        location = sink_location(self.settings, self.pipeline.job, self.connection)
        sink = open_sink(
            declared,
            location,
            name,
            job=self.pipeline.job,
            kafka=self.connection.kafka,
            connection=self.connection,
            delivery_timeout_s=self.settings.delivery_timeout_s,
            kafka_client=self.settings.kafka_sink_client,
            key=sink_key(declared, self.pipeline.job, self.connection, lambda: self.control.key),
            generation=self.generation,
        )
        try:
            recovery = sink.recover(self.restore or 0)
        except BaseException:
            getattr(sink, "close", lambda: None)()
            raise
        if recovery:
            log.info(
                f"{name}: sink recovered: committed epochs {recovery.committed}, discarded "
                f"{recovery.discarded}, retracted {recovery.retracted}"
            )
        if recovery.irrevocable:
            log.info(
                f"{name}: WARNING: epochs {recovery.irrevocable} were committed to Kafka after "
                f"checkpoint {self.restore or 0}; readers have them and the replay writes them again"
            )
        return sink

    def _task_io(
        self,
        name: str,
        stage: Stage,
        sink: ObjectStoreSink | KafkaSink | DeltaSink | None,
        kept: Mapping[str, int | None],
    ) -> TaskIO:
        """The task's I/O on the worker's Kafka clients, store and sink; what
        its checkpoints need that time retention may delete soon (``kept``:
        its input topics' retention.ms) is asked of Kafka once per topic and
        checkpoint."""
        watch = RetentionWatch(
            kept,
            OffsetsAtTime.shared(self.connection.kafka),
            relied_on_ms(self.settings.interval_s, self.settings.timeout_s),
        )
        if sink is None:
            stage_epoch = None
        elif isinstance(sink, KafkaSink):
            declared = stage.sink
            avro_values = (
                registered_avro(declared, current_registry(f"sink {declared.topic}"))
                if declared is not None and declared.avro is not None
                else None
            )

            def stage_epoch(epoch, table):
                return sink.stage(epoch, kafka_records(table, stage.key, avro_values))
        else:
            stage_epoch = sink.stage
        return TaskIO(
            send=lambda c, k, v, h: self.producer.send(c.topic, key=k, value=v, headers=h, partition=c.partition),
            append_barrier=lambda markers: append_markers(self.producer, markers),
            publish=self.control.publish,
            dead_letter=self.dead_letters.send,
            write_snapshot=self._write_snapshot(name),
            read_range=functools.partial(read_range, self.connection.kafka),
            stage_epoch=stage_epoch,
            flush=self._flush,
            prepare=self.prepare.get(stage.name),
            retention_risk=watch.at_risk if watch.retention_ms else None,
        )

    def _flush(self) -> None:
        """The worker's records and dead letters so far are in Kafka, each
        send known to have succeeded (``streaming.adapters.kafka.producer.CheckedSends``): bounded by
        the delivery timeout, a ``KafkaUnavailableError`` otherwise."""
        self.producer.flush()
        self.dead_letters.flush()

    def _must_copy(self, spec: TaskSpec, kept: Mapping[str, int | None]) -> bool:
        """Whether unaligned channel state must be copied: a range is only good
        while Kafka keeps its records, at least until the checkpoint is superseded."""
        if self.settings.in_flight is InFlightFormat.RECORDS:
            return True
        if self.settings.mode not in (Mode.UNALIGNED, Mode.ALIGNED_TIMEOUT):
            return False
        needed_ms = 10 * (self.settings.retain * self.settings.interval_s + self.settings.timeout_s) * 1000
        for topic in sorted({c.topic for c in spec.inputs}):
            kept_ms = kept[topic]
            if kept_ms is not None and kept_ms < needed_ms:
                log.info(
                    f"{spec.name}: topic {topic} keeps records {kept_ms} ms, less than the {needed_ms:.0f} ms a "
                    f"checkpoint may need them: copying in-flight records instead of keeping ranges"
                )
                return True
        return False

    def _write_snapshot(self, name: str):
        def write(checkpoint_id, generation, task, parts):
            faults.point(name, "during_upload", checkpoint_id)
            return self.store().write_task(checkpoint_id, generation, task, parts)

        return write
