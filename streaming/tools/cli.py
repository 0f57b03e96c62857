"""The ``spark-abs`` command line: the local runtime, the smoke pipeline and the
protocol simulator.  Errors of the project print as one clear line (exit 2);
anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from streaming import console
from streaming.api.config import Connection, LocalRuntimeSettings, SparkSettings, default_home
from streaming.api.settings import IN_FLIGHT_FORMATS, MODES, WORKER_GROUPINGS, JobSettings
from streaming.errors import SparkAbsError
from streaming.local.artifacts import FETCHABLE

__all__ = ["main", "build_parser"]

# by name: `python -m streaming.tools.cli` runs this module as __main__
log = logging.getLogger("streaming.tools.cli")

DESCRIPTION = """\
spark-abs: Asynchronous Barrier Snapshots (Chandy-Lamport) for pipelines of
PySpark Structured Streaming queries joined by Kafka topics.

Everything runs on loopback.  `spark-abs local up` starts a Kafka broker (KRaft)
and an S3 API server (versitygw) from artifacts it fetches once into the cache
($SPARK_ABS_HOME, default ~/.cache/spark-abs); the connection details go to
<home>/runtime/connection.json, which every other command reads.
"""


def _runtime_settings(args: argparse.Namespace) -> LocalRuntimeSettings:
    home = Path(args.home).expanduser().resolve() if args.home else default_home()
    if getattr(args, "cluster", False):
        return LocalRuntimeSettings.cluster(home, s3_port=getattr(args, "s3_port", 0) or 0)
    return LocalRuntimeSettings(
        home=home,
        kafka_port=getattr(args, "kafka_port", 0) or 0,
        s3_port=getattr(args, "s3_port", 0) or 0,
    )


def _cmd_local(args: argparse.Namespace) -> int:
    from streaming.local import LocalRuntime

    runtime = LocalRuntime(_runtime_settings(args), progress=log.info)
    if args.action == "fetch":
        for what, paths in runtime.fetch(args.only or FETCHABLE).items():
            log.info(f"{what}: {len(paths)} file(s) cached, e.g. {paths[0] if paths else '-'}")
    elif args.action == "up":
        runtime.up()
        print(runtime.status().render())
    elif args.action == "down":
        for line in runtime.down(purge=args.purge):
            log.info(line)
    elif args.action == "env":
        connection = Connection.load(runtime.settings, environ={})
        for name, value in connection.as_env().items():
            print(f"export {name}={shlex.quote(value)}")
    else:
        status = runtime.status()
        print(status.render())
        return 0 if status.all_running else 1
    return 0


def _cmd_smoke(args: argparse.Namespace) -> int:
    from streaming.adapters.kafka_admin import check_broker
    from streaming.adapters.spark import spark_session
    from streaming.local import LocalRuntime
    from streaming.tools.smoke import SmokeRun, run_smoke

    settings = _runtime_settings(args)
    connection = Connection.from_env(os.environ) or LocalRuntime(settings, progress=log.info).up()
    check_broker(connection.kafka_bootstrap)
    log.info("starting Spark (local master) with the Kafka connector")
    started = time.monotonic()
    spark = spark_session(SparkSettings(master=connection.spark_master), settings, progress=log.info)
    log.info(f"Spark {spark.version} ready in {time.monotonic() - started:.1f} s")
    run_id = uuid.uuid4().hex[:8]
    try:
        run = SmokeRun(
            topic=f"smoke-{run_id}", prefix=f"smoke/{run_id}", records=args.records, partitions=args.partitions
        )
        report = run_smoke(spark, connection, run, progress=log.info)
    finally:
        spark.stop()
    print(report.render())
    log.info("smoke pipeline passed: Kafka -> Structured Streaming foreachBatch -> Arrow -> Parquet on S3 -> read back")
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
    from streaming.api.pipeline import parse_parallelism
    from streaming.engine import metrics
    from streaming.engine.job.runner import JobRunner, RunOptions
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
    if args.heartbeat_timeout is not None:
        extra["heartbeat_timeout_s"] = args.heartbeat_timeout
    settings = JobSettings(
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
    connection = Connection.from_env(os.environ) or LocalRuntime(_runtime_settings(args), progress=log.info).up()
    runner = JobRunner(
        args.pipeline,
        settings,
        connection,
        job=args.job,
        options=RunOptions(
            workers=args.workers,
            max_restores=args.max_restores,
            parallelism=parse_parallelism(",".join(args.parallelism)),
            remote=args.remote_workers,
            metrics=metrics.settings_from(args),
            allow_dropped=_allow_dropped(args),
        ),
    )
    run_job(runner, restore=args.restore, seconds=args.seconds, checkpoints=args.checkpoints, drain=args.drain)
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    import signal
    import threading

    from streaming.adapters.control import ControlTopic
    from streaming.engine import metrics
    from streaming.engine.remote.member import RemoteWorker, wait_for_lease
    from streaming.local import LocalRuntime

    _export_home(args)
    if os.getcwd() not in sys.path:  # the pipeline's module, as `run` finds it
        sys.path.insert(0, os.getcwd())
    connection = Connection.from_env(os.environ) or LocalRuntime(_runtime_settings(args), progress=log.info).up()
    served = metrics.serve(metrics.settings_from(args), "--metrics-port")
    if served is not None:
        log.info(f"worker: metrics on {served.url}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    control = ControlTopic(connection.kafka_bootstrap, args.job)
    try:
        control.seek_to_end()
        log.info(f"worker: waiting for the runner of job {args.job} (its lease on {control.topic})")
        lease = wait_for_lease(control, args.job, stop=stop)
    finally:
        control.close()
    if lease is None:
        return 0
    worker = RemoteWorker(lease, args.group, connection)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    try:
        worker.start()
        return worker.serve()
    except KeyboardInterrupt:
        log.info("worker: stopping (Ctrl-C)")
        return 130
    finally:
        # stopping: a second SIGTERM (a process manager's, sent again) neither cuts the close short
        # nor kills the process while it exits
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker.close()


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help="snapshot store URI: file:///dir or s3://bucket/prefix")
    parser.add_argument("--job", required=True, help="job name")


def _checkpoints(args: argparse.Namespace, *, kafka: bool = False):
    """The job's checkpoints; the runtime's connection when the store is S3
    or (``kafka``) channel-state ranges are read back."""
    from streaming.tools.checkpoints.inspection import Checkpoints

    if not args.verbose:  # these commands report every problem they meet themselves
        logging.getLogger("streaming.adapters.snapshots").setLevel(logging.ERROR)
    connection = None
    if kafka or not args.store.startswith("file://"):
        connection = Connection.from_env(os.environ) or Connection.load(_runtime_settings(args))
    return Checkpoints.open(args.store, args.job, connection), connection


def _ids(args: argparse.Namespace, allowed: tuple[int, ...]) -> list[int]:
    from streaming.errors import ConfigError

    if len(args.ids) not in allowed:
        wanted = " or ".join(str(n) for n in allowed)
        raise ConfigError(f"checkpoints {args.action} takes {wanted} checkpoint id(s), got {len(args.ids)}")
    return args.ids


def _cmd_checkpoints(args: argparse.Namespace) -> int:
    import json

    from streaming.tools import views
    from streaming.tools.checkpoints import gc
    from streaming.tools.checkpoints.inspection import CheckpointDetail

    checkpoints, connection = _checkpoints(args)
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
            from streaming.adapters.sinks import sink_location

            _ids(args, (0,))
            sink = sink_location(JobSettings(store=args.store), args.job, connection)
            plan = gc.plan_gc(checkpoints.store, sink, retain=args.retain, grace_s=args.grace, progress=log.info)
            if not args.dry_run:
                removed = gc.apply_gc(checkpoints.store, plan)
                plan = gc.GcPlan(removed, plan.kept)
            print(views.render_gc(plan, dry_run=args.dry_run))
    return 0


def _cmd_state(args: argparse.Namespace) -> int:
    from streaming.tools import views

    checkpoints, _ = _checkpoints(args, kafka=args.channels)
    with checkpoints:
        if args.channels:
            channels = checkpoints.channel_state(args.checkpoint, task=args.task, progress=log.info)
            tables = {"records": channels.records, "rows": channels.rows}
            text = views.render_channels(channels.records, channels.rows, channels.problems, args.rows)
        else:
            tables = checkpoints.state(args.checkpoint, task=args.task, table=args.table)
            text = views.render_state(tables, args.rows)
    if args.output:
        for path in _export(tables, Path(args.output)):
            log.info(f"wrote {path}")
    else:
        print(text)
    return 0


def _export(tables: dict, output: Path) -> list[Path]:
    """Each table to ``output`` (one table) or ``<stem>-<name><suffix>`` (several)."""
    import json

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    import pyarrow.types as pat

    from streaming.errors import ConfigError

    if output.suffix not in (".parquet", ".csv"):
        raise ConfigError(f"--output must end in .parquet or .csv, got {output.name}")
    written = []
    for name, table in tables.items():
        path = output if len(tables) == 1 else output.with_name(f"{output.stem}-{name}{output.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        if output.suffix == ".parquet":
            pq.write_table(table, path)
        else:  # CSV takes flat columns: nested ones (record headers) go as JSON text
            columns = {
                c: pa.array([json.dumps(v, default=str) for v in table[c].to_pylist()], pa.string())
                if pat.is_nested(table.schema.field(c).type)
                else table[c]
                for c in table.column_names
            }
            pacsv.write_csv(pa.table(columns), path)
        written.append(path)
    return written


def _allow_dropped(args: argparse.Namespace):
    """The stages whose state a restore into a changed pipeline may drop."""
    from streaming.engine.restore.changes import AllowDropped

    if args.allow_all_dropped_state:
        return AllowDropped.everything()
    return AllowDropped.of([s.strip() for given in args.allow_dropped_state for s in given.split(",") if s.strip()])


def _cmd_restore(args: argparse.Namespace) -> int:
    from streaming.errors import ConfigError
    from streaming.tools import views

    if args.dry_run and args.parallelism:
        from streaming.api.pipeline import load_pipeline, parse_parallelism

        if not args.pipeline:
            raise ConfigError("restore --dry-run --parallelism: give --pipeline, whose stages say how rows are routed")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        pipeline = load_pipeline(args.pipeline, args.job)
        checkpoints, _ = _checkpoints(args, kafka=True)
        with checkpoints:
            plan = checkpoints.rescale_plan(
                pipeline, parse_parallelism(",".join(args.parallelism)), args.checkpoint, progress=log.info
            )
        print(views.render_rescale_plan(plan))
        return 0
    if args.dry_run:
        checkpoints, _ = _checkpoints(args)
        with checkpoints:
            if args.pipeline:  # the pipeline as its code now declares it: which stages changed
                from streaming.api.pipeline import load_pipeline

                if os.getcwd() not in sys.path:
                    sys.path.insert(0, os.getcwd())
                pipeline = load_pipeline(args.pipeline, args.job)
                change = checkpoints.change_plan(
                    pipeline, args.checkpoint, allow=_allow_dropped(args), progress=log.info
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
        checkpoints, _ = _checkpoints(args)
        with checkpoints:
            picked, _ = checkpoints.store.latest_verified()
        if picked is None:
            raise ConfigError(
                f"job {args.job}: no checkpoint verifies, nothing to restore from (`run` starts it from the beginning)"
            )
        args.checkpoint = picked.checkpoint_id
    args.restore = args.checkpoint
    return _cmd_run(args)


def _cmd_ui(args: argparse.Namespace) -> int:
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
            connection = Connection.from_env(os.environ) or Connection.load(_runtime_settings(args))
        except RuntimeNotRunningError as exc:
            if not args.store.startswith("file://"):
                raise
            log.info(f"{exc}; the page shows the store alone")
    watch = ControlWatch(connection.kafka_bootstrap, args.job) if connection and not args.store_only else None
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


def _cmd_compare(args: argparse.Namespace) -> int:
    from streaming.tools.compare import run as compare

    _export_home(args)
    return compare.main(args.rest)


def _cmd_drill(args: argparse.Namespace) -> int:
    from streaming.tools.drill import run as drill

    _export_home(args)
    return drill.main(args.rest)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from barriers.simulation import narrate

    return narrate.main(args.rest)


def _add_job_options(parser: argparse.ArgumentParser) -> None:
    """The options of a job run, shared by ``run`` and ``restore``; their
    defaults are ``JobSettings``'s."""
    from streaming.engine import metrics
    from streaming.tools.commands import add_state_snapshot_options

    mode, in_flight = JobSettings.default("mode"), JobSettings.default("in_flight").value
    parser.add_argument("--mode", default=mode, choices=MODES, help=f"checkpoint mode (default {mode})")
    parser.add_argument(
        "--in-flight",
        default=in_flight,
        choices=IN_FLIGHT_FORMATS,
        help=f"unaligned channel state: offset ranges or copied records (default {in_flight})",
    )
    parser.add_argument(
        "--alignment-timeout-ms",
        type=int,
        help="aligned-timeout: turn unaligned once this long has passed since the checkpoint's trigger",
    )
    parser.add_argument("--held-bytes-budget", type=int, help="aligned-timeout: switch past this many held bytes")
    interval, retain = JobSettings.default("interval_s"), JobSettings.default("retain")
    parser.add_argument(
        "--interval", type=float, default=interval, help=f"seconds between checkpoints (default {interval:g})"
    )
    parser.add_argument("--retain", type=int, default=retain, help=f"completed checkpoints kept (default {retain})")
    add_state_snapshot_options(parser, base_every=True)
    segment_ms = JobSettings.default("segment_ms")
    parser.add_argument(
        "--segment-ms",
        type=float,
        default=segment_ms,
        help="unaligned and aligned-timeout modes: how long a task processes records between two looks at "
        f"control events, about how long an announced checkpoint waits (default {segment_ms:g})",
    )
    parser.add_argument(
        "--state-memory",
        type=int,
        metavar="BYTES",
        help="bytes of keyed-state rows a worker keeps in memory; past them rows spill to memory-mapped files "
        "under spill/ in the spark-abs home (default: no limit)",
    )
    parser.add_argument(
        "--workers",
        default="one",
        choices=WORKER_GROUPINGS,
        help="one worker process (one Spark application) for the whole job, or one per stage (default one)",
    )
    parser.add_argument(
        "--for",
        dest="seconds",
        type=float,
        metavar="SECONDS",
        help="stop this many seconds after all tasks are up (default: run until Ctrl-C)",
    )
    parser.add_argument(
        "--checkpoints",
        type=int,
        metavar="N",
        help="stop once N checkpoints completed in this run (with --for: whichever comes first)",
    )
    parser.add_argument(
        "--parallelism",
        action="append",
        default=[],
        metavar="STAGE=N",
        help="run STAGE with N tasks (repeat, or give several as a=2,b=3). A job restored from a checkpoint "
        "taken with other task counts is rescaled: keyed state divided by key, channel state routed "
        "again, internal topics of the new counts. Default: the counts of the job's latest run",
    )
    parser.add_argument(
        "--allow-dropped-state",
        action="append",
        default=[],
        metavar="STAGE",
        help="a restore into a changed pipeline may drop STAGE's state (repeat, or give several as a,b): a "
        "stage removed from the pipeline, or one whose operator no longer takes its stored state (it starts "
        "empty). Without it such a restore is refused (Flink: --allowNonRestoredState)",
    )
    parser.add_argument(
        "--allow-all-dropped-state",
        action="store_true",
        help="a restore into a changed pipeline may drop the state of any stage (--allow-dropped-state for every one)",
    )
    parser.add_argument(
        "--remote-workers",
        action="store_true",
        help="start no worker process here: each worker group (see --workers) is a `spark-abs worker --job JOB "
        "--group GROUP` process on any host that reaches Kafka and the store; the job waits for them, and "
        "restores when one goes silent",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        metavar="SECONDS",
        help="with --remote-workers: a worker group not heard this long is taken for dead (the job restores), "
        f"and a worker that hears nothing of the runner this long stops its tasks "
        f"(default {JobSettings.default('heartbeat_timeout_s'):g})",
    )
    parser.add_argument(
        "--max-restores",
        type=int,
        default=10,
        metavar="N",
        help="give up (exit status 2) when workers died N times in this run (default 10)",
    )
    parser.add_argument(
        "--drain",
        action="store_true",
        help="stop once everything the input topics hold when the job starts is processed and committed "
        "(a final aligned checkpoint covers it); a bounded input's last run",
    )
    metrics.add_options(parser, "the runner's", workers=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spark-abs", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--home", help="cache and state directory (default: $SPARK_ABS_HOME or ~/.cache/spark-abs)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    local = sub.add_parser(
        "local",
        help="start, stop or inspect the embedded runtime (Kafka + S3 server), or the local cluster",
        description="The embedded runtime on loopback: a KRaft Kafka broker and "
        "an S3 API server, plus Spark's Kafka connector jars. With --cluster: three "
        "Kafka nodes, the S3 server and a Spark standalone master with two workers.",
    )
    local.add_argument(
        "action",
        choices=["up", "down", "status", "fetch", "env"],
        help="up: start what is not running (idempotent); down: stop what up started; "
        "status: what runs where (exit 1 unless all run); "
        "fetch: only download/build the artifacts into the cache; "
        'env: the SPARK_ABS_* variables that point commands at it (eval "$(spark-abs local env --cluster)")',
    )
    local.add_argument(
        "--cluster",
        action="store_true",
        help="the local cluster instead, under <home>/cluster: three Kafka nodes (replication factor 3, "
        "min.insync.replicas 2), the S3 server, a Spark standalone master and two workers from the "
        "installed pyspark; jobs run as applications on it",
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
    run.add_argument(
        "pipeline",
        help="module:attribute (its module importable from here), e.g. shop:pipeline, or a pipeline's name "
        "(spark-abs's examples: money, orders, clickstream, payments, devices, carts)",
    )
    run.add_argument("--store", required=True, help="snapshot store URI: file:///dir or s3://bucket/prefix")
    run.add_argument("--job", help="job name (default: the pipeline's own)")
    _add_job_options(run)
    run.add_argument("--restore", type=int, metavar="N", help="start from checkpoint N (a restore drill)")
    run.set_defaults(func=_cmd_run)

    worker = sub.add_parser(
        "worker",
        help="run one worker group of a job started with `run --remote-workers`, on this host",
        description="Joins job JOB as its worker group GROUP: waits for the job runner's lease on the "
        "job's control topic, becomes the group's member (a second worker of a group waits as its "
        "standby), runs the group's tasks as one Spark application on this host's SPARK_ABS_* "
        "deployment (its Spark master, Kafka and store), restores in place when the job restores, and "
        "stops its tasks when the runner stops or goes silent, waiting for the next one. The pipeline "
        "and the job's settings come from the runner; the pipeline's module must be importable here "
        "(e.g. from the current directory). Runs until SIGTERM or Ctrl-C.",
    )
    worker.add_argument("--job", required=True, help="the job's name (as the runner has it)")
    worker.add_argument(
        "--group",
        required=True,
        help="the worker group: `all` with the runner's --workers one, a stage's name with per-stage",
    )
    from streaming.engine import metrics

    metrics.add_options(worker, "this worker's")
    worker.set_defaults(func=_cmd_worker)

    checkpoints = sub.add_parser(
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
    checkpoints.add_argument(
        "action", nargs="?", default="list", choices=("list", "show", "diff", "verify", "gc"), help="(default list)"
    )
    checkpoints.add_argument("ids", nargs="*", type=int, metavar="N", help="checkpoint id(s) the action takes")
    _add_store_options(checkpoints)
    checkpoints.add_argument(
        "--no-checksums", action="store_true", help="list: check sizes only, without reading parts"
    )
    checkpoints.add_argument("--json", action="store_true", help="show: the checkpoint as JSON")
    checkpoints.add_argument("--rows", type=int, default=10, help="diff: changed rows shown per table (default 10)")
    checkpoints.add_argument("--dry-run", action="store_true", help="gc: list what would go, remove nothing")
    retain = JobSettings.default("retain")
    checkpoints.add_argument(
        "--retain", type=int, default=retain, help=f"gc: complete checkpoints kept (default {retain})"
    )
    checkpoints.add_argument(
        "--grace",
        type=float,
        default=86400.0,
        metavar="SECONDS",
        help="gc: retracted sink output is kept this long (default 86400, a day)",
    )
    checkpoints.set_defaults(func=_cmd_checkpoints)

    state = sub.add_parser(
        "state",
        help="a checkpoint's operator state and channel state as tables (print, or export)",
        description="Reads checkpoint N's operator state tables (or, with --channels, its "
        "unaligned channel state: copied records and ranges read back from Kafka while "
        "it holds them, stale older-generation records marked) and prints a sample of "
        "each, or writes them to --output (.parquet or .csv; with several tables, one "
        "file each, named after the table). From Python: streaming.tools.checkpoints.inspection."
        "Checkpoints (Arrow tables; to_spark for Spark DataFrames and SQL).",
    )
    state.add_argument("checkpoint", type=int, metavar="N", help="checkpoint id")
    _add_store_options(state)
    state.add_argument("--task", help="only this task")
    state.add_argument("--table", help="only this state table")
    state.add_argument("--channels", action="store_true", help="channel state instead of operator state")
    state.add_argument("--rows", type=int, default=10, help="rows shown per table (default 10)")
    state.add_argument("--output", help="write to this .parquet or .csv file instead of printing a sample")
    state.set_defaults(func=_cmd_state)

    restore = sub.add_parser(
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
    restore.add_argument(
        "checkpoint", nargs="?", type=int, metavar="N", help="checkpoint id (default: the newest that verifies)"
    )
    _add_store_options(restore)
    restore.add_argument("--dry-run", action="store_true", help="say what a restore would do; start nothing")
    restore.add_argument("--pipeline", help="module:attribute of the job's pipeline (needed without --dry-run)")
    _add_job_options(restore)
    restore.set_defaults(func=_cmd_restore)

    web = sub.add_parser(
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
    _add_store_options(web)
    web.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback only)")
    web.add_argument("--port", type=int, default=8050, help="port to listen on (default 8050; 0: a free one)")
    web.add_argument(
        "--refresh",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="the history reloads itself this often (default 5; 0: never)",
    )
    web.add_argument(
        "--store-only",
        action="store_true",
        help="read the store alone, not the control topic (a job that no longer runs, or no Kafka at hand)",
    )
    web.set_defaults(func=_cmd_ui)

    _add_passthrough(
        sub,
        "compare",
        _cmd_compare,
        "aligned vs unaligned checkpoints side by side under a backlog: a table of their costs",
    )
    _add_passthrough(
        sub,
        "drill",
        _cmd_drill,
        "a restore drill: failures of every kind from a seed, restores, the output checked with great-expectations",
    )
    _add_passthrough(sub, "simulate", _cmd_simulate, "narrate a simulated snapshot run")
    return parser


def _add_passthrough(sub, name: str, func, help: str) -> None:
    """A command that parses its own options (one of ``_OWN_OPTIONS``)."""
    parser = sub.add_parser(name, add_help=False, help=f"{help} (see `spark-abs {name} --help`)")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=func)


def _passthrough(argv: list[str]) -> tuple[str, list[str]] | None:
    """``simulate``, ``demo``, ``compare`` and ``drill`` take their own options: everything after the
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


_OWN_OPTIONS = ("simulate", "demo", "compare", "drill")


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
    console.install("[spark-abs] ", verbose=args.verbose)
    if not args.verbose:
        # kafka-python logs every lost connection and retry of its own (a line every few ms while a
        # broker is down); spark-abs says itself what it waits for and fails with a clear error
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except SparkAbsError as exc:
        print(f"spark-abs: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spark-abs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
