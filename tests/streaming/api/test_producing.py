"""What producers of an ingress topic may write besides their records,
without a broker: the headers of a watermark record, and ``end_input``'s
records (one header-only record per partition, carrying ``MAX_WATERMARK``)
sent through a fake producer with kafka-python's ``send``."""

from __future__ import annotations

import pytest

from barriers.headers import KIND_HEADER, WATERMARK_HEADER
from streaming.api.producing import MAX_WATERMARK, WATERMARK_KIND, end_input, watermark_record_headers
from streaming.engine.task.watermarks import watermark_headers

_END = [("abs.kind", b"watermark"), ("abs.wm", b"9223372036854775807")]


class _Producer:
    """What ``end_input`` may call of a ``KafkaProducer``: ``send`` records
    what it is given; ``flush`` counts, so a test can tell it was not called."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes, list[tuple[str, bytes]]]] = []
        self.flushes = 0

    def send(self, topic, *, value, headers, partition):
        self.sent.append((topic, partition, value, headers))

    def flush(self):
        self.flushes += 1


def test_the_end_of_input_is_the_largest_signed_64_bit_watermark():
    assert MAX_WATERMARK == 9223372036854775807 == 2**63 - 1
    assert WATERMARK_KIND == b"watermark"


def test_watermark_record_headers_say_the_kind_and_the_watermark_as_decimal_text():
    assert KIND_HEADER == "abs.kind" and WATERMARK_HEADER == "abs.wm"
    assert watermark_record_headers(1_700_000_000_123) == [("abs.kind", b"watermark"), ("abs.wm", b"1700000000123")]


@pytest.mark.parametrize(
    ("watermark", "text"),
    [(0, b"0"), (-5, b"-5"), (12.9, b"12"), (MAX_WATERMARK, b"9223372036854775807")],
)
def test_a_watermark_is_written_as_whole_milliseconds(watermark, text):
    assert watermark_record_headers(watermark)[1] == ("abs.wm", text)


def test_a_producer_s_watermark_headers_are_those_the_engine_writes_between_tasks():
    for watermark in (0, 250, MAX_WATERMARK):
        assert watermark_record_headers(watermark) == watermark_headers(watermark)


def test_end_input_of_a_partition_count_ends_every_partition_from_zero():
    producer = _Producer()
    end_input(producer, "orders", 3)
    assert producer.sent == [("orders", 0, b"", _END), ("orders", 1, b"", _END), ("orders", 2, b"", _END)]


def test_end_input_of_chosen_partitions_ends_only_those_in_their_order():
    producer = _Producer()
    end_input(producer, "orders", [5, 2])
    assert [(topic, partition) for topic, partition, _, _ in producer.sent] == [("orders", 5), ("orders", 2)]
    assert all(value == b"" and headers == _END for _, _, value, headers in producer.sent)


def test_end_input_sends_partitions_as_ints():
    producer = _Producer()
    end_input(producer, "orders", ("1", 3.0))
    partitions = [partition for _, partition, _, _ in producer.sent]
    assert partitions == [1, 3]
    assert all(type(p) is int for p in partitions)


def test_end_input_of_no_partitions_sends_nothing():
    producer = _Producer()
    end_input(producer, "orders", 0)
    end_input(producer, "orders", [])
    assert producer.sent == []


def test_end_input_sends_without_flushing():
    producer = _Producer()
    end_input(producer, "orders", 2)
    assert len(producer.sent) == 2
    assert producer.flushes == 0
