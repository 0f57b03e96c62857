"""Exactly-once sinks: the two-phase commit at the end of the pipeline.

Epoch ``n`` of a sink task is the output it produced after barrier ``n-1`` and
up to barrier ``n``.  Phase one (``stage``) writes the epoch's output to a
staging area in object storage, immutable, before the task acknowledges
checkpoint ``n``.  Phase two (``commit``) runs when checkpoint ``n`` is complete
(its manifest exists) and makes the epoch visible:

- ``ObjectStoreSink``: moves the staged file to ``<root>/output/epoch-<n>/<task>.parquet``
  (a rename on a local filesystem, a server-side copy then a delete on S3);
  one object per (epoch, task), so it appears whole or not at all.
- ``KafkaSink``: publishes the staged rows to the output topic in one Kafka
  transaction that also carries a commit marker ``<task>:<n>`` to the sink's
  commit topic; ``read_committed`` readers see the epoch exactly once.

A committed epoch leaves nothing staged (the Kafka sink deletes its staged
file after the transaction), so what is staged is only what waits for its
checkpoint and a commit lists a handful of files, however long the job runs.
Both commits are idempotent (a committed epoch is recognised and skipped), so
``recover(completed)`` after a restore simply commits every staged epoch up to
the restored checkpoint, which covers a crash between the manifest and the
sink's commit, and discards staged epochs after it: they belong to the run
that failed and the new generation writes them again.  Output committed
after the restored checkpoint (a restore to an older, named checkpoint, or
past a newer one that failed to verify) is taken back by the object-store
sink (moved to ``<root>/retracted/``); a Kafka transaction cannot be taken
back, so the Kafka sink reports those epochs as irrevocable and marks them
superseded in its commit topic (``<task>:<n>:superseded``).  Every record
it publishes names its epoch in the header ``abs.epoch``, so a reader that
skips the superseded epochs (``read_kafka_output``) reads each result once
even after such a restore.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, SchemaMismatchError
from kafka import TopicPartition
from kafka.errors import AuthorizationError, KafkaError

from streaming.adapters import avro, codec, kafka_clients
from streaming.adapters.kafka_admin import create_topic
from streaming.adapters.kafka_io import DELIVERY_BOUND_S, close_producer, producer, within
from streaming.adapters.kafka_txn import JavaTransactions, TxnRecord
from streaming.adapters.objects import ObjectFiles, StoreLocation, list_files, open_store
from streaming.adapters.registry import SchemaRegistry, subject_of
from streaming.api.avro import AvroSchema
from streaming.api.config import Connection, KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Sink, SinkKind
from streaming.api.settings import KAFKA_SINK_CLIENTS, JobSettings
from streaming.errors import ConfigError, KafkaUnavailableError, SinkError, SinkFencedError, StoreError

__all__ = [
    "open_sink",
    "sink_location",
    "sink_place",
    "kafka_records",
    "registered_avro",
    "ObjectStoreSink",
    "KafkaSink",
    "Recovery",
    "read_committed_output",
    "read_kafka_output",
    "KafkaOutput",
    "DeltaSink",
    "delta_storage_options",
    "delta_table_uri",
    "read_delta_output",
    "EPOCH_HEADER",
    "DELTA_COLUMNS",
]

log = logging.getLogger(__name__)

_EPOCH_DIR = re.compile(r"epoch-(\d+)$")

# the header of every record a Kafka sink publishes: ``<task>:<epoch>``
EPOCH_HEADER = "abs.epoch"
# the header of a commits-topic marker: the job key's signature of the sink topic, the marker and its value
SIGNATURE_HEADER = "abs.signature"
# a commit-topic key: the epoch it follows was committed after the checkpoint a restore went back to
_SUPERSEDED = b":superseded"


def _epoch_dir(epoch: int) -> str:
    return f"epoch-{epoch:012d}"


@dataclass(frozen=True, slots=True)
class _Staging:
    """The staging area of one sink task: ``<root>/staging/epoch-<n>/<task>.parquet``."""

    location: StoreLocation
    task_id: str

    def path(self, epoch: int) -> str:
        return self.location.path("staging", _epoch_dir(epoch), f"{self.task_id}.parquet")

    def write(self, epoch: int, table: pa.Table) -> str:
        path = self.path(epoch)
        try:
            ObjectFiles(self.location).write_parquet(path, table)
        except OSError as exc:
            raise StoreError(
                f"staging epoch {epoch} of sink task {self.task_id} at {self.location.uri} failed: {exc}"
            ) from exc
        return path

    def read(self, epoch: int) -> pa.Table:
        try:
            return pq.read_table(self.path(epoch), filesystem=self.location.filesystem)
        except (OSError, pa.ArrowInvalid) as exc:
            raise SinkError(
                f"staged output of epoch {epoch} for sink task {self.task_id} "
                f"is missing or unreadable at {self.path(epoch)}: {exc}"
            ) from exc

    def epochs(self) -> list[int]:
        """Epochs this task has staged output for."""
        selector = pafs.FileSelector(self.location.path("staging"), allow_not_found=True, recursive=True)
        found = []
        for info in self.location.filesystem.get_file_info(selector):
            match = _EPOCH_DIR.search(info.path.rsplit("/", 1)[0])
            if match and info.type == pafs.FileType.File and info.path == self.path(int(match.group(1))):
                found.append(int(match.group(1)))
        return sorted(found)

    def staged(self, epoch: int) -> bool:
        return self.location.filesystem.get_file_info(self.path(epoch)).type == pafs.FileType.File

    def discard(self, epoch: int) -> None:
        self.location.filesystem.delete_file(self.path(epoch))

    def discard_if_staged(self, epoch: int) -> None:
        """What a commit leaves behind when it was cut short (S3's move is a copy then a delete)."""
        try:
            self.discard(epoch)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("sink task %s: staged epoch %d not removed: %s", self.task_id, epoch, exc)


class _TwoPhaseSink:
    """Staging, idempotent commit and recovery; subclasses say how an epoch is
    made visible (``_publish``) and how to tell it already is (``_committed``)."""

    def __init__(self, staging: StoreLocation, task_id: str):
        self._staging = _Staging(staging, task_id)
        self.task_id = task_id

    def stage(self, epoch: int, table: pa.Table) -> str:
        """Phase one: keep ``table`` as epoch ``epoch``'s output (not visible yet)."""
        path = self._staging.write(epoch, table)
        log.debug("sink task %s staged epoch %d (%d rows)", self.task_id, epoch, table.num_rows)
        return path

    def staged_epochs(self) -> list[int]:
        """Epochs staged and not committed yet, ascending."""
        return self._staging.epochs()

    def commit(self, epoch: int) -> bool:
        """Phase two, once checkpoint ``epoch`` is complete.  Returns False when
        the epoch was already committed (nothing is written twice)."""
        if self._committed(epoch) or (not self._staging.staged(epoch) and self._committed_elsewhere(epoch)):
            log.debug("sink task %s: epoch %d already committed", self.task_id, epoch)
            self._staging.discard_if_staged(epoch)
            return False
        self._publish(epoch)
        self._staging.discard_if_staged(epoch)
        log.debug("sink task %s committed epoch %d", self.task_id, epoch)
        return True

    def commit_through(self, completed_checkpoint: int) -> list[int]:
        """Commit every staged epoch up to ``completed_checkpoint`` (an epoch of
        an aborted checkpoint is committed with the next one that completes).
        Returns the epochs committed now."""
        return [epoch for epoch in self._staging.epochs() if epoch <= completed_checkpoint and self.commit(epoch)]

    def recover(self, completed_checkpoint: int) -> Recovery:
        """After a restore to ``completed_checkpoint``: take back what was
        committed after it (a restore to an older checkpoint, or past one that
        failed to verify: the new generation writes that output again), commit
        the staged epochs up to it and discard those after it."""
        retracted, kept = self._retract_after(completed_checkpoint)
        committed, discarded = [], []
        for epoch in self._staging.epochs():
            if epoch <= completed_checkpoint:
                if self.commit(epoch):
                    committed.append(epoch)
            else:
                self._staging.discard(epoch)
                discarded.append(epoch)
        return Recovery(committed, discarded, retracted, kept)

    def _retract_after(self, checkpoint: int) -> tuple[list[int], list[int]]:
        """Committed epochs after ``checkpoint``: (taken back, still visible)."""
        return [], []

    def _committed(self, epoch: int) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def _committed_elsewhere(self, epoch: int) -> bool:
        """Whether another instance committed ``epoch`` since this one looked
        (its staged file is gone: a commit removes it)."""
        return False

    def _publish(self, epoch: int) -> None:  # pragma: no cover - abstract
        """Make staged epoch ``epoch`` visible."""
        raise NotImplementedError


@dataclass(frozen=True)
class Recovery:
    """What ``recover`` did, by epoch: committed now (their checkpoint completed
    before the crash), discarded (staged by the run that failed), retracted
    (committed after the restored checkpoint, moved out of the output) and
    irrevocable (committed after it where nothing can take them back: a Kafka
    transaction; readers have them and the replay writes them again)."""

    committed: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    retracted: list[int] = field(default_factory=list)
    irrevocable: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.committed or self.discarded or self.retracted or self.irrevocable)


class ObjectStoreSink(_TwoPhaseSink):
    """Parquet per epoch and task under ``<root>/output``, visible only after the
    checkpoint that closes the epoch completes."""

    def __init__(self, location: StoreLocation, task_id: str):
        super().__init__(location, task_id)
        self._location = location

    def output_path(self, epoch: int) -> str:
        return self._location.path("output", _epoch_dir(epoch), f"{self.task_id}.parquet")

    def _committed(self, epoch: int) -> bool:
        fs = self._location.filesystem
        return fs.get_file_info(self.output_path(epoch)).type == pafs.FileType.File

    def _retract_after(self, checkpoint: int) -> tuple[list[int], list[int]]:
        """Move this task's committed epochs after ``checkpoint`` from
        ``output/`` to ``retracted/``, where readers of the output do not look."""
        fs = self._location.filesystem
        retracted = []
        try:
            for info in fs.get_file_info(pafs.FileSelector(self._location.path("output"), allow_not_found=True)):
                match = _EPOCH_DIR.search(info.path)
                if not match or int(match.group(1)) <= checkpoint:
                    continue
                epoch = int(match.group(1))
                if not self._committed(epoch):
                    continue
                fs.create_dir(self._location.path("retracted", _epoch_dir(epoch)))
                retracted_path = self._location.path("retracted", _epoch_dir(epoch), f"{self.task_id}.parquet")
                fs.move(self.output_path(epoch), retracted_path)
                if isinstance(fs, pafs.LocalFileSystem):  # a rename keeps the old time; gc's grace counts from now
                    os.utime(retracted_path)
                log.warning(
                    "sink task %s: epoch %d was committed after checkpoint %d, the restored one; "
                    "moved to retracted/ (the new generation writes it again)",
                    self.task_id,
                    epoch,
                    checkpoint,
                )
                retracted.append(epoch)
        except OSError as exc:
            raise StoreError(
                f"sink task {self.task_id}: taking back output committed after checkpoint {checkpoint} failed: {exc}"
            ) from exc
        return sorted(retracted), []

    def _publish(self, epoch: int) -> None:
        staged = self._staging.path(epoch)
        fs = self._location.filesystem
        if not self._staging.staged(epoch):
            raise SinkError(
                f"staged output of epoch {epoch} for sink task {self.task_id} is missing or unreadable at {staged}"
            )
        try:
            fs.create_dir(self._location.path("output", _epoch_dir(epoch)))
            fs.move(staged, self.output_path(epoch))
        except OSError as exc:
            raise StoreError(f"committing epoch {epoch} of sink task {self.task_id} failed: {exc}") from exc


def read_committed_output(location: StoreLocation) -> pa.Table | None:
    """Every committed epoch of an ``ObjectStoreSink`` in epoch order (then task
    order), or None when nothing is committed yet."""
    fs = location.filesystem
    files = [i.path for i in list_files(fs, location.path("output")) if i.path.endswith(".parquet")]
    if not files:
        return None
    return pa.concat_tables([pq.read_table(p, filesystem=fs) for p in files], promote_options="default")


class KafkaSink(_TwoPhaseSink):
    """Rows with ``key`` and ``value`` columns (binary or string; optional
    ``partition``) published to ``topic`` in one transaction per epoch, with a
    commit marker in ``<topic>.commits`` inside the same transaction.
    ``client``: who writes the transactions, ``"java"`` (Kafka's Java client
    in a JVM of its own, on the broker's transaction protocol:
    ``streaming.adapters.kafka_txn``) or ``"python"`` (kafka-python)."""

    def __init__(
        self,
        staging: StoreLocation,
        task_id: str,
        *,
        kafka: KafkaAccess,
        topic: str,
        transactional_id: str,
        delivery_timeout_s: float = DELIVERY_BOUND_S,
        key: JobKey | None = None,
        client: str = "java",
    ):
        super().__init__(staging, task_id)
        self.topic = topic
        # signs the markers of the commits topic; the markers read back must carry its signature
        self._key = key
        # a transaction's sends, commit and abort each end within it (kafka-python's wait for good)
        self.delivery_timeout_s = delivery_timeout_s
        self.commit_topic = f"{topic}.commits"
        self._kafka = kafka
        create_topic(kafka, self.commit_topic, 1, config={"cleanup.policy": "compact"})
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
            [] if self._key is None else [(SIGNATURE_HEADER, _marker_signature(self._key, self.topic, marker, value))]
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
        (idempotent: the topic is compacted by key)."""
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
            if "Fenced" in type(exc).__name__:
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


def read_kafka_output(
    kafka: KafkaAccess, topic: str, *, timeout_ms: int = 3000, key: JobKey | None = None
) -> KafkaOutput:
    """The records a Kafka sink committed to ``topic`` (read_committed),
    without those of epochs its commit topic marks superseded: committed
    after the checkpoint a restore went back to, and written again by the
    restored job.  Records without an ``abs.epoch`` header are kept.  With
    the job's ``key`` (``Connection.job_key(job)``), a superseded mark
    counts only when the job signed it: a forged one hides nothing."""
    superseded = {
        marker[: -len(_SUPERSEDED)]
        for marker in _commit_keys(kafka, f"{topic}.commits", timeout_ms, key=key, topic_of=topic)
        if marker.endswith(_SUPERSEDED)
    }
    values: list[bytes] = []
    skipped: dict[str, int] = {}
    for record in _read_to_end(kafka, topic, timeout_ms):
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
    for record in _read_to_end(kafka, topic, timeout_ms):
        if not record.key:
            continue
        if key is not None:
            signature = dict(record.headers or []).get(SIGNATURE_HEADER)
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


def _read_to_end(kafka: KafkaAccess, topic: str, timeout_ms: int) -> list:
    """Every committed record of ``topic`` (read_committed), partition by
    partition in offset order, up to the end offsets when the read began;
    none when the topic does not exist."""
    consumer = kafka_clients.consumer(
        kafka,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not partitions:
            return []
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records: dict[TopicPartition, list] = {tp: [] for tp in partitions}
        # an open transaction keeps a read_committed reader below the end: stop when nothing comes
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            batch = consumer.poll(timeout_ms=timeout_ms)
            if not batch:
                break
            for tp, got in batch.items():
                records[tp].extend(got)
        return [r for tp in partitions for r in records[tp]]
    finally:
        consumer.close()


# the columns a Delta sink adds to every row: the sink task and the epoch that wrote it
DELTA_COLUMNS = ("_abs_task", "_abs_epoch")
# Delta commits that lose a race with another task's commit (delta-rs retries plain appends
# itself; a delete meeting a concurrent append is refused) are tried again this often
_DELTA_ATTEMPTS = 5


def delta_storage_options(table_uri: str, connection: Connection | None) -> dict[str, str]:
    """How delta-rs reaches the table at ``table_uri``: on the job's S3
    server for an ``s3://`` table (none needed for a local path).  Commits
    are put-if-absent (``If-None-Match``), which the local S3 server honours:
    tasks committing at once each get their own table version."""
    if connection is None or not table_uri.startswith("s3://"):
        return {}
    endpoint = urlparse(connection.s3_endpoint)
    return {
        "AWS_ENDPOINT_URL": connection.s3_endpoint,
        "AWS_ACCESS_KEY_ID": connection.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": connection.s3_secret_key,
        "AWS_REGION": connection.s3_region,
        "AWS_ALLOW_HTTP": str(endpoint.scheme == "http").lower(),
    }


def delta_table_uri(sink: Sink, location: StoreLocation) -> str:
    """Where a Delta sink writes: its ``table``, or ``<sink location>/table``.
    A local path is made absolute (delta-rs and Spark read it alike)."""
    uri = sink.table or f"{location.uri}/table"
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return str(Path(parsed.path if parsed.scheme else uri).expanduser().resolve())
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ConfigError(f"delta sink table {uri!r}: give s3://bucket/path or a local path")
    return uri


class DeltaSink(_TwoPhaseSink):
    """Each epoch's rows appended to the Delta table at ``table_uri`` in one
    commit carrying the application transaction ``app_id`` at the epoch's
    number; ``_abs_task`` (``<job>/<task>``) and ``_abs_epoch`` added to every row."""

    def __init__(
        self,
        staging: StoreLocation,
        task_id: str,
        *,
        table_uri: str,
        app_id: str,
        storage_options: dict[str, str],
        writer: str | None = None,
    ):
        super().__init__(staging, task_id)
        self.table_uri = table_uri
        self.app_id = app_id
        # what the rows' _abs_task says: the job and the task, so that tables shared by jobs keep them apart
        self.writer = writer or task_id
        self._options = storage_options
        self._table: DeltaTable | None = None

    def _loaded(self) -> DeltaTable | None:
        """The table at its latest version, or None while nothing made it."""
        try:
            if self._table is None:
                if not DeltaTable.is_deltatable(self.table_uri, storage_options=self._options):
                    return None
                self._table = DeltaTable(self.table_uri, storage_options=self._options)
            else:
                self._table.update_incremental()
        except (OSError, DeltaError) as exc:
            self._table = None
            raise StoreError(f"sink task {self.task_id}: reading Delta table {self.table_uri} failed: {exc}") from exc
        return self._table

    def committed_version(self) -> int | None:
        """The last epoch this task committed to the table (its application transaction's version)."""
        table = self._loaded()
        return None if table is None else table.transaction_version(self.app_id)

    def _committed(self, epoch: int) -> bool:
        version = self.committed_version()
        return version is not None and version >= epoch

    def _committed_elsewhere(self, epoch: int) -> bool:
        return self._committed(epoch)

    def _publish(self, epoch: int) -> None:
        rows = self._staging.read(epoch)
        if rows.num_rows == 0:  # nothing to add: no commit (the table's log grows only with output)
            return
        rows = rows.append_column(DELTA_COLUMNS[0], pa.array([self.writer] * rows.num_rows, pa.string()))
        rows = rows.append_column(DELTA_COLUMNS[1], pa.array([epoch] * rows.num_rows, pa.int64()))
        properties = CommitProperties(
            app_transactions=[Transaction(self.app_id, epoch)],
            custom_metadata={EPOCH_HEADER: self._marker(epoch)},
        )

        def append() -> None:
            table = self._loaded()
            written = rows if table is None else _as_table_columns(rows, _columns(table), self)
            if table is None:
                _typed_columns(written, self)
            write_deltalake(
                table or self.table_uri,
                written,
                mode="append",
                storage_options=self._options,
                commit_properties=properties,
            )

        self._with_retries(append, f"committing epoch {epoch}", again=lambda: self._committed(epoch))

    def _retract_after(self, checkpoint: int) -> tuple[list[int], list[int]]:
        """This task's rows of epochs after ``checkpoint`` deleted from the
        table, its transaction's version set back to ``checkpoint`` in the
        same commit (so epochs numbered again after it are written again)."""
        table = self._loaded()
        version = None if table is None else table.transaction_version(self.app_id)
        if table is None or version is None or version <= checkpoint:
            return [], []
        epochs = self._epochs_after(table, checkpoint)
        back = CommitProperties(app_transactions=[Transaction(self.app_id, checkpoint)])
        writer = self.writer.replace("'", "''")
        predicate = f"{DELTA_COLUMNS[0]} = '{writer}' AND {DELTA_COLUMNS[1]} > {int(checkpoint)}"

        def take_back() -> None:
            current = self._loaded()
            if current is None:
                return
            if epochs:
                current.delete(predicate, commit_properties=back)
            else:  # nothing to delete (the later epochs had no rows): a commit of no rows sets the version back
                empty = _columns(current).empty_table()
                write_deltalake(current, empty, mode="append", storage_options=self._options, commit_properties=back)

        self._with_retries(take_back, f"taking back epochs after {checkpoint}")
        if epochs:
            log.warning(
                "sink task %s: epochs %s were committed to %s after checkpoint %d, the restored one; "
                "their rows are deleted from the table (the new generation writes them again)",
                self.task_id,
                epochs,
                self.table_uri,
                checkpoint,
            )
        return epochs, []

    def _epochs_after(self, table: DeltaTable, checkpoint: int) -> list[int]:
        if not set(DELTA_COLUMNS) <= set(_columns(table).names):
            return []
        found = table.to_pyarrow_dataset().to_table(
            columns=[DELTA_COLUMNS[1]],
            filter=(pc.field(DELTA_COLUMNS[0]) == self.writer) & (pc.field(DELTA_COLUMNS[1]) > checkpoint),
        )
        return sorted(pc.unique(found[DELTA_COLUMNS[1]]).to_pylist())

    def _marker(self, epoch: int) -> str:
        return f"{self.task_id}:{epoch}"

    def _with_retries(self, commit: Callable[[], object], what: str, again: Callable[[], bool] = lambda: False) -> None:
        """``commit()``, again after a pause while another writer's commit
        wins the race for a table version (at most ``_DELTA_ATTEMPTS`` times;
        ``again()`` says whether a commit that failed went in after all).
        Any other failure is a ``SinkError`` or, when the store is, a ``StoreError``."""
        for attempt in range(1, _DELTA_ATTEMPTS + 1):
            try:
                commit()
                return
            except CommitFailedError as exc:
                self._table = None
                if attempt == _DELTA_ATTEMPTS:
                    raise SinkError(
                        f"sink task {self.task_id}: {what} to Delta table {self.table_uri} lost to other writers "
                        f"{attempt} times: {exc}"
                    ) from exc
                log.info("sink task %s: %s: %s; trying again", self.task_id, what, exc)
                time.sleep(random.uniform(0.05, 0.25) * attempt)
                if again():
                    return
            except SchemaMismatchError as exc:
                raise SinkError(
                    f"sink task {self.task_id}: {what}: the output's columns do not match Delta table "
                    f"{self.table_uri}'s ({exc}); a pipeline whose output changes writes to a new table"
                ) from exc
            except (OSError, DeltaError) as exc:
                self._table = None
                raise StoreError(
                    f"sink task {self.task_id}: {what} to Delta table {self.table_uri} failed: {exc}"
                ) from exc
            except (SinkError, StoreError):
                raise
            except Exception as exc:  # delta-rs raises plain exceptions too (an Arrow cast, a write)
                raise SinkError(
                    f"sink task {self.task_id}: {what} to Delta table {self.table_uri} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc


def _columns(table: DeltaTable) -> pa.Schema:
    """The table's columns as an Arrow schema."""
    return pa.schema(table.schema().to_arrow())


def _as_table_columns(rows: pa.Table, columns: pa.Schema, sink: DeltaSink) -> pa.Table:
    """``rows`` with the table's columns: the same names and types (a column
    of nothing but nulls takes the table's type), else a ``SinkError`` that
    says what differs: nothing is cast silently."""
    if set(rows.column_names) != set(columns.names):
        missing, extra = (
            sorted(set(columns.names) - set(rows.column_names)),
            sorted(set(rows.column_names) - set(columns.names)),
        )
        raise SinkError(
            f"sink task {sink.task_id}: the output's columns do not match Delta table {sink.table_uri}'s "
            f"(missing {missing}, not in the table {extra}); a pipeline whose output changes writes to a new table"
        )
    out = []
    for target in columns:
        column = rows[target.name]
        if column.type == pa.null():
            column = pa.nulls(rows.num_rows, target.type)
        elif not column.type.equals(target.type) and not _same_kind(column.type, target.type):
            raise SinkError(
                f"sink task {sink.task_id}: column {target.name!r} of the output is {column.type}, Delta table "
                f"{sink.table_uri} has {target.type}; a pipeline whose output changes writes to a new table"
            )
        out.append(column.cast(target.type) if not column.type.equals(target.type) else column)
    return pa.table(out, schema=columns)


def _same_kind(given: pa.DataType, kept: pa.DataType) -> bool:
    """Types Delta stores alike (strings and timestamps in their large or zoned forms)."""

    def kind(t: pa.DataType) -> str:
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return "string"
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return "binary"
        if pa.types.is_timestamp(t):
            return "timestamp"
        return str(t)

    return kind(given) == kind(kept)


def _typed_columns(rows: pa.Table, sink: DeltaSink) -> None:
    """The first epoch makes the table: a column of nothing but nulls has no type to give it."""
    untyped = [f.name for f in rows.schema if f.type == pa.null()]
    if untyped:
        raise SinkError(
            f"sink task {sink.task_id}: the first epoch written to Delta table {sink.table_uri} has only nulls in "
            f"{untyped}, so they have no type; give them one in the stage's output (a cast in its operator or Spark code)"
        )


def read_delta_output(table_uri: str, connection: Connection | None = None) -> pa.Table | None:
    """What a Delta sink committed to ``table_uri``, without the sink's own
    columns (``DELTA_COLUMNS``), or None when no table is there yet."""
    options = delta_storage_options(table_uri, connection)
    if not DeltaTable.is_deltatable(table_uri, storage_options=options):
        return None
    table = DeltaTable(table_uri, storage_options=options).to_pyarrow_table()
    return table.drop_columns([c for c in DELTA_COLUMNS if c in table.column_names])


def sink_place(sink: Sink, settings: JobSettings, job: str, connection: Connection | None) -> str:
    """Where ``sink`` of job ``job`` makes its output visible, in words a user can follow."""
    if sink.kind is SinkKind.KAFKA:
        avro = " as Avro registered under " + subject_of(sink.topic or "") if sink.avro is not None else ""
        return f"Kafka topic {sink.topic}{avro} (read it with isolation.level=read_committed)"
    location = sink_location(settings, job, connection)
    if sink.kind is SinkKind.DELTA:
        return f"Delta table {delta_table_uri(sink, location)} (spark.read.format('delta'), or read_delta_output)"
    return f"Parquet under {location.uri}/output (read_committed_output)"


def sink_location(settings: JobSettings, job: str, connection: Connection | None) -> StoreLocation:
    """Where job ``job``'s sinks keep their epochs: ``<store>/<job>/sink``."""
    return open_store(f"{settings.store.rstrip('/')}/{job}/sink", connection)


def open_sink(
    sink: Sink,
    location: StoreLocation,
    task: str,
    *,
    job: str,
    kafka: KafkaAccess,
    connection: Connection | None = None,
    delivery_timeout_s: float = DELIVERY_BOUND_S,
    key: JobKey | None = None,
    kafka_client: str = "java",
) -> ObjectStoreSink | KafkaSink | DeltaSink:
    """The sink of sink task ``task`` of job ``job`` (``connection``: the S3
    server of a Delta sink's ``s3://`` table; ``kafka_client``: which client
    writes a Kafka sink's transactions, ``JobSettings.kafka_sink_client``)."""
    if sink.kind is SinkKind.DELTA:
        uri = delta_table_uri(sink, location)
        return DeltaSink(
            location,
            task,
            table_uri=uri,
            app_id=f"spark-abs/{job}/{task}",
            storage_options=delta_storage_options(uri, connection),
            writer=f"{job}/{task}",
        )
    if sink.kind is SinkKind.KAFKA:
        if sink.topic is None:  # Sink refuses a Kafka sink without one
            raise ConfigError(f"sink task {task}: a Kafka sink names no topic")
        return KafkaSink(
            location,
            task,
            kafka=kafka,
            topic=sink.topic,
            transactional_id=f"spark-abs-{job}-{task}",
            delivery_timeout_s=delivery_timeout_s,
            key=key,
            client=kafka_client,
        )
    return ObjectStoreSink(location, task)


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
