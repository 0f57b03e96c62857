"""``spark-abs ui``: a read-only web page for a job."""

from __future__ import annotations

import argparse
import functools
import logging
import os
from pathlib import Path

from streaming.adapters.kafka.admin import job_key
from streaming.api.config import default_home
from streaming.tools.cli.options import add_store_options, store_connection

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
        "after the fact the store alone suffices. Read-only, and bound to loopback by default, where it "
        "answers only requests that name a loopback host (localhost, 127.0.0.1, [::1]; more with "
        "--allow-host). Bound to any other address it asks every request for a token ($SPARK_ABS_UI_TOKEN "
        "or --token-file) and does not start without one.",
    )
    add_store_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=int, default=8050, help="port to listen on (default 8050; 0: a free one)")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name requests may name besides localhost, 127.0.0.1 and [::1] (the name the page is "
        "reached by off loopback; repeatable)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="read the token every request must carry from PATH (readable by its owner only), instead of "
        "$SPARK_ABS_UI_TOKEN; required, one way or the other, to listen on an address that is not loopback",
    )
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
    from streaming.errors import ConfigError
    from streaming.tools.ui import app as ui
    from streaming.tools.ui.access import TOKEN_ENV, Access, is_loopback, read_token
    from streaming.tools.ui.live import ControlWatch

    token = read_token(os.environ, args.token_file)
    loopback = is_loopback(args.host)
    if not loopback and token is None:
        raise ConfigError(
            f"ui: serving on {args.host}, not loopback, needs a token every request must carry: set "
            f"{TOKEN_ENV}, or give --token-file PATH (a file only you can read: chmod 600), e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))' > PATH; or serve on 127.0.0.1 "
            "and reach it through an SSH tunnel"
        )
    # the address it listens on, when one, is a name it is reached by (0.0.0.0 and :: are not)
    named = [] if args.host in ("0.0.0.0", "::") else [args.host]
    access = Access(token=token).allowing([*args.allow_host, *named])

    if not args.verbose:  # the pages say what they could not read; requests are not logged
        logging.getLogger("streaming.adapters.snapshots").setLevel(logging.ERROR)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    connection = None
    if not (args.store_only and args.store.startswith("file://")):
        connection = store_connection(args, "the page shows the store alone")
    watch = None
    if connection and not args.store_only:
        try:  # the page shows only control events the job's key vouches for
            connection.store_key(args.job)  # a job secret is at hand (its Kafka key asks Kafka: on first look)
            watch = ControlWatch(connection.kafka, args.job, functools.partial(job_key, connection, args.job))
        except ConfigError as exc:  # no job secret here: the store alone
            log.warning(f"{exc}; the page shows the store alone (no live view of the control topic)")
    home = Path(args.home).expanduser().resolve() if args.home else default_home()
    source = ui.JobSource(args.store, args.job, connection, home)
    app = ui.create_app(source, refresh_s=args.refresh, watch=watch, access=access)
    if not loopback:
        log.warning(
            f"serving on {args.host}, not loopback: every request must carry the token; requests may name "
            f"{', '.join(sorted(access.hosts))} (more with --allow-host). Over plain HTTP the token crosses "
            "the network as it is: prefer an SSH tunnel or a TLS proxy"
        )
    try:  # a port in use: werkzeug says so and exits (status 1)
        server = ui.serve(app, args.host, args.port)
    except OSError as exc:
        raise ConfigError(f"ui: cannot serve on {args.host}:{args.port}: {exc}") from exc
    asks = "; asks for the token" if token is not None else ""
    print(f"job {args.job} of {args.store}: http://{args.host}:{server.server_port}/ (read-only{asks}; Ctrl-C stops)")
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if watch is not None:
            watch.close()
    return 0
