"""Control events signed and verified with the job's key
(``streaming.api.job_key``): an HMAC over the control topic's name and the
event's bytes, in the record's ``abs.sig`` header.  A reader acts on no
event it cannot verify: ``verified_event`` turns unsigned, wrongly signed
and malformed records into a ``RejectedEvent`` with its reason."""

from __future__ import annotations

from barriers.headers import SIGNATURE_HEADER
from streaming.adapters.kafka.control.events import ControlEvent
from streaming.adapters.serde.records import Headers
from streaming.api.job_key import JobKey

__all__ = ["verified_event", "RejectedEvent"]


class RejectedEvent(ValueError):
    """A record of the control topic that no reader may act on: ``kind`` is
    ``unsigned``, ``signature`` (wrongly signed) or ``malformed``."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


def verified_event(
    topic: str, key: JobKey, value: bytes | None, headers: Headers | None, offset: int = -1
) -> ControlEvent:
    """The event a record of the control topic ``topic`` carries, once its
    signature is verified with ``key``; a ``RejectedEvent`` with the reason
    for anything else."""
    signatures = [v for n, v in headers or () if n == SIGNATURE_HEADER]
    if not signatures:
        raise RejectedEvent("unsigned", f"unsigned (no {SIGNATURE_HEADER} header): not written by job {key.job}")
    if len(signatures) > 1 or not key.verify(signatures[0], topic.encode(), value or b""):
        raise RejectedEvent("signature", f"the signature does not match job {key.job}'s key")
    try:
        return ControlEvent.decode(value or b"", offset)
    except ValueError as exc:  # signed, but not an event this version reads
        raise RejectedEvent("malformed", str(exc)) from exc
