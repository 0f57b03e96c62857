"""``spark-abs drill``: a restore drill.

A drill runs a job (the money pipeline by default) as a real ``spark-abs
run`` process, on a workload produced while it runs, and injects failures at
moments drawn from a seed: after each, the job must restore by itself and
complete a checkpoint again.  At the end the job is drained (SIGUSR1 to
``spark-abs run``: it stops once every input record is processed and
committed), and great-expectations suites check the
committed output against a reference Spark computes in batch from the same
ingress topics, every checkpoint a coordinator reported complete, and the
dead letters (``streaming.tools.drill.checks``).  The report (Markdown, JSON
and GX's own results) goes to a directory; ``streaming.tools.drill.report``
writes it.

Failure kinds (``FailureKind``), drawn in rounds that hold every chosen
kind once, so that ``k`` failures give each ``k / kinds`` times (rounded)
and any first ones are balanced:

- ``worker``: a worker process and its Spark JVM SIGKILLed, at a random
  moment or at a named fault point (``streaming.engine.faults``: mid-batch,
  during alignment, during upload, between the manifest and the sink's
  commit, during the restore itself), armed in the running worker through
  its fault file;
- ``runner``: the job runner (it hosts the coordinator) SIGKILLed; its
  workers must stop by themselves (the drill waits for that, and fails the
  drill if any outlives the bound), then ``spark-abs run`` starts again and
  restores;
- ``broker``: the local runtime's Kafka broker stopped for a few seconds and
  started again;
- ``store``: the local runtime's S3 server stopped for a few seconds (the
  store is ``s3://`` by default so it can be), so checkpoints decline until
  it is back;
- ``damage``: the runner SIGKILLed, the newest complete checkpoint damaged (a
  part deleted or a byte flipped), the runner started again: the restore
  must skip it for an older one that verifies;
- ``retention`` (drilled when named in ``--kinds``): every record of the
  job's internal topics before where the newest complete checkpoint reads
  them again deleted (``DeleteRecords``, as retention would), then a worker
  SIGKILLed: the restore must use a checkpoint Kafka still holds, that one
  or a later one (docs/operations/retention.md);
- ``worker-frozen``: a worker's process stopped (SIGSTOP, its Spark JVM
  running on) for 5 to 15 s past the heartbeat timeout (15 s): the runner
  must find its tasks silent, SIGKILL it and restore; a worker still there
  then is continued (SIGCONT);
- ``broker-long`` (when named): the Kafka broker stopped for 1.25 to 1.75
  times the job's delivery timeout (a job's default is 120 s: minutes;
  ``--delivery-timeout`` runs the job with a shorter one, which the report
  names): the job must recover by itself once Kafka is back (a worker
  with a send pending through the outage exits when it fails, and the job
  restores; one with none goes on);
- ``store-long`` (when named): the S3 server stopped for 1.1 to 1.4 times
  the store's retries (120 s): the job must recover by itself once it is
  back, restored or not;
- ``stuck-send`` (when named): a task's thread blocked for good where it
  flushes its sends before a snapshot (the ``stuck_send`` fault point,
  armed in the running worker), the worker alive and heard: the runner
  must restore once more checkpoints than it tolerates failed (3, each
  aborted at the 60 s checkpoint timeout: minutes).  The recovery limit
  counts once the job had that long;
- ``poison`` (when named): records no schema expected appended to every
  ingress topic (not JSON, 5,000 digits, deep nesting, an Arrow batch,
  ``abs.wm`` and ``abs.gen`` of ``zz``, an unsigned barrier, an unknown
  schema id), and the workload's own records its code raises on: each must
  be one dead letter, with no restore, and the output the reference's over
  the other records (a workload whose reference leaves them out:
  ``DrillWorkload.poison_ready``).

With ``--cluster`` the drill runs on the local cluster (``spark-abs local up
--cluster``: three Kafka nodes, a Spark standalone master with two
workers), the job's worker groups remote (a ``spark-abs worker`` per group,
a group per stage or, with ``--workers one``, one for the whole job, which
the drill starts, and starts again when one dies, as a host's process
manager would), and draws from the cluster's kinds as well
(``streaming.tools.drill.cluster``):

- ``broker-node``: one Kafka node of three SIGKILLed until the job went on
  without it; no restore;
- ``spark-worker``: one Spark worker of two SIGKILLed the same way; no restore;
- ``group``: a worker group's member SIGKILLed, no standby waiting: a restore,
  the group run by the worker started for it;
- ``group-standby``: the same with a standby waiting, which runs the group;
- ``runner-remote``: the runner SIGKILLed and started again, at once or once
  its lease lapsed: a restore, every group run by the same member.

``worker``, ``damage``, ``store`` and ``retention`` mean there what they mean
on the local runtime (a worker is a remote group's member; the runner a
``damage`` kills leaves its members up, their tasks stopped); ``runner`` and
``broker`` are the local runtime's own.

Each failure waits for recovery (a checkpoint completes after it; for a kind
that must restore, in a later generation), which the report times, with
each restore's cause; ``--seed`` makes the plan (kinds, order, moments,
fault points, damage) the same again.

At scale: ``--failures N`` and/or ``--duration 45m`` (``DrillBudget``: no
failure starts that would not end, at the 90th percentile of the recoveries
so far, before the duration less the time kept to drain and check); a
failure not recovered within ``--recovery-limit`` seconds stops the drill,
which fails saying so; ``--mode aligned,unaligned`` drills each mode in
turn, a job of its own, sharing the failures and the duration.  The report
gives each recovery's time, its percentiles (p50, p90, p99, max) per kind
and mode, the input records each restore read again, and the output checked
against the reference at the end (drift).

Any pipeline whose module provides a workload by the protocol of
``streaming.tools.drill.workload`` (``drill_workload()``) can be drilled:
``--pipeline money`` (the default), ``orders``, ``clickstream``,
``payments``, ``devices``, ``carts`` (``examples/``), or ``module:attribute``
(``--workload module:function`` names a workload of another module)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from streaming import console
from streaming.api.config import Connection, LocalRuntimeSettings, default_home
from streaming.api.pipeline import named_pipelines
from streaming.api.settings import MODES, WORKER_GROUPINGS, JobSettings
from streaming.errors import parse_choice
from streaming.tools.cli.options import add_state_snapshot_options, export_home, import_from_here

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    from streaming.tools.drill.plan import CLUSTER_KINDS, CLUSTER_ONLY, KINDS, NAMED_ONLY, LivenessBounds

    parser = sub.add_parser(
        "drill",
        help="a restore drill: failures of every kind from a seed, restores, the output checked with great-expectations",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--failures", type=int, help="failures to inject (default 12, or as many as --duration allows)")
    parser.add_argument(
        "--duration",
        help="bound the whole drill: 45m, 1h30m, 90s (failures stop in time to drain and check within it)",
    )
    parser.add_argument(
        "--recovery-limit",
        type=float,
        default=180.0,
        help="seconds a failure may take to recover before the drill stops and fails (default 180; counted once "
        "a long outage or a freeze ended, or the job had the time it takes to notice a stuck send)",
    )
    parser.add_argument("--seed", type=int, default=1, help="draws the failures, moments and workload (default 1)")
    parser.add_argument(
        "--kinds",
        help=f"comma-separated failure kinds, taken in turn (default: {','.join(KINDS)}; with --cluster "
        f"{','.join(CLUSTER_KINDS)}; drilled when named: {','.join(NAMED_ONLY)})",
    )
    delivery = LivenessBounds().delivery_timeout_s
    parser.add_argument(
        "--delivery-timeout",
        type=float,
        metavar="SECONDS",
        help="run the job with this delivery timeout (spark-abs run --delivery-timeout; default a job's own, "
        f"{delivery:g} s): a broker-long outage lasts 1.25 to 1.75 times it, so a shorter one keeps such a drill "
        "short; the report says when the drill shortened it",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="drill on the local cluster (spark-abs local up --cluster, started if need be; SPARK_ABS_* ignored): "
        "the job's worker groups remote, a `spark-abs worker` per group, and the cluster's failure kinds "
        f"({','.join(CLUSTER_ONLY)})",
    )
    parser.add_argument(
        "--workers",
        choices=WORKER_GROUPINGS,
        help="with --cluster: the remote worker groups, as `spark-abs run --workers` lays them out: a group per "
        "stage (default), or one group for the whole job (one Spark application: fewer JVMs on a small machine)",
    )
    mode = JobSettings.default("mode")
    parser.add_argument(
        "--mode",
        default=mode,
        help=f"checkpoint mode, or several comma-separated, drilled in turn ({', '.join(MODES)}; default {mode})",
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints (default 1)")
    add_state_snapshot_options(parser, base_every=False)
    parser.add_argument("--rate", type=float, default=200.0, help="input records per second (default 200)")
    parser.add_argument(
        "--pipeline",
        default="money",
        help=f"a pipeline's name ({', '.join(sorted(named_pipelines()))}) or module:attribute whose module provides "
        "drill_workload() (default money)",
    )
    parser.add_argument(
        "--workload", help="module:function returning a DrillWorkload for --pipeline (default its module's)"
    )
    parser.add_argument("--store", help="snapshot store URI (default s3://<local bucket>/drills)")
    parser.add_argument("--out", help="report directory (default <home>/drills/<time>)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streaming.adapters.serde.schema_registry import registry_users
    from streaming.api.pipeline import load_pipeline
    from streaming.local import LocalRuntime
    from streaming.tools.drill import report as drill_report
    from streaming.tools.drill.plan import FailureKind, LivenessBounds, check_kinds, parse_duration
    from streaming.tools.drill.run import DrillProgress, check_workers, run_drill
    from streaming.tools.drill.settings import DrillSettings

    export_home(args)
    console.install("[drill] ")
    import_from_here()
    duration_s = parse_duration(args.duration) if args.duration else None
    failures = args.failures if args.failures is not None or duration_s is not None else DrillSettings.failures
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else None
    if kinds:  # before the runtime starts
        check_kinds([parse_choice(FailureKind, k, "failure kind") for k in kinds], args.cluster)
    check_workers(args.workers, args.cluster)
    LivenessBounds.of(args.delivery_timeout)
    connection = None if args.cluster else Connection.from_env(os.environ)
    runtime = None
    if connection is None:
        runtime = LocalRuntime(
            LocalRuntimeSettings.cluster(default_home()) if args.cluster else None, progress=log.info
        )
        # with the schema registry when the pipeline reads or writes Avro through one
        connection = runtime.up(registry=bool(registry_users(load_pipeline(args.pipeline))))
    out = Path(args.out) if args.out else default_home() / "drills" / time.strftime("%Y%m%d-%H%M%S")
    bar = DrillProgress(failures, duration_s) if sys.stdout.isatty() else None
    settings = DrillSettings(
        pipeline=args.pipeline,
        workload=args.workload,
        failures=failures,
        duration_s=duration_s,
        seed=args.seed,
        kinds=kinds,
        mode=args.mode,
        interval_s=args.interval,
        state_snapshots=args.state_snapshots,
        rate=args.rate,
        store_uri=args.store,
        report_dir=out,
        recovery_limit_s=args.recovery_limit,
        delivery_timeout_s=args.delivery_timeout,
        cluster=args.cluster,
        workers=args.workers,
    )
    if bar is None:
        drilled = run_drill(settings, connection, runtime=runtime)
    else:
        with bar.progress:
            drilled = run_drill(settings, connection, runtime=runtime, on_failure=bar)
    print()
    print(drill_report.render(drilled))
    print(f"\nreport: {out / 'report.md'} (and report.json, recoveries.png, gx-*.json, *.csv)")
    return 0 if drilled.passed else 1
