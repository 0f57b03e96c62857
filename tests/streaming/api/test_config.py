"""Settings and connection details: validation with messages that name the
option, and the environment / connection-file round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streaming.api.config import ENV, Connection, LocalRuntimeSettings, SparkSettings, default_home
from streaming.errors import ConfigError, RuntimeNotRunningError


def _conn(**over) -> Connection:
    base = dict(
        kafka_bootstrap="127.0.0.1:9092",
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
        (dict(kafka_bootstrap=""), "SPARK_ABS_KAFKA_BOOTSTRAP"),
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
    assert Connection.load(settings, environ={}) == _conn()
    other = _conn(kafka_bootstrap="elsewhere:9092")
    assert Connection.load(settings, environ=other.as_env()) == other


def test_a_corrupt_connection_file_is_a_clear_error(tmp_path):
    settings = LocalRuntimeSettings(home=tmp_path)
    settings.runtime_dir.mkdir(parents=True)
    settings.connection_file.write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        Connection.load(settings, environ={})


def test_spark_settings_validate_extra_conf():
    with pytest.raises(ConfigError, match="not a spark"):
        SparkSettings(extra_conf=(("executor.memory", "1g"),))
    with pytest.raises(ConfigError, match="shuffle_partitions"):
        SparkSettings(shuffle_partitions=0)
