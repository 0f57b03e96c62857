"""``spark-abs worker``: one worker group of a job whose groups are remote, on this host."""

from __future__ import annotations

import argparse
import functools
import logging

from streaming.adapters.kafka.admin import job_key
from streaming.engine import metrics
from streaming.tools.cli.options import connection_for, export_home, import_from_here

__all__ = ["register", "run"]

log = logging.getLogger(__name__)

# how long a worker waits for its job's runner to publish a lease, by default
RUNNER_WAIT_S = 600.0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "worker",
        help="run one worker group of a job started with `run --remote-workers`, on this host",
        description="Joins job JOB as its worker group GROUP: waits for the job runner's lease on the "
        "job's control topic, becomes the group's member (a second worker of a group waits as its "
        "standby), runs the group's tasks as one Spark application on this host's SPARK_ABS_* "
        "deployment (its Spark master, Kafka and store), restores in place when the job restores, and "
        "stops its tasks when the runner stops or goes silent, waiting for the next one. "
        "The job's settings come from the runner's lease, which the job's key signs (the job secret: "
        "SPARK_ABS_JOB_SECRET or SPARK_ABS_JOB_SECRET_FILE, as the runner's); the pipeline is the one "
        "--pipeline names, whose module must be importable here (e.g. from the current directory), and a "
        "lease for another job or pipeline is refused. Runs until SIGTERM or Ctrl-C.",
    )
    parser.add_argument("--job", required=True, help="the job's name (as the runner has it)")
    parser.add_argument(
        "--pipeline",
        required=True,
        help="the pipeline the runner runs, as its command line names it (module:attribute, "
        "arguments after ?, or a name): the only code this worker runs",
    )
    parser.add_argument(
        "--group",
        required=True,
        help="the worker group: `all` with the runner's --workers one, a stage's name with per-stage",
    )
    parser.add_argument(
        "--wait-for-runner",
        type=float,
        default=RUNNER_WAIT_S,
        metavar="SECONDS",
        help="give up (exit status 2) when no runner of the job has published its lease this long after the "
        f"worker began to wait: a mistyped --job, or a runner never started (default {RUNNER_WAIT_S:g}; 0: wait "
        "until stopped)",
    )

    metrics.add_options(parser, "this worker's")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import signal
    import threading

    from streaming.adapters.kafka.admin import delete_topics, end_offsets
    from streaming.adapters.kafka.control.transport import ControlTopic, control_jobs
    from streaming.engine.remote.member import RemoteWorker, wait_for_lease
    from streaming.errors import ConfigError, names_like

    if args.wait_for_runner < 0:
        raise ConfigError(f"--wait-for-runner {args.wait_for_runner:g}: give seconds >= 0 (0: wait until stopped)")
    export_home(args)
    import_from_here()
    connection = connection_for(args, args.pipeline, args.job)
    served = metrics.serve(metrics.settings_from(args), "--metrics-port")
    if served is not None:
        log.info(f"worker: metrics on {served.url}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    known = control_jobs(connection.kafka)
    if args.job not in known:
        log.warning(
            f"worker: job {args.job!r} has no control topic on this Kafka: no runner of it has started here yet "
            f"({names_like(args.job, known, 'jobs with a control topic here')})"
        )
    control = ControlTopic(
        connection.kafka,
        args.job,
        job_key(connection, args.job),
        on_rejected=functools.partial(metrics.control_rejected, args.job, "worker"),
    )
    bound = args.wait_for_runner or None
    try:
        control.seek_to_end()
        waiting = f"up to {bound:g} s (--wait-for-runner)" if bound else "until stopped"
        log.info(f"worker: waiting {waiting} for the runner of job {args.job} (its lease on {control.topic})")
        lease = wait_for_lease(control, args.job, args.pipeline, stop=stop, timeout_s=bound)
    finally:
        control.close()
    if lease is None and not stop.is_set():
        if args.job not in known and not sum(end_offsets(connection.kafka, control.topic, 1).values()):
            delete_topics(connection.kafka, [control.topic])  # made by this wait alone: no trace of a typo
        raise ConfigError(
            f"no runner of job {args.job!r} published its lease on {control.topic} in {bound:g} s "
            f"(--wait-for-runner): start the job with `spark-abs run PIPELINE --remote-workers` under that name, "
            f"or give --job the runner's job name "
            f"({names_like(args.job, [j for j in control_jobs(connection.kafka) if j != args.job], 'jobs with a control topic here')})"
        )
    if lease is None:
        return 0
    worker = RemoteWorker(lease, args.group, connection, args.pipeline)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    try:
        worker.start()
        return worker.serve()
    except KeyboardInterrupt:
        log.info("worker: stopping (Ctrl-C)")
        return 130
    finally:
        # stopping: a second SIGTERM (a process manager's, sent again) neither cuts the close short
        # nor kills the process while it exits
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker.close()
