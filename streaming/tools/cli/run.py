"""``spark-abs run``: a pipeline of the user's run with checkpoints (or
restored from one).

``run`` starts a job (or restarts it from its latest complete checkpoint that
verifies, when the store already knows the job, or from a named one with
``--restore N``: a restore drill), takes checkpoints on its interval and
restores by itself when a worker dies, until ``--for`` seconds passed or
Ctrl-C; ``--drain`` (or SIGUSR1 to a running one) stops it once everything
in its input topics is processed and committed (``run_job``).  Looking at
checkpoints is ``streaming.tools.checkpoints``."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import threading
import time

from streaming.tools.cli.options import (
    add_job_options,
    connection_for,
    export_home,
    import_from_here,
    job_settings,
    run_options,
)
from streaming.waits import Deadline

__all__ = ["register", "run", "run_job"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help="run a pipeline of yours with checkpoints (or restore it from one)",
        description="Starts the job of PIPELINE (module:attribute, a Pipeline or a function "
        "(job=...) returning one; the module must be importable, e.g. from the "
        "current directory) on the local runtime or the SPARK_ABS_* deployment. "
        "A job the store already knows restarts from its latest complete "
        "checkpoint that verifies; --restore N starts from checkpoint N instead "
        "(a new generation). Checkpoints are taken every --interval seconds; a "
        "worker that dies is restored. Runs until Ctrl-C, --for seconds after all "
        "its tasks are up, or --checkpoints N completed.",
    )
    parser.add_argument(
        "pipeline",
        help="module:attribute (its module importable from here), e.g. shop:pipeline, or a pipeline's name "
        "(spark-abs's examples: money, orders, clickstream, payments, devices, carts)",
    )
    parser.add_argument("--store", required=True, help="snapshot store URI: file:///dir or s3://bucket/prefix")
    parser.add_argument("--job", help="job name (default: the pipeline's own)")
    add_job_options(parser)
    parser.add_argument("--restore", type=int, metavar="N", help="start from checkpoint N (a restore drill)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streaming.engine.job.runner import JobRunner
    from streaming.errors import ConfigError

    for flag, value in (("--for", args.seconds), ("--checkpoints", args.checkpoints)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be positive, got {value:g}")
    export_home(args)
    import_from_here()
    settings = job_settings(args)
    # the local runtime (unless SPARK_ABS_* name a deployment), with its schema registry if the pipeline uses one
    connection = connection_for(args, args.pipeline, args.job)
    runner = JobRunner(args.pipeline, settings, connection, job=args.job, options=run_options(args))
    run_job(runner, restore=args.restore, seconds=args.seconds, checkpoints=args.checkpoints, drain=args.drain)
    return 0


def _say_where_output_goes(runner) -> None:
    from streaming.adapters.sinks.factory import sink_place

    for stage in runner.pipeline.stages:
        if stage.sink is not None:
            place = sink_place(stage.sink, runner.settings, runner.job, runner.connection)
            log.info(f"job {runner.job}: stage {stage.name} commits its output to {place}")


def run_job(
    runner,
    *,
    restore: int | None = None,
    seconds: float | None = None,
    checkpoints: int | None = None,
    drain: bool = False,
    drain_timeout_s: float = 600.0,
) -> None:
    """Start ``runner`` (a ``JobRunner``; from checkpoint ``restore`` when
    given) and drive it until ``seconds`` passed once all its tasks are up,
    or ``checkpoints`` checkpoints completed, whichever comes first (neither:
    until Ctrl-C); then stop its workers.  With ``drain``, or once the process
    gets SIGUSR1, run until everything the ingress topics hold then is
    processed and committed (a final aligned checkpoint covers it, as a
    stop-with-savepoint does), then stop.  What it does is logged (INFO)."""
    from barriers.coordinator import CheckpointStatus
    from streaming.engine.job.operations import run_until_caught_up

    started = time.monotonic()
    deadline: Deadline | None = None  # from when all tasks are ready
    asked = threading.Event()
    previous = previous_term = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGUSR1, lambda *_: asked.set())
        # a process manager's SIGTERM stops the job as Ctrl-C does: workers stopped, remote ones told
        previous_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        runner.start(restore=restore)
        log.info(
            f"job {runner.job}: {len(runner.layout.local)} worker process(es) starting"
            + (f", {len(runner.layout.remote_names)} remote group(s) to join" if runner.layout.remote_names else "")
            + f", generation {runner.generation} (Ctrl-C or SIGTERM stops it; SIGUSR1 drains it)"
        )
        _say_where_output_goes(runner)
        while not (drain or asked.is_set()) and (deadline is None or not deadline.passed()):
            runner.step()
            if (
                checkpoints is not None
                and sum(r.status == CheckpointStatus.COMPLETED for r in runner.checkpoints()) >= checkpoints
            ):
                break
            # no coordinator while a restore waits for Kafka or the store (liveness)
            if deadline is None and runner.coordinator is not None and runner.coordinator.all_ready:
                log.info(
                    f"all tasks ready after {time.monotonic() - started:.1f} s; checkpoints every "
                    f"{runner.settings.interval_s:g} s" + ("" if seconds is None else f", for {seconds:g} s")
                )
                deadline = Deadline(math.inf if seconds is None else seconds)
        if drain or asked.is_set():
            log.info("draining: until everything in the input topics now is processed and committed")
            record = run_until_caught_up(runner, drain_timeout_s)
            log.info("drained: checkpoint %d covers every input record and is committed", record.checkpoint_id)
    except KeyboardInterrupt:
        log.info("stopping (Ctrl-C or SIGTERM)")
    finally:
        if previous is not None:
            signal.signal(signal.SIGUSR1, previous)
        if previous_term is not None:  # a second SIGTERM does not cut the close short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            runner.close()
        finally:
            if previous_term is not None:
                signal.signal(signal.SIGTERM, previous_term)
    done = [r for r in runner.checkpoints() if r.status == CheckpointStatus.COMPLETED]
    log.info(
        f"stopped; {len(done)} checkpoint(s) completed in this run"
        + (f", the last {done[-1].checkpoint_id}" if done else "")
    )


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
