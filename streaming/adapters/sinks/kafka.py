"""The Kafka sink: a commit publishes the staged rows to the output topic in
one Kafka transaction that also carries a commit marker ``<task>:<n>`` to the
sink's commits topic, signed with the job's key; ``read_committed`` readers
see the epoch exactly once.  The transactions are written by Kafka's Java
client (``streaming.adapters.kafka.transactions``), or by kafka-python.

A Kafka transaction cannot be taken back, so output committed after a
restored checkpoint is reported irrevocable and marked superseded in the
commits topic (``<task>:<n>:superseded``).  Every record published names its
epoch in the header ``abs.epoch``, so a reader that skips the superseded
epochs (``read_kafka_output``) reads each result once even after such a
restore.  Rows are written as JSON, or as Avro registered under
``<topic>-value`` (``registered_avro``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from kafka.errors import AuthorizationError, KafkaError

from barriers.headers import EPOCH_HEADER, MARKER_SIGNATURE_HEADER
from barriers.messages import Unsigned
from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.kafka.admin import create_topic
from streaming.adapters.kafka.producer import DELIVERY_BOUND_S, close_producer, producer, within
from streaming.adapters.kafka.ranges import read_to_end, topic_config
from streaming.adapters.kafka.transactions import JavaTransactions, TxnRecord
from streaming.adapters.objects import StoreLocation
from streaming.adapters.serde import avro, codec
from streaming.adapters.serde.schema_registry import SchemaRegistry, subject_of
from streaming.adapters.sinks.base import TwoPhaseSink, signing_key
from streaming.api.avro_schema import AvroSchema
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Sink
from streaming.api.settings import KAFKA_SINK_CLIENTS
from streaming.api.topics import commits_topic
from streaming.errors import ConfigError, KafkaUnavailableError, SinkError, SinkFencedError

__all__ = ["kafka_records", "registered_avro", "KafkaSink", "read_kafka_output", "KafkaOutput"]

log = logging.getLogger(__name__)


# the commits topic keeps every record: compacted, a record anyone wrote with a marker's key (a
# tombstone, say) would erase the signed marker, and an epoch committed could be published again
COMMITS_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}


def _refuse_compacted(kafka: KafkaAccess, topic: str, transactional_id: str) -> None:
    """A ``SinkError`` when the commits ``topic`` is compacted (made so by an
    earlier release, or by hand), saying how to change it."""
    policy = topic_config(kafka, topic, "cleanup.policy")
    if policy is not None and "compact" in policy.split(","):
        raise SinkError(
            f"Kafka sink {transactional_id}: its commits topic {topic} is compacted (cleanup.policy={policy}): "
            "any writer of a record with a marker's key would erase the signed marker, and the epoch could be "
            "published twice. Make it keep every record, then start the job again: kafka-configs.sh "
            f"--bootstrap-server ... --alter --entity-type topics --entity-name {topic} --add-config "
            f"'{','.join(f'{name}={value}' for name, value in COMMITS_TOPIC_CONFIG.items())}'"
        )
    if policy is None:
        log.warning(
            "Kafka sink %s: the cleanup policy of %s is unknown; it must not be compact", transactional_id, topic
        )


def _fenced(exc: BaseException, last_error: BaseException | None = None) -> bool:
    """Whether kafka-python's ``exc`` says a newer instance fenced the
    producer: the error itself, or the error a failed background request left
    the transaction in (``last_error``, the transaction manager's; ``exc`` then
    says only "Cannot execute transactional method because we are in an
    error state", or carries that error as an argument)."""
    causes = [exc, last_error, *(arg for arg in exc.args if isinstance(arg, BaseException))]
    return any(cause is not None and "Fenced" in type(cause).__name__ for cause in causes)


# a commit-topic key: the epoch it follows was committed after the checkpoint a restore went back to
_SUPERSEDED = b":superseded"


class KafkaSink(TwoPhaseSink):
    """Rows with ``key`` and ``value`` columns (binary or string; optional
    ``partition``) published to ``topic`` in one transaction per epoch, with a
    commit marker in ``<topic>.commits`` inside the same transaction.
    ``client``: who writes the transactions, ``"java"`` (Kafka's Java client
    in a JVM of its own, on the broker's transaction protocol:
    ``streaming.adapters.kafka.transactions``) or ``"python"`` (kafka-python)."""

    def __init__(
        self,
        staging: StoreLocation,
        task_id: str,
        *,
        kafka: KafkaAccess,
        topic: str,
        transactional_id: str,
        delivery_timeout_s: float = DELIVERY_BOUND_S,
        key: JobKey | Unsigned,
        client: str = "java",
    ):
        super().__init__(staging, task_id)
        self.topic = topic
        # signs the markers of the commits topic; the markers read back must carry its signature
        # (UNSIGNED, said explicitly: tests only)
        self._key = signing_key(key, "Kafka")
        # a transaction's sends, commit and abort each end within it (kafka-python's wait for good)
        self.delivery_timeout_s = delivery_timeout_s
        self.commit_topic = commits_topic(topic)
        self._kafka = kafka
        create_topic(kafka, self.commit_topic, 1, config=COMMITS_TOPIC_CONFIG)
        _refuse_compacted(kafka, self.commit_topic, transactional_id)
        if client not in KAFKA_SINK_CLIENTS:
            raise ConfigError(f"Kafka sink {transactional_id}: client {client!r}: use one of {KAFKA_SINK_CLIENTS}")
        # Kafka's Java client, on the broker's transaction protocol (the second since Kafka 4.0)
        self._java: JavaTransactions | None = None
        if client == "java":
            # starting it fences any older instance with the same id and aborts what it left open
            self._java = JavaTransactions(kafka, transactional_id, delivery_timeout_s=delivery_timeout_s)
            try:
                self._done = self._read_markers()
            except BaseException:
                self._java.close()
                raise
            return
        try:
            # init_transactions fences any older instance with the same id and
            # aborts what it left open.
            self._producer = producer(
                kafka,
                delivery_timeout_s=delivery_timeout_s,
                transactional_id=transactional_id,
                enable_idempotence=True,
                max_block_ms=int(min(60.0, delivery_timeout_s) * 1000),
            )
            self._producer.init_transactions()
        except (KafkaError, KafkaUnavailableError) as exc:
            denied = isinstance(exc, AuthorizationError)
            why = kafka_clients.refusal(kafka, exc, f"to use transactional id {transactional_id}") if denied else exc
            raise SinkError(
                f"Kafka sink {transactional_id}: cannot start a transactional producer on {kafka}: {why}"
            ) from exc
        self._done = self._read_markers()

    def _marker(self, epoch: int) -> bytes:
        return f"{self.task_id}:{epoch}".encode()

    def _read_markers(self) -> set[bytes]:
        return _commit_keys(self._kafka, self.commit_topic, key=self._key, topic_of=self.topic)

    def _marker_record(self, marker: bytes, value: bytes) -> dict:
        """A commits-topic record: ``marker``, ``value``, signed with the job's key when the sink has it."""
        headers = (
            []
            if self._key is None
            else [(MARKER_SIGNATURE_HEADER, _marker_signature(self._key, self.topic, marker, value))]
        )
        return {"key": marker, "value": value, "headers": headers}

    def _committed(self, epoch: int) -> bool:
        return self._marker(epoch) in self._done

    def _committed_elsewhere(self, epoch: int) -> bool:
        self._done = self._read_markers()
        return self._committed(epoch)

    def _retract_after(self, checkpoint: int) -> tuple[list[int], list[int]]:
        """A committed Kafka transaction cannot be taken back: the epochs
        committed after ``checkpoint`` are reported, not retracted."""
        prefix = f"{self.task_id}:".encode()
        epochs = sorted(
            int(m[len(prefix) :]) for m in self._done if m and m.startswith(prefix) and m[len(prefix) :].isdigit()
        )
        later = [e for e in epochs if e > checkpoint]
        # a mark stays: an epoch numbered below the restored checkpoint is not of its history when a
        # fallback abandoned that history (the generations after it go on with higher numbers)
        fresh = [e for e in later if self._marker(e) + _SUPERSEDED not in self._done]
        if fresh:
            self._supersede(fresh, checkpoint)
            log.warning(
                "sink task %s: epochs %s were committed to %s after checkpoint %d, the restored one; "
                "read_committed readers have them and the replay writes their records again; they are "
                "marked superseded in %s (a reader that skips them, by their %s header, reads each result once)",
                self.task_id,
                fresh,
                self.topic,
                checkpoint,
                self.commit_topic,
                EPOCH_HEADER,
            )
        return [], later

    def _supersede(self, epochs: list[int], checkpoint: int) -> None:
        """Mark ``epochs`` superseded in the commit topic, in one transaction
        (idempotent: a reader takes a key's latest signed record)."""
        value = f"restored to checkpoint {checkpoint}".encode()
        marks = [self._marker_txn_record(self._marker(epoch) + _SUPERSEDED, value) for epoch in epochs]
        self._transact(marks, f"marking epochs {epochs} of {self.topic} superseded")
        self._done.update(self._marker(e) + _SUPERSEDED for e in epochs)

    def _publish(self, epoch: int) -> None:
        rows = self._staging.read(epoch).to_pylist()
        headers = [(EPOCH_HEADER, self._marker(epoch))]
        records: list[TxnRecord] = [
            (self.topic, row.get("partition"), _bytes(row.get("key")), _bytes(row.get("value")), headers)
            for row in rows
        ]
        records.append(self._marker_txn_record(self._marker(epoch), str(len(rows)).encode()))
        try:
            self._transact(records, f"committing epoch {epoch} to {self.topic}")
        except SinkFencedError as exc:
            raise SinkFencedError(
                f"sink task {self.task_id}: a newer instance took over; epoch {epoch} is left to it"
            ) from exc
        self._done.add(self._marker(epoch))

    def _marker_txn_record(self, marker: bytes, value: bytes) -> TxnRecord:
        record = self._marker_record(marker, value)
        return (self.commit_topic, None, record["key"], record["value"], record["headers"])

    def _transact(self, records: list[TxnRecord], what: str) -> None:
        """``records`` in one transaction (``what`` it does, for the errors):
        ``SinkFencedError`` when a newer instance took over, ``SinkError``
        when it failed (aborted)."""
        if self._java is not None:
            self._java.commit(records, what)  # its errors name the transactional id: job and task
            return
        try:
            self._producer.begin_transaction()
            for topic, partition, key, value, headers in records:
                self._producer.send(topic, key=key, value=value, partition=partition, headers=list(headers))
            self._end_transaction(self._producer.commit_transaction, what)
        except KafkaError as exc:
            manager = getattr(self._producer, "_transaction_manager", None)
            if _fenced(exc, getattr(manager, "last_error", None)):
                raise SinkFencedError(f"sink task {self.task_id}: {what}: a newer instance took over") from exc
            self._abort_quietly()
            raise SinkError(f"sink task {self.task_id}: {what} failed: {exc}") from exc

    def _end_transaction(self, end: Callable[[], None], what: str) -> None:
        """Commit or abort (``end``) the open transaction, within the
        delivery timeout and a little more: a ``KafkaUnavailableError``
        otherwise (the transaction stays open until the next instance of the
        sink fences it and aborts it)."""
        within(
            end,
            self.delivery_timeout_s + 5.0,
            f"sink task {self.task_id}: {what} to {self.topic}",
            "the delivery timeout, delivery_timeout_s, and 5 s",
        )

    def _abort_quietly(self) -> None:
        """Abort the open transaction after a failure, as far as Kafka lets
        (the failure itself is what the caller reports)."""
        try:
            self._end_transaction(self._producer.abort_transaction, "aborting a transaction")
        except (KafkaError, KafkaUnavailableError) as exc:
            log.warning("sink task %s: aborting the open transaction: %s", self.task_id, exc)

    def close(self) -> None:
        if self._java is not None:
            self._java.close()
        else:
            close_producer(self._producer, f"sink task {self.task_id}")


@dataclass(frozen=True)
class KafkaOutput:
    """What a Kafka sink committed to its topic: the values of every record
    of an epoch not superseded, in partition and offset order, and the
    records skipped per superseded epoch (``<task>:<epoch>``)."""

    values: list[bytes]
    superseded: dict[str, int] = field(default_factory=dict)


def read_kafka_output(kafka: KafkaAccess, topic: str, *, timeout_ms: int = 3000, key: JobKey | Unsigned) -> KafkaOutput:
    """The records a Kafka sink committed to ``topic`` (read_committed),
    without those of epochs its commit topic marks superseded: committed
    after the checkpoint a restore went back to, and written again by the
    restored job.  Records without an ``abs.epoch`` header are kept.  With
    the job's ``key`` (``Connection.job_key(job)``), a superseded mark
    counts only when the job signed it: a forged one hides nothing."""
    superseded = {
        marker[: -len(_SUPERSEDED)]
        for marker in _commit_keys(
            kafka, commits_topic(topic), timeout_ms, key=signing_key(key, "Kafka"), topic_of=topic
        )
        if marker.endswith(_SUPERSEDED)
    }
    values: list[bytes] = []
    skipped: dict[str, int] = {}
    for record in read_to_end(kafka, topic, timeout_ms):
        epoch = dict(record.headers or []).get(EPOCH_HEADER)
        if epoch is not None and epoch in superseded:
            skipped[epoch.decode()] = skipped.get(epoch.decode(), 0) + 1
        elif record.value:
            values.append(record.value)
    return KafkaOutput(values, dict(sorted(skipped.items())))


def _marker_signature(key: JobKey, sink_topic: str, marker: bytes, value: bytes) -> bytes:
    return key.sign(b"sink-commit", sink_topic.encode(), marker, value).encode()


def _commit_keys(
    kafka: KafkaAccess, topic: str, timeout_ms: int = 2000, *, key: JobKey | None = None, topic_of: str = ""
) -> set[bytes]:
    """The markers a sink's commit topic holds.  With the job's ``key``,
    only those the job signed (for the sink topic ``topic_of``) count: a
    record anyone else wrote there, a tombstone included, is logged and
    left out.  Without it every marker counts and a tombstone, a null
    value, takes its marker away."""
    latest: dict[bytes, bytes | None] = {}
    for record in read_to_end(kafka, topic, timeout_ms):
        if not record.key:
            continue
        if key is not None:
            signature = dict(record.headers or []).get(MARKER_SIGNATURE_HEADER)
            signed = record.value is not None and key.verify(
                signature, b"sink-commit", topic_of.encode(), record.key, record.value
            )
            if not signed:
                log.warning(
                    "%s offset %d: marker %r not signed by job %s; left out (someone else can write to the topic)",
                    topic,
                    record.offset,
                    record.key[:80],
                    key.job,
                )
                continue
        latest[record.key] = record.value
    return {marker for marker, value in latest.items() if value is not None}


def kafka_records(
    table: pa.Table, key: str | None, avro_values: Callable[[pa.Table], list[bytes]] | None = None
) -> pa.Table:
    """A sink epoch as the Kafka sink takes it: ``key`` (the stage's key
    column) and ``value`` (JSON, or what ``avro_values`` makes of the rows)."""
    keys = (
        pc.cast(pc.cast(table[key], pa.string()), pa.binary())
        if key and key in table.column_names
        else pa.nulls(table.num_rows, pa.binary())
    )
    values = codec.encode(table) if avro_values is None else avro_values(table)
    return pa.table({"key": keys, "value": pa.array(values, pa.binary())})


def registered_avro(sink: Sink, registry: SchemaRegistry) -> Callable[[pa.Table], list[bytes]]:
    """How a Kafka sink with ``avro`` writes rows: Avro records of its schema
    after Confluent's header with the schema's id, registered under
    ``<topic>-value`` (once; the registry's compatibility rule decides
    whether a changed schema may be)."""
    if sink.topic is None or not isinstance(sink.avro, AvroSchema):
        raise ConfigError("registered_avro: a Kafka sink with an avro schema")
    schema, subject = sink.avro, subject_of(sink.topic)

    def values(table: pa.Table) -> list[bytes]:
        schema_id = registry.register(subject, schema.json)
        try:
            return avro.encode(table.to_pylist(), schema, schema_id=schema_id)
        except (ValueError, TypeError) as exc:
            raise SinkError(
                f"sink {sink.topic}: a row is not a record of the sink's Avro schema ({subject}, id {schema_id}): {exc}"
            ) from exc

    return values


def _bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()
