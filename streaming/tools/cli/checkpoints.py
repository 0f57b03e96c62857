"""``spark-abs checkpoints``: a job's checkpoints listed, shown, compared, verified, garbage-collected."""

from __future__ import annotations

import argparse
import logging

from streaming.api.settings import JobSettings
from streaming.tools.cli.options import add_store_options, open_checkpoints

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "checkpoints",
        help="list, show, diff, verify or garbage-collect a job's checkpoints",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Looks inside a job's checkpoints in the store (every part read is checked
against its checksum):

  list              every checkpoint, whether it verifies, the one a restore picks (default)
  show N            checkpoint N in words: mode, what each task's checkpoint turned out
                    to be (aligned, unaligned, switched), its timings, state tables,
                    in-flight channels and watermarks (--json for machines)
  diff A B          which keys' state changed from checkpoint A to B, per task and table
  verify [N]        every part and checksum of N (or of every complete checkpoint);
                    exit status 1 when one does not verify, naming what is wrong
  gc [--dry-run]    applies retention (--retain), removes orphaned parts, staged copies of
                    committed sink output and retracted output older than --grace; never
                    the checkpoint a restore would pick; --dry-run lists what would go

Operator and channel state as tables: `spark-abs state N`.""",
    )
    parser.add_argument(
        "action", nargs="?", default="list", choices=("list", "show", "diff", "verify", "gc"), help="(default list)"
    )
    parser.add_argument("ids", nargs="*", type=int, metavar="N", help="checkpoint id(s) the action takes")
    add_store_options(parser)
    parser.add_argument("--no-checksums", action="store_true", help="list: check sizes only, without reading parts")
    parser.add_argument("--json", action="store_true", help="show: the checkpoint as JSON")
    parser.add_argument("--rows", type=int, default=10, help="diff: changed rows shown per table (default 10)")
    parser.add_argument("--dry-run", action="store_true", help="gc: list what would go, remove nothing")
    retain = JobSettings.default("retain")
    parser.add_argument("--retain", type=int, default=retain, help=f"gc: complete checkpoints kept (default {retain})")
    parser.add_argument(
        "--grace",
        type=float,
        default=86400.0,
        metavar="SECONDS",
        help="gc: retracted sink output is kept this long (default 86400, a day)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from streaming.errors import ConfigError
    from streaming.tools import views
    from streaming.tools.checkpoints import gc
    from streaming.tools.checkpoints.inspection import CheckpointDetail

    checkpoints, connection = open_checkpoints(args)
    with checkpoints:
        if args.action == "list":
            _ids(args, (0,))
            print(
                views.render_checkpoints(
                    args.job, checkpoints.rows(checksums=not args.no_checksums), checkpoints.generation()
                )
            )
        elif args.action == "show":
            (checkpoint_id,) = _ids(args, (1,))
            detail: CheckpointDetail = checkpoints.detail(checkpoint_id)
            print(json.dumps(detail.to_dict(), indent=2) if args.json else views.render_detail(detail))
            return 1 if detail.problems else 0
        elif args.action == "diff":
            a, b = _ids(args, (2,))
            print(views.render_diff(a, b, checkpoints.diff(a, b, sample=args.rows), args.rows))
        elif args.action == "verify":
            ids = _ids(args, (0, 1))
            results = checkpoints.verify(ids[0] if ids else None, progress=log.info)
            print(views.render_verify(args.job, results))
            return 1 if any(results.values()) else 0
        else:
            from streaming.adapters.sinks.factory import sink_location

            _ids(args, (0,))
            if not args.dry_run and not checkpoints.store.signed:
                raise ConfigError(
                    f"checkpoints gc deletes what job {args.job}'s manifests say is superseded, and without the "
                    "job's secret it cannot tell the job's manifests from anyone's: set SPARK_ABS_JOB_SECRET_FILE "
                    "(or SPARK_ABS_JOB_SECRET), or look first with --dry-run"
                )
            sink = sink_location(JobSettings(store=args.store), args.job, connection)
            plan = gc.plan_gc(checkpoints.store, sink, retain=args.retain, grace_s=args.grace, progress=log.info)
            if not args.dry_run:
                removed = gc.apply_gc(checkpoints.store, plan)
                plan = gc.GcPlan(removed, plan.kept)
            print(views.render_gc(plan, dry_run=args.dry_run))
    return 0


def _ids(args: argparse.Namespace, allowed: tuple[int, ...]) -> list[int]:
    from streaming.errors import ConfigError

    if len(args.ids) not in allowed:
        wanted = " or ".join(str(n) for n in allowed)
        raise ConfigError(f"checkpoints {args.action} takes {wanted} checkpoint id(s), got {len(args.ids)}")
    return args.ids
