"""Kafka's refusals said as what to set or grant (unit), and on the secured runtime (``local up --secure``): the
job's user reaches its topics; a client without credentials, with a wrong
password, or a user without rights gets a spark-abs error that says what to
set or grant, and never holds a password."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from streaming.adapters.kafka.admin import check_broker, create_topic, end_offsets
from streaming.adapters.kafka.producer import CheckedSends, producer
from streaming.adapters.kafka.ranges import read_range
from streaming.api.config import ENV, KafkaAccess
from streaming.errors import KafkaAccessError, KafkaUnavailableError
from streaming.local.kafka_security import OUTSIDER, BrokerSecurity


def test_kafka_pythons_logged_configuration_holds_no_password():
    import logging

    import streaming.adapters.kafka.clients  # noqa: F401  (installs the filter)

    # a handler on the logger itself: what any handler gets, whatever else the session did to logging
    logger = logging.getLogger("kafka.admin.client")
    seen: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    level, disabled = logger.level, logger.disabled
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.disabled = False
    try:
        logger.debug("configuration: %s", {"sasl_plain_password": "pw-123456"})
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled
    text = "\n".join(seen)
    assert "pw-123456" not in text and "[redacted]" in text


def test_a_refusal_says_what_to_grant_and_no_secret():
    from kafka.errors import SaslAuthenticationFailedError, TransactionalIdAuthorizationFailedError

    from streaming.adapters.kafka.clients import refusal

    access = KafkaAccess("b:9093", "SASL_PLAINTEXT", "PLAIN", "job", "pw-123456")
    denied = refusal(access, TransactionalIdAuthorizationFailedError(), "to use transactional id t")
    assert isinstance(denied, KafkaAccessError)
    assert "did not authorize user 'job' to use transactional id t: grant it the ACLs on the transactional id" in str(
        denied
    )
    failed = refusal(access, SaslAuthenticationFailedError("bad"), "to connect")
    assert "refused user 'job': SASL authentication (PLAIN) failed" in str(failed)
    assert all("pw-123456" not in str(e) for e in (denied, failed))


@pytest.fixture(scope="module")
def job_kafka(secure_connection) -> KafkaAccess:
    return secure_connection.kafka


@pytest.fixture(scope="module")
def outsider(secure_runtime_settings, job_kafka) -> KafkaAccess:
    """A user Kafka knows, with no ACL."""
    return BrokerSecurity(secure_runtime_settings.runtime_dir / "secrets").access(job_kafka.servers, OUTSIDER)


@pytest.fixture(scope="module")
def topic(job_kafka, secure_runtime_settings) -> str:
    """A topic of the job's (under the prefix the runtime granted job ``secured``), one record in it."""
    from spark_abs_examples import money
    from streaming.local import LocalRuntime

    LocalRuntime(secure_runtime_settings).grant(money.pipeline("secured"))
    name = "spark-abs.secured.topic"
    create_topic(job_kafka, name, 1)
    sends = CheckedSends(producer(job_kafka), "a record")
    sends.send(name, value=b"x", partition=0)
    sends.flush()
    sends.close()
    return name


def _password(kafka: KafkaAccess) -> str:
    return kafka.client_options()["sasl_plain_password"]


@pytest.mark.integration
def test_the_jobs_user_reaches_its_topics(job_kafka, topic):
    assert end_offsets(job_kafka, topic, 1)[0] >= 1
    assert read_range(job_kafka, _channel(topic), 0, 1).num_rows == 1


@pytest.mark.integration
def test_a_client_without_credentials_is_told_to_set_them(job_kafka):
    with pytest.raises(
        KafkaUnavailableError, match="if its listener is secured, set SPARK_ABS_KAFKA_SECURITY_PROTOCOL"
    ):
        check_broker(KafkaAccess(job_kafka.servers), 3)


@pytest.mark.integration
def test_a_user_without_rights_is_refused_what_a_job_does(outsider, topic):
    check_broker(outsider, 5)  # it authenticates
    with pytest.raises(KafkaAccessError, match="did not authorize user 'outsider' to create topic 'theirs'.*grant"):
        create_topic(outsider, "theirs", 1)
    with pytest.raises(KafkaAccessError, match=f"did not authorize user 'outsider' to describe topic {topic}"):
        end_offsets(outsider, topic, 1)
    with pytest.raises(KafkaAccessError, match=f"did not authorize user 'outsider' to read topic {topic}"):
        read_range(outsider, _channel(topic), 0, 1)
    sends = CheckedSends(producer(outsider, delivery_timeout_s=10), "a record")
    with pytest.raises(KafkaAccessError, match=f"did not authorize a send of a record to {topic}.*grant") as caught:
        sends.send(topic, value=b"y", partition=0)
        sends.flush()
    sends.close(1)
    assert _password(outsider) not in str(caught.value)


def _channel(topic: str):
    from barriers.messages import ChannelId

    return ChannelId(topic, 0)


@pytest.mark.integration
def test_a_command_given_a_wrong_password_fails_with_one_line_without_it(secure_connection, tmp_path):
    env = {k: v for k, v in {**os.environ, **secure_connection.as_env()}.items() if k != ENV["kafka_password_file"]}
    env[ENV["kafka_password"]] = "wrong-password-0123456789"
    done = subprocess.run(
        [sys.executable, "-m", "streaming.tools.cli", "smoke"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    # said outright, or (kafka-python dropped the refusal that came with the close) as most likely
    assert re.search(r"user 'spark-abs'.* SASL authentication \(SCRAM-SHA-512\) failed — check", done.stderr)
    assert "wrong-password-0123456789" not in done.stderr and "SPARK_ABS_KAFKA_PASSWORD_FILE" in done.stderr
