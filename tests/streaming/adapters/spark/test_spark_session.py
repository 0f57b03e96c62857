"""The Spark session's settings: a local master retries tasks as a cluster
does, and the driver listens on loopback when every executor is local."""

from __future__ import annotations

import pytest

from streaming.adapters.spark.session import LOCAL_DRIVER_ADDRESS, local_master, master_url, spark_conf
from streaming.api.config import SparkSettings


def test_a_local_master_retries_a_task_as_a_cluster_does():
    assert master_url("local[2]") == "local[2,4]" and master_url("local[*]") == "local[*,4]"
    assert master_url("local") == "local[1,4]"
    # a failure count given, or a cluster, is left as it is
    assert master_url("local[2,1]") == "local[2,1]" and master_url("spark://h:7077") == "spark://h:7077"


BIND = ("spark.driver.bindAddress", "spark.driver.host")


LOCAL = ["local", "local[2]", "local[*]", "local[2,4]", "local-cluster[2,1,1024]", "spark://127.0.0.1:7077"]
LOCAL += ["spark://localhost:7077", "spark://[::1]:7077", "spark://127.0.0.1:7077,127.0.0.1:7078"]


@pytest.mark.parametrize("master", LOCAL)
def test_the_driver_of_a_master_on_this_machine_listens_on_loopback_alone(master):
    assert local_master(master)
    conf = spark_conf(SparkSettings(master=master), [])
    assert [conf[key] for key in BIND] == ["127.0.0.1", "127.0.0.1"] == [LOCAL_DRIVER_ADDRESS] * 2
    # its RPC and block manager ports bind that address: no other address is set for them
    assert not {"spark.driver.port", "spark.driver.blockManager.port", "spark.blockManager.port"} & set(conf)
    assert conf["spark.ui.enabled"] == "false"  # the Spark UI (which binds every interface) stays off


@pytest.mark.parametrize(
    "master", ["spark://spark-master:7077", "spark://10.0.0.5:7077", "spark://127.0.0.1:7077,h:7077", "yarn"]
)
def test_a_driver_of_a_master_elsewhere_binds_where_the_deployment_says(master):
    assert not local_master(master)
    assert not set(BIND) & set(spark_conf(SparkSettings(master=master), []))
    given = (("spark.driver.bindAddress", "0.0.0.0"), ("spark.driver.host", "pipeline"))
    assert [spark_conf(SparkSettings(master=master, extra_conf=given), [])[k] for k in BIND] == [
        "0.0.0.0",
        "pipeline",
    ]
    assert [spark_conf(SparkSettings(master="local[2]", extra_conf=given), [])[k] for k in BIND] == [
        "0.0.0.0",
        "pipeline",
    ]


def test_the_session_of_the_local_runtime_has_its_driver_on_loopback(spark, connection):
    assert local_master(connection.spark_master)
    assert [spark.conf.get(key) for key in BIND] == [LOCAL_DRIVER_ADDRESS] * 2


@pytest.mark.parametrize("master", ["spark://spark-master:7077", "spark://10.0.0.5:7077", "yarn", "k8s://h:443"])
def test_a_session_holding_kafkas_credentials_needs_authenticated_encrypted_rpc_to_a_master_elsewhere(master):
    from streaming.adapters.spark.session import unprotected_rpc

    secured = SparkSettings(master=master, carries_secrets=True)
    assert unprotected_rpc(secured, {}) == ["spark.authenticate", "spark.network.crypto.enabled"]
    assert unprotected_rpc(secured, {"spark.authenticate": "true"}) == ["spark.network.crypto.enabled"]
    both = {"spark.authenticate": "true", "spark.network.crypto.enabled": "TRUE"}
    assert unprotected_rpc(secured, both) == []
    assert unprotected_rpc(SparkSettings(master=master), {}) == []  # nothing secret in its options
    for local in LOCAL:
        assert unprotected_rpc(SparkSettings(master=local, carries_secrets=True), {}) == []


def test_spark_redacts_a_kafka_client_keys_pem_and_a_jaas_config_as_it_does_a_password():
    """Spark matches spark.redaction.regex against each option's name and value: its default
    misses kafka.ssl.keystore.key and the PEM in it."""
    import re

    from streaming.adapters.spark.session import REDACTION

    regex = re.compile(REDACTION.removeprefix("(?i)"), re.IGNORECASE)
    options = {
        "kafka.ssl.keystore.key": "-----BEGIN PRIVATE KEY-----\nMIGH...\n-----END PRIVATE KEY-----",
        "kafka.sasl.jaas.config": 'ScramLoginModule required username="u" password="p";',
        "spark.authenticate.secret": "s",
        "fs.s3a.access.key": "a",
    }
    for name in options:
        assert regex.search(name), name
    assert regex.search(options["kafka.ssl.keystore.key"].split("\n")[0])
    default = re.compile(r"secret|password|token|access[.]?key", re.IGNORECASE)
    assert not default.search("kafka.ssl.keystore.key") and not default.search(options["kafka.ssl.keystore.key"])
    for harmless in ("kafka.bootstrap.servers", "subscribe", "startingOffsets", "maxOffsetsPerTrigger"):
        assert not regex.search(harmless), harmless
    assert spark_conf(SparkSettings(), [])["spark.redaction.regex"] == REDACTION
