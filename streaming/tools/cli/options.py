"""Options the commands share, by concern, and what they make: the local
runtime and the home (``--home``), where a job's checkpoints are
(``--store``, ``--job``), a job's checkpoints (``JobSettings``) and how it
runs (``RunOptions``), its state snapshots and its metrics."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from streaming.api.config import Connection, LocalRuntimeSettings, default_home
from streaming.api.settings import (
    IN_FLIGHT_FORMATS,
    MODES,
    RECORD_ERRORS,
    STATE_SNAPSHOTS,
    WORKER_GROUPINGS,
    JobSettings,
)
from streaming.errors import RuntimeNotRunningError

if TYPE_CHECKING:
    from streaming.engine.job.runner import RunOptions

log = logging.getLogger(__name__)

__all__ = [
    "import_from_here",
    "runtime_settings",
    "connection_for",
    "export_home",
    "add_store_options",
    "open_checkpoints",
    "allow_dropped",
    "add_job_options",
    "add_state_snapshot_options",
    "job_settings",
    "run_options",
]


def import_from_here() -> None:
    """The user's modules (a pipeline, a drill workload) importable from the
    current directory, as ``python -m`` would find them."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def runtime_settings(args: argparse.Namespace) -> LocalRuntimeSettings:
    home = Path(args.home).expanduser().resolve() if args.home else default_home()
    if getattr(args, "cluster", False):
        return LocalRuntimeSettings.cluster(home, s3_port=getattr(args, "s3_port", 0) or 0)
    if getattr(args, "secure", False):
        return LocalRuntimeSettings.secure(
            home, kafka_port=getattr(args, "kafka_port", 0) or 0, s3_port=getattr(args, "s3_port", 0) or 0
        )
    return LocalRuntimeSettings(
        home=home,
        kafka_port=getattr(args, "kafka_port", 0) or 0,
        s3_port=getattr(args, "s3_port", 0) or 0,
    )


def connection_for(args: argparse.Namespace, pipeline: str, job: str | None = None) -> Connection:
    """The ``SPARK_ABS_*`` deployment's connection, else the local runtime's,
    brought up (``LocalRuntime.up``) with its schema registry when the
    pipeline ``pipeline`` names reads or writes Avro through one
    (``registry_users``): built and started for the first such job."""
    given = Connection.from_env(os.environ)
    if given is not None:
        return given
    from streaming.adapters.serde.schema_registry import registry_users
    from streaming.api.pipeline import load_pipeline
    from streaming.local import LocalRuntime

    registry = bool(registry_users(load_pipeline(pipeline, job)))
    return LocalRuntime(runtime_settings(args), progress=log.info).up(registry=registry)


def export_home(args: argparse.Namespace) -> None:
    """``--home`` for the commands whose work reads the home from the environment."""
    if args.home:
        os.environ["SPARK_ABS_HOME"] = str(Path(args.home).expanduser().resolve())


def add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help="snapshot store URI: file:///dir or s3://bucket/prefix")
    parser.add_argument("--job", required=True, help="job name")


def open_checkpoints(args: argparse.Namespace, *, kafka: bool = False):
    """The job's checkpoints; the runtime's connection when the store is S3
    or (``kafka``) channel-state ranges are read back."""
    from streaming.tools.checkpoints.inspection import Checkpoints

    if not args.verbose:  # these commands report every problem they meet themselves
        logging.getLogger("streaming.adapters.snapshots").setLevel(logging.ERROR)
    connection = None
    if kafka or not args.store.startswith("file://"):
        connection = store_connection(args, "channel state kept as ranges in Kafka is not read")
    return Checkpoints.open(args.store, args.job, connection, existing=True), connection


def store_connection(args: argparse.Namespace, without: str) -> Connection | None:
    """The deployment's connection (``SPARK_ABS_*``, else the local
    runtime's).  A store on this machine (``file://``) is read without one:
    None when there is none, logging ``without`` (what goes unread); a store
    elsewhere needs it (``RuntimeNotRunningError``)."""
    try:
        return Connection.from_env(os.environ) or Connection.load(runtime_settings(args))
    except RuntimeNotRunningError as exc:
        if not args.store.startswith("file://"):
            raise
        log.info(f"{exc}; {without}")
        return None


def allow_dropped(args: argparse.Namespace):
    """The stages whose state a restore into a changed pipeline may drop."""
    from streaming.engine.restore.changes import AllowDropped

    if args.allow_all_dropped_state:
        return AllowDropped.everything()
    return AllowDropped.of([s.strip() for given in args.allow_dropped_state for s in given.split(",") if s.strip()])


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """The options of a job run, shared by ``run`` and ``restore``, in
    groups by concern: its checkpoints (``JobSettings``, whose defaults they
    take), its worker processes, how long it runs, what a restore may drop,
    and its metrics."""
    from streaming.engine import metrics

    checkpoints = parser.add_argument_group("checkpoints (JobSettings)")
    mode, in_flight = JobSettings.default("mode"), JobSettings.default("in_flight").value
    checkpoints.add_argument("--mode", default=mode, choices=MODES, help=f"checkpoint mode (default {mode})")
    checkpoints.add_argument(
        "--in-flight",
        default=in_flight,
        choices=IN_FLIGHT_FORMATS,
        help=f"unaligned channel state: offset ranges or copied records (default {in_flight})",
    )
    checkpoints.add_argument(
        "--alignment-timeout-ms",
        type=int,
        help="aligned-timeout: turn unaligned once this long has passed since the checkpoint's trigger",
    )
    checkpoints.add_argument("--held-bytes-budget", type=int, help="aligned-timeout: switch past this many held bytes")
    interval, retain = JobSettings.default("interval_s"), JobSettings.default("retain")
    checkpoints.add_argument(
        "--interval", type=float, default=interval, help=f"seconds between checkpoints (default {interval:g})"
    )
    checkpoints.add_argument(
        "--retain", type=int, default=retain, help=f"completed checkpoints kept (default {retain})"
    )
    add_state_snapshot_options(checkpoints, base_every=True)
    segment_ms = JobSettings.default("segment_ms")
    checkpoints.add_argument(
        "--segment-ms",
        type=float,
        default=segment_ms,
        help="unaligned and aligned-timeout modes: how long a task processes records between two looks at "
        f"control events, about how long an announced checkpoint waits (default {segment_ms:g})",
    )
    checkpoints.add_argument(
        "--state-memory",
        type=int,
        metavar="BYTES",
        help="bytes of keyed-state rows a worker keeps in memory; past them rows spill to memory-mapped files "
        "under spill/ in the spark-abs home (default: no limit)",
    )
    workers = parser.add_argument_group("worker processes (RunOptions)")
    workers.add_argument(
        "--workers",
        default="one",
        choices=WORKER_GROUPINGS,
        help="one worker process (one Spark application) for the whole job, or one per stage (default one)",
    )
    workers.add_argument(
        "--parallelism",
        action="append",
        default=[],
        metavar="STAGE=N",
        help="run STAGE with N tasks (repeat, or give several as a=2,b=3). A job restored from a checkpoint "
        "taken with other task counts is rescaled: keyed state divided by key, channel state routed "
        "again, internal topics of the new counts. Default: the counts of the job's latest run",
    )
    workers.add_argument(
        "--remote-workers",
        action="store_true",
        help="start no worker process here: each worker group (see --workers) is a `spark-abs worker --job JOB "
        "--group GROUP` process on any host that reaches Kafka and the store; the job waits for them, and "
        "restores when one goes silent",
    )
    workers.add_argument(
        "--heartbeat-timeout",
        type=float,
        metavar="SECONDS",
        help="a worker process alive but none of whose tasks is heard this long while Kafka answers (frozen, "
        "stuck), or a remote worker group not heard this long, is taken for dead: the job restores; a remote "
        "worker that hears nothing of the runner this long stops its tasks "
        f"(default {JobSettings.default('heartbeat_timeout_s'):g})",
    )
    workers.add_argument(
        "--tolerable-failed-checkpoints",
        type=int,
        metavar="N",
        help="restore the job from its latest checkpoint after more than N checkpoints failed in a row "
        "(declined, expired, the store failed), as Flink's tolerable failed checkpoints "
        f"(default {JobSettings.default('tolerable_failed_checkpoints')})",
    )
    records = parser.add_argument_group("records the stages' code raises on")
    records.add_argument(
        "--record-errors",
        choices=RECORD_ERRORS,
        help="what a record that makes a stage's code raise does: isolate, to the dead letters with the "
        "exception (the rest goes on as if it had not been there), or fail, the job stops naming it "
        f"(default {JobSettings.default('record_errors')})",
    )
    records.add_argument(
        "--max-isolated-records",
        type=int,
        metavar="N",
        help="stop the job once a task set more than N records aside in one checkpoint interval "
        f"(default {JobSettings.default('max_isolated_records')})",
    )
    records.add_argument(
        "--max-isolated-share",
        type=float,
        metavar="SHARE",
        help="stop the job once a task set aside more than this share of the records of one checkpoint "
        f"interval, from the tenth on (default {JobSettings.default('max_isolated_share'):g})",
    )
    records.add_argument(
        "--skip-records",
        action="append",
        default=[],
        metavar="TOPIC:PARTITION:FIRST-LAST",
        help="skip these records into the dead letters, unread (repeat for more ranges): a restore past records "
        "that fail a task every time, as the runner's error names them. Not on a channel a stage of Spark code "
        "reads (its records are searched by Spark)",
    )
    workers.add_argument(
        "--delivery-timeout",
        type=float,
        metavar="SECONDS",
        help="how long a send to Kafka may take, retries included: a task whose records Kafka has not taken "
        "by then fails and the job restores once Kafka answers again "
        f"(default {JobSettings.default('delivery_timeout_s'):g})",
    )
    workers.add_argument(
        "--max-restores",
        type=int,
        default=10,
        metavar="N",
        help="give up (exit status 2) after the job restored N times in this run (default 10)",
    )
    until = parser.add_argument_group("how long it runs (default: until Ctrl-C)")
    until.add_argument(
        "--for",
        dest="seconds",
        type=float,
        metavar="SECONDS",
        help="stop this many seconds after all tasks are up (default: run until Ctrl-C)",
    )
    until.add_argument(
        "--checkpoints",
        type=int,
        metavar="N",
        help="stop once N checkpoints completed in this run (with --for: whichever comes first)",
    )
    until.add_argument(
        "--drain",
        action="store_true",
        help="stop once everything the input topics hold when the job starts is processed and committed "
        "(a final aligned checkpoint covers it); a bounded input's last run. SIGUSR1 drains a running job "
        "likewise, to what the topics hold when the signal comes",
    )
    changed = parser.add_argument_group("a restore into a changed pipeline")
    changed.add_argument(
        "--allow-dropped-state",
        action="append",
        default=[],
        metavar="STAGE",
        help="a restore into a changed pipeline may drop STAGE's state (repeat, or give several as a,b): a "
        "stage removed from the pipeline, or one whose operator no longer takes its stored state (it starts "
        "empty). Without it such a restore is refused (Flink: --allowNonRestoredState)",
    )
    changed.add_argument(
        "--allow-all-dropped-state",
        action="store_true",
        help="a restore into a changed pipeline may drop the state of any stage (--allow-dropped-state for every one)",
    )
    metrics.add_options(parser.add_argument_group("metrics"), "the runner's", workers=True)


def add_state_snapshot_options(parser: argparse._ActionsContainer, *, base_every: bool) -> None:
    """``--state-snapshots`` (``run``, ``demo``, ``drill``) and, with
    ``base_every``, ``--base-every``; their defaults are ``JobSettings``'s."""
    kind, every = JobSettings.default("state_snapshots").value, JobSettings.default("base_every")
    parser.add_argument(
        "--state-snapshots",
        default=kind,
        choices=STATE_SNAPSHOTS,
        help="what a checkpoint stores of the operator state: every table whole, or what changed since the "
        f"task's previous checkpoint, linked to a base stored whole (default {kind})",
    )
    if base_every:
        parser.add_argument(
            "--base-every",
            type=int,
            default=every,
            help=f"incremental: store the whole state every this many checkpoints, or sooner once the changes "
            f"outweigh it (default {every})",
        )


def job_settings(args: argparse.Namespace) -> JobSettings:
    """The job's checkpoint settings as ``add_job_options``' options give them."""
    extra = {}
    if args.alignment_timeout_ms is not None:
        extra["alignment_timeout_ms"] = args.alignment_timeout_ms
    if args.held_bytes_budget is not None:
        extra["held_bytes_budget"] = args.held_bytes_budget
    if args.heartbeat_timeout is not None:
        extra["heartbeat_timeout_s"] = args.heartbeat_timeout
    if args.tolerable_failed_checkpoints is not None:
        extra["tolerable_failed_checkpoints"] = args.tolerable_failed_checkpoints
    if args.delivery_timeout is not None:
        extra["delivery_timeout_s"] = args.delivery_timeout
    for name in ("record_errors", "max_isolated_records", "max_isolated_share"):
        if getattr(args, name, None) is not None:
            extra[name] = getattr(args, name)
    if getattr(args, "skip_records", None):
        extra["skip_records"] = tuple(args.skip_records)
    return JobSettings(
        store=args.store,
        mode=args.mode,
        in_flight=args.in_flight,
        interval_s=args.interval,
        retain=args.retain,
        state_snapshots=args.state_snapshots,
        base_every=args.base_every,
        segment_ms=args.segment_ms,
        state_memory_bytes=args.state_memory,
        **extra,
    )


def run_options(args: argparse.Namespace) -> RunOptions:
    """How the job runs, as ``add_job_options``' options say."""
    from streaming.api.pipeline import parse_parallelism
    from streaming.engine import metrics
    from streaming.engine.job.runner import RunOptions

    return RunOptions(
        workers=args.workers,
        max_restores=args.max_restores,
        parallelism=parse_parallelism(",".join(args.parallelism)),
        remote=args.remote_workers,
        metrics=metrics.settings_from(args),
        allow_dropped=allow_dropped(args),
    )
