"""``spark-abs smoke``: the smoke pipeline through real Kafka, Spark and S3."""

from __future__ import annotations

import argparse
import logging
import os
import time
import uuid

from streaming.api.config import Connection
from streaming.tools.cli.options import runtime_settings

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "smoke",
        help="run the smoke pipeline through real Kafka, Spark and S3",
        description="Brings the local runtime up (unless SPARK_ABS_KAFKA_BOOTSTRAP "
        "names a deployment), produces records with headers, streams them "
        "through foreachBatch into Parquet on S3 and checks them.",
    )
    parser.add_argument("--records", type=int, default=2000, help="records to produce (default 2000)")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the topic (default 2)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streaming.adapters.kafka.admin import check_broker
    from streaming.adapters.spark.session import spark_session
    from streaming.local import LocalRuntime
    from streaming.tools.smoke.run import SmokeRun, run_smoke

    settings = runtime_settings(args)
    connection = Connection.from_env(os.environ) or LocalRuntime(settings, progress=log.info).up()
    check_broker(connection.kafka)
    log.info("starting Spark (local master) with the Kafka connector")
    started = time.monotonic()
    spark = spark_session(connection.spark_settings(), settings, progress=log.info)
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
