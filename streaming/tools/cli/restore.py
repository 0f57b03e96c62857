"""``spark-abs restore``: a job restored from a checkpoint, or (``--dry-run``) what a restore would do."""

from __future__ import annotations

import argparse
import logging

from streaming.tools.cli import run as run_command
from streaming.tools.cli.options import (
    add_job_options,
    add_store_options,
    allow_dropped,
    import_from_here,
    open_checkpoints,
)

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "restore",
        help="restore a job from a checkpoint, or (--dry-run) say what a restore would do",
        description="With --dry-run: which checkpoint a restore would pick (N if it "
        "verifies, else the newest that does, and why newer ones are skipped), which "
        "generation it would start and what each task would load and replay; with "
        "--pipeline, what happens to each stage of the pipeline as its code now declares it "
        "(kept, added, removed, state schema or inputs changed, refused); with "
        "--parallelism too, how it would be rescaled: each new task's "
        "state, channels and re-routed channel state, and the new topics. "
        "Without: the restore itself, as `run PIPELINE --restore N` (give --pipeline).",
    )
    parser.add_argument(
        "checkpoint", nargs="?", type=int, metavar="N", help="checkpoint id (default: the newest that verifies)"
    )
    add_store_options(parser)
    parser.add_argument("--dry-run", action="store_true", help="say what a restore would do; start nothing")
    parser.add_argument("--pipeline", help="module:attribute of the job's pipeline (needed without --dry-run)")
    add_job_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streaming.errors import ConfigError
    from streaming.tools import views

    if args.dry_run and args.parallelism:
        from streaming.api.pipeline import load_pipeline, parse_parallelism

        if not args.pipeline:
            raise ConfigError("restore --dry-run --parallelism: give --pipeline, whose stages say how rows are routed")
        import_from_here()
        pipeline = load_pipeline(args.pipeline, args.job)
        checkpoints, _ = open_checkpoints(args, kafka=True)
        with checkpoints:
            plan = checkpoints.rescale_plan(
                pipeline, parse_parallelism(",".join(args.parallelism)), args.checkpoint, progress=log.info
            )
        print(views.render_rescale_plan(plan))
        return 0
    if args.dry_run:
        checkpoints, _ = open_checkpoints(args)
        with checkpoints:
            if args.pipeline:  # the pipeline as its code now declares it: which stages changed
                from streaming.api.pipeline import load_pipeline

                import_from_here()
                pipeline = load_pipeline(args.pipeline, args.job)
                change = checkpoints.change_plan(
                    pipeline, args.checkpoint, allow=allow_dropped(args), progress=log.info
                )
                print(views.render_pipeline_change(change))
                change.check()  # refused: the reasons, exit status 2
                if change.changed:
                    return 0
            print(views.render_restore_plan(checkpoints.restore_plan(args.checkpoint, progress=log.info)))
        return 0
    if not args.pipeline:
        raise ConfigError(
            "restore: give --pipeline (module:attribute or a pipeline's name) to restore the job, or --dry-run"
        )
    if args.checkpoint is None:  # named explicitly: a job that only ran generation 0 would start afresh
        checkpoints, _ = open_checkpoints(args)
        with checkpoints:
            picked, _ = checkpoints.store.latest_verified()
        if picked is None:
            raise ConfigError(
                f"job {args.job}: no checkpoint verifies, nothing to restore from (`run` starts it from the beginning)"
            )
        args.checkpoint = picked.checkpoint_id
    args.restore = args.checkpoint
    return run_command.run(args)
