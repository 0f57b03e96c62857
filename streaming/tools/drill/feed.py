"""A restore drill's traffic on Kafka (``streaming.tools.drill.run``): the
workload it sends while failures go on (``WorkloadFeed``) and the progress
events of the job's tasks it watches on the control topic
(``ProgressWatch``: how far each generation read the ingress channels; with
remote worker groups also the runner's latest lease and each worker's
latest heartbeat), each on a thread of its own until the drill sets their
``stop`` event."""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable

from streaming.adapters.kafka.control.events import Heartbeat, Lease, Progress
from streaming.adapters.kafka.control.transport import ControlTopic
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Pipeline
from streaming.tools.drill.workload import DrillWorkload, InputRecord

__all__ = ["KEPT_BEATS", "ProgressWatch", "WorkloadFeed"]

# the latest heartbeats of each worker whose offsets the watch keeps (the cluster drill appends them again)
KEPT_BEATS = 30


class WorkloadFeed:
    """The workload's records sent at ``rate`` per second until ``stop`` is
    set, then the records that close the input; ``produced`` counts the
    records sent, ``malformed`` holds (channel, offset) of those made
    malformed, ``last`` the last well-formed record sent to each topic,
    ``error`` what ended the sending early."""

    def __init__(
        self,
        kafka: KafkaAccess,
        workload: DrillWorkload,
        pipeline: Pipeline,
        *,
        seed: int,
        rate: float,
        stop: threading.Event,
    ):
        self.kafka = kafka
        self.workload = workload
        self.pipeline = pipeline
        self.seed = seed
        self.rate = rate
        self.stop = stop
        self.error: BaseException | None = None
        self.produced = 0
        self.malformed: list[tuple[str, int]] = []  # (channel, offset) of records made malformed
        self.last: dict[str, InputRecord] = {}  # topic -> the last well-formed record sent to it
        self.thread = threading.Thread(target=self._feed, name="drill-feed", daemon=True)

    def _feed(self) -> None:
        from streaming.adapters.kafka import clients as kafka_clients

        producer = kafka_clients.raw_producer(
            self.kafka,
            acks="all",
            linger_ms=20,
            retries=1_000_000,  # a broker outage is one of the failures: keep trying until it is back
            request_timeout_ms=5_000,
            reconnect_backoff_max_ms=1_000,  # as a Java producer would: back within a second of the broker
            delivery_timeout_ms=600_000,
            max_block_ms=600_000,
        )
        rng = random.Random(self.seed)
        records = self.workload.records(self.pipeline, rng)
        sent = time.monotonic()
        pending = []
        try:
            while not self.stop.is_set():
                record = next(records)
                future = producer.send(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    partition=record.partition,
                )
                if record.malformed:
                    pending.append((record, future))
                else:
                    self.produced += 1
                    self.last[record.topic] = record
                sent += 1.0 / self.rate
                pause = sent - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            for record in self.workload.closing(self.pipeline):
                producer.send(
                    record.topic, value=record.value, headers=list(record.headers), partition=record.partition
                )
            producer.flush(600)
            for record, future in pending:
                metadata = future.get(timeout=60)
                self.malformed.append((f"{record.topic}:{record.partition}", metadata.offset))
        except BaseException as exc:  # noqa: BLE001 - reported by the drill's main loop
            self.error = exc
        finally:
            producer.close()


class ProgressWatch:
    """How far the tasks of each generation read the ingress channels (their
    progress events on the control topic), watched until ``stop`` is set;
    with remote worker groups, who the runner's lease names (``lease``) and
    what each worker said last (``beats``: incarnation -> its heartbeat and
    when it was read, on ``clock``).  ``key``: the job's key, or what gives it
    once the watch starts (it asks Kafka for the cluster's id)."""

    def __init__(
        self,
        kafka: KafkaAccess,
        pipeline: Pipeline,
        key: JobKey | Callable[[], JobKey],
        stop: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.kafka = kafka
        self.job = pipeline.job
        self.key = key
        self.ingress = frozenset(f"{i.topic}:{p}" for i in pipeline.ingress for p in range(i.partitions))
        self.stop = stop
        self.furthest: dict[int, dict[str, int]] = {}
        self.clock = clock
        self.lease: Lease | None = None
        self.beats: dict[str, tuple[Heartbeat, float]] = {}
        # incarnation -> the offsets of its latest heartbeats on the control topic
        self.beat_offsets: dict[str, collections.deque[int]] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._listen, name="drill-control", daemon=True)

    def _listen(self) -> None:
        control = None
        while not self.stop.is_set() or control is None:
            try:
                if control is None:
                    key = self.key if isinstance(self.key, JobKey) else self.key()
                    control = ControlTopic(self.kafka, self.job, key)
                self.take(control.poll(0.5))
            except Exception:  # the broker may be down (a drill's outage): try again
                time.sleep(1.0)
            if self.stop.is_set():
                break
        if control is not None:
            control.close()

    def take(self, events) -> None:
        with self.lock:
            for event in events:
                if isinstance(event, Lease):
                    self.lease = event
                elif isinstance(event, Heartbeat):
                    self.beats[event.incarnation] = (event, self.clock())
                    if event.offset >= 0:  # read from the topic
                        kept = self.beat_offsets.setdefault(event.incarnation, collections.deque(maxlen=KEPT_BEATS))
                        kept.append(event.offset)
                if not isinstance(event, Progress):
                    continue
                reached = self.furthest.setdefault(event.generation, {})
                for channel, position in event.positions.items():
                    if channel in self.ingress:
                        reached[channel] = max(reached.get(channel, 0), position)

    def members(self) -> dict[str, str]:
        """Group -> the incarnation the runner's latest lease names its member (empty before any lease)."""
        with self.lock:
            return dict(self.lease.members) if self.lease is not None else {}

    def heartbeat_offsets(self, incarnation: str) -> list[int]:
        """The offsets of ``incarnation``'s latest heartbeats (at most ``KEPT_BEATS``)."""
        with self.lock:
            return list(self.beat_offsets.get(incarnation, ()))

    def heartbeats(self, since: float) -> dict[str, Heartbeat]:
        """Incarnation -> its latest heartbeat, of those read after ``since`` (on ``clock``)."""
        with self.lock:
            return {incarnation: beat for incarnation, (beat, at) in self.beats.items() if at > since}

    def before(self, generation: int) -> dict[str, int]:
        """The furthest position on each ingress channel of the generations before ``generation``."""
        with self.lock:
            reached: dict[str, int] = {}
            for g, positions in self.furthest.items():
                if g < generation:
                    for channel, position in positions.items():
                        reached[channel] = max(reached.get(channel, 0), position)
            return reached
