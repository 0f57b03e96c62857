"""The Kafka sink's transactions written by Kafka's own Java client.

Since Kafka 4.0 a broker runs the second transaction protocol (KIP-890,
``transaction.version`` 2): the producer's epoch goes up with every
transaction, so a late write of an older transaction is refused by the
broker itself.  Only clients that speak it get it: kafka-python and
librdkafka do not (they send ``EndTxn`` of version 3 at most, and the broker
keeps the first protocol for them), nor does the kafka-clients 3.9 in
Spark's session.  So each sink task of a Kafka sink drives one small JVM,
``spark_abs.TransactionalSender`` (``jvm_kafka/``), on kafka-clients
``KAFKA_CLIENTS_VERSION``: a transaction's records go to it over a pipe and
it answers when Kafka committed them, or why not.

The jars are resolved from Maven once into the cache and the class compiled
there on first use (``jvm_helpers.compile_jar``); every wait on the process
has a bound, named in the error when it passes."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import struct
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from streaming.adapters.jars import Artifact, require_tool, resolve_jars
from streaming.adapters.jvm_helpers import compile_jar
from streaming.api.config import KafkaAccess, LocalRuntimeSettings
from streaming.errors import KafkaUnavailableError, SinkError, SinkFencedError

__all__ = ["KAFKA_CLIENTS_VERSION", "JavaTransactions", "sender_classpath", "TxnRecord"]

log = logging.getLogger(__name__)

KAFKA_CLIENTS_VERSION = "4.4.0"
SOURCES = Path(__file__).parent / "jvm_kafka"
_MAIN = "spark_abs.TransactionalSender"
# how long the JVM may take to start and fence older instances, beyond the producer's own bound
_START_MARGIN_S = 30.0
# a record of a transaction: topic, partition (None: the partitioner's), key, value, headers
TxnRecord = tuple[str, int | None, bytes | None, bytes | None, Sequence[tuple[str, bytes]]]


def sender_classpath(cache_dir: Path | None = None, progress: Callable[[str], None] = log.info) -> list[Path]:
    """The sender's class and kafka-clients ``KAFKA_CLIENTS_VERSION`` with
    what it needs, resolved and compiled into ``cache_dir`` once."""
    cache_dir = cache_dir or LocalRuntimeSettings().cache_dir
    clients = resolve_jars(
        f"kafka-clients-{KAFKA_CLIENTS_VERSION}",
        [Artifact("org.apache.kafka", "kafka-clients", KAFKA_CLIENTS_VERSION)],
        cache_dir,
        progress,
    )
    sender = compile_jar(
        SOURCES,
        clients,
        f"spark-abs-kafka-txn-{KAFKA_CLIENTS_VERSION}",
        cache_dir,
        what=f"the Kafka sink's transactional sender for kafka-clients {KAFKA_CLIENTS_VERSION}",
        hint="is the JDK's javac installed?",
        progress=progress,
    )
    return [sender, *clients]


def _properties(options: dict[str, str]) -> bytes:
    """Java properties text of ``options`` (backslashes, line ends and the
    separators escaped as ``Properties.load`` reads them)."""

    def escaped(text: str, key: bool = False) -> str:
        text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return text.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ") if key else text

    return "".join(f"{escaped(k, True)}={escaped(v)}\n" for k, v in options.items()).encode()


def _framed(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


class JavaTransactions:
    """One transactional producer of Kafka's Java client, ``transactional_id``
    on ``kafka``: started (fencing any older instance of the id) when made,
    ``commit(records)`` writes records in one transaction.  Each answer is
    awaited within the delivery timeout and ``_START_MARGIN_S``."""

    def __init__(
        self,
        kafka: KafkaAccess,
        transactional_id: str,
        *,
        delivery_timeout_s: float,
        classpath: Sequence[Path] | None = None,
    ):
        self.transactional_id = transactional_id
        self.bound_s = delivery_timeout_s + _START_MARGIN_S
        delivery_ms = int(delivery_timeout_s * 1000)
        request_ms = max(1_000, min(30_000, delivery_ms - 500))
        options = {key.removeprefix("kafka."): value for key, value in kafka.spark_options().items()}
        options |= {
            "transactional.id": transactional_id,
            "enable.idempotence": "true",
            "acks": "all",
            "linger.ms": "5",
            "request.timeout.ms": str(request_ms),
            "delivery.timeout.ms": str(max(delivery_ms, request_ms + 5)),
            "max.block.ms": str(int(min(60.0, delivery_timeout_s) * 1000)),
            "client.id": f"spark-abs-sink-{transactional_id}",
        }
        java = require_tool("java")
        jars = os.pathsep.join(map(str, classpath or sender_classpath()))
        self._process = subprocess.Popen(
            [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", jars, _MAIN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._said: list[str] = []  # the last lines of its stderr, for the errors
        threading.Thread(target=self._read_answers, daemon=True, name=f"txn-{transactional_id}").start()
        threading.Thread(target=self._read_stderr, daemon=True, name=f"txn-log-{transactional_id}").start()
        self._write(_framed(_properties(options)))
        answer = self._answer("starting the transactional producer (initTransactions)")
        if answer != "READY":
            self.close()
            raise SinkError(
                f"Kafka sink {transactional_id}: cannot start a transactional producer on {kafka}: {answer}"
            )

    def _read_answers(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._answers.put(line.decode(errors="replace").rstrip("\n"))
        self._answers.put(None)

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            text = line.decode(errors="replace").rstrip()
            if text:
                self._said = [*self._said[-19:], text]
                log.debug("%s: %s", self.transactional_id, text)

    def _write(self, data: bytes) -> None:
        try:
            assert self._process.stdin is not None
            self._process.stdin.write(data)
            self._process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise SinkError(
                f"Kafka sink {self.transactional_id}: its Java producer is gone ({exc}){self._last_words()}"
            ) from exc

    def _answer(self, what: str) -> str:
        try:
            answer = self._answers.get(timeout=self.bound_s)
        except queue.Empty:
            self.close()
            raise KafkaUnavailableError(
                f"Kafka sink {self.transactional_id}: {what} took over {self.bound_s:.0f} s "
                "(the delivery timeout, delivery_timeout_s, and 30 s); is Kafka reachable?"
            ) from None
        if answer is None:
            self._process.wait(timeout=5)
            raise SinkError(
                f"Kafka sink {self.transactional_id}: its Java producer exited "
                f"(code {self._process.returncode}) while {what}{self._last_words()}"
            )
        return answer

    def _last_words(self) -> str:
        return ": " + " | ".join(self._said[-3:]) if self._said else ""

    def commit(self, records: Iterable[TxnRecord], what: str) -> None:
        """``records`` in one transaction, committed when this returns
        (``what`` the transaction is, for the errors): ``SinkFencedError``
        when a newer instance of the id took over, ``SinkError`` when Kafka
        refused it (it was aborted)."""
        parts = [b"T", b""]
        count = 0
        for topic, partition, key, value, headers in records:
            count += 1
            parts.append(_framed(topic.encode()) + struct.pack(">i", -1 if partition is None else int(partition)))
            parts.append(_framed(key) + _framed(value) + struct.pack(">i", len(headers)))
            parts.extend(_framed(name.encode()) + _framed(data) for name, data in headers)
        parts[1] = struct.pack(">i", count)
        self._write(b"".join(parts))
        answer = self._answer(what)
        if answer == "OK":
            return
        if answer.startswith("FENCED"):
            raise SinkFencedError(f"Kafka sink {self.transactional_id}: {what}: {answer[len('FENCED ') :]}")
        raise SinkError(f"Kafka sink {self.transactional_id}: {what} failed: {answer.removeprefix('ERROR ')}")

    def transaction_version(self) -> int:
        """The cluster's finalized ``transaction.version`` (2: the second protocol)."""
        self._write(b"F")
        answer = self._answer("reading the cluster's transaction.version")
        if not answer.startswith("FEATURE "):
            raise SinkError(f"Kafka sink {self.transactional_id}: reading transaction.version: {answer}")
        return int(answer.split()[1])

    def producers(self, topic: str, partition: int) -> list[tuple[int, int]]:
        """The producers Kafka has state of on ``topic``'s ``partition``: (producer id, epoch) each."""
        self._write(b"P" + _framed(topic.encode()) + struct.pack(">i", partition))
        answer = self._answer(f"describing the producers of {topic}:{partition}")
        if not answer.startswith("PRODUCERS"):
            raise SinkError(f"Kafka sink {self.transactional_id}: describing producers: {answer}")
        return [(int(a), int(b)) for a, b in (p.split(":") for p in answer.split()[1:])]

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the producer and end the process (killed after ``timeout_s``)."""
        if self._process.poll() is None:
            try:
                assert self._process.stdin is not None
                self._process.stdin.write(b"Q")
                self._process.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "Kafka sink %s: its Java producer did not stop in %.0f s: killed", self.transactional_id, timeout_s
                )
                self._process.kill()
                self._process.wait(timeout=5)


def java_available() -> bool:
    """Whether a JDK is on the PATH (the sender needs ``java``, and ``javac`` once)."""
    return shutil.which("java") is not None
