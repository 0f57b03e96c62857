"""The Kafka sink's transactions written by Kafka's own Java client.

Since Kafka 4.0 a broker runs the second transaction protocol (KIP-890,
``transaction.version`` 2): the producer's epoch goes up with every
transaction, so a late write of an older transaction is refused by the
broker itself.  Only clients that speak it get it: kafka-python and
librdkafka do not (they send ``EndTxn`` of version 3 at most, and the broker
keeps the first protocol for them), nor does the kafka-clients 3.9 in
Spark's session.  So each sink task of a Kafka sink drives one small JVM,
``spark_abs.TransactionalSender`` (``java/``), on kafka-clients
``KAFKA_CLIENTS_VERSION``: a transaction's records go to it over a pipe and
it answers when Kafka committed them, or why not.

The jars are resolved from Maven once into the cache and the class compiled
there on first use (``streaming.adapters.spark.jvm.compile_jar``); every wait on the process
has a bound, named in the error when it passes."""

from __future__ import annotations

import collections
import logging
import os
import queue
import struct
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from streaming.adapters.spark.jars import Artifact, require_tool, resolve_jars
from streaming.adapters.spark.jvm import compile_jar
from streaming.api.config import KafkaAccess, LocalRuntimeSettings
from streaming.errors import KafkaUnavailableError, SinkError, SinkFencedError
from streaming.waits import Deadline, WaitTimeout, join_within

__all__ = ["KAFKA_CLIENTS_VERSION", "JavaTransactions", "sender_classpath", "TxnRecord"]

log = logging.getLogger(__name__)

KAFKA_CLIENTS_VERSION = "4.4.0"
SOURCES = Path(__file__).parent / "java"
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
    ``commit(records)`` writes records in one transaction, streamed to the
    process as it sends them.  Each request, written and answered, ends
    within ``bound_s`` (the delivery timeout, the producer's blocking bound
    and ``_START_MARGIN_S``), or the process is killed and the error says so."""

    def __init__(
        self,
        kafka: KafkaAccess,
        transactional_id: str,
        *,
        delivery_timeout_s: float,
        classpath: Sequence[Path] | None = None,
        heap: str = "256m",
    ):
        self.transactional_id = transactional_id
        block_s = min(60.0, delivery_timeout_s)
        self.bound_s = delivery_timeout_s + block_s + _START_MARGIN_S
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
            "max.block.ms": str(int(block_s * 1000)),
            "client.id": f"spark-abs-sink-{transactional_id}",
        }
        java = require_tool("java")
        jars = os.pathsep.join(map(str, classpath or sender_classpath()))
        self._process = subprocess.Popen(
            [java, f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", jars, _MAIN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # the process ends when this object goes (its stdin closed), even unclosed
        weakref.finalize(self, _end, self._process)
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._said: collections.deque[str] = collections.deque(maxlen=20)  # its last lines on stderr
        # the readers hold the pipes, never this object
        threading.Thread(
            target=_read_answers, args=(self._process.stdout, self._answers), daemon=True, name="txn-answers"
        ).start()
        self._stderr = threading.Thread(
            target=_read_said, args=(self._process.stderr, self._said, transactional_id), daemon=True, name="txn-log"
        )
        self._stderr.start()
        answer = self._request(
            [_framed(_properties(options))], "starting the transactional producer (initTransactions)"
        )
        if answer != "READY":
            self.close()
            raise SinkError(
                f"Kafka sink {transactional_id}: cannot start a transactional producer on {kafka}: "
                f"{answer.removeprefix('ERROR ')}"
            )

    def _request(self, chunks: Iterable[bytes], what: str) -> str:
        """Write ``chunks`` (one request) and read the answer, all within ``bound_s``."""
        if self._process.poll() is not None:
            raise SinkError(f"Kafka sink {self.transactional_id}: its Java producer is gone{self._last_words()}")
        deadline = Deadline(self.bound_s)
        failed: list[BaseException] = []
        stdin = self._process.stdin

        def write() -> None:
            try:
                assert stdin is not None
                for chunk in chunks:
                    stdin.write(chunk)
                stdin.flush()
            except (OSError, ValueError) as exc:  # a closed pipe: the process is gone
                failed.append(exc)

        writer = threading.Thread(target=write, daemon=True, name="txn-request")
        writer.start()
        try:
            join_within(writer, deadline.left(), f"writing the request ({what})", error=WaitTimeout)
        except WaitTimeout:
            self._kill()
            raise self._overdue(what) from None
        if failed:
            raise SinkError(
                f"Kafka sink {self.transactional_id}: its Java producer is gone while {what} "
                f"({failed[0]}){self._last_words()}"
            )
        try:
            answer = self._answers.get(timeout=deadline.left())
        except queue.Empty:
            self._kill()
            raise self._overdue(what) from None
        if answer is None:
            self._kill()
            raise SinkError(
                f"Kafka sink {self.transactional_id}: its Java producer exited "
                f"(code {self._process.returncode}) while {what}{self._last_words()}"
            )
        return answer

    def _overdue(self, what: str) -> KafkaUnavailableError:
        return KafkaUnavailableError(
            f"Kafka sink {self.transactional_id}: {what} took over {self.bound_s:.0f} s (the delivery timeout, "
            "delivery_timeout_s, the producer's blocking bound and 30 s); is Kafka reachable? The Java producer "
            f"was stopped{self._last_words()}"
        )

    def _kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("Kafka sink %s: its Java producer did not exit after SIGKILL", self.transactional_id)
        join_within(self._stderr, 2.0, f"reading the last words of {self.transactional_id}'s Java producer")

    def _last_words(self) -> str:
        return ": " + " | ".join(list(self._said)[-3:]) if self._said else ""

    def commit(self, records: Sequence[TxnRecord], what: str) -> None:
        """``records`` in one transaction, committed when this returns
        (``what`` the transaction is, for the errors): ``SinkFencedError``
        when the broker refused the producer's epoch (a newer instance took
        over), ``SinkError`` when Kafka refused it (it was aborted)."""
        answer = self._request(_transaction(records), what)
        if answer == "OK":
            return
        if answer.startswith("FENCED "):
            raise SinkFencedError(f"Kafka sink {self.transactional_id}: {what}: {answer.removeprefix('FENCED ')}")
        raise SinkError(f"Kafka sink {self.transactional_id}: {what} failed: {answer.removeprefix('ERROR ')}")

    def transaction_version(self) -> int:
        """The cluster's finalized ``transaction.version`` (2: the second protocol)."""
        answer = self._request([b"F"], "reading the cluster's transaction.version")
        if not answer.startswith("FEATURE "):
            raise SinkError(f"Kafka sink {self.transactional_id}: reading transaction.version: {answer}")
        return int(answer.split()[1])

    def producers(self, topic: str, partition: int) -> list[tuple[int, int]]:
        """The producers Kafka has state of on ``topic``'s ``partition``: (producer id, epoch) each."""
        request = b"P" + _framed(topic.encode()) + struct.pack(">i", partition)
        answer = self._request([request], f"describing the producers of {topic}:{partition}")
        if not answer.startswith("PRODUCERS"):
            raise SinkError(f"Kafka sink {self.transactional_id}: describing producers: {answer}")
        return [(int(a), int(b)) for a, b in (p.split(":") for p in answer.split()[1:])]

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the producer and end the process (killed after ``timeout_s``)."""
        if self._process.poll() is None:
            _end(self._process)
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "Kafka sink %s: its Java producer did not stop in %.0f s: killed", self.transactional_id, timeout_s
                )
                self._kill()


def _transaction(records: Sequence[TxnRecord]) -> Iterator[bytes]:
    """A transaction request of ``records``, in chunks of about 1 MiB."""
    chunk = [b"T", struct.pack(">i", len(records))]
    size = 0
    for topic, partition, key, value, headers in records:
        part = [
            _framed(topic.encode()),
            struct.pack(">i", -1 if partition is None else int(partition)),
            _framed(key),
            _framed(value),
            struct.pack(">i", len(headers)),
            *(_framed(name.encode()) + _framed(data) for name, data in headers),
        ]
        chunk += part
        size += sum(map(len, part))
        if size >= 1 << 20:
            yield b"".join(chunk)
            chunk, size = [], 0
    yield b"".join(chunk)


def _end(process: subprocess.Popen) -> None:
    """Ask the sender to close (``Q``, then the end of its stdin): it closes its producer and exits."""
    try:
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.write(b"Q")
            process.stdin.close()
    except (OSError, ValueError):
        pass


def _read_answers(stdout: Any, answers: queue.Queue) -> None:
    for line in stdout:
        answers.put(line.decode(errors="replace").rstrip("\n"))
    answers.put(None)


def _read_said(stderr: Any, said: collections.deque, transactional_id: str) -> None:
    for line in stderr:
        text = line.decode(errors="replace").rstrip()
        if text:
            said.append(text)
            log.debug("%s: %s", transactional_id, text)
