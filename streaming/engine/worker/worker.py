"""A worker process: runs some tasks of a pipeline in one Spark application
until told to stop.  The tasks of one stage share one Structured Streaming
query (their jobs run in the order they come) whose micro-batches are split by
channel among them: every channel has exactly one reading task, so a task
sees its channels as if the query were its own, and a job pays one Spark
micro-batch per stage instead of one per task.  The job
runner starts it (``streaming.engine.job.supervisor``) and talks to it on stdin;
the coordinator on the control topic.  When the runner's process ends,
however it ends, the pipe closes and the worker stops its tasks and its
Spark (``--runner-pipe``): no worker works on uncoordinated.

    python -m streaming.engine.worker.worker --pipeline spark_abs_examples.money:pipeline --job demo \\
        --tasks legs-0,accounts-0 --settings '{"store": "file:///..."}' \\
        --generation 2 --restore 7

With ``--restore N`` every task loads its snapshot of checkpoint N (state,
positions, watermarks), sink tasks first commit their staged epochs up to N
and discard later ones, and queries start at the snapshot's offsets with a
fresh Spark checkpoint location.  The control topic brings ``complete``
(sinks commit, then say ``committed``) and ``abort`` events.

Fault injection for drills and tests: ``SPARK_ABS_FAULT=<task>:<point>:<n>``
kills this process with SIGKILL at that point for checkpoint n (see
``streaming.engine.faults``)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barriers.messages import ChannelId
from streaming import console
from streaming.adapters.kafka.admin import job_key
from streaming.adapters.kafka.control.events import Complete, ControlEvent, Heartbeat, Lease, Ready
from streaming.adapters.kafka.control.transport import ControlTopic
from streaming.adapters.kafka.dead_letters import DeadLetterTopic
from streaming.adapters.kafka.producer import CheckedSends, producer
from streaming.adapters.objects import open_store
from streaming.adapters.sinks.kafka import KafkaSink
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import Connection, MetricsSettings
from streaming.api.pipeline import Pipeline, Scale, load_pipeline
from streaming.api.settings import JobSettings
from streaming.engine import faults, metrics
from streaming.engine.task.stage_task import StageTask
from streaming.engine.worker.commits import CheckpointCommits
from streaming.engine.worker.wiring import RunningTask, TaskFactory, WorkerClients
from streaming.errors import PIPELINE_ERRORS, ConfigError, SparkAbsError, TaskError
from streaming.waits import Deadline

if TYPE_CHECKING:  # the Spark adapter loads when a worker starts, not when this module is imported
    from streaming.adapters.spark.query import ChannelQuery, Prepare
    from streaming.adapters.spark.stage import SparkStage

__all__ = ["Worker", "main", "HANDED_PER_RECORD", "EXIT_PIPELINE_ERROR", "WORKER_PREFIX"]

# a worker's exit status when the pipeline itself is wrong (a ``ConfigError``: Spark code
# that fails on its input, an operator that cannot be built): a restore would fail the same way
EXIT_PIPELINE_ERROR = 3
# what starts each line the worker itself logs
WORKER_PREFIX = "[worker] "

# named, not __name__: run as `python -m streaming.engine.worker.worker` this module is __main__
log = logging.getLogger("streaming.engine.worker.worker")

# how often each task publishes its positions on the control topic (lag, a comparison's backpressure)
PROGRESS_INTERVAL_S = 0.5
# how a stopped stage query's log line names the bytes Spark handed to Python per Kafka record read
HANDED_PER_RECORD = "bytes per record handed to Python"
# past the producers' delivery timeout, how long a flush waits for the sends the timeout just failed
_FLUSH_MARGIN_S = 5.0
# how long a worker that stops waits for its records still on their way (a restore does not need them)
_STOP_FLUSH_S = 10.0
# events between the runner and remote workers, not for tasks (streaming.engine.remote.membership)
_MEMBERSHIP = (Lease, Heartbeat)


class _Dispatch:
    """A stage query's micro-batch split among the tasks that read its
    channels (each task's part in channel and offset order, as the query
    hands it over)."""

    def __init__(self, handlers: dict[str, Callable], readers: dict[ChannelId, str]):
        self._handlers = handlers
        self._readers = readers

    def __call__(self, table: pa.Table, batch_id: int) -> None:
        if len(self._handlers) == 1:
            next(iter(self._handlers.values()))(table, batch_id)
            return
        parts: dict[str, list[pa.Table]] = {}
        for channel, rows in _by_channel(table):
            parts.setdefault(self._readers[channel], []).append(rows)
        for name, tables in parts.items():
            self._handlers[name](pa.concat_tables(tables), batch_id)


def _collect(code: SparkStage | None) -> Prepare | None:
    """What a stage query does with each micro-batch before Python: the stage's Spark code, if any."""
    return code.collect if code is not None else None


def _by_channel(table: pa.Table) -> list[tuple[ChannelId, pa.Table]]:
    """The runs of one channel in a table ordered by channel and offset."""
    n = table.num_rows
    if n == 0:
        return []
    ahead, behind = table.slice(1), table.slice(0, n - 1)
    new = pc.or_(pc.not_equal(ahead["topic"], behind["topic"]), pc.not_equal(ahead["partition"], behind["partition"]))
    bounds = [0, *(np.flatnonzero(new.to_numpy(zero_copy_only=False)) + 1).tolist(), n]
    return [
        (ChannelId(table["topic"][a].as_py(), table["partition"][a].as_py()), table.slice(a, b - a))
        for a, b in zip(bounds[:-1], bounds[1:])
    ]


class Worker:
    """Runs ``task_names`` of ``pipeline`` in one Spark application (``spark``,
    or a session of its own made when it starts)."""

    def __init__(
        self,
        pipeline: Pipeline,
        task_names: list[str],
        settings: JobSettings,
        connection: Connection,
        *,
        generation: int | None,
        restore: int | None,
        spark=None,
        metrics_endpoint: str = "",
    ):
        self.pipeline = pipeline
        # where this process serves its metrics (host:port, "" for nowhere): its ready events say it
        self.metrics_endpoint = metrics_endpoint
        self.settings = settings
        self.connection = connection
        self.generation = generation
        self.restore = restore
        self.task_names = task_names
        self._spark = spark
        self._stop = threading.Event()
        # publishes the tasks' progress (``_beat``), from the first ``serve`` on
        self._progress_thread: threading.Thread | None = None
        self.commands: queue.Queue[tuple[int, int | None]] = queue.Queue()
        self.running: list[RunningTask] = []
        self.queries: list[ChannelQuery] = []
        faults.set_generation(generation or 0)

    def start(self) -> None:
        self.open()
        self._start_tasks()
        log.info(
            f"worker g{self.generation}: tasks {', '.join(self.task_names)} running"
            + (f" (restored checkpoint {self.restore})" if self.restore else "")
        )

    def open(self) -> None:
        """The worker's clients, store and Spark application, with no task running yet."""
        from streaming.adapters.spark.session import spark_session  # pyspark loads here, in the worker process

        job = self.pipeline.job
        kafka = self.connection.kafka
        self.store = SnapshotStore(
            open_store(self.settings.store, self.connection), job, key=self.connection.store_key(job)
        )
        delivery_s = self.settings.delivery_timeout_s
        self.control = ControlTopic(
            kafka,
            job,
            job_key(self.connection, job),
            delivery_timeout_s=delivery_s,
            on_rejected=functools.partial(metrics.control_rejected, job, "worker"),
        )
        self.control.seek_to_end()
        # one in-flight request per connection keeps each partition in send order; every send
        # is checked before a barrier goes on after it (a failed one fails the worker)
        self.producer = CheckedSends(
            producer(kafka, delivery_timeout_s=delivery_s, linger_ms=5, max_in_flight_requests_per_connection=1),
            "the tasks' records",
            delivery_s + _FLUSH_MARGIN_S,
        )
        self.dead_letters = DeadLetterTopic(kafka, job, delivery_timeout_s=delivery_s)
        self._spark = self._spark or spark_session(self.connection.spark_settings(app_name=f"spark-abs-{job}"))

    def _start_tasks(self) -> None:
        """Every task of this worker, then one query per stage over the
        channels of that stage's tasks here, from where each task starts."""
        from streaming.adapters.spark.query import ChannelQuery, QuerySpec
        from streaming.adapters.spark.stage import spark_stages

        stages = sorted({self.pipeline.task(name).stage for name in self.task_names})
        code = spark_stages(self._spark, self.pipeline, list(stages), self.settings.max_decoded_bytes)
        factory = TaskFactory(
            self.pipeline,
            self.settings,
            self.connection,
            WorkerClients(self.producer, self.control, self.dead_letters, lambda: self.store),
            generation=self.running_generation(),
            restore=self.restore,
            prepare={stage: c.records for stage, c in code.items()},
        )
        by_stage: dict[str, list[tuple[StageTask, dict[ChannelId, int]]]] = {}
        factory.open_sinks(list(self.task_names))
        for name in self.task_names:
            running, starting = factory.build(name)
            self.running.append(running)
            by_stage.setdefault(running.task.spec.stage, []).append((running.task, starting))
        for stage, tasks in by_stage.items():
            handlers = {t.spec.name: faults.wrap_batch(t.spec.name, t) for t, _ in tasks}
            readers = {c: t.spec.name for t, _ in tasks for c in t.spec.inputs}
            if stage in code:  # what a failed generation wrote after a restored barrier: Spark code skips it too
                code[stage].skip_stale({c: t.lineage for t, _ in tasks for c in t.spec.inputs})
            spec = QuerySpec(
                name=f"{self.pipeline.job}-{stage}-g{self.generation}",
                channels=tuple(readers),
                starting={c: o for _, starting in tasks for c, o in starting.items()},
                max_records_per_batch=self.settings.max_records_per_batch,
            )
            query = ChannelQuery(
                self._spark,
                self.connection,
                spec,
                on_batch=_Dispatch(handlers, readers),
                prepare=_collect(code.get(stage)),
            )
            query.start(interval=self.settings.trigger_interval)
            self.queries.append(query)
        for running in self.running:
            # "replaying": records of restored channel state (ranges and copies) still to process; a
            # "replayed" event follows when they are processed
            self.control.publish(
                Ready(
                    task=running.task.spec.name,
                    generation=self.running_generation(),
                    replaying=running.task.replay_records,
                    endpoint=self.metrics_endpoint,
                )
            )
            running.task.start_replay()  # copied channel state, while checkpoints go on

    def restart(
        self,
        generation: int,
        restore: int | None,
        *,
        pipeline: Pipeline | None = None,
        task_names: list[str] | None = None,
    ) -> None:
        """Restore in place: stop this generation's queries and start the next
        one's from checkpoint ``restore`` in the same Spark application (no
        new JVM), as the job does after another worker died; with
        ``pipeline`` and ``task_names``, those tasks (a rescaled job)."""
        was_running = bool(self.running)
        self._stop_tasks()
        self._abandon_sends()
        self.generation, self.restore = generation, restore
        self.pipeline = pipeline or self.pipeline
        self.task_names = task_names if task_names is not None else self.task_names
        faults.set_generation(generation)
        self.control.seek_to_end()
        self._start_tasks()
        log.info(
            f"worker g{generation}: tasks {', '.join(self.task_names)} "
            + ("restored in place from " if was_running else "started from ")
            + (f"checkpoint {restore}" if restore else "the beginning")
        )

    def running_generation(self) -> int:
        """The generation the tasks run in; a ``TaskError`` while they run in
        none (a remote worker between leases)."""
        if self.generation is None:
            raise TaskError(f"worker: tasks {', '.join(self.task_names)} run in no generation")
        return self.generation

    def idle(self, reason: str) -> None:
        """Stop every task (the Spark application stays up) and wait."""
        if self.running:
            self._stop_tasks()
            self._abandon_sends()
            log.info(f"worker g{self.generation}: tasks {', '.join(self.task_names)} stopped: {reason}")
        self.generation = None

    def _abandon_sends(self) -> None:
        """The stopped generation's sends still on their way: waited for a
        little, and what failed forgotten (the job restores from a checkpoint
        before them), so the next generation's sends start clean."""
        for sends in (self.producer, self.dead_letters):
            failed = sends.abandon(_STOP_FLUSH_S)
            if failed:
                log.warning("worker: sends of generation %s dropped with it: %s", self.generation, failed)

    def _round(self) -> None:
        """A hook run once per round of ``serve``."""

    def serve(self) -> int:
        """Follow the control topic until stopped; 1 if a query failed,
        ``EXIT_PIPELINE_ERROR`` if it failed on an error in the pipeline."""
        if self._progress_thread is None:
            self._progress_thread = threading.Thread(target=self._beat, name="spark-abs-progress", daemon=True)
            self._progress_thread.start()
        progress_due = Deadline(0.0)  # a schedule, not a wait: the lag is recorded every PROGRESS_INTERVAL_S
        while not self._stop.is_set():
            try:
                self.restart(*self.commands.get_nowait())
            except queue.Empty:
                pass
            for event in self.control.poll(0.2):
                self._on_control(event)
            for running in self.running:
                running.task.tick()
            self._round()
            if self.metrics_endpoint and progress_due.passed():
                progress_due = Deadline(PROGRESS_INTERVAL_S)
                self._record_lag()
            for running in self.running:
                error = running.task.replay_error
                if isinstance(error, PIPELINE_ERRORS):
                    print(f"worker: {running.task.spec.name}: {error}", file=sys.stderr, flush=True)
                    return EXIT_PIPELINE_ERROR
                if error is not None:
                    log.info(f"{running.task.spec.name}: replaying its channel state failed: {error}")
                    return 1
            for query in self.queries:
                if query.pipeline_error is not None:
                    print(f"worker: {query.name}: {query.pipeline_error}", file=sys.stderr, flush=True)
                    return EXIT_PIPELINE_ERROR
                failed = query.failure()
                if failed is not None:
                    log.info(f"{query.name}: stage query failed: {failed}")
                    return 1
        return 0

    def _beat(self) -> None:
        """Each running task's progress on the control topic, every
        ``PROGRESS_INTERVAL_S``, from a thread of its own: it is how the
        runner knows the process is alive (a worker none of whose tasks it
        hears for ``heartbeat_timeout_s`` is taken for stuck), and the main
        loop may wait longer than that on the store or Kafka (a sink's
        commit, bounded) without being stuck.  A frozen process says
        nothing; a stuck task makes its checkpoints fail."""
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            for running in list(self.running):
                try:
                    self.control.publish(running.task.progress())
                except SparkAbsError as exc:  # Kafka away: the runner cannot hear anyone either
                    log.warning("worker: progress not published: %s", exc)
                    break

    def _record_lag(self) -> None:
        """Each task's lag on each input channel: Kafka's latest offset as its
        stage query last saw it, minus where the task is."""
        latest: dict[ChannelId, int] = {}
        for query in self.queries:
            latest.update(query.latest_offsets())
        for running in self.running:
            task = running.task
            for channel in task.spec.inputs:
                if channel in latest:
                    task.metrics.lag(channel, latest[channel] - task.handler.position(channel))

    def _on_control(self, event: ControlEvent) -> None:
        if not event.belongs_to(self.generation) or isinstance(event, _MEMBERSHIP):
            return
        commits = (
            CheckpointCommits(event, self.running_generation(), lambda: self.store, self.control.publish)
            if isinstance(event, Complete)
            else None
        )
        for running in self.running:
            running.task.on_control(event)
            if commits is not None:
                commits.commit(running)

    def stop(self) -> None:
        self._stop.set()

    def _stop_tasks(self) -> None:
        for query in self.queries:
            try:
                query.stop()
            except Exception as exc:  # the JVM may already be gone on a signal
                log.warning("%s: stopping the query: %s", query.name, exc)
            records, handed = query.handed["records"], query.handed["bytes"]
            if records:
                log.info(f"{query.name}: {records} records read, {handed / records:.1f} {HANDED_PER_RECORD}")
        self.queries = []
        for running in self.running:
            try:
                running.task.wait_for_uploads(10)
                running.task.close()
            finally:
                if isinstance(running.sink, KafkaSink):
                    running.sink.close()  # its transactions' JVM ends whatever the task did
        metrics.forget_tasks(self.pipeline.job, [r.task.spec.name for r in self.running])
        self.running = []

    def close(self) -> None:
        self._stop_tasks()
        try:
            self.producer.wait(_STOP_FLUSH_S, "the stop of a worker")
        except SparkAbsError as exc:  # stopping anyway: what was not delivered, the next generation sends again
            log.warning("worker: stopping with records not delivered: %s", exc)
        self.producer.close()
        self.dead_letters.close()
        self.control.close()
        self.store.close()


def _read_commands(worker: Worker, runner_pipe: bool) -> None:
    """The job runner's commands on stdin: ``restore <generation> <checkpoint|none>``.
    With ``runner_pipe``, stdin is the runner's pipe, which closes when the
    runner's process ends however it ends (a SIGKILL too): the worker stops
    rather than work on with nobody coordinating it."""
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "restore":
            worker.commands.put((int(parts[1]), None if parts[2] == "none" else int(parts[2])))
        elif parts:
            log.warning("ignored command %r", line.strip())
    if runner_pipe:
        log.info("the job runner is gone (its pipe to this worker closed): stopping the tasks and Spark")
        worker.stop()


def _serve_metrics(settings: MetricsSettings, runner_started: bool) -> metrics.MetricsServer | None:
    """This worker's metrics endpoint.  A worker its runner started takes a
    free port when its own is in use (a worker of an earlier runner still
    stopping, another program): its ready event names the endpoint, so the
    runner's targets file follows; losing the job over a metrics port would
    be worse."""
    try:
        return metrics.serve(settings, "--metrics-port")
    except ConfigError as exc:
        if not runner_started:
            raise
        log.warning("worker: %s; serving them on a free port instead", exc)
        return metrics.serve(dataclasses.replace(settings, port=0), "--metrics-port")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streaming.engine.worker.worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pipeline", required=True, help="module:attribute of the pipeline")
    parser.add_argument("--job", help="job name (passed to a pipeline factory)")
    parser.add_argument("--tasks", required=True, help="comma-separated task names, e.g. legs-0,accounts-1")
    parser.add_argument("--settings", required=True, help="JobSettings as JSON")
    parser.add_argument("--generation", type=int, default=0)
    parser.add_argument("--restore", type=int, default=None, help="checkpoint id to restore from")
    parser.add_argument(
        "--scale", help="task counts and internal topics other than the pipeline declares, as JSON (a rescaled job)"
    )
    parser.add_argument(
        "--runner-pipe",
        action="store_true",
        help="stdin is the job runner's pipe: stop when it closes (the runner ended or died)",
    )
    metrics.add_options(parser, "this worker's")
    args = parser.parse_args(argv)
    console.install(WORKER_PREFIX)
    try:
        served = _serve_metrics(metrics.settings_from(args), args.runner_pipe)
        if served is not None:
            log.info(f"worker: metrics on {served.url}")
        pipeline = load_pipeline(args.pipeline, args.job)
        if args.scale:
            pipeline = pipeline.rescaled(Scale.from_json(json.loads(args.scale)))
        worker = Worker(
            pipeline,
            [t for t in args.tasks.split(",") if t],
            JobSettings.from_json(args.settings),
            Connection.load(),
            generation=args.generation,
            restore=args.restore,
            metrics_endpoint=served.address if served is not None else "",
        )
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        threading.Thread(target=_read_commands, args=(worker, args.runner_pipe), daemon=True).start()
        worker.start()
    except ConfigError as exc:  # the pipeline cannot run: a restore would not change that
        print(f"worker: {exc}", file=sys.stderr, flush=True)
        return EXIT_PIPELINE_ERROR
    except SparkAbsError as exc:
        print(f"worker: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        code = worker.serve()
    except SparkAbsError as exc:  # Kafka or the store away past its bound, a send that failed: the job restores
        print(f"worker: {exc}", file=sys.stderr, flush=True)
        code = 1
    if code != 0:
        # a failed worker leaves at once (``_exit``): what it would flush and stop belongs to a
        # generation the runner gives up, and a stop may wait on Kafka or a stuck batch for minutes
        print(f"worker: exiting with status {code}; the job runner restores the job", file=sys.stderr, flush=True)
        return code
    worker.close()
    return 0


def _exit(code: int) -> None:
    """Exit with ``code``.  A worker that failed exits at once, without
    waiting for its threads (a micro-batch may still wait on Kafka): its
    runner restores the job either way, and a process stuck on its way out
    would only be killed later."""
    if code == 0:
        sys.exit(0)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        status = main()
    except SystemExit as stop:  # --help, a wrong option
        status = stop.code if isinstance(stop.code, int) else 2
    except BaseException:  # a bug: its traceback, then out at once (see _exit)
        traceback.print_exc()
        status = 1
    _exit(status)
