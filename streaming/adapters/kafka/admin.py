"""Kafka topics for stages and tests: create (idempotently, with the partition
count checked), delete, read end offsets, each partition's earliest offset
and the first offset at or after a time, delete a partition's records
before an offset (``DeleteRecords``), and find partitions whose replicas
are not all in sync (a job's topics and Kafka's own), with broker errors turned into clear messages."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from barriers.messages import ChannelId
from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.kafka.clients import RECONNECT, refusal
from streaming.api.config import Connection, KafkaAccess
from streaming.api.job_key import JobKey
from streaming.errors import ConfigError, KafkaUnavailableError
from streaming.waits import poll_until

__all__ = [
    "replication",
    "admin_client",
    "cluster_id",
    "job_key",
    "check_broker",
    "create_topic",
    "delete_topics",
    "end_offsets",
    "earliest_offsets",
    "OffsetsAtTime",
    "delete_records",
    "RECONNECT",
    "lagging_replicas",
    "out_of_sync",
    "watched",
    "KAFKA_INTERNAL",
]

log = logging.getLogger(__name__)


def admin_client(kafka: KafkaAccess, timeout_s: float = 15.0) -> KafkaAdminClient:
    """An admin client on ``kafka`` (``kafka_clients.admin``)."""
    return kafka_clients.admin(kafka, timeout_s)


_CLUSTER_IDS: dict[str, str] = {}
_CLUSTER_IDS_LOCK = threading.Lock()


def cluster_id(kafka: KafkaAccess, timeout_s: float = 15.0) -> str:
    """The id of the Kafka cluster at ``kafka`` (asked once per process and servers: it never
    changes while the cluster lives); a ``KafkaUnavailableError`` when no broker answers."""
    with _CLUSTER_IDS_LOCK:
        known = _CLUSTER_IDS.get(kafka.servers)
    if known:
        return known
    admin = admin_client(kafka, timeout_s)
    try:
        found = admin.describe_cluster().get("cluster_id") or ""
    except KafkaError as exc:  # a broker that went away between the connection and the answer
        raise refusal(
            kafka, exc, "to describe the cluster", f"asking Kafka at {kafka} for its cluster id failed"
        ) from exc
    finally:
        admin.close()
    if not found:
        raise KafkaUnavailableError(f"Kafka at {kafka.servers} names no cluster id (a broker older than 0.10.1?)")
    with _CLUSTER_IDS_LOCK:
        _CLUSTER_IDS[kafka.servers] = found
    return found


def job_key(connection: Connection, job: str) -> JobKey:
    """Job ``job``'s key on ``connection``'s Kafka cluster (``Connection.job_key``, bound to its id)."""
    return connection.job_key(job, cluster=cluster_id(connection.kafka))


def replication(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) of a topic on ``brokers``
    brokers: a replica on each (at most 3), and a write needs all but one,
    so one broker may stop and every topic is still written and read."""
    factor = min(3, max(1, brokers))
    return factor, max(1, factor - 1)


def check_broker(kafka: KafkaAccess, timeout_s: float = 10.0) -> None:
    """Fail fast, with KafkaUnavailableError, when no broker answers."""
    admin_client(kafka, timeout_s).close()


def create_topic(
    kafka: KafkaAccess, name: str, partitions: int, *, config: dict[str, str] | None = None, timeout_s: float = 30.0
) -> None:
    """Create ``name`` with ``partitions`` partitions, or accept it if it already
    has exactly that many; waits until its metadata is visible.  Replicated
    as ``replication`` says for the brokers the cluster has now."""
    if partitions < 1:
        raise ConfigError(f"topic {name!r}: partitions must be >= 1, got {partitions}")
    admin = admin_client(kafka)
    try:
        factor, min_isr = replication(len(admin.describe_cluster().get("brokers", [])))
        settings = {**({"min.insync.replicas": str(min_isr)} if factor > 1 else {}), **(config or {})}
        try:
            admin.create_topics([NewTopic(name, partitions, factor, topic_configs=settings)])
        except TopicAlreadyExistsError:
            pass

        def appeared() -> bool:
            described = admin.describe_topics([name])
            found = [len(t.get("partitions", [])) for t in described if t.get("error_code", 0) == 0]
            if found and found[0] not in (0, partitions):
                raise ConfigError(f"topic {name!r} exists with {found[0]} partitions, not {partitions}")
            return bool(found) and found[0] == partitions

        poll_until(
            appeared,
            timeout_s,
            f"topic {name!r} appearing",
            every_s=0.2,
            error=lambda message: KafkaUnavailableError(f"topic {name!r} did not appear within {timeout_s:.0f} s"),
        )
    except KafkaError as exc:
        raise refusal(kafka, exc, f"to create topic {name!r}", f"creating topic {name!r} on {kafka} failed") from exc
    finally:
        admin.close()


def delete_topics(kafka: KafkaAccess, names: Iterable[str]) -> None:
    names = list(names)
    if not names:
        return
    admin = admin_client(kafka)
    try:
        admin.delete_topics(names)
    except KafkaError as exc:
        log.warning("deleting topics %s failed: %s", names, exc)
    finally:
        admin.close()


def end_offsets(kafka: KafkaAccess, topic: str, partitions: int) -> dict[int, int]:
    """The next offset to be written on each partition of ``topic``."""
    consumer = kafka_clients.consumer(kafka, client_id="spark-abs-offsets", enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
    except KafkaError as exc:
        raise refusal(kafka, exc, f"to describe topic {topic}", f"reading the end offsets of {topic} failed") from exc
    finally:
        consumer.close()


def earliest_offsets(kafka: KafkaAccess, channels: Iterable[ChannelId]) -> dict[ChannelId, int]:
    """Each channel's earliest offset (its log start: what retention and
    ``DeleteRecords`` left), in one request."""
    channels = list(channels)
    if not channels:
        return {}
    consumer = kafka_clients.consumer(kafka, client_id="spark-abs-offsets", enable_auto_commit=False)
    try:
        found = consumer.beginning_offsets([TopicPartition(c.topic, c.partition) for c in channels])
    except KafkaError as exc:
        raise refusal(
            kafka, exc, "to read offsets", f"reading the earliest offsets of {len(channels)} channels failed"
        ) from exc
    finally:
        consumer.close()
    return {ChannelId(tp.topic, tp.partition): offset for tp, offset in found.items()}


class OffsetsAtTime:
    """Each channel's first offset whose record's timestamp is at or after a
    time (``offsets_for_times``), on one consumer kept open between calls
    and shared by the threads of a process (``shared``).  An answer is kept
    ``fresh_s``: a request asks for every partition of the topic the process
    has asked about, so the tasks of a worker uploading one checkpoint cost
    one request per topic (an answer at most ``fresh_s`` old was found for a
    time that much earlier, which the callers' horizons dwarf)."""

    _shared: dict[KafkaAccess, OffsetsAtTime] = {}
    _sharing = threading.Lock()

    def __init__(self, kafka: KafkaAccess, timeout_ms: int = 10_000, fresh_s: float = 1.0):
        self.kafka = kafka
        self.timeout_ms = timeout_ms  # a broker that does not answer: the upload goes on without the check
        self.fresh_s = fresh_s
        self._consumer: KafkaConsumer | None = None
        self._lock = threading.Lock()
        self._known: set[ChannelId] = set()
        self._answers: dict[ChannelId, tuple[float, int | None]] = {}  # channel -> (when, offset)

    @classmethod
    def shared(cls, kafka: KafkaAccess) -> OffsetsAtTime:
        """The process's one for ``kafka``."""
        with cls._sharing:
            return cls._shared.setdefault(kafka, cls(kafka))

    def __call__(self, channels: list[ChannelId], timestamp_ms: int) -> dict[ChannelId, int | None]:
        with self._lock:
            now = time.monotonic()
            stale = [c for c in channels if c not in self._answers or now - self._answers[c][0] > self.fresh_s]
            if stale:
                self._known.update(stale)
                topics = {c.topic for c in stale}
                asked = sorted((c for c in self._known if c.topic in topics), key=str)
                found = self._query(asked, timestamp_ms)
                self._answers.update({c: (now, found.get(c)) for c in asked})
            return {c: self._answers[c][1] for c in channels}

    def _query(self, channels: list[ChannelId], timestamp_ms: int) -> dict[ChannelId, int | None]:
        """One request: each channel's first offset at or after ``timestamp_ms`` (None: no such record)."""
        wanted = {TopicPartition(c.topic, c.partition): max(0, timestamp_ms) for c in channels}
        try:
            if self._consumer is None:
                self._consumer = kafka_clients.consumer(
                    self.kafka,
                    client_id="spark-abs-retention",
                    enable_auto_commit=False,
                )
            found = self._consumer.offsets_for_times(wanted, timeout_ms=self.timeout_ms)
        except KafkaError as exc:
            raise KafkaUnavailableError(f"finding offsets at {timestamp_ms} ms failed: {exc}") from exc
        return {ChannelId(tp.topic, tp.partition): None if at is None else at.offset for tp, at in found.items()}


def delete_records(kafka: KafkaAccess, before: dict[ChannelId, int]) -> None:
    """Delete each channel's records before its offset (Kafka's
    ``DeleteRecords``: its earliest offset moves there), as retention would."""
    if not before:
        return
    admin = admin_client(kafka)
    try:
        admin.delete_records({TopicPartition(c.topic, c.partition): offset for c, offset in before.items()})
    except KafkaError as exc:
        raise KafkaUnavailableError(f"deleting records of {len(before)} channels failed: {exc}") from exc
    finally:
        admin.close()


# Kafka's own topics a transactional sink writes to (and consumer groups commit to): a write waits for
# min.insync.replicas of theirs as well
KAFKA_INTERNAL = ("__transaction_state", "__consumer_offsets")


def out_of_sync(kafka: KafkaAccess, name_contains: str) -> list[str]:
    """``topic:partition`` of every partition with a replica not in sync (a
    broker that was down and is catching up), sorted, of the topics
    ``watched`` picks: those whose name holds ``name_contains`` and Kafka's
    own (``KAFKA_INTERNAL``)."""
    admin = admin_client(kafka)
    try:
        topics = watched(admin.list_topics(), name_contains)
        return lagging_replicas(admin.describe_topics(topics) if topics else [])
    except KafkaError as exc:
        raise KafkaUnavailableError(f"describing the topics of {name_contains} failed: {exc}") from exc
    finally:
        admin.close()


def watched(topics: Iterable[str], name_contains: str) -> list[str]:
    """Of ``topics``, those whose name holds ``name_contains`` and those of ``KAFKA_INTERNAL`` there, sorted."""
    return sorted(t for t in topics if name_contains in t or t in KAFKA_INTERNAL)


def lagging_replicas(described: Iterable[dict]) -> list[str]:
    """``topic:partition`` of every partition of ``described`` (the admin
    client's ``describe_topics``) whose in-sync replicas are fewer than its replicas."""
    return sorted(
        f"{topic.get('name') or topic.get('topic')}:{part['partition_index']}"
        for topic in described
        for part in topic.get("partitions", [])
        if len(part.get("isr_nodes", [])) < len(part.get("replica_nodes", []))
    )
