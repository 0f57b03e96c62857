"""The job's key: derived per job and Kafka cluster from the operator's secret,
which comes from a variable or a file only its owner can read and is never
shown; the store's key per job, without Kafka."""

from __future__ import annotations

import os

import pytest

from streaming.api.config import ENV, Connection, KafkaAccess
from streaming.api.job_key import JobKey, generate_secret, read_secret_file, write_secret_file
from streaming.errors import ConfigError

SECRET = "an operator's secret, of more than 32 characters"


def test_each_job_signs_with_a_key_of_its_own_and_nothing_shows_it():
    orders, payments = JobKey.derive(SECRET, "orders", cluster="c1"), JobKey.derive(SECRET, "payments", cluster="c1")
    assert orders == JobKey.derive(SECRET, "orders", cluster="c1")
    assert orders.key != payments.key and orders.barriers not in (orders.key, payments.barriers)
    # the same secret and job on another Kafka cluster (staging's): another key
    staging = JobKey.derive(SECRET, "orders", cluster="c2")
    assert staging.key != orders.key and staging.barriers != orders.barriers
    assert JobKey.store_key(SECRET, "orders") not in (orders.key, staging.key, JobKey.store_key(SECRET, "payments"))
    with pytest.raises(ConfigError, match="bound to its Kafka cluster"):
        JobKey.derive(SECRET, "orders", cluster="")
    signature = orders.sign(b"topic", b"value")
    assert orders.verify(signature, b"topic", b"value") and orders.verify(signature.encode(), b"topic", b"value")
    assert not payments.verify(signature, b"topic", b"value")
    # parts are signed as parts: moving a byte from one to the other changes the signature
    assert not orders.verify(signature, b"topi", b"cvalue")
    assert not orders.verify(None, b"topic", b"value")
    assert repr(orders) == "JobKey(job='orders')"
    connection = Connection(
        KafkaAccess("k:9092"), "http://s3:9000", "access", "s3-secret-value", "b", job_secret=SECRET
    )
    assert SECRET not in repr(connection) and connection.job_key("orders", cluster="c1") == orders
    assert connection.store_key("orders") == JobKey.store_key(SECRET, "orders")


def test_a_short_or_missing_secret_is_refused_saying_what_to_set():
    with pytest.raises(ConfigError, match="fewer than 32"):
        JobKey.derive("short", "orders", cluster="c1")
    with pytest.raises(ConfigError, match=f"no job secret: set {ENV['job_secret']}"):
        Connection(KafkaAccess("k:9092"), "http://s3:9000", "a", "s", "b").store_key("orders")
    assert len(generate_secret()) >= 32 and generate_secret() != generate_secret()


def test_the_secret_comes_from_a_variable_or_a_file_only_its_owner_can_read(tmp_path):
    base = {ENV["kafka_bootstrap"]: "k:9092", ENV["s3_endpoint"]: "http://s3:9000"} | {
        ENV[n]: "x" for n in ("s3_access_key", "s3_secret_key", "s3_bucket")
    }
    from_variable = Connection.from_env(base | {ENV["job_secret"]: SECRET})
    assert from_variable is not None and from_variable.job_secret == SECRET
    assert from_variable.as_env()[ENV["job_secret"]] == SECRET  # what a worker process inherits
    path = tmp_path / "job.secret"
    write_secret_file(path, SECRET)
    assert os.stat(path).st_mode & 0o777 == 0o600
    from_file = Connection.from_env(base | {ENV["job_secret_file"]: str(path)})
    assert from_file is not None and from_file.job_key("orders", cluster="c") == JobKey.derive(
        SECRET, "orders", cluster="c"
    )
    # a worker process is given the file's name, not the secret
    assert from_file.as_env()[ENV["job_secret_file"]] == str(path) and from_file.as_env()[ENV["job_secret"]] == ""
    # a worker started over an environment that names another secret gets its runner's
    inherited = base | {ENV["job_secret"]: "another secret, of more than 32 characters"}
    assert Connection.from_env(inherited | from_file.as_env()) == from_file
    path.chmod(0o640)
    with pytest.raises(ConfigError, match=r"SPARK_ABS_JOB_SECRET_FILE .* can be read by others"):
        from_file.job_key("orders", cluster="c")
    with pytest.raises(ConfigError, match=r"can be read by others \(mode 640\): `chmod 600"):
        read_secret_file(path)
    with pytest.raises(ConfigError, match="cannot be read"):
        read_secret_file(tmp_path / "absent")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_secret_file(tmp_path)
