"""The keyed count in Flink SQL (PyFlink, a local mini-cluster of
``--parallelism`` slots): the topic read to its end (a bounded Kafka
source; the header-only barriers spark-abs appends to the topic are
skipped), ``GROUP BY k`` with mini-batches, updates to ``--out`` through the
upsert-kafka sink exactly once (Kafka transactions), checkpoints every
second.  Runs in the Flink environment (``benchmarks.peers``)."""

from __future__ import annotations

import argparse
import uuid

from pyflink.table import EnvironmentSettings, TableEnvironment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--jar", required=True, help="flink-sql-connector-kafka for this Flink")
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    for key, value in {
        "pipeline.jars": f"file://{args.jar}",
        "parallelism.default": str(args.parallelism),
        "execution.checkpointing.interval": "1 s",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "table.exec.mini-batch.enabled": "true",
        "table.exec.mini-batch.allow-latency": "500 ms",
        "table.exec.mini-batch.size": "5000",
    }.items():
        config.set(key, value)
    run = uuid.uuid4().hex[:8]
    env.execute_sql(f"""
        CREATE TABLE events (k STRING, v BIGINT) WITH (
            'connector' = 'kafka', 'topic' = '{args.topic}',
            'properties.bootstrap.servers' = '{args.bootstrap}', 'properties.group.id' = 'bench-flink-{run}',
            'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset',
            'format' = 'json', 'json.ignore-parse-errors' = 'true')""")
    env.execute_sql(f"""
        CREATE TABLE totals (k STRING, n BIGINT, `sum` BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH (
            'connector' = 'upsert-kafka', 'topic' = '{args.out}',
            'properties.bootstrap.servers' = '{args.bootstrap}',
            'properties.transaction.timeout.ms' = '600000',
            'key.format' = 'json', 'value.format' = 'json',
            'sink.delivery-guarantee' = 'exactly-once', 'sink.transactional-id-prefix' = 'bench-flink-{run}')""")
    env.execute_sql("INSERT INTO totals SELECT k, COUNT(*), SUM(v) FROM events GROUP BY k").wait()


if __name__ == "__main__":
    main()
