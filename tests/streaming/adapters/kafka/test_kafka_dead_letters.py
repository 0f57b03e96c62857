"""The dead-letter topic on a real broker: a dead letter keeps the record and
its reason, and one too large to send is cut with a note of what it was."""

from __future__ import annotations

import hashlib

import pytest

from barriers.messages import ChannelId
from streaming.adapters.kafka.dead_letters import DeadLetterTopic, fit_dead_letter


@pytest.mark.integration
def test_dead_letters_keep_the_record_and_its_reason(connection, unique_name, read_partition):
    letters = DeadLetterTopic(connection.kafka, unique_name)
    letters.send(ChannelId("in", 1), 42, b"k", b"{broken", [("h", b"v")], "value is not JSON")
    # a record larger than the producer may send is kept truncated, with a note, not lost and
    # not failing the task (before: kafka-python refused it, MessageSizeTooLargeError)
    huge = bytes(range(256)) * 8192  # 2 MiB
    letters.send(ChannelId("in", 0), 7, b"k", huge, [("h", b"v")], "value is not JSON")
    letters.flush()
    assert letters.count == 2
    record, cut = read_partition(connection.kafka, letters.topic, 0)
    headers = dict(record.headers)
    assert (record.key, record.value) == (b"k", b"{broken")
    assert headers["spark-abs-reason"] == b"value is not JSON" and "spark-abs-truncated" not in headers
    assert (headers["spark-abs-source"], headers["spark-abs-source-offset"], headers["h"]) == (b"in:1", b"42", b"v")

    headers = dict(cut.headers)
    assert 900_000 < len(cut.value) < 1 << 20 and huge.startswith(cut.value)
    assert headers["spark-abs-truncated"] == b"value"
    assert headers["spark-abs-original-bytes"] == str(len(huge)).encode()
    assert headers["spark-abs-original-sha256"] == hashlib.sha256(huge).hexdigest().encode()
    assert headers["spark-abs-reason"] == b"value is not JSON" and headers["h"] == b"v"
    letters.close()


def test_a_dead_letter_too_large_to_send_is_cut_with_a_note_of_what_it_was():
    notes = [("spark-abs-reason", b"value is not JSON")]
    assert fit_dead_letter(b"k", b"v" * 100, [("h", b"x")], notes, 1000) == (b"k", b"v" * 100, [("h", b"x"), *notes])

    value = bytes(range(256)) * 40
    key, cut, headers = fit_dead_letter(b"k", value, [("h", b"x")], notes, 4000)
    said = dict(headers)
    assert key == b"k" and value.startswith(cut) and 3000 < len(cut) < 4000
    assert said["spark-abs-truncated"] == b"value" and said["h"] == b"x"
    assert said["spark-abs-original-bytes"] == b"10240"
    assert said["spark-abs-original-sha256"] == hashlib.sha256(value).hexdigest().encode()

    # headers alone over the size: they go too, and the key is cut
    key, cut, headers = fit_dead_letter(b"k" * 5000, value, [("h", b"x" * 5000)], notes, 4000)
    said = dict(headers)
    assert said["spark-abs-truncated"] == b"value,headers,key" and "h" not in said
    assert len(key) == 1000 and value.startswith(cut)
    assert sum(len(k) + len(v) for k, v in headers) + len(key) + len(cut) < 4000
