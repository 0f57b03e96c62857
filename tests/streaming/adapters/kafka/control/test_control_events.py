"""The control events (``streaming.adapters.kafka.control.events``): encoded
and decoded as one, and every malformed value refused with a reason."""

from __future__ import annotations

import pytest

from streaming.adapters.kafka.control.events import Ack, ControlEvent
from streaming.adapters.snapshots import TaskCheckpointMetrics


def test_control_events_round_trip_and_reject_garbage():
    event = Ack(checkpoint_id=7, task="stage-a/0", generation=1, metrics=TaskCheckpointMetrics(state_bytes=12))
    assert ControlEvent.decode(event.encode()) == event
    for bad, reason in [
        (b"\xff", "not JSON"),
        (b"[]", "checkpoint_id"),
        (b'{"kind": "ack"}', "checkpoint_id"),
        (b'{"kind": "hello", "checkpoint_id": 1}', "hello"),
    ]:
        with pytest.raises(ValueError, match=reason):
            ControlEvent.decode(bad)
