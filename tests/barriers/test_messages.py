"""Barrier messages: named option constructors, header round trips, and
rejection (with a reason) of anything that only looks like a barrier."""

from __future__ import annotations

import pytest

from barriers.messages import (
    Alignment,
    Barrier,
    BarrierRejected,
    CancelBarrier,
    ChannelId,
    CheckpointOptions,
    InFlightFormat,
    decode,
    encode,
    is_control,
)

OPTIONS = [
    CheckpointOptions.aligned(),
    CheckpointOptions.unaligned(),
    CheckpointOptions.unaligned(InFlightFormat.RECORDS),
    CheckpointOptions.aligned_with_timeout(timeout_ms=250),
    CheckpointOptions.aligned_with_timeout(held_bytes_budget=1 << 20),
    CheckpointOptions.aligned_with_timeout(10, 20, InFlightFormat.RECORDS),
    CheckpointOptions.at_least_once(),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.describe())
def test_barrier_round_trips_through_headers(options):
    barrier = Barrier(42, 3, options, 1_700_000_000_000, "payments")
    headers = encode(barrier)
    assert all(isinstance(k, str) and isinstance(v, bytes) for k, v in headers)
    assert is_control(headers)
    assert decode(headers, job="payments") == barrier


def test_cancel_round_trips_and_headers_may_be_a_mapping():
    cancel = CancelBarrier(7, 1, "task b declined", "job")
    assert decode(dict(encode(cancel))) == cancel


def test_data_records_are_not_control_records():
    assert not is_control([("abs.gen", b"0"), ("trace", b"x")])
    assert not is_control(None)


def test_signed_barriers_verify_and_forgeries_are_rejected():
    key = b"job-secret"
    barrier = Barrier(5, 0, CheckpointOptions.unaligned(), job="j")
    assert decode(encode(barrier, key=key), key=key) == barrier
    with pytest.raises(BarrierRejected, match="unsigned"):
        decode(encode(barrier), key=key)
    tampered = [(k, b"6" if k == "abs.checkpoint" else v) for k, v in encode(barrier, key=key)]
    with pytest.raises(BarrierRejected, match="signature"):
        decode(tampered, key=key)
    with pytest.raises(BarrierRejected, match="signature"):
        decode(encode(barrier, key=b"other"), key=key)
    # a signature a writer made up of any bytes is rejected, never an error of another kind
    for made_up in ("é".encode(), b"", ("0" * 64 + "é").encode(), b"\xff"):
        forged = [(k, v) for k, v in encode(barrier) if k != "abs.sig"] + [("abs.sig", made_up)]
        with pytest.raises(BarrierRejected, match="signature|not UTF-8"):
            decode(forged, key=key)


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"abs.kind": b"snapshot"}, "expected 'barrier' or 'cancel'"),
        ({"abs.checkpoint": None}, "abs.checkpoint is missing"),
        ({"abs.checkpoint": b"-1"}, "not a non-negative integer"),
        ({"abs.checkpoint": b"0"}, "below 1"),
        ({"abs.checkpoint": b"\xff"}, "not UTF-8"),
        ({"abs.gen": b"x"}, "abs.gen"),
        ({"abs.alignment": b"sideways"}, "bad options"),
        ({"abs.timeout_ms": b"5", "abs.alignment": b"unaligned"}, "aligned checkpoints only"),
        ({"abs.job": b"someone-else"}, "belongs to job"),
    ],
)
def test_malformed_barriers_are_rejected_with_a_reason(change, reason):
    headers = dict(encode(Barrier(3, 0, CheckpointOptions.aligned(), job="j")))
    for name, value in change.items():
        if value is None:
            headers.pop(name)
        else:
            headers[name] = value
    with pytest.raises(BarrierRejected, match=reason) as caught:
        decode(list(headers.items()), job="j")
    assert caught.value.reason


def test_a_header_given_twice_is_rejected():
    headers = encode(Barrier(3)) + [("abs.checkpoint", b"4")]
    with pytest.raises(BarrierRejected, match="twice"):
        decode(headers)


def test_option_constructors_validate():
    with pytest.raises(ValueError, match="needs a timeout"):
        CheckpointOptions.aligned_with_timeout()
    with pytest.raises(ValueError, match="aligned checkpoints only"):
        CheckpointOptions(Alignment.UNALIGNED, alignment_timeout_ms=3)
    with pytest.raises(ValueError, match="non-negative"):
        CheckpointOptions.aligned_with_timeout(timeout_ms=-1)
    assert CheckpointOptions.aligned_with_timeout(timeout_ms=5).may_switch_to_unaligned
    assert not CheckpointOptions.aligned().may_switch_to_unaligned


def test_channel_ids_print_and_parse():
    channel = ChannelId("orders.v1", 12)
    assert str(channel) == "orders.v1:12"
    assert ChannelId.parse("orders.v1:12") == channel
    for bad in ("orders", "orders:x", ":1"):
        with pytest.raises(ValueError):
            ChannelId.parse(bad)
    with pytest.raises(ValueError):
        ChannelId("t", -1)


def test_channel_names_round_trip():
    assert ChannelId.parse("money.transfers:3") == ChannelId("money.transfers", 3)
    assert str(ChannelId("orders", 0)) == "orders:0"
    with pytest.raises(ValueError, match="topic:partition"):
        ChannelId.parse("no-partition")
    with pytest.raises(ValueError, match="contain no ':'"):
        ChannelId.parse("a:b:0")  # Kafka topic names have no ':'
