"""The control topic (``streaming.adapters.kafka.control.transport``): a send
refused at once is a clear Kafka error; on a real broker, signed events are
delivered in order and every other record is rejected and counted."""

from __future__ import annotations

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError

from barriers.headers import SIGNATURE_HEADER
from streaming.adapters.kafka.admin import job_key
from streaming.adapters.kafka.control.events import Complete, Lease, Progress, Trigger
from streaming.adapters.kafka.control.transport import ControlTopic, send_event
from streaming.api.job_key import JobKey
from streaming.errors import ConfigError, KafkaUnavailableError

KEY = JobKey.derive("a secret of the job's operator, long enough", "j", cluster="test-cluster")


def test_a_send_refused_at_once_is_a_clear_kafka_error_naming_what():
    class NoMetadata:  # kafka-python raises from send() itself when no broker gives the topic's metadata
        def send(self, *args, **kwargs):
            raise KafkaTimeoutError("Failed to update metadata after 60.0 secs.")

    lease = Lease("runner", 3, None, "p:pipeline", "j", "{}", None, {}, {}, 10.0)
    with pytest.raises(KafkaUnavailableError, match="publishing the lease of generation 3 failed: .*metadata"):
        send_event(NoMetadata(), "spark-abs.j.control", lease, KEY, 1.0, "the lease of generation 3")
    with pytest.raises(KafkaUnavailableError, match="publishing a lease event failed"):  # no checkpoint to name
        send_event(NoMetadata(), "spark-abs.j.control", lease, KEY)


@pytest.mark.integration
def test_control_topic_delivers_signed_events_in_order_and_counts_the_rest(connection, unique_name):
    key = job_key(connection, unique_name)
    control = ControlTopic(connection.kafka, unique_name, key)
    heard: list[str] = []
    reader = ControlTopic(connection.kafka, unique_name, key, on_rejected=heard.append)
    first = control.publish(Trigger(checkpoint_id=1, generation=0))
    # anyone else who can write to the topic: garbage, and a well-formed event without the job's key
    forger = KafkaProducer(**connection.kafka.client_options())
    forger.send(control.topic, value=b"garbage", partition=0).get(10)
    forger.send(control.topic, value=Complete(checkpoint_id=1, generation=0).encode(), partition=0).get(10)
    stranger = JobKey.derive("not the secret of this job's operator", unique_name, cluster="test-cluster")
    forger.send(
        control.topic,
        value=(forged := Complete(checkpoint_id=2, generation=0).encode()),
        headers=[(SIGNATURE_HEADER, stranger.sign(control.topic.encode(), forged).encode())],
        partition=0,
    ).get(10)
    forger.close()
    control.publish(Progress(task="t0", generation=0, positions={"a:0": 4}))
    seen = reader.wait_for(lambda e: e.kind == "progress", timeout_s=20)
    assert [(e.kind, e.offset) for e in seen] == [("trigger", first), ("progress", first + 4)]
    assert seen[1].positions == {"a:0": 4}
    assert reader.rejected == {"unsigned": 2, "signature": 1}
    assert sorted(heard) == ["signature", "unsigned", "unsigned"]
    with pytest.raises(ConfigError, match="needs that job's key"):
        ControlTopic(connection.kafka, unique_name, stranger.derive("x" * 40, "another", cluster="test-cluster"))
    control.close()
    reader.close()
