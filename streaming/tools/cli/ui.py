"""``spark-abs ui``: a read-only web page for a job."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from streaming.api.config import Connection, default_home
from streaming.tools.cli.options import add_store_options, runtime_settings

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "ui",
        help="a read-only web page for a job: checkpoints, their detail, state, generations, reports",
        description="Serves a web page for job JOB: its checkpoint history (status, duration, size, "
        "kinds, the one a restore picks) with a chart of durations and sizes, one checkpoint's per-task "
        "detail (the barrier's path through each task, alignment, why a task turned unaligned, state "
        "tables, channels), its operator and channel state as tables (as `spark-abs state` shows them), "
        "the job's generations and the restores that started them, and the latest `spark-abs drill` "
        "report of the job and `spark-abs compare` charts under the home. Every page reads the store "
        "afresh; the history reloads itself. Live, while the job runs, it also reads the job's control "
        "topic (Kafka of SPARK_ABS_* or the local runtime) for checkpoints in progress and aborted; "
        "after the fact the store alone suffices. Read-only, and bound to loopback by default: the page "
        "has no authentication.",
    )
    add_store_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=int, default=8050, help="port to listen on (default 8050; 0: a free one)")
    parser.add_argument(
        "--refresh",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="the history reloads itself this often (default 5; 0: never)",
    )
    parser.add_argument(
        "--store-only",
        action="store_true",
        help="read the store alone, not the control topic (a job that no longer runs, or no Kafka at hand)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import ipaddress

    from streaming.errors import ConfigError, RuntimeNotRunningError
    from streaming.tools.ui import app as ui
    from streaming.tools.ui.live import ControlWatch

    if not args.verbose:  # the pages say what they could not read; requests are not logged
        logging.getLogger("streaming.adapters.snapshots").setLevel(logging.ERROR)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    connection = None
    if not (args.store_only and args.store.startswith("file://")):
        try:
            connection = Connection.from_env(os.environ) or Connection.load(runtime_settings(args))
        except RuntimeNotRunningError as exc:
            if not args.store.startswith("file://"):
                raise
            log.info(f"{exc}; the page shows the store alone")
    watch = ControlWatch(connection.kafka, args.job) if connection and not args.store_only else None
    home = Path(args.home).expanduser().resolve() if args.home else default_home()
    app = ui.create_app(ui.JobSource(args.store, args.job, connection, home), refresh_s=args.refresh, watch=watch)
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:  # a host name
        loopback = False
    if not loopback:
        log.warning(
            f"serving on {args.host}, not loopback: the page has no authentication, anyone who reaches "
            f"{args.host}:{args.port} reads the job's checkpoints and state"
        )
    try:  # a port in use: werkzeug says so and exits (status 1)
        server = ui.serve(app, args.host, args.port)
    except OSError as exc:
        raise ConfigError(f"ui: cannot serve on {args.host}:{args.port}: {exc}") from exc
    print(f"job {args.job} of {args.store}: http://{args.host}:{server.server_port}/ (read-only; Ctrl-C stops)")
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if watch is not None:
            watch.close()
    return 0
