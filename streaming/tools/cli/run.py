"""``spark-abs run``: a pipeline of the user's run with checkpoints (or restored from one)."""

from __future__ import annotations

import argparse
import logging

from streaming.tools.cli.options import (
    add_job_options,
    connection_for,
    export_home,
    import_from_here,
    job_settings,
    run_options,
)

__all__ = ["register", "run"]

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
    from streaming.tools.commands import run_job

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
