"""The ``spark-abs`` command line: the local runtime, the smoke pipeline and the
protocol simulator.  Errors of the project print as one clear line (exit 2);
anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from streaming.api.config import Connection, LocalRuntimeSettings, SparkSettings, default_home
from streaming.api.settings import MODES, WORKER_LAYOUTS
from streaming.errors import SparkAbsError
from streaming.local.artifacts import FETCHABLE

__all__ = ["main", "build_parser"]

DESCRIPTION = """\
spark-abs: Asynchronous Barrier Snapshots (Chandy-Lamport) for pipelines of
PySpark Structured Streaming queries joined by Kafka topics.

Everything runs on loopback.  `spark-abs local up` starts a Kafka broker (KRaft)
and an S3 API server (versitygw) from artifacts it fetches once into the cache
($SPARK_ABS_HOME, default ~/.cache/spark-abs); the connection details go to
<home>/runtime/connection.json, which every other command reads.
"""


def _say(message: str) -> None:
    print(f"[spark-abs] {message}", flush=True)


def _runtime_settings(args: argparse.Namespace) -> LocalRuntimeSettings:
    home = Path(args.home).expanduser().resolve() if args.home else default_home()
    return LocalRuntimeSettings(
        home=home,
        kafka_port=getattr(args, "kafka_port", 0) or 0,
        s3_port=getattr(args, "s3_port", 0) or 0,
    )


def _cmd_local(args: argparse.Namespace) -> int:
    from streaming.local import LocalRuntime

    runtime = LocalRuntime(_runtime_settings(args), progress=_say)
    if args.action == "fetch":
        for what, paths in runtime.fetch(args.only or FETCHABLE).items():
            _say(f"{what}: {len(paths)} file(s) cached, e.g. {paths[0] if paths else '-'}")
    elif args.action == "up":
        runtime.up()
        print(runtime.status().render())
    elif args.action == "down":
        for line in runtime.down(purge=args.purge):
            _say(line)
    else:
        status = runtime.status()
        print(status.render())
        return 0 if status.all_running else 1
    return 0


def _cmd_smoke(args: argparse.Namespace) -> int:
    from streaming.adapters.kafka_admin import check_broker
    from streaming.adapters.spark import spark_session
    from streaming.local import LocalRuntime
    from streaming.tools.smoke import run_smoke

    settings = _runtime_settings(args)
    connection = Connection.from_env(os.environ) or LocalRuntime(settings, progress=_say).up()
    check_broker(connection.kafka_bootstrap)
    _say("starting Spark (local master) with the Kafka connector")
    started = time.monotonic()
    spark = spark_session(SparkSettings(master=connection.spark_master), settings, progress=_say)
    _say(f"Spark {spark.version} ready in {time.monotonic() - started:.1f} s")
    run_id = uuid.uuid4().hex[:8]
    try:
        report = run_smoke(
            spark,
            connection,
            topic=f"smoke-{run_id}",
            prefix=f"smoke/{run_id}",
            records=args.records,
            partitions=args.partitions,
            progress=_say,
        )
    finally:
        spark.stop()
    print(report.render())
    _say("smoke pipeline passed: Kafka -> Structured Streaming foreachBatch -> Arrow -> Parquet on S3 -> read back")
    return 0


def _export_home(args: argparse.Namespace) -> None:
    """``--home`` for the commands whose work reads the home from the environment."""
    if args.home:
        os.environ["SPARK_ABS_HOME"] = str(Path(args.home).expanduser().resolve())


def _cmd_demo(args: argparse.Namespace) -> int:
    from streaming.tools import demo

    _export_home(args)
    return demo.main(args.rest)


def _cmd_run(args: argparse.Namespace) -> int:
    from streaming.api.settings import JobSettings
    from streaming.engine.runner import JobRunner
    from streaming.errors import ConfigError
    from streaming.local import LocalRuntime
    from streaming.tools.commands import run_job

    for flag, value in (("--for", args.seconds), ("--checkpoints", args.checkpoints)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be positive, got {value:g}")
    _export_home(args)
    if os.getcwd() not in sys.path:  # the user's pipeline module, as `python -m` would find it
        sys.path.insert(0, os.getcwd())
    extra = {}
    if args.alignment_timeout_ms is not None:
        extra["alignment_timeout_ms"] = args.alignment_timeout_ms
    if args.held_bytes_budget is not None:
        extra["held_bytes_budget"] = args.held_bytes_budget
    settings = JobSettings(
        store=args.store,
        mode=args.mode,
        in_flight=args.in_flight,
        interval_s=args.interval,
        retain=args.retain,
        **extra,
    )
    connection = Connection.from_env(os.environ) or LocalRuntime(_runtime_settings(args), progress=_say).up()
    runner = JobRunner(args.pipeline, settings, connection, job=args.job, workers=args.workers, say=_say)
    run_job(runner, restore=args.restore, seconds=args.seconds, checkpoints=args.checkpoints, say=_say)
    return 0


def _cmd_checkpoints(args: argparse.Namespace) -> int:
    from streaming.adapters.objects import open_store
    from streaming.adapters.snapshots import SnapshotStore
    from streaming.tools.commands import checkpoint_rows, render_checkpoints

    connection = None
    if not args.store.startswith("file://"):
        connection = Connection.load(_runtime_settings(args))
    store = SnapshotStore(open_store(args.store, connection), args.job)
    try:
        meta = store.read_job()
        rows = checkpoint_rows(store, checksums=not args.no_checksums)
    finally:
        store.close()
    generation = meta.generation if meta else (0 if rows else None)  # generation 0 writes no job file
    print(render_checkpoints(args.job, rows, generation))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from streaming.tools import compare

    _export_home(args)
    return compare.main(args.rest)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from barriers.simulation import narrate

    return narrate.main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spark-abs", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--home", help="cache and state directory (default: $SPARK_ABS_HOME or ~/.cache/spark-abs)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    local = sub.add_parser(
        "local",
        help="start, stop or inspect the embedded runtime (Kafka + S3 server)",
        description="The embedded runtime on loopback: a KRaft Kafka broker and "
        "an S3 API server, plus Spark's Kafka connector jars.",
    )
    local.add_argument(
        "action",
        choices=["up", "down", "status", "fetch"],
        help="up: start what is not running (idempotent); down: stop what up started; "
        "status: what runs where (exit 1 unless all run); "
        "fetch: only download/build the artifacts into the cache",
    )
    local.add_argument("--only", action="append", choices=FETCHABLE, help="with fetch: just this artifact (repeatable)")
    local.add_argument("--kafka-port", type=int, default=0, help="broker port (default: a free one, kept)")
    local.add_argument("--s3-port", type=int, default=0, help="S3 server port (default: a free one, kept)")
    local.add_argument("--purge", action="store_true", help="with down: also delete data and logs")
    local.set_defaults(func=_cmd_local)

    smoke = sub.add_parser(
        "smoke",
        help="run the smoke pipeline through real Kafka, Spark and S3",
        description="Brings the local runtime up (unless SPARK_ABS_KAFKA_BOOTSTRAP "
        "names a deployment), produces records with headers, streams them "
        "through foreachBatch into Parquet on S3 and checks them.",
    )
    smoke.add_argument("--records", type=int, default=2000, help="records to produce (default 2000)")
    smoke.add_argument("--partitions", type=int, default=2, help="partitions of the topic (default 2)")
    smoke.set_defaults(func=_cmd_smoke)

    _add_passthrough(
        sub, "demo", _cmd_demo, "the money-in-transit pipeline: checkpoints, a killed stage, a restore, checked output"
    )

    run = sub.add_parser(
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
    run.add_argument("pipeline", help="module:attribute, e.g. orders:orders")
    run.add_argument("--store", required=True, help="snapshot store URI: file:///dir or s3://bucket/prefix")
    run.add_argument("--job", help="job name (default: the pipeline's own)")
    run.add_argument("--mode", default="aligned", choices=MODES, help="checkpoint mode (default aligned)")
    run.add_argument(
        "--in-flight",
        default="range",
        choices=("range", "records"),
        help="unaligned channel state: offset ranges or copied records (default range)",
    )
    run.add_argument("--alignment-timeout-ms", type=int, help="aligned-timeout: switch after this long aligning")
    run.add_argument("--held-bytes-budget", type=int, help="aligned-timeout: switch past this many held bytes")
    run.add_argument("--interval", type=float, default=2.0, help="seconds between checkpoints (default 2)")
    run.add_argument("--retain", type=int, default=3, help="completed checkpoints kept (default 3)")
    run.add_argument("--restore", type=int, metavar="N", help="start from checkpoint N (a restore drill)")
    run.add_argument(
        "--workers",
        default="one",
        choices=WORKER_LAYOUTS,
        help="one worker process (one Spark application) for the whole job, or one per stage (default one)",
    )
    run.add_argument(
        "--for",
        dest="seconds",
        type=float,
        metavar="SECONDS",
        help="stop this many seconds after all tasks are up (default: run until Ctrl-C)",
    )
    run.add_argument(
        "--checkpoints",
        type=int,
        metavar="N",
        help="stop once N checkpoints completed in this run (with --for: whichever comes first)",
    )
    run.set_defaults(func=_cmd_run)

    checkpoints = sub.add_parser(
        "checkpoints",
        help="list a job's checkpoints, whether they verify, and which one a restore would pick",
        description="Reads the job's checkpoints from the store, checks each "
        "(manifest, task files, sizes and checksums) and marks the one a "
        "restore would start from.",
    )
    checkpoints.add_argument("--store", required=True, help="snapshot store URI: file:///dir or s3://bucket/prefix")
    checkpoints.add_argument("--job", required=True, help="job name")
    checkpoints.add_argument("--no-checksums", action="store_true", help="check sizes only, without reading every part")
    checkpoints.set_defaults(func=_cmd_checkpoints)

    _add_passthrough(
        sub,
        "compare",
        _cmd_compare,
        "aligned vs unaligned checkpoints side by side under a backlog: a table of their costs",
    )
    _add_passthrough(sub, "simulate", _cmd_simulate, "narrate a simulated snapshot run")
    return parser


def _add_passthrough(sub, name: str, func, help: str) -> None:
    """A command that parses its own options (one of ``_OWN_OPTIONS``)."""
    parser = sub.add_parser(name, add_help=False, help=f"{help} (see `spark-abs {name} --help`)")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=func)


def _passthrough(argv: list[str]) -> tuple[str, list[str]] | None:
    """``simulate``, ``demo`` and ``compare`` take their own options: everything after the
    command name goes to them untouched."""
    index = 0
    while index < len(argv):
        token = argv[index]
        if token in _OWN_OPTIONS:
            return token, argv[index + 1 :]
        if not token.startswith("-"):
            return None
        index += 2 if token == "--home" else 1  # the one global option that takes a value
    return None


_OWN_OPTIONS = ("simulate", "demo", "compare")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = _passthrough(argv)
    if passthrough is not None:
        command, rest = passthrough
        index = argv.index(command)
        args = build_parser().parse_args(argv[: index + 1])
        args.rest = rest
    else:
        args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kafka-python warns when one of its own sends is slow; not the user's concern
        logging.getLogger("kafka.net.selector").setLevel(logging.ERROR)
    try:
        return args.func(args)
    except SparkAbsError as exc:
        print(f"spark-abs: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spark-abs: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
