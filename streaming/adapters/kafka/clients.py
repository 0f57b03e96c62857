"""Every kafka-python client of spark-abs, made in one place from a
``KafkaAccess`` (servers and security), and Kafka's refusals turned into
errors that say what to set or grant (``refusal``).  The Spark side of the
same access is ``KafkaAccess.spark_options``."""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Iterator
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import (
    AuthorizationError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)

from streaming.api.config import ENV, KafkaAccess
from streaming.errors import KafkaAccessError, KafkaUnavailableError

__all__ = ["RECONNECT", "GRANT_DOC", "admin", "consumer", "raw_producer", "refusal"]

# every Kafka client of the engine: after a broker came back, try it again within a second (as Java
# clients do); kafka-python's own default lets the wait grow to 30 s, so a 6-second broker outage kept
# producers and tasks away for up to half a minute more
RECONNECT = {"reconnect_backoff_max_ms": 1_000}

GRANT_DOC = "docs/operations/security-kafka.md"

# what a principal lacks, by the error Kafka answered with
_RESOURCES = {
    TopicAuthorizationFailedError: "the topic",
    GroupAuthorizationFailedError: "the consumer group",
    TransactionalIdAuthorizationFailedError: "the transactional id",
    ClusterAuthorizationFailedError: "the cluster",
}


class _Refusals(logging.Handler):
    """What kafka-python logged, and otherwise swallowed, while bootstrapping:
    a failed SASL authentication or TLS handshake, or connections the broker
    closed (it retries, then reports a mere timeout)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[BaseException] = []
        self.closed = 0

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        self.seen += [
            a for a in args if isinstance(a, SaslAuthenticationFailedError | AuthorizationError | ssl.SSLError)
        ]
        self.closed += sum(isinstance(a, KafkaConnectionError) and "disconnected" in str(a) for a in args)


@contextlib.contextmanager
def _explained(kafka: KafkaAccess, doing: str) -> Iterator[None]:
    """Kafka's refusals met inside, or a client's error, as ``refusal`` says them."""
    watch, logger = _Refusals(), logging.getLogger("kafka")
    logger.addHandler(watch)
    try:
        yield
    except KafkaError as exc:
        if watch.seen:
            raise refusal(kafka, watch.seen[-1], doing) from exc
        if watch.closed and kafka.sasl_mechanism is not None:
            # a broker sends its SASL refusal as it closes the connection, and kafka-python drops what
            # came with the close: a connection closed (after TLS, so not TLS) is most likely a refusal
            raise KafkaAccessError(
                f"Kafka at {kafka} closed every connection of user {kafka.username!r} {doing}: most likely "
                f"SASL authentication ({kafka.sasl_mechanism}) failed — check {ENV['kafka_username']} and "
                f"{ENV['kafka_password_file']} (or {ENV['kafka_password']}), and {ENV['kafka_sasl_mechanism']}"
            ) from exc
        raise refusal(kafka, exc, doing) from exc
    finally:
        logger.removeHandler(watch)


def _redacted(record: logging.LogRecord) -> bool:
    """kafka-python's admin client logs its configuration (at DEBUG): the password out of it."""

    def clean(arg: object) -> object:
        if isinstance(arg, dict) and arg.get("sasl_plain_password"):
            return {**arg, "sasl_plain_password": "[redacted]"}
        return arg

    # a lone mapping argument is the record's args itself
    record.args = tuple(map(clean, record.args)) if isinstance(record.args, tuple) else clean(record.args)  # type: ignore[assignment]
    return True


logging.getLogger("kafka.admin.client").addFilter(_redacted)


def consumer(kafka: KafkaAccess, **options: Any) -> KafkaConsumer:
    """A consumer on ``kafka`` with KafkaConsumer's ``options``."""
    with _explained(kafka, "to open a consumer"):
        return KafkaConsumer(**{**RECONNECT, **options, **kafka.client_options()})


def raw_producer(kafka: KafkaAccess, **options: Any) -> KafkaProducer:
    """A producer on ``kafka`` with KafkaProducer's ``options`` as given
    (``streaming.adapters.kafka.producer.producer`` adds the engine's defaults)."""
    with _explained(kafka, "to open a producer"):
        return KafkaProducer(**{**RECONNECT, **options, **kafka.client_options()})


def admin(kafka: KafkaAccess, timeout_s: float = 15.0, client_id: str = "spark-abs-admin") -> KafkaAdminClient:
    """An admin client on ``kafka``; KafkaUnavailableError (KafkaAccessError
    when refused) when no broker lets it in within ``timeout_s``."""
    with _explained(kafka, "to connect"):
        return KafkaAdminClient(
            client_id=client_id,
            request_timeout_ms=int(timeout_s * 1000),
            bootstrap_timeout_ms=int(timeout_s * 1000),
            **RECONNECT,
            **kafka.client_options(),
        )


def refusal(kafka: KafkaAccess, exc: BaseException, doing: str, otherwise: str | None = None) -> KafkaUnavailableError:
    """The spark-abs error for ``exc``, raised by a client of ``kafka`` while
    ``doing`` (e.g. "to write topic T"): a KafkaAccessError that says what to
    set or grant when Kafka refused the client, else a KafkaUnavailableError
    saying ``otherwise`` (by default: no broker let the client in).  Neither
    holds a secret (kafka-python's messages hold none either)."""
    who = f"user {kafka.username!r}" if kafka.username else "this client"
    if isinstance(exc, SaslAuthenticationFailedError | UnsupportedSaslMechanismError):
        return KafkaAccessError(
            f"Kafka at {kafka} refused {who}: SASL authentication ({kafka.sasl_mechanism}) failed — check "
            f"{ENV['kafka_username']} and {ENV['kafka_password_file']} (or {ENV['kafka_password']}), and "
            f"{ENV['kafka_sasl_mechanism']}"
        )
    if isinstance(exc, AuthorizationError):
        resource = next((what for kind, what in _RESOURCES.items() if isinstance(exc, kind)), "the resource")
        return KafkaAccessError(
            f"Kafka at {kafka} did not authorize {who} {doing}: grant it the ACLs on {resource} that a job "
            f"needs (see {GRANT_DOC}) ({type(exc).__name__})"
        )
    if isinstance(exc, ssl.SSLError) or "SSL" in str(exc) or "certificate" in str(exc):
        return KafkaAccessError(
            f"Kafka at {kafka}: the TLS handshake failed {doing} ({exc}) — check "
            f"{ENV['kafka_ca_file']} (the CA that signed the brokers' certificates)"
        )
    if otherwise is not None:
        return KafkaUnavailableError(f"{otherwise}: {exc}")
    if kafka.security_protocol.endswith("SSL"):
        hint = f"; if it is up, check {ENV['kafka_ca_file']} (the CA of the brokers' certificates)"
    elif kafka.is_secured:
        hint = ""
    else:
        hint = f"; if its listener is secured, set {ENV['kafka_security_protocol']} and the credentials ({GRANT_DOC})"
    return KafkaUnavailableError(
        f"no Kafka broker answers at {kafka} ({who}, {doing}: {exc}); "
        f"is the runtime up (`spark-abs local status`)?{hint}"
    )
