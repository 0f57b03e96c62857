"""``spark-abs local``: the embedded runtime (or the local cluster) started, stopped, looked at."""

from __future__ import annotations

import argparse
import logging
import shlex

from streaming.api.config import Connection
from streaming.local.artifacts import FETCHABLE
from streaming.tools.cli.options import runtime_settings

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "local",
        help="start, stop or inspect the embedded runtime (Kafka + S3 server), or the local cluster",
        description="The embedded runtime on loopback: a KRaft Kafka broker and "
        "an S3 API server, plus Spark's Kafka connector jars; a schema registry (Apicurio) on "
        "demand, built and started for the first job whose pipeline uses one or with --registry. "
        "With --cluster: three Kafka nodes, the S3 server and a Spark standalone master with two workers.",
    )
    parser.add_argument(
        "action",
        choices=["up", "down", "status", "fetch", "env", "grant"],
        help="up: start what is not running (idempotent); down: stop what up started; "
        "status: what runs where (exit 1 unless all run); "
        "fetch: only download/build the artifacts into the cache (the schema registry's too); "
        'env: the SPARK_ABS_* variables that point commands at it (eval "$(spark-abs local env --cluster)"); '
        "grant (with --secure and --pipeline): give the job user the Kafka ACLs that pipeline's job needs, "
        "prefixed on the job's own topics and transactional ids, literal on its ingress and sink topics "
        "(the user has none until then), and print them as kafka-acls.sh arguments",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="the local cluster instead, under <home>/cluster: three Kafka nodes (replication factor 3, "
        "min.insync.replicas 2), the S3 server, a Spark standalone master and two workers from the "
        "installed pyspark; jobs run as applications on it",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="the secured runtime instead, under <home>/secure: the broker takes SASL_SSL (SCRAM) only, "
        "with ACLs; its CA, certificates and password files in <home>/secure/runtime/secrets, the job "
        "user's credentials named (by file) in its connection file",
    )
    parser.add_argument(
        "--registry",
        action="store_true",
        help="with up: the schema registry too (built with Maven the first time, a few minutes); without it, "
        "up keeps a registry started since the last down and starts none (`spark-abs run` starts it for a "
        "pipeline that uses one)",
    )
    parser.add_argument("--pipeline", metavar="MODULE:FUNCTION", help="with grant: the pipeline whose job is granted")
    parser.add_argument("--job", help="with grant: the job's name (default: the pipeline's own)")
    parser.add_argument(
        "--only", action="append", choices=FETCHABLE, help="with fetch: just this artifact (repeatable)"
    )
    parser.add_argument("--kafka-port", type=int, default=0, help="broker port (default: a free one, kept)")
    parser.add_argument("--s3-port", type=int, default=0, help="S3 server port (default: a free one, kept)")
    parser.add_argument("--purge", action="store_true", help="with down: also delete data and logs")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streaming.errors import ConfigError
    from streaming.local import LocalRuntime

    if args.registry and args.action != "up":
        raise ConfigError(f"--registry goes with up, not {args.action} (fetch builds the registry anyway)")
    runtime = LocalRuntime(runtime_settings(args), progress=log.info)
    if args.action == "fetch":
        for what, paths in runtime.fetch(args.only or FETCHABLE).items():
            log.info(f"{what}: {len(paths)} file(s) cached, e.g. {paths[0] if paths else '-'}")
    elif args.action == "up":
        runtime.up(registry=args.registry)
        print(runtime.status().render())
    elif args.action == "down":
        for line in runtime.down(purge=args.purge):
            log.info(line)
    elif args.action == "grant":
        from streaming.api.pipeline import load_pipeline
        from streaming.local.kafka_security import JOB_USER
        from streaming.tools.cli.options import import_from_here

        if not args.pipeline:
            raise ConfigError("grant needs --pipeline MODULE:FUNCTION (and --job, when not the pipeline's own)")
        import_from_here()
        pipeline = load_pipeline(args.pipeline, args.job)
        for grant in runtime.grant(pipeline):
            print(grant.render(JOB_USER))
        log.info(f"granted user {JOB_USER} what job {pipeline.job} needs on the secured runtime's broker")
    elif args.action == "env":
        connection = Connection.load(runtime.settings, environ={})
        for name, value in connection.as_env().items():
            print(f"export {name}={shlex.quote(value)}")
    else:
        status = runtime.status()
        print(status.render())
        return 0 if status.all_running else 1
    return 0
