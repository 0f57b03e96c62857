"""Barrier messages: named option constructors, header round trips, and
rejection (with a reason) of anything that only looks like a barrier."""

from __future__ import annotations

import pytest

from barriers import messages
from barriers.messages import (
    UNSIGNED,
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
    headers = encode(barrier, key=UNSIGNED)
    assert all(isinstance(k, str) and isinstance(v, bytes) for k, v in headers)
    assert is_control(headers)
    assert decode(headers, job="payments", key=UNSIGNED) == barrier


def test_cancel_round_trips_and_headers_may_be_a_mapping():
    cancel = CancelBarrier(7, 1, "task b declined", "job")
    assert decode(dict(encode(cancel, key=UNSIGNED)), key=UNSIGNED) == cancel


def test_data_records_are_not_control_records():
    assert not is_control([("abs.gen", b"0"), ("trace", b"x")])
    assert not is_control(None)


def test_signed_barriers_verify_and_forgeries_are_rejected():
    key = b"job-secret"
    here = ChannelId("in", 0)
    barrier = Barrier(5, 0, CheckpointOptions.unaligned(), job="j")
    assert decode(encode(barrier, key=key, channel=here), key=key, channel=here) == barrier
    with pytest.raises(BarrierRejected, match="unsigned"):
        decode(encode(barrier, channel=here, key=UNSIGNED), key=key, channel=here)
    tampered = [(k, b"6" if k == "abs.checkpoint" else v) for k, v in encode(barrier, key=key, channel=here)]
    with pytest.raises(BarrierRejected, match="signature"):
        decode(tampered, key=key, channel=here)
    with pytest.raises(BarrierRejected, match="signature"):
        decode(encode(barrier, key=b"other", channel=here), key=key, channel=here)
    # a signature a writer made up of any bytes is rejected, never an error of another kind
    for made_up in ("é".encode(), b"", ("0" * 64 + "é").encode(), b"\xff"):
        forged = [(k, v) for k, v in encode(barrier, channel=here, key=UNSIGNED) if k != "abs.sig"] + [
            ("abs.sig", made_up)
        ]
        with pytest.raises(BarrierRejected, match="signature|not UTF-8"):
            decode(forged, key=key, channel=here)


def test_a_signed_barrier_verifies_on_its_own_channel_only():
    """A copy of barrier n appended to another channel, ahead of the one the
    upstream task writes there, would cut that channel where no task did:
    the copy names its own channel, under the signature."""
    key = b"job-secret"
    ingress, internal = ChannelId("in", 0), ChannelId("spark-abs.j.a-b", 1)
    for message in (Barrier(5, 2, CheckpointOptions.aligned(), job="j"), CancelBarrier(5, 2, "gone", "j")):
        signed = encode(message, key=key, channel=ingress)
        with pytest.raises(BarrierRejected, match=r"written for channel 'in:0', read from spark-abs.j.a-b:1"):
            decode(signed, job="j", key=key, channel=internal)
        # the channel rewritten to the one it is copied to: the signature no longer matches
        moved = [(k, str(internal).encode() if k == "abs.channel" else v) for k, v in signed]
        with pytest.raises(BarrierRejected, match="signature"):
            decode(moved, job="j", key=key, channel=internal)
        # no channel at all, re-signed by nobody: a job that signs wants one
        bare = [(k, v) for k, v in signed if k != "abs.channel"]
        with pytest.raises(BarrierRejected, match="signature"):
            decode(bare, job="j", key=key, channel=internal)
    with pytest.raises(ValueError, match="names the channel"):
        encode(Barrier(5, job="j"), key=key)


def test_a_signed_barrier_names_its_channel_when_the_job_signs():
    key = b"job-secret"
    # signed by the key's holder without a channel (no encode does that): still refused on a channel
    unbound = encode(Barrier(5, job="j"), channel=ChannelId("in", 0), key=UNSIGNED)
    unbound = [(k, v) for k, v in unbound if k != "abs.channel"]
    unbound.append(("abs.sig", messages._sign(unbound, key).encode()))
    assert decode(unbound, job="j", key=key) == Barrier(5, job="j")
    with pytest.raises(BarrierRejected, match="names no channel"):
        decode(unbound, job="j", key=key, channel=ChannelId("in", 0))


def test_the_signature_tells_headers_apart_whatever_their_values_hold():
    """Each name and value is length-prefixed under the signature: before, a
    value holding NULs could stand for the headers after it."""
    key = b"job-secret"
    here = ChannelId("in", 0)
    signed = dict(encode(CancelBarrier(3, 0, "r", "j"), key=key, channel=here))
    merged = {k: v for k, v in signed.items() if k != "abs.gen"}
    merged["abs.checkpoint"] = signed["abs.checkpoint"] + b"\0abs.gen\0" + signed["abs.gen"]
    with pytest.raises(BarrierRejected, match="signature"):
        decode(list(merged.items()), job="j", key=key, channel=here)


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
    headers = dict(encode(Barrier(3, 0, CheckpointOptions.aligned(), job="j"), key=UNSIGNED))
    for name, value in change.items():
        if value is None:
            headers.pop(name)
        else:
            headers[name] = value
    with pytest.raises(BarrierRejected, match=reason) as caught:
        decode(list(headers.items()), job="j", key=UNSIGNED)
    assert caught.value.reason


def test_a_header_given_twice_is_rejected():
    headers = encode(Barrier(3), key=UNSIGNED) + [("abs.checkpoint", b"4")]
    with pytest.raises(BarrierRejected, match="twice"):
        decode(headers, key=UNSIGNED)


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


def test_a_key_is_given_or_unsigned_is_said_never_left_out():
    barrier = Barrier(5, job="j")
    for call in (lambda: encode(barrier), lambda: decode(encode(barrier, key=UNSIGNED))):
        with pytest.raises(TypeError, match="key"):
            call()
    for key in (None, b"", "text"):
        with pytest.raises(TypeError, match="UNSIGNED said explicitly"):
            encode(barrier, key=key, channel=ChannelId("in", 0))  # type: ignore[arg-type]
