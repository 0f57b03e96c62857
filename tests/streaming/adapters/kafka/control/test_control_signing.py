"""Signed control events (``streaming.adapters.kafka.control.signing``): only
an event signed with the job's key, for the job's control topic, verifies;
every other value is rejected with its kind, never an error of another kind."""

from __future__ import annotations

import pytest

from barriers.headers import SIGNATURE_HEADER
from streaming.adapters.kafka.control.events import Complete
from streaming.adapters.kafka.control.signing import RejectedEvent, verified_event
from streaming.api.job_key import JobKey

KEY = JobKey.derive("a secret of the job's operator, long enough", "j", cluster="test-cluster")


def test_only_events_signed_with_the_jobs_key_verify():
    topic = "spark-abs.j.control"
    event = Complete(checkpoint_id=4, generation=1)
    value = event.encode()
    signed = [(SIGNATURE_HEADER, KEY.sign(topic.encode(), value).encode())]
    assert verified_event(topic, KEY, value, signed, 12) == event
    other_job = JobKey.derive("a secret of the job's operator, long enough", "k", cluster="test-cluster")
    other_secret = JobKey.derive("another operator's secret, just as long", "j", cluster="test-cluster")
    forged = Complete(checkpoint_id=5, generation=1).encode()
    cases = [
        (value, [], "unsigned", "unsigned"),
        (forged, signed, "signature", "does not match"),  # a genuine signature on other bytes
        (value, [(SIGNATURE_HEADER, other_job.sign(topic.encode(), value).encode())], "signature", "does not match"),
        (value, [(SIGNATURE_HEADER, other_secret.sign(topic.encode(), value).encode())], "signature", "does not"),
        (value, signed + signed, "signature", "does not match"),
        # a made-up signature of any bytes is rejected, never an error of another kind
        (value, [(SIGNATURE_HEADER, b"\xff")], "signature", "does not match"),
        (value, [(SIGNATURE_HEADER, "é".encode())], "signature", "does not match"),
        (value, [(SIGNATURE_HEADER, None)], "signature", "does not match"),
        (b"{}", [(SIGNATURE_HEADER, KEY.sign(topic.encode(), b"{}").encode())], "malformed", "checkpoint_id"),
    ]
    for data, headers, kind, reason in cases:
        with pytest.raises(RejectedEvent, match=reason) as rejected:
            verified_event(topic, KEY, data, headers)
        assert rejected.value.kind == kind
    # the same event on another job's topic does not verify either
    with pytest.raises(RejectedEvent, match="does not match"):
        verified_event("spark-abs.k.control", KEY, value, signed)
