"""Prometheus metrics of the job runner and of each worker process
(docs/operations/metrics.md lists them, with their ports and PromQL).

Every metric is defined here once, on one registry per process
(``REGISTRY``), named ``spark_abs_*`` with a ``job_name`` label (the spark-abs job's name;
Prometheus keeps ``job`` for its scrape job) and, where it
applies, ``task``, ``channel``, ``mode``, ``reason``, ``cause``, ``phase``
or ``group``; no label holds a checkpoint id or anything else unbounded.
The engine records a value where it already knows it: the runner per
checkpoint (triggered, completed from the tasks' acknowledgements, aborted),
per restore and per heartbeat; a worker's tasks per micro-batch and per
segment, never per record.

``serve`` starts the process's HTTP endpoint (``MetricsSettings``: the
address, a free port when 0); ``Targets`` writes the runner's file of
Prometheus targets (``file_sd``), its own endpoint and every worker's."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from barriers.failures import CheckpointFailure
from barriers.messages import Alignment, ChannelId, CheckpointOptions
from streaming.api.config import ENV, MetricsSettings
from streaming.errors import ConfigError
from streaming.hosts import LOOPBACK_HOSTS, host_name, is_loopback
from streaming.private_files import write_atomically

if TYPE_CHECKING:  # what a task measured: an annotation here (the snapshot format loads the store)
    from streaming.adapters.snapshots.format import TaskCheckpointMetrics

__all__ = [
    "REGISTRY",
    "MetricsServer",
    "Targets",
    "TARGETS_FILE",
    "serve",
    "add_options",
    "settings_from",
    "mode_of",
    "checkpoint_triggered",
    "checkpoint_completed",
    "checkpoint_aborted",
    "failed_in_a_row",
    "tolerable_failed_checkpoints",
    "pending",
    "restored",
    "generation",
    "heartbeat",
    "control_rejected",
    "TaskMetrics",
    "forget_tasks",
]

log = logging.getLogger(__name__)

# the runner's file of Prometheus targets, in the job's log directory
TARGETS_FILE = "prometheus-targets.json"

# one registry per process: the runner's, or a worker's (with the process's CPU, memory and GC)
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

# seconds: from a few milliseconds (a small task's snapshot) to minutes (a checkpoint near its timeout)
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _counter(name: str, documentation: str, labels: tuple[str, ...]) -> Counter:
    return Counter(name, documentation, labels, registry=REGISTRY)


def _gauge(name: str, documentation: str, labels: tuple[str, ...]) -> Gauge:
    return Gauge(name, documentation, labels, registry=REGISTRY)


def _histogram(name: str, documentation: str, labels: tuple[str, ...]) -> Histogram:
    return Histogram(name, documentation, labels, registry=REGISTRY, buckets=SECONDS)


# ---- the job runner: checkpoints, restores, remote workers

CHECKPOINTS_TRIGGERED = _counter(
    "spark_abs_checkpoints_triggered",
    "Checkpoints the coordinator triggered (barriers injected).",
    ("job_name", "mode"),
)
CHECKPOINTS_COMPLETED = _counter(
    "spark_abs_checkpoints_completed", "Checkpoints completed (manifest written).", ("job_name", "mode")
)
CHECKPOINTS_ABORTED = _counter(
    "spark_abs_checkpoints_aborted", "Checkpoints aborted, by the reason (a CheckpointFailure).", ("job_name", "reason")
)
CHECKPOINTS_PENDING = _gauge("spark_abs_checkpoints_pending", "Checkpoints triggered and not yet done.", ("job_name",))
CHECKPOINT_DURATION = _histogram(
    "spark_abs_checkpoint_duration_seconds", "Trigger to complete of each completed checkpoint.", ("job_name", "mode")
)
LAST_COMPLETED = _gauge(
    "spark_abs_last_checkpoint_completed_timestamp_seconds",
    "When the latest checkpoint completed (Unix time).",
    ("job_name",),
)
LAST_CHECKPOINT = _gauge("spark_abs_last_checkpoint_id", "The id of the latest completed checkpoint.", ("job_name",))
FAILED_IN_A_ROW = _gauge(
    "spark_abs_checkpoints_failed_in_a_row",
    "Checkpoints that failed since the last one completed, as tolerable_failed_checkpoints counts them "
    "(declined, expired, the store failed); past that setting the job restores.",
    ("job_name",),
)
TOLERABLE_FAILED = _gauge(
    "spark_abs_tolerable_failed_checkpoints",
    "The job's tolerable_failed_checkpoints: more checkpoints failed in a row than this and it restores.",
    ("job_name",),
)
TASK_PHASE = _histogram(
    "spark_abs_task_checkpoint_seconds",
    "Each task's part of a completed checkpoint: phase first_barrier (trigger to the task seeing it), "
    "alignment, sync (taking the snapshot on the task's thread), async (the upload).",
    ("job_name", "task", "phase"),
)
STATE_BYTES = _gauge(
    "spark_abs_checkpoint_state_bytes",
    "Operator state bytes each task stored in the latest checkpoint.",
    ("job_name", "task"),
)
CHANNEL_STATE_RECORDS = _gauge(
    "spark_abs_checkpoint_channel_state_records",
    "Records in flight each task recorded as channel state in the latest checkpoint (unaligned).",
    ("job_name", "task"),
)
CHANNEL_STATE_BYTES = _gauge(
    "spark_abs_checkpoint_channel_state_bytes",
    "Bytes of the in-flight records each task copied into the latest checkpoint (in-flight records).",
    ("job_name", "task"),
)
HELD_BYTES_MAX = _gauge(
    "spark_abs_checkpoint_held_bytes_max",
    "The most bytes each task held while aligning before its snapshot of the latest checkpoint.",
    ("job_name", "task"),
)
RESTORES = _counter(
    "spark_abs_restores",
    "Restores of the job (a new generation), by cause: worker_died, worker_lost, worker_stuck, "
    "checkpoints_failing, restart, requested, rescale.",
    ("job_name", "cause"),
)
GENERATION = _gauge("spark_abs_generation", "The job's current generation (one more per restore).", ("job_name",))
HEARTBEATS = _counter(
    "spark_abs_remote_heartbeats", "Heartbeats the runner read from remote worker groups.", ("job_name", "group")
)
LAST_HEARTBEAT = _gauge(
    "spark_abs_remote_last_heartbeat_timestamp_seconds",
    "When the runner last read a heartbeat of each remote worker group (Unix time).",
    ("job_name", "group"),
)
CONTROL_REJECTED = _counter(
    "spark_abs_control_rejected",
    "Records on the job's control topic that this process did not act on, by reason: unsigned, "
    "signature (signed with another key), malformed. Anything but 0 means someone else writes to the topic.",
    ("job_name", "reader", "reason"),
)

# ---- a worker's tasks: the data path, per micro-batch and per segment

RECORDS_IN = _counter(
    "spark_abs_records_in", "Records each task processed from each input channel.", ("job_name", "task", "channel")
)
RECORDS_OUT = _counter(
    "spark_abs_records_out",
    "Rows each task sent to each output channel (channel sink: into the sink's epoch).",
    ("job_name", "task", "channel"),
)
CHANNEL_LAG = _gauge(
    "spark_abs_channel_lag_records",
    "Records on each input channel the task has not processed yet (Kafka's latest offset as the stage "
    "query last saw it, minus the task's position).",
    ("job_name", "task", "channel"),
)
HELD_BYTES = _gauge(
    "spark_abs_task_held_bytes", "Bytes of the records alignment holds, after each micro-batch.", ("job_name", "task")
)
WATERMARK = _gauge(
    "spark_abs_task_watermark_ms",
    "The task's event-time watermark (ms since the epoch), after each micro-batch; no series before its first.",
    ("job_name", "task"),
)
IDLE_INPUTS = _gauge(
    "spark_abs_task_idle_inputs",
    "Event-time input channels of the task left out of its watermark as idle, after each micro-batch.",
    ("job_name", "task"),
)
BATCH_SECONDS = _histogram(
    "spark_abs_task_batch_seconds", "The time a task took over each micro-batch it was handed.", ("job_name", "task")
)
DEAD_LETTERS = _counter(
    "spark_abs_dead_letters",
    "Records and rows sent to the dead-letter topic, by reason: malformed, refused (by the operator), "
    "given_up (rows an operator gave up on), rejected_control (barriers failing their checks).",
    ("job_name", "task", "reason"),
)

# the task's metrics whose value is a level, not a count: dropped with the task
_TASK_LEVELS = (
    STATE_BYTES,
    CHANNEL_STATE_RECORDS,
    CHANNEL_STATE_BYTES,
    HELD_BYTES_MAX,
    CHANNEL_LAG,
    HELD_BYTES,
    WATERMARK,
    IDLE_INPUTS,
)


def mode_of(options: CheckpointOptions) -> str:
    """The job mode a barrier's options are (``streaming.api.settings.Mode``'s names)."""
    if options.alignment is Alignment.ALIGNED and options.may_switch_to_unaligned:
        return "aligned-timeout"
    return options.alignment.value


# ---- recorded by the runner


def checkpoint_triggered(job: str, options: CheckpointOptions) -> None:
    CHECKPOINTS_TRIGGERED.labels(job, mode_of(options)).inc()


def pending(job: str, count: int) -> None:
    CHECKPOINTS_PENDING.labels(job).set(count)


def checkpoint_completed(
    job: str,
    checkpoint_id: int,
    options: CheckpointOptions,
    duration_s: float | None,
    tasks: Mapping[str, TaskCheckpointMetrics],
) -> None:
    """Checkpoint ``checkpoint_id`` completed in ``duration_s``; ``tasks``:
    what each task measured of it (the manifest's per-task metrics)."""
    mode = mode_of(options)
    CHECKPOINTS_COMPLETED.labels(job, mode).inc()
    if duration_s is not None:
        CHECKPOINT_DURATION.labels(job, mode).observe(duration_s)
    LAST_COMPLETED.labels(job).set(time.time())
    LAST_CHECKPOINT.labels(job).set(checkpoint_id)
    for task, measured in tasks.items():
        for phase, seconds in (
            ("first_barrier", measured.first_barrier_s),
            ("alignment", measured.alignment_s),
            ("sync", measured.sync_snapshot_s),
            ("async", measured.async_snapshot_s),
        ):
            if seconds is not None:
                TASK_PHASE.labels(job, task, phase).observe(seconds)
        for gauge, value in (
            (STATE_BYTES, measured.state_bytes),
            (CHANNEL_STATE_RECORDS, measured.in_flight_records_referenced),
            (CHANNEL_STATE_BYTES, measured.in_flight_bytes_copied),
            (HELD_BYTES_MAX, measured.held_bytes_max),
        ):
            if value is not None:
                gauge.labels(job, task).set(value)


def checkpoint_aborted(job: str, failure: CheckpointFailure | None) -> None:
    CHECKPOINTS_ABORTED.labels(job, (failure or CheckpointFailure.USER).name.lower()).inc()


def failed_in_a_row(job: str, count: int) -> None:
    FAILED_IN_A_ROW.labels(job).set(count)


def tolerable_failed_checkpoints(job: str, count: int) -> None:
    TOLERABLE_FAILED.labels(job).set(count)


def restored(job: str, cause: str) -> None:
    """The job restored; ``cause`` is a short name, never the prose reason."""
    RESTORES.labels(job, cause).inc()


def generation(job: str, generation: int) -> None:
    GENERATION.labels(job).set(generation)


def heartbeat(job: str, group: str) -> None:
    HEARTBEATS.labels(job, group).inc()
    LAST_HEARTBEAT.labels(job, group).set(time.time())


def control_rejected(job: str, reader: str, reason: str) -> None:
    """``reader`` (the runner, a worker, a remote worker waiting for its lease) did not act on a
    record of the control topic."""
    CONTROL_REJECTED.labels(job, reader, reason).inc()


def forget_tasks(job: str, tasks: Iterable[str]) -> None:
    """Drop the levels (gauges) of ``tasks`` of ``job``: tasks that no longer
    run here (a rescale, a worker's tasks stopped).  Counts stay."""
    for task in tasks:
        for metric in _TASK_LEVELS:
            metric.remove_by_labels({"job_name": job, "task": task})


# ---- recorded by a task


class TaskMetrics:
    """The data-path metrics of task ``task`` of ``job``, their series made
    once (a label lookup per record would cost): records in per input
    channel, out per output channel, held bytes and the time per batch."""

    def __init__(self, job: str, task: str, inputs: Iterable[ChannelId], outputs: Iterable[ChannelId]):
        self.job, self.task = job, task
        self.records_in = {c: RECORDS_IN.labels(job, task, str(c)) for c in inputs}
        outputs = list(outputs)
        self.records_out = [RECORDS_OUT.labels(job, task, str(c)) for c in outputs]
        self.records_to_sink = None if outputs else RECORDS_OUT.labels(job, task, "sink")
        self.held_bytes = HELD_BYTES.labels(job, task)
        self.batch_seconds = BATCH_SECONDS.labels(job, task)
        self.idle_inputs = IDLE_INPUTS.labels(job, task)

    def batch(self, seconds: float, held_bytes: int, watermark: int | None = None, idle_inputs: int = 0) -> None:
        """A micro-batch took ``seconds``; alignment holds ``held_bytes``
        after it, event time reached ``watermark`` (None: not yet, or the
        task has none) with ``idle_inputs`` event-time channels left out."""
        self.batch_seconds.observe(seconds)
        self.held_bytes.set(held_bytes)
        if watermark is not None:
            WATERMARK.labels(self.job, self.task).set(watermark)
        self.idle_inputs.set(idle_inputs)

    def dead_letter(self, reason: str) -> None:
        DEAD_LETTERS.labels(self.job, self.task, reason).inc()

    def lag(self, channel: ChannelId, records: int) -> None:
        CHANNEL_LAG.labels(self.job, self.task, str(channel)).set(max(0, records))


# ---- the endpoint


def add_options(parser: argparse._ActionsContainer, whose: str, *, workers: bool = False) -> None:
    """``--metrics-port``, ``--metrics-host`` and ``--no-metrics`` (``whose``
    endpoint they set, and whether its ``workers`` follow it, for the help);
    ``settings_from`` reads them, with the environment's defaults (read then,
    so a bad variable fails the command that serves metrics, not every one)."""
    default = MetricsSettings()
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help=f"serve {whose} Prometheus metrics on this port; 0 picks a free one, said in the log"
        + ("; its worker processes serve theirs on the ports after it (free ones with 0)" if workers else "")
        + f" (default {default.port}, or ${ENV['metrics_port']}: a port, 0 or off)",
    )
    parser.add_argument(
        "--metrics-host",
        metavar="ADDRESS",
        help=f"the address the metrics endpoint binds; 0.0.0.0 for a Prometheus on another host "
        f"(default {default.host}, or ${ENV['metrics_host']})",
    )
    parser.add_argument("--no-metrics", action="store_true", help="serve no metrics")


def settings_from(args: argparse.Namespace) -> MetricsSettings:
    """The ``MetricsSettings`` the options of ``add_options`` give, over the
    environment's (``MetricsSettings.from_env``)."""
    if args.no_metrics:
        return MetricsSettings.off()
    settings = MetricsSettings.from_env()
    host = args.metrics_host or settings.host
    port = settings.port if args.metrics_port is None else args.metrics_port
    return MetricsSettings(host=host, port=port)


class MetricsServer:
    """This process's HTTP endpoint (``/metrics``), at ``address`` (host:port
    as others reach it)."""

    def __init__(self, server: Any, address: str):
        self._server = server
        self.address = address

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(settings: MetricsSettings, option: str) -> MetricsServer | None:
    """Serve this process's metrics as ``settings`` say (None when they say
    not to); ``option`` names the setting for a port already in use."""
    if settings.port is None:
        return None
    try:
        server = _serve_checked(settings.host, settings.port, metric_hosts(settings.host))
    except OSError as exc:
        raise ConfigError(
            f"{option} {settings.port}: cannot serve metrics on {settings.host}:{settings.port} ({exc.strerror or exc}); "
            f"give another port, 0 for a free one, or --no-metrics"
        ) from exc
    host = settings.host
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()  # bound to every interface: others reach it by the host's name
    port = server.server_address[1]
    return MetricsServer(server, f"[{host}]:{port}" if ":" in host else f"{host}:{port}")


def metric_hosts(bound: str, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The names a request's ``Host`` may give an endpoint bound to
    ``bound``: the loopback names; off loopback also the address bound, this
    host's name (what the targets file gives Prometheus) and the names in
    ``SPARK_ABS_METRICS_ALLOW_HOST`` (comma-separated), for a Prometheus that
    reaches it by another."""
    environ = os.environ if environ is None else environ
    names = set(LOOPBACK_HOSTS)
    if not is_loopback(bound):
        names |= {host_name(bound), host_name(socket.gethostname()), host_name(socket.getfqdn())}
        names |= {host_name(n) for n in environ.get(ENV["metrics_allow_host"], "").split(",") if n.strip()}
    names.discard("")
    return frozenset(names - {"0.0.0.0", "::"})


def _serve_checked(host: str, port: int, hosts: frozenset[str]) -> WSGIServer:
    """prometheus-client's exposition (``make_wsgi_app``) behind a check of
    the ``Host`` header, on a thread of its own: a request naming another host
    (a web page that rebound its name to this address) is a 400."""
    app = make_wsgi_app(REGISTRY)
    allowed = ", ".join(sorted(hosts))

    def checked(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if host_name(environ.get("HTTP_HOST", "")) not in hosts:
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [
                f"400: these metrics answer to {allowed} (any port), not to the Host this request names; "
                f"a Prometheus that reaches them by another name goes in {ENV['metrics_allow_host']}\n".encode()
            ]
        return app(environ, start_response)

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, checked, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="spark-abs-metrics", daemon=True).start()
    return server


class _QuietHandler(WSGIRequestHandler):
    """Scrapes are not logged."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Targets:
    """The runner's Prometheus targets (``file_sd_configs``): its own endpoint
    and each worker's, as the workers' ready events name them, written to
    ``path`` (atomically) whenever one changes."""

    def __init__(self, path: Path, job: str, runner: str):
        self.path = path
        self.job = job
        self.runner = runner
        self.workers: dict[str, str] = {}
        self._write()

    def update(self, workers: Mapping[str, str]) -> None:
        """Worker name -> endpoint, as the workers said (an empty one: none)."""
        changed = {name: address for name, address in workers.items() if address and self.workers.get(name) != address}
        if changed:
            self.workers.update(changed)
            self._write()
            for name, address in sorted(changed.items()):
                log.info("worker %s serves metrics on http://%s/metrics", name, address)

    def entries(self) -> list[dict[str, Any]]:
        runner = {"targets": [self.runner], "labels": {"spark_abs_role": "runner", "spark_abs_job": self.job}}
        return [runner] + [
            {
                "targets": [address],
                "labels": {"spark_abs_role": "worker", "spark_abs_job": self.job, "spark_abs_worker": name},
            }
            for name, address in sorted(self.workers.items())
        ]

    def _write(self) -> None:
        """The file, written atomically; a file that cannot be written is said, never fatal to the job."""
        try:
            write_atomically(self.path, json.dumps(self.entries(), indent=2) + "\n")
        except OSError as exc:
            log.warning("cannot write the Prometheus targets file %s: %s", self.path, exc)
