"""A worker process: runs some tasks of a pipeline in one Spark application,
each as its own Structured Streaming query, until told to stop.

    python -m streaming.worker --pipeline streaming.demo:pipeline --job demo \\
        --tasks legs-0,accounts-0 --settings '{"store": "file:///..."}' \\
        --generation 2 --restore 7

With ``--restore N`` every task loads its snapshot of checkpoint N (state,
positions, watermarks), sink tasks first commit their staged epochs up to N
and discard later ones, and queries start at the snapshot's offsets with a
fresh Spark checkpoint location.  The control topic brings ``complete``
(sinks commit, then say ``committed``) and ``abort`` events.

Fault injection for drills and tests: ``SPARK_ABS_FAULT=<task>:<point>:<n>``
kills this process with SIGKILL at that point for checkpoint n (see
``streaming.faults``)."""

from __future__ import annotations

import argparse
import importlib
import logging
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from kafka import KafkaProducer

from barriers.lineage import Lineage
from barriers.messages import ChannelId
from streaming import codec, faults
from streaming.channels import ChannelQuery
from streaming.config import Connection, SparkSettings
from streaming.errors import ConfigError, SparkAbsError
from streaming.kafka_io import ControlEvent, ControlTopic, DeadLetters, append_markers, read_range, retention_ms
from streaming.pipeline import Pipeline
from streaming.settings import JobSettings
from streaming.sinks import KafkaSink, ObjectStoreSink
from streaming.snapshots import SnapshotStore
from streaming.store import open_store
from streaming.task import StageTask, TaskIO, TaskStart

__all__ = ["load_pipeline", "Worker", "main", "sink_location"]

log = logging.getLogger(__name__)


def load_pipeline(reference: str, job: str | None = None) -> Pipeline:
    """``module:attribute``: a Pipeline, or a function ``(job=...)`` returning one."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"pipeline {reference!r}: expected 'module:attribute'")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"pipeline {reference!r} cannot be loaded: {exc}") from exc
    pipeline = target(**({"job": job} if job else {})) if callable(target) else target
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(f"pipeline {reference!r} gave {type(pipeline).__name__}, not a Pipeline")
    if job and pipeline.job != job:
        raise ConfigError(f"pipeline {reference!r} named its job {pipeline.job!r}, not {job!r}")
    return pipeline


def sink_location(settings: JobSettings, job: str, connection: Connection):
    return open_store(f"{settings.store.rstrip('/')}/{job}/sink", connection)


@dataclass
class _Running:
    task: StageTask
    query: ChannelQuery
    sink: ObjectStoreSink | KafkaSink | None


class Worker:
    def __init__(self, pipeline: Pipeline, task_names: list[str], settings: JobSettings, connection: Connection,
                 *, generation: int, restore: int | None, spark=None, say: Callable[[str], None] = print):
        self.pipeline = pipeline
        self.settings = settings
        self.connection = connection
        self.generation = generation
        self.restore = restore
        self.say = say
        self.task_names = task_names
        self._spark = spark
        self._stop = threading.Event()
        self.commands: queue.Queue[tuple[int, int | None]] = queue.Queue()
        self.running: list[_Running] = []
        faults.set_generation(generation)

    def start(self) -> None:
        from streaming.spark import spark_session

        job = self.pipeline.job
        bootstrap = self.connection.kafka_bootstrap
        self.store = SnapshotStore(open_store(self.settings.store, self.connection), job)
        self.control = ControlTopic(bootstrap, job)
        self.control.seek_to_end()
        # one in-flight request per connection keeps each partition in send order
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                      max_in_flight_requests_per_connection=1)
        self.dead_letters = DeadLetters(bootstrap, job)
        self._spark = self._spark or spark_session(SparkSettings(master=self.connection.spark_master,
                                                                 app_name=f"spark-abs-{job}"))
        for name in self.task_names:
            self.running.append(self._start_task(self._spark, name))
        self.say(f"worker g{self.generation}: tasks {', '.join(self.task_names)} running"
                 + (f" (restored checkpoint {self.restore})" if self.restore else ""))

    def _start_task(self, spark, name: str) -> _Running:
        spec = self.pipeline.task(name)
        stage = self.pipeline.stage(spec.stage)
        start = TaskStart(generation=self.generation)
        query_start: dict[ChannelId, int] = {}
        if self.restore:
            loaded = self.store.load_task(self.restore, name)
            faults.point(name, "during_restore", self.restore)
            snapshot = loaded.snapshot
            positions = {ChannelId.parse(c): p for c, p in snapshot.positions.items()}
            ranges = {ChannelId.parse(c): (int(a), int(b)) for c, (a, b) in snapshot.in_flight.items()}
            replay = {ChannelId.parse(c): t for c, t in loaded.channel_records.items()}
            # channel state first: copied records are replayed; a range is read again by the query,
            # from its start (older-generation records skipped only after the barrier)
            handler_positions = {c: min(p, ranges[c][0]) if c in ranges else p for c, p in positions.items()}
            query_start = {c: handler_positions[c] if c in ranges and c not in replay else p
                           for c, p in positions.items()}
            start = TaskStart(
                generation=self.generation,
                checkpoint_id=self.restore,
                positions=handler_positions,
                state=loaded.state,
                watermarks={ChannelId.parse(c): int(w)
                            for c, w in (snapshot.metadata.get("watermarks") or {}).items()},
                lineage=Lineage.from_json(snapshot.metadata.get("lineage")).after_restore(self.generation, positions),
                replay=replay,
            )
        elif self.generation > 0:  # a restore from the beginning: everything older is stale
            start = TaskStart(generation=self.generation, lineage=Lineage().after_restore(self.generation, None))
        sink = None
        if stage.sink is not None:
            location = sink_location(self.settings, self.pipeline.job, self.connection)
            if stage.sink.kind == "kafka":
                sink = KafkaSink(location, name, bootstrap=self.connection.kafka_bootstrap, topic=stage.sink.topic,
                                 transactional_id=f"spark-abs-{self.pipeline.job}-{name}")
            else:
                sink = ObjectStoreSink(location, name)
            recovery = sink.recover(self.restore or 0)
            if recovery:
                self.say(f"{name}: sink recovered: committed epochs {recovery.committed}, discarded "
                         f"{recovery.discarded}, retracted {recovery.retracted}")
            if recovery.irrevocable:
                self.say(f"{name}: WARNING: epochs {recovery.irrevocable} were committed to Kafka after "
                         f"checkpoint {self.restore or 0}; readers have them and the replay writes them again")
        io = TaskIO(
            send=lambda c, k, v, h: self.producer.send(c.topic, key=k, value=v, headers=h, partition=c.partition),
            append_barrier=lambda channels, headers: append_markers(self.producer, channels, headers),
            publish=self.control.publish,
            dead_letter=self.dead_letters.send,
            write_snapshot=self._write_snapshot(name),
            read_range=lambda c, a, b: read_range(self.connection.kafka_bootstrap, c, a, b),
            stage_epoch=(None if sink is None else
                         (lambda epoch, table: sink.stage(epoch, kafka_records(table, stage.key)))
                         if isinstance(sink, KafkaSink) else sink.stage),
            flush=self.producer.flush,
        )
        task = StageTask(self.pipeline, spec, io, start=start, max_concurrent=self.settings.max_concurrent,
                         copy_in_flight=self._must_copy(spec))
        query = ChannelQuery(spark, self.connection, name=f"{self.pipeline.job}-{name}-g{self.generation}",
                             channels=spec.inputs, starting=query_start,
                             max_records_per_batch=self.settings.max_records_per_batch,
                             on_batch=faults.wrap_batch(name, task))
        query.start(interval=self.settings.trigger_interval)
        self.control.publish(ControlEvent("ready", 0, name, {"generation": self.generation}))
        return _Running(task, query, sink)

    def _must_copy(self, spec) -> bool:
        """Whether unaligned channel state must be copied: a range is only good
        while Kafka keeps its records, at least until the checkpoint is superseded."""
        if self.settings.in_flight == "records":
            return True
        if self.settings.mode not in ("unaligned", "aligned-timeout"):
            return False
        needed_ms = 10 * (self.settings.retain * self.settings.interval_s + self.settings.timeout_s) * 1000
        for topic in sorted({c.topic for c in spec.inputs}):
            kept = retention_ms(self.connection.kafka_bootstrap, topic)
            if kept is not None and kept < needed_ms:
                self.say(f"{spec.name}: topic {topic} keeps records {kept} ms, less than the {needed_ms:.0f} ms a "
                         f"checkpoint may need them: copying in-flight records instead of keeping ranges")
                return True
        return False

    def _write_snapshot(self, name: str):
        def write(checkpoint_id, generation, task, state, **kwargs):
            faults.point(name, "during_upload", checkpoint_id)
            return self.store.write_task(checkpoint_id, generation, task, state, **kwargs)
        return write

    def restart(self, generation: int, restore: int | None) -> None:
        """Restore in place: stop this generation's queries and start the next
        one's from checkpoint ``restore`` in the same Spark application (no
        new JVM), as the job does after another worker died."""
        self._stop_tasks()
        self.producer.flush(30)
        self.generation, self.restore = generation, restore
        faults.set_generation(generation)
        self.control.seek_to_end()
        for name in self.task_names:
            self.running.append(self._start_task(self._spark, name))
        self.say(f"worker g{generation}: tasks {', '.join(self.task_names)} restored in place from "
                 + (f"checkpoint {restore}" if restore else "the beginning"))

    def serve(self) -> int:
        """Follow the control topic until stopped; 1 if a query failed."""
        while not self._stop.is_set():
            try:
                self.restart(*self.commands.get_nowait())
            except queue.Empty:
                pass
            for event in self.control.poll(0.2):
                self._on_control(event)
            for running in self.running:
                running.task.tick()
                error = running.query.failure()
                if error is not None:
                    self.say(f"{running.task.spec.name}: stage query failed: {error}")
                    return 1
        return 0

    def _on_control(self, event: ControlEvent) -> None:
        if event.payload.get("generation") != self.generation:
            return
        for running in self.running:
            running.task.on_control(event)
            if event.kind == "complete" and running.sink is not None:
                faults.point(running.task.spec.name, "before_sink_commit", event.checkpoint_id)
                committed = running.sink.commit_through(event.checkpoint_id)
                self.control.publish(ControlEvent("committed", event.checkpoint_id, running.task.spec.name,
                                                  {"generation": self.generation, "epochs": committed}))

    def stop(self) -> None:
        self._stop.set()

    def _stop_tasks(self) -> None:
        for running in self.running:
            try:
                running.query.stop()
            except Exception as exc:  # the JVM may already be gone on a signal
                log.warning("%s: stopping the query: %s", running.task.spec.name, exc)
            running.task.wait_for_uploads(10)
            running.task.close()
            if isinstance(running.sink, KafkaSink):
                running.sink.close()
        self.running = []

    def close(self) -> None:
        self._stop_tasks()
        self.producer.flush(10)
        self.producer.close()
        self.dead_letters.close()
        self.control.close()
        self.store.close()


def kafka_records(table: pa.Table, key: str | None) -> pa.Table:
    """A sink epoch as the Kafka sink takes it: ``key`` (the stage's key column) and ``value`` (JSON)."""
    keys = (pc.cast(table[key], pa.string()).to_pylist() if key and key in table.column_names
            else [None] * table.num_rows)
    return pa.table({"key": pa.array([k.encode() if k is not None else None for k in keys], pa.binary()),
                     "value": pa.array(codec.encode(table), pa.binary())})


def _read_commands(worker: Worker) -> None:
    """The job runner's commands on stdin: ``restore <generation> <checkpoint|none>``."""
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "restore":
            worker.commands.put((int(parts[1]), None if parts[2] == "none" else int(parts[2])))
        elif parts:
            print(f"[worker] ignored command {line.strip()!r}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streaming.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", required=True, help="module:attribute of the pipeline")
    parser.add_argument("--job", help="job name (passed to a pipeline factory)")
    parser.add_argument("--tasks", required=True, help="comma-separated task names, e.g. legs-0,accounts-1")
    parser.add_argument("--settings", required=True, help="JobSettings as JSON")
    parser.add_argument("--generation", type=int, default=0)
    parser.add_argument("--restore", type=int, default=None, help="checkpoint id to restore from")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    say = lambda line: print(f"[worker] {line}", flush=True)  # noqa: E731
    try:
        pipeline = load_pipeline(args.pipeline, args.job)
        worker = Worker(pipeline, [t for t in args.tasks.split(",") if t], JobSettings.from_json(args.settings),
                        Connection.load(), generation=args.generation, restore=args.restore, say=say)
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        threading.Thread(target=_read_commands, args=(worker,), daemon=True).start()
        worker.start()
    except SparkAbsError as exc:
        print(f"worker: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        return worker.serve()
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main())
