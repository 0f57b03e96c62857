"""What producers of an ingress topic may say besides their records: how far
event time got on a partition (a watermark record) and that a partition's
input ended (``end_input``).  Both are header-only records with an empty
value, so any Kafka client can write them:

==================  ==========================================================
header              value
==================  ==========================================================
``abs.kind``        ``watermark``
``abs.wm``          the partition's watermark, in event-time milliseconds, as
                    decimal text; ``9223372036854775807`` (``MAX_WATERMARK``)
                    says the partition's input ended
==================  ==========================================================

After the end of its input a partition holds no event time back (its
watermark is +inf), so every window and timer after it closes once the
other inputs end too, and ``spark-abs run --drain`` commits them all.
Records written to a partition after its end are late wherever event time
is followed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from barriers.headers import KIND_HEADER, WATERMARK_HEADER

__all__ = [
    "WATERMARK_KIND",
    "MAX_WATERMARK",
    "watermark_record_headers",
    "end_input",
]

# the abs.kind of a record with only headers that moves its partition's watermark
WATERMARK_KIND = b"watermark"
# the watermark of a partition whose input ended: every window closes
MAX_WATERMARK = (1 << 63) - 1


def watermark_record_headers(watermark: int) -> list[tuple[str, bytes]]:
    """The headers of a record that says event time reached ``watermark``
    (milliseconds) on the partition it is written to."""
    return [(KIND_HEADER, WATERMARK_KIND), (WATERMARK_HEADER, str(int(watermark)).encode())]


def end_input(producer: Any, topic: str, partitions: int | Iterable[int]) -> None:
    """Say that ``partitions`` of ``topic`` (a count: all of ``0..n-1``) will
    get no more input, with ``producer``: a kafka-python ``KafkaProducer``
    (or anything with its ``send(topic, value=, headers=, partition=)``).
    The records are sent, not flushed: flush the producer as usual.

    >>> from kafka import KafkaProducer                     # doctest: +SKIP
    >>> producer = KafkaProducer(bootstrap_servers="localhost:9092")
    >>> end_input(producer, "orders", 4)                   # orders has 4 partitions
    >>> producer.flush()
    """
    chosen = range(partitions) if isinstance(partitions, int) else partitions
    headers = watermark_record_headers(MAX_WATERMARK)
    for partition in chosen:
        producer.send(topic, value=b"", headers=headers, partition=int(partition))
