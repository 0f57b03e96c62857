"""``spark-abs compare``: what aligned and unaligned checkpoints cost, measured side by side.

One job per variant (and per workload point: a per-record cost, a backlog,
a skew) runs at the same time as every other on this machine, fed the same
records, so all of them share the machine's load and the ratios between
them are taken within one run.  Workloads (--workload):

  backpressure  (default) a slow stage (--costs ms per record, 1 and 10 by
                default: the workload of Flink's checkpointing-under-
                backpressure benchmark) under a continuous source at --load
                times what the stage can take (or --rate records/s) for
                --duration seconds; checkpoints every --interval seconds.
                The source is throttled while --buffer seconds of the
                stage's work wait unread in front of it, as Flink's network
                buffers throttle its sources (Kafka alone would let the
                backlog grow for ever), so every barrier has about that
                much in front of it.
  skew          the same, with partition 0 starting --skew records behind
                partition 1: aligned tasks hold the fast channel's records.
  backlog       rounds: a fixed backlog (--backlogs, records per partition)
                in front of one checkpoint triggered in every job at once.
  money         the demo's money pipeline (three stages, keyed and windowed
                state) under a continuous stream of transfers at --rate.

Variants (--variants): aligned, unaligned (channel state as offset ranges),
unaligned-records (channel state copied), aligned-timeout (--timeout-ms,
counted from the checkpoint's trigger), at-least-once.  The first is the
baseline of the ratios.

Per variant: checkpoint time (trigger to complete) p50/p90/p99, time from
the trigger to the task's snapshot ("first barrier"), alignment time, bytes
held while aligning, channel state (records referenced, bytes copied),
state bytes, records read per second, and, at the end, a restore from the
latest checkpoint: until every task runs again ("ready") and until every
task has processed its restored channel state again ("replayed").
Everything goes to --out (default $SPARK_ABS_HOME/runs/compare-<time>/):
comparison.json (every checkpoint of every job), the tables (tables.txt)
and three PNG charts, each with a legend that says how to read it."""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import replace
from pathlib import Path

from streaming.errors import ConfigError
from streaming.tools.cli.options import export_home
from streaming.tools.compare.workloads import VARIANTS, WORKLOADS, Workload

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="aligned vs unaligned checkpoints side by side under a backlog: a table of their costs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = Workload()
    parser.add_argument("--workload", default=defaults.kind, choices=WORKLOADS, help="what the jobs run (above)")
    parser.add_argument(
        "--variants",
        default="aligned,unaligned,aligned-timeout",
        help=f"comma-separated, the first is the baseline of the ratios; any of {', '.join(VARIANTS)} "
        f"(default aligned,unaligned,aligned-timeout)",
    )
    parser.add_argument(
        "--costs", default="1,10", help="ms per record of the slow stage; one job per cost (default 1,10)"
    )
    parser.add_argument(
        "--load", type=float, default=defaults.load, help="source rate ÷ what the slow stage can take (default 1.25)"
    )
    parser.add_argument("--rate", type=float, help="records (money: transfers) per second into each job")
    parser.add_argument(
        "--buffer",
        type=float,
        default=defaults.buffer_s,
        help="backpressure: the source waits while this many seconds of the stage's work are unread (default 1)",
    )
    parser.add_argument("--duration", type=float, default=defaults.duration_s, help="seconds measured (default 30)")
    parser.add_argument(
        "--interval", type=float, default=defaults.interval_s, help="seconds between checkpoints (default 1)"
    )
    parser.add_argument(
        "--warmup", type=float, default=defaults.warmup_s, help="seconds run before measuring (default 5)"
    )
    parser.add_argument(
        "--keys", type=int, default=defaults.keys, help="distinct keys (state size); money: accounts (default 7)"
    )
    parser.add_argument(
        "--skew", type=int, default=defaults.skew, help="skew: records partition 0 starts behind (default 3000)"
    )
    parser.add_argument(
        "--backlogs",
        default="500,1000,2000",
        help="backlog: records per partition in front of each round's barriers (default 500,1000,2000)",
    )
    parser.add_argument(
        "--timeout-ms",
        type=int,
        default=defaults.timeout_ms,
        help="aligned-timeout: ms after the trigger (default 200)",
    )
    parser.add_argument("--no-restore", action="store_true", help="skip the restore measured at the end")
    parser.add_argument("--store", help="snapshot store URI (default file://<home>/compare-store)")
    parser.add_argument("--out", help="directory for the JSON, tables and charts (default <home>/runs/compare-<time>)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streaming.tools.compare import report as compare_report
    from streaming.tools.compare.run import check_variants, run_compare

    export_home(args)
    import os

    from streaming import console
    from streaming.api.config import Connection, default_home
    from streaming.local import LocalRuntime

    console.install("[compare] ")
    # progress comes from the comparison: the jobs' own checkpoint lines are left out
    logging.getLogger("streaming.engine.job.coordinator").setLevel(logging.WARNING)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    check_variants(variants)
    workload = _workload(args)
    out = Path(args.out) if args.out else default_home() / "runs" / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    connection = Connection.from_env(os.environ) or LocalRuntime(progress=log.info).up()
    store = args.store or f"file://{default_home() / 'compare-store'}"
    comparison = run_compare(
        connection, store_uri=store, workload=workload, variants=variants, restore=not args.no_restore
    )
    compare_report.write_and_show(comparison, out)
    return 0


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{option} {text}: comma-separated numbers") from None


def _workload(args: argparse.Namespace) -> Workload:
    """The workload the options name (money: 10 accounts unless --keys says otherwise)."""
    defaults = Workload()
    workload = Workload(
        kind=args.workload,
        costs=_floats(args.costs, "--costs"),
        load=args.load,
        rate=args.rate,
        duration_s=args.duration,
        interval_s=args.interval,
        warmup_s=args.warmup,
        buffer_s=args.buffer,
        keys=args.keys,
        skew=args.skew,
        backlogs=tuple(int(b) for b in _floats(args.backlogs, "--backlogs")),
        timeout_ms=args.timeout_ms,
    )
    if workload.kind == "money" and args.keys == defaults.keys:
        workload = replace(workload, keys=10)
    return workload
