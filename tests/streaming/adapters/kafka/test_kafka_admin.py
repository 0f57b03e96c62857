"""``kafka_admin.OffsetsAtTime`` without a broker: one request per topic
for the tasks of a process uploading one checkpoint, answers kept briefly."""

from __future__ import annotations

from barriers.messages import ChannelId
from streaming.adapters.kafka import admin as kafka_admin
from streaming.adapters.kafka.admin import OffsetsAtTime

A0, A1, B0 = ChannelId("a", 0), ChannelId("a", 1), ChannelId("b", 0)


def test_one_request_per_topic_answers_every_task_of_the_process(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(kafka_admin.time, "monotonic", lambda: clock[0])
    offsets = OffsetsAtTime("broker:9092", fresh_s=1.0)
    asked = []

    def query(channels, timestamp_ms):
        asked.append((sorted(map(str, channels)), timestamp_ms))
        return {c: 10 * c.partition for c in channels}

    offsets._query = query
    assert offsets([A0], 5_000) == {A0: 0}  # task a-0's upload
    assert offsets([A1], 5_001) == {A1: 10}  # task a-1's: a partition not asked about yet
    assert offsets([A0], 5_002) == {A0: 0}  # kept
    assert offsets([B0], 9_000) == {B0: 0}  # another topic, its own request
    assert asked == [(["a:0"], 5_000), (["a:0", "a:1"], 5_001), (["b:0"], 9_000)]
    clock[0] += 1.5  # the next checkpoint: every partition of the topic known in one request
    assert offsets([A1], 6_500) == {A1: 10}
    assert offsets([A0], 6_501) == {A0: 0}
    assert asked[3:] == [(["a:0", "a:1"], 6_500)]
