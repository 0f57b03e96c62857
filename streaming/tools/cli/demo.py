"""``spark-abs demo``: the money-in-transit example (``spark_abs_examples.money``)
run on real Kafka, Spark and object storage, with the worker running a stage
killed and the job restored.

    transfers (2 partitions) --> legs (2 tasks) --> accounts (2 tasks) --> windows (1 task) --> sink

For every completed checkpoint the demo checks that the balances in the
``accounts`` tasks' states (plus any legs recorded as channel state) add up
to zero, and at the end it compares the committed output with what the
transfers give when computed directly (a run without failures)."""

from __future__ import annotations

import argparse
import logging

from streaming.api.settings import IN_FLIGHT_FORMATS, MODES, WORKER_GROUPINGS, JobSettings, Mode
from streaming.tools.cli.options import add_state_snapshot_options, export_home

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="the money-in-transit pipeline: checkpoints, a killed stage, a restore, checked output",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--transfers", type=int, default=2000, help="transfers to produce (default 2000)")
    mode, in_flight = JobSettings.default("mode"), JobSettings.default("in_flight").value
    parser.add_argument(
        "--mode",
        default=mode,
        choices=MODES,
        help=f"checkpoint mode (default {mode}; {Mode.ALIGNED_TIMEOUT} switches after 200 ms)",
    )
    parser.add_argument(
        "--in-flight",
        default=in_flight,
        choices=IN_FLIGHT_FORMATS,
        help=f"unaligned channel state: offset ranges or copied records (default {in_flight})",
    )
    parser.add_argument(
        "--kill",
        default="accounts",
        help="SIGKILL the worker running this stage after the first checkpoint; 'none' for no failure "
        "(default accounts)",
    )
    parser.add_argument(
        "--workers",
        default="one",
        choices=WORKER_GROUPINGS,
        help="one worker process (one Spark application) for the job, or one per stage (default one)",
    )
    parser.add_argument("--store", help="snapshot store URI (default file://<home>/demo-store)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints (default 1)")
    add_state_snapshot_options(parser, base_every=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streaming.tools.demo.run import DemoOptions, run_demo

    export_home(args)
    import os

    from streaming import console
    from streaming.api.config import Connection, default_home
    from streaming.local import LocalRuntime

    console.install("[demo] ")
    connection = Connection.from_env(os.environ) or LocalRuntime(progress=log.info).up()
    store = args.store or f"file://{default_home() / 'demo-store'}"
    settings = JobSettings(
        store=store,
        mode=args.mode,
        interval_s=args.interval,
        in_flight=args.in_flight,
        state_snapshots=args.state_snapshots,
        # aligned with a timeout: switch after 200 ms
        alignment_timeout_ms=200 if args.mode == Mode.ALIGNED_TIMEOUT else None,
    )
    options = DemoOptions(
        transfers=args.transfers, kill=None if args.kill == "none" else args.kill, workers=args.workers
    )
    report = run_demo(connection, settings, options)
    print()
    print(report.render())
    return 0 if report.passed else 1
