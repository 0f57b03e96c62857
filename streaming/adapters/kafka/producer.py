"""Writing to Kafka, every send accounted for: the producer factory, waits on
the broker bounded by the delivery timeout (``patiently``, ``within``), sends
whose failures are raised (``CheckedSends``), and markers and records
appended to explicit channels, with the offsets Kafka gave them (the barrier
positions, re-routed channel state).

What a barrier's headers say is the business of ``barriers``; this module
only moves bytes and reports offsets."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kafka import KafkaProducer
from kafka.errors import AuthorizationError, KafkaError, KafkaTimeoutError

from barriers.messages import ChannelId
from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.serde.records import Headers
from streaming.api.config import KafkaAccess
from streaming.errors import KafkaAccessError, KafkaUnavailableError
from streaming.waits import call_within, retry

__all__ = [
    "CLOSE_BOUND_S",
    "DELIVERY_BOUND",
    "DELIVERY_BOUND_S",
    "CheckedSends",
    "patiently",
    "within",
    "close_producer",
    "append_markers",
    "write_records",
    "producer",
]

log = logging.getLogger(__name__)


T = TypeVar("T")


# how long a send may wait for the broker: the producer's own delivery timeout (it retries until then);
# a job's ``JobSettings.delivery_timeout_s``
DELIVERY_BOUND_S = 120.0


# how long closing a producer may wait for what it still holds (its owner flushed what it needs before)
CLOSE_BOUND_S = 5.0


def producer(kafka: KafkaAccess, *, delivery_timeout_s: float = DELIVERY_BOUND_S, **options: Any) -> KafkaProducer:
    """A producer on ``kafka``: every replica acknowledges, no lingering,
    unless ``options`` (KafkaProducer's) say otherwise; a send it has not
    delivered within ``delivery_timeout_s`` (retries included) fails; a
    clear error when Kafka cannot be reached."""
    delivery_ms = int(delivery_timeout_s * 1000)
    linger_ms = int(options.get("linger_ms", 0))
    # Kafka's rule: a request times out before the delivery does
    request_ms = max(1_000, min(30_000, delivery_ms - linger_ms - 500))
    defaults = {
        "acks": "all",
        "linger_ms": 0,
        "delivery_timeout_ms": max(delivery_ms, request_ms + linger_ms),
        "request_timeout_ms": request_ms,
    }
    return kafka_clients.raw_producer(kafka, **{**defaults, **options})


# what a bound is called in the errors that name it, by default: the producers' own
DELIVERY_BOUND = "the delivery timeout, delivery_timeout_s"


def patiently(
    step: Callable[[float], T], what: str, bound_s: float = DELIVERY_BOUND_S, bound: str = DELIVERY_BOUND
) -> T:
    """``step(timeout_s)`` (a send's ``get``, a ``flush``) again while it times
    out, for at most ``bound_s`` (``waits.retry``): while the broker is
    unreachable the producer retries the send itself (idempotently, so
    nothing is written twice) and this waits, saying so with growing pauses.
    A ``KafkaUnavailableError`` naming ``what`` and the bound (``bound`` says
    which it is) when the bound passes or the send fails."""
    try:
        return retry(
            lambda: step(min(2.0, bound_s)),
            bound_s,
            f"Kafka taking {what}",
            retry_on=KafkaTimeoutError,
            bound=bound,
            first_s=0.5,
            max_s=8.0,
            cause="the broker looks unreachable",
            logger=log,
            error=lambda message: KafkaUnavailableError(
                f"Kafka did not take {what} within {bound_s:g} s ({bound}): is the broker reachable?"
            ),
        )
    except AuthorizationError as exc:
        raise _unauthorized(what, exc) from exc
    except KafkaError as exc:
        raise KafkaUnavailableError(f"{what} failed: {exc}") from exc


def _unauthorized(what: str, exc: BaseException, topic: str | None = None) -> KafkaAccessError:
    where = f" to {topic}" if topic else ""
    return KafkaAccessError(
        f"Kafka did not authorize {what}{where} ({type(exc).__name__}): grant the job's user the ACLs a job "
        f"needs (see {kafka_clients.GRANT_DOC})"
    )


def close_producer(producer: KafkaProducer, what: str, timeout_s: float = CLOSE_BOUND_S) -> None:
    """Close ``producer`` waiting at most ``timeout_s`` for what it still
    holds; what Kafka did not take by then is dropped, with a warning (its
    owner flushed what it needed before: this is the way out)."""
    try:
        producer.close(timeout=timeout_s)
    except KafkaError as exc:
        # kafka-python's close raises from its flush before it stops its sender thread: stop it here
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()
        log.warning(
            "closing the producer of %s: records not taken by Kafka within %g s dropped (%s)", what, timeout_s, exc
        )


def within(call: Callable[[], T], bound_s: float, what: str, bound: str = DELIVERY_BOUND) -> T:
    """``call()`` waited for at most ``bound_s`` (``waits.call_within``), for
    the calls of kafka-python that take no timeout (a transaction's commit or
    abort waits for the broker for good).  It runs on a thread of its own;
    when the bound passes, a ``KafkaUnavailableError`` naming ``what`` and the
    bound (``bound`` says which; the call is left to end on its own: whoever
    called fails, and the job restores)."""
    return call_within(
        call,
        bound_s,
        what,
        bound=bound,
        error=lambda message: KafkaUnavailableError(
            f"{what} did not finish within {bound_s:g} s ({bound}): is the broker reachable?"
        ),
    )


class CheckedSends:
    """The sends of one ``producer``, each known to succeed or fail: a send
    whose future failed (the broker refused it, or it outlasted the delivery
    timeout while Kafka was away) is remembered, and ``flush`` raises it, so
    whoever forwards a barrier or acknowledges a snapshot after the flush
    never counts a record Kafka does not hold.  kafka-python's own ``flush``
    returns without a word for batches that expired.

    ``bound_s`` bounds ``wait`` and ``flush()`` (``patiently``); ``what``
    names the sends in its errors.  Shared by the threads of a worker: one
    failed send fails them all (the worker exits and the job restores) until
    ``abandon`` gives the sends so far up with their generation."""

    def __init__(self, producer: KafkaProducer, what: str, bound_s: float = DELIVERY_BOUND_S):
        self.producer = producer
        self.what = what
        self.bound_s = bound_s
        self._failure: tuple[str, BaseException] | None = None
        # the sends of one generation: a failure of an abandoned one's is not the next one's
        self._epoch = 0

    def send(self, topic: str, **record: Any) -> Any:
        """``producer.send(topic, **record)``, its outcome watched; its future."""
        self.check()
        try:
            future = self.producer.send(topic, **record)
        except KafkaError as exc:
            raise KafkaUnavailableError(f"sending {self.what} to {topic} failed: {exc}") from exc
        future.add_errback(self._failed, topic, self._epoch)
        return future

    def _failed(self, topic: str, epoch: int, exc: BaseException) -> None:
        if self._failure is None and epoch == self._epoch:
            self._failure = (topic, exc)
            log.error("a send of %s to %s failed: %s", self.what, topic, exc)

    def check(self) -> None:
        """A ``KafkaUnavailableError`` if a send failed."""
        if self._failure is not None:
            topic, exc = self._failure
            if isinstance(exc, AuthorizationError):
                raise _unauthorized(f"a send of {self.what}", exc, topic)
            raise KafkaUnavailableError(
                f"a send of {self.what} to {topic} failed ({type(exc).__name__}: {exc}); the task fails rather "
                f"than go on without the record, and the job restores from its latest checkpoint"
            )

    def flush(self, timeout: float | None = None) -> None:
        """As kafka-python's ``flush``, checked: with ``timeout``, a
        ``KafkaTimeoutError`` when the sends are not done by then (for
        ``patiently`` to wait again); without, ``wait`` for ``bound_s``.  A
        ``KafkaUnavailableError`` if a send failed."""
        if timeout is None:
            self.wait(self.bound_s)
            return
        self.producer.flush(timeout=timeout)
        self.check()

    def wait(self, bound_s: float, bound: str = DELIVERY_BOUND) -> None:
        """Every send so far has succeeded or failed, waited for at most
        ``bound_s`` (``bound`` names it); a ``KafkaUnavailableError`` when the
        bound passes or a send failed."""
        patiently(lambda t: self.producer.flush(timeout=t), self.what, bound_s, bound)
        self.check()

    def abandon(self, timeout_s: float) -> str | None:
        """The sends so far belong to a generation the job gave up (it
        restores): wait for them at most ``timeout_s``, then forget them and
        what failed (one of them failing later is not the next generation's
        concern), so the next generation's sends start clean.  What failed,
        said, or None."""
        try:
            self.wait(timeout_s, "the stop of a generation")
        except KafkaUnavailableError as exc:
            return str(exc)
        finally:
            self._epoch += 1
            self._failure = None
        return None

    def close(self, timeout_s: float = CLOSE_BOUND_S) -> None:
        close_producer(self.producer, self.what, timeout_s)


def append_markers(
    producer: KafkaProducer, markers: Mapping[ChannelId, Headers], timeout_s: float = DELIVERY_BOUND_S
) -> dict[ChannelId, int]:
    """Append one empty record to each channel of ``markers``, carrying that
    channel's headers, and return the offset each got.  Everything sent to a
    channel before this call comes before the marker (the producer is flushed
    first).  While the broker is unreachable this waits, up to ``timeout_s``
    (``patiently``)."""
    patiently(lambda t: producer.flush(timeout=t), "the records before a marker", timeout_s)
    futures = {
        c: producer.send(c.topic, value=b"", headers=list(headers), partition=c.partition)
        for c, headers in markers.items()
    }
    return {
        channel: patiently(future.get, f"a marker for {channel}", timeout_s).offset
        for channel, future in futures.items()
    }


def write_records(
    producer: KafkaProducer,
    records: Mapping[ChannelId, Sequence[bytes]],
    headers: Headers,
    timeout_s: float = DELIVERY_BOUND_S,
) -> dict[ChannelId, tuple[int, int]]:
    """Write ``records`` (values, in order) to each channel with ``headers``
    and return the offset range ``[first, last + 1)`` each channel's got."""
    futures = {
        channel: [
            producer.send(channel.topic, value=v, headers=list(headers), partition=channel.partition) for v in values
        ]
        for channel, values in records.items()
        if values
    }
    patiently(lambda t: producer.flush(timeout=t), "re-routed channel state", timeout_s)
    written = {}
    for channel, sent in futures.items():
        first = patiently(sent[0].get, f"re-routed records for {channel}", timeout_s).offset
        last = patiently(sent[-1].get, f"re-routed records for {channel}", timeout_s).offset
        written[channel] = (first, last + 1)
    return written
