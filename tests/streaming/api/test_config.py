"""Settings and connection details: validation with messages that name the
option, and the environment / connection-file round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streaming.api.config import ENV, Connection, KafkaAccess, LocalRuntimeSettings, SparkSettings, default_home
from streaming.errors import ConfigError, RuntimeNotRunningError


def _conn(**over) -> Connection:
    base = dict(
        kafka=KafkaAccess("127.0.0.1:9092"),
        s3_endpoint="http://127.0.0.1:9000",
        s3_access_key="a",
        s3_secret_key="b",
        s3_bucket="bucket",
    )
    return Connection(**{**base, **over})


def test_home_comes_from_the_environment(tmp_path):
    assert default_home({ENV["home"]: str(tmp_path)}) == tmp_path.resolve()
    assert default_home({}) == Path.home() / ".cache" / "spark-abs"


@pytest.mark.parametrize(
    "kwargs, names",
    [
        (dict(kafka_port=70000), "kafka_port"),
        (dict(s3_port=-1), "s3_port"),
        (dict(kafka_port=9000, s3_port=9000), "must differ"),
        (dict(start_timeout_s=0), "start_timeout_s"),
    ],
)
def test_runtime_settings_reject_bad_values(kwargs, names, tmp_path):
    with pytest.raises(ConfigError, match=names):
        LocalRuntimeSettings(home=tmp_path, **kwargs)


def test_cache_defaults_under_home_and_can_be_shared(tmp_path):
    assert LocalRuntimeSettings(home=tmp_path).cache_dir == tmp_path / "cache"
    assert LocalRuntimeSettings(home=tmp_path, cache=tmp_path / "c").cache_dir == tmp_path / "c"


@pytest.mark.parametrize(
    "over, message",
    [
        (dict(kafka=KafkaAccess("127.0.0.1:9092").servers), "kafka must be a KafkaAccess"),
        (dict(s3_endpoint="127.0.0.1:9000"), "SPARK_ABS_S3_ENDPOINT"),
        (dict(s3_bucket=""), "SPARK_ABS_S3_BUCKET"),
    ],
)
def test_connection_names_the_variable_that_is_wrong(over, message):
    with pytest.raises(ConfigError, match=message):
        _conn(**over)


def test_connection_round_trips_through_the_environment():
    conn = _conn(spark_master="spark://m:7077")
    assert Connection.from_env(conn.as_env()) == conn
    assert Connection.from_env({}) is None


def test_connection_from_env_lists_what_is_missing():
    with pytest.raises(ConfigError, match="s3_endpoint"):
        Connection.from_env({ENV["kafka_bootstrap"]: "h:1"})


def test_load_prefers_the_environment_then_the_file(tmp_path):
    settings = LocalRuntimeSettings(home=tmp_path)
    with pytest.raises(RuntimeNotRunningError, match="spark-abs local up"):
        Connection.load(settings, environ={})
    settings.runtime_dir.mkdir(parents=True)
    settings.connection_file.write_text(json.dumps({"connection": _conn().to_dict()}))
    settings.connection_file.chmod(0o600)  # it holds the job secret: the runtime writes it so
    assert Connection.load(settings, environ={}) == _conn()
    other = _conn(kafka=KafkaAccess("elsewhere:9092"))
    assert Connection.load(settings, environ=other.as_env()) == other


def test_a_corrupt_connection_file_is_a_clear_error(tmp_path):
    settings = LocalRuntimeSettings(home=tmp_path)
    settings.runtime_dir.mkdir(parents=True)
    settings.connection_file.write_text("{not json")
    settings.connection_file.chmod(0o600)
    with pytest.raises(ConfigError, match="unreadable"):
        Connection.load(settings, environ={})


def test_spark_settings_validate_extra_conf():
    with pytest.raises(ConfigError, match="not a spark"):
        SparkSettings(extra_conf=(("executor.memory", "1g"),))
    with pytest.raises(ConfigError, match="shuffle_partitions"):
        SparkSettings(shuffle_partitions=0)


# ---- Kafka's security: KafkaAccess


@pytest.fixture
def tls_files(tmp_path) -> dict[str, Path]:
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    for path in files.values():
        path.write_text(f"-----BEGIN {path.stem}-----\n")
    password = tmp_path / "password"
    password.write_text('s3cr3t"pw\n')
    for secret in (files["key"], password):  # secrets: this user's alone
        secret.chmod(0o600)
    return {**files, "password": password}


def _sasl(tls_files, **over) -> KafkaAccess:
    base = dict(
        servers="b1:9093,b2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        username="job",
        password_file=tls_files["password"],
        ca_file=tls_files["ca"],
    )
    return KafkaAccess(**{**base, **over})


@pytest.mark.parametrize(
    "over, message",
    [
        (dict(servers=""), "SPARK_ABS_KAFKA_BOOTSTRAP"),
        (dict(security_protocol="TLS"), "SPARK_ABS_KAFKA_SECURITY_PROTOCOL 'TLS': use one of PLAINTEXT, SSL"),
        (dict(sasl_mechanism=None), "SASL_SSL needs SPARK_ABS_KAFKA_SASL_MECHANISM"),
        (dict(sasl_mechanism="GSSAPI"), "SPARK_ABS_KAFKA_SASL_MECHANISM 'GSSAPI'"),
        (dict(username=None), "needs SPARK_ABS_KAFKA_USERNAME and SPARK_ABS_KAFKA_PASSWORD_FILE"),
        (dict(password_file=None), "needs SPARK_ABS_KAFKA_USERNAME and SPARK_ABS_KAFKA_PASSWORD_FILE"),
        (dict(password="pw"), "give the Kafka password once"),
        (dict(password_file="/nonexistent/pw"), "SPARK_ABS_KAFKA_PASSWORD_FILE: /nonexistent/pw is not a readable"),
        (dict(ca_file="/nonexistent/ca.pem"), "SPARK_ABS_KAFKA_CA_FILE: /nonexistent/ca.pem is not a readable"),
        (dict(security_protocol="SASL_PLAINTEXT"), "SPARK_ABS_KAFKA_CA_FILE given, but .* is SASL_PLAINTEXT"),
        (dict(security_protocol="PLAINTEXT", ca_file=None), "SPARK_ABS_KAFKA_SASL_MECHANISM, SPARK_ABS_KAFKA_USERNAME"),
        (dict(key_file="/x"), "SPARK_ABS_KAFKA_KEY_FILE given without SPARK_ABS_KAFKA_CERT_FILE"),
    ],
)
def test_kafka_access_names_the_variable_that_is_wrong(tls_files, over, message):
    with pytest.raises(ConfigError, match=message):
        _sasl(tls_files, **over)


@pytest.mark.parametrize(("name", "variable"), [("password", "PASSWORD_FILE"), ("key", "KEY_FILE")])
def test_a_kafka_secret_file_others_may_read_is_refused_saying_how_to_fix_it(tls_files, name, variable):
    tls_files[name].chmod(0o644)
    with pytest.raises(ConfigError, match=f"SPARK_ABS_KAFKA_{variable} .* can be read by others .*chmod 600"):
        _sasl(tls_files, cert_file=tls_files["cert"], key_file=tls_files["key"])


def test_an_unreadable_ca_file_is_refused(tls_files):
    tls_files["ca"].chmod(0)
    try:
        import os

        if os.access(tls_files["ca"], os.R_OK):  # root reads anything
            pytest.skip("running as root: every file is readable")
        with pytest.raises(ConfigError, match="SPARK_ABS_KAFKA_CA_FILE"):
            _sasl(tls_files)
    finally:
        tls_files["ca"].chmod(0o600)


def test_kafka_python_gets_the_servers_and_the_security(tls_files):
    assert KafkaAccess("b:9092").client_options() == {"bootstrap_servers": "b:9092", "security_protocol": "PLAINTEXT"}
    assert _sasl(tls_files, cert_file=tls_files["cert"], key_file=tls_files["key"]).client_options() == {
        "bootstrap_servers": "b1:9093,b2:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "job",
        "sasl_plain_password": 's3cr3t"pw',
        "ssl_cafile": str(tls_files["ca"]),
        "ssl_certfile": str(tls_files["cert"]),
        "ssl_keyfile": str(tls_files["key"]),
    }


def test_spark_gets_the_java_clients_settings(tls_files):
    assert KafkaAccess("b:9092").spark_options() == {"kafka.bootstrap.servers": "b:9092"}
    options = _sasl(tls_files, cert_file=tls_files["cert"]).spark_options()
    assert options == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="job" password="s3cr3t\\"pw";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(tls_files["ca"]),
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.location": str(tls_files["cert"]),
    }
    plain = _sasl(tls_files, sasl_mechanism="plain", security_protocol="sasl_plaintext", ca_file=None)
    assert plain.spark_options()["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
    )
    separate = _sasl(tls_files, cert_file=tls_files["cert"], key_file=tls_files["key"]).spark_options()
    assert separate["kafka.ssl.keystore.key"] == "-----BEGIN key-----\n"


def test_secrets_are_in_no_repr_and_str_is_the_servers(tls_files):
    given = _sasl(tls_files, password="hunter2-pw", password_file=None)
    conn = _conn(kafka=given, s3_secret_key="s3-secret-key")
    for shown in (repr(conn), str(conn), repr(given), str(given), repr(LocalRuntimeSettings())):
        assert "hunter2-pw" not in shown and "s3-secret-key" not in shown and "sparkabs-secret" not in shown
    assert str(given) == "b1:9093,b2:9093"
    assert 's3cr3t"pw' not in repr(_sasl(tls_files))


def test_security_round_trips_through_the_environment_with_the_password_file(tls_files):
    conn = _conn(kafka=_sasl(tls_files))
    env = conn.as_env()
    assert env[ENV["kafka_password_file"]] == str(tls_files["password"])
    assert env[ENV["kafka_password"]] == "" and 's3cr3t"pw' not in json.dumps(conn.to_dict())
    assert Connection.from_env(env) == conn
    # over an environment that gives the password the other way (a worker's, inherited), the same connection
    assert Connection.from_env({ENV["kafka_password"]: "inherited", **env}) == conn
    assert Connection.from_dict(conn.to_dict()) == conn
    # a password given in a variable travels on in one (to the job's workers)
    direct = _conn(kafka=_sasl(tls_files, password="pw", password_file=None))
    assert Connection.from_env(direct.as_env()) == direct


def test_protocol_and_mechanism_are_case_insensitive(tls_files):
    access = _sasl(tls_files, security_protocol="sasl_ssl", sasl_mechanism="scram-sha-256")
    assert (access.security_protocol, access.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-256")


def test_the_secure_runtime_is_one_node_under_its_own_home(tmp_path):
    secure = LocalRuntimeSettings.secure(tmp_path)
    assert secure.home == tmp_path / "secure" and secure.cache_dir == tmp_path / "cache" and secure.is_secure
    with pytest.raises(ConfigError, match="kafka_security 'tls'"):
        LocalRuntimeSettings(home=tmp_path, kafka_security="tls")
    with pytest.raises(ConfigError, match="one node"):
        LocalRuntimeSettings.cluster(tmp_path, kafka_security="sasl_ssl")
