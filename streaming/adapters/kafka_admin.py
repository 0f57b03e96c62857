"""Kafka topics for stages and tests: create (idempotently, with the partition
count checked), delete, and read end offsets, with broker errors turned into
clear messages."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError

from streaming.errors import ConfigError, KafkaUnavailableError

__all__ = [
    "replication",
    "admin_client",
    "check_broker",
    "create_topic",
    "delete_topics",
    "end_offsets",
]

log = logging.getLogger(__name__)


def admin_client(bootstrap: str, timeout_s: float = 15.0) -> KafkaAdminClient:
    try:
        return KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="spark-abs-admin",
            request_timeout_ms=int(timeout_s * 1000),
            bootstrap_timeout_ms=int(timeout_s * 1000),
        )
    except KafkaTimeoutError as exc:
        raise KafkaUnavailableError(
            f"no Kafka broker answers at {bootstrap}; is the runtime up (`spark-abs local status`)?"
        ) from exc


def replication(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) of a topic on ``brokers``
    brokers: a replica on each (at most 3), and a write needs all but one,
    so one broker may stop and every topic is still written and read."""
    factor = min(3, max(1, brokers))
    return factor, max(1, factor - 1)


def check_broker(bootstrap: str, timeout_s: float = 10.0) -> None:
    """Fail fast, with KafkaUnavailableError, when no broker answers."""
    admin_client(bootstrap, timeout_s).close()


def create_topic(
    bootstrap: str, name: str, partitions: int, *, config: dict[str, str] | None = None, timeout_s: float = 30.0
) -> None:
    """Create ``name`` with ``partitions`` partitions, or accept it if it already
    has exactly that many; waits until its metadata is visible.  Replicated
    as ``replication`` says for the brokers the cluster has now."""
    if partitions < 1:
        raise ConfigError(f"topic {name!r}: partitions must be >= 1, got {partitions}")
    admin = admin_client(bootstrap)
    try:
        factor, min_isr = replication(len(admin.describe_cluster().get("brokers", [])))
        settings = {**({"min.insync.replicas": str(min_isr)} if factor > 1 else {}), **(config or {})}
        try:
            admin.create_topics([NewTopic(name, partitions, factor, topic_configs=settings)])
        except TopicAlreadyExistsError:
            pass
        deadline = time.monotonic() + timeout_s
        while True:
            described = admin.describe_topics([name])
            found = [len(t.get("partitions", [])) for t in described if t.get("error_code", 0) == 0]
            if found and found[0] == partitions:
                return
            if found and found[0] not in (0, partitions):
                raise ConfigError(f"topic {name!r} exists with {found[0]} partitions, not {partitions}")
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"topic {name!r} did not appear within {timeout_s:.0f} s")
            time.sleep(0.2)
    except KafkaError as exc:
        raise KafkaUnavailableError(f"creating topic {name!r} on {bootstrap} failed: {exc}") from exc
    finally:
        admin.close()


def delete_topics(bootstrap: str, names: Iterable[str]) -> None:
    names = list(names)
    if not names:
        return
    admin = admin_client(bootstrap)
    try:
        admin.delete_topics(names)
    except KafkaError as exc:
        log.warning("deleting topics %s failed: %s", names, exc)
    finally:
        admin.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """The next offset to be written on each partition of ``topic``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="spark-abs-offsets", enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()
