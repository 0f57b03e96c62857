"""What the local runtime fetches once into the cache, each by its service's
module: the Kafka broker's jars (``kafka_broker.broker_artifacts``, resolved
from Maven Central by ``streaming.adapters.spark.jars``), the S3 server binary
built with ``go install`` (``s3_server.build_versitygw``), the schema registry
(Apicurio Registry) built from its Maven Central artifact with Quarkus
(``schema_registry.build``), the Spark Kafka connector's jars and the Kafka
sink's Java client.  The registry only when something asks for it
(``ON_DEMAND``), as ``up`` does for the first job that uses a registry.

A finished build is marked, as a jar set is, by a ``.complete`` file written
last, so an interrupted one is redone rather than used half-way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pyspark

from streaming.adapters.kafka import transactions as kafka_txn
from streaming.adapters.spark import jars
from streaming.api.config import LocalRuntimeSettings
from streaming.errors import ConfigError
from streaming.local import kafka_broker, s3_server, schema_registry
from streaming.local.services import Progress

__all__ = ["FETCHABLE", "ON_DEMAND", "fetch"]

log = logging.getLogger(__name__)

# What `spark-abs local fetch` can resolve into the cache.
FETCHABLE = ("kafka", "s3-server", "spark-connector", "schema-registry", "kafka-sink")
# What `spark-abs local up` fetches only when asked to start what needs it: the schema registry
# (a Maven build of minutes, the first time) is built for the first job that uses one.
ON_DEMAND = ("schema-registry",)


def fetch(
    settings: LocalRuntimeSettings, only: Sequence[str] = FETCHABLE, progress: Progress = log.info
) -> dict[str, list[Path]]:
    """Resolve (once, into ``settings.cache_dir``) the artifacts named in ``only``:
    ``kafka`` jars, the ``s3-server`` binary, the ``spark-connector`` jars,
    the ``schema-registry``'s runnable jar, the ``kafka-sink``'s Java
    client (``streaming.adapters.kafka.transactions``)."""
    unknown = sorted(set(only) - set(FETCHABLE))
    if unknown:
        raise ConfigError(f"cannot fetch {', '.join(unknown)}; choose from {', '.join(FETCHABLE)}")
    s = settings
    fetched: dict[str, list[Path]] = {}
    if "kafka" in only:
        fetched["kafka"] = jars.resolve_jars(
            f"kafka-{s.kafka_version}", kafka_broker.broker_artifacts(s.kafka_version), s.cache_dir, progress
        )
    if "s3-server" in only:
        fetched["s3-server"] = [s3_server.build_versitygw(s.s3_server_version, s.cache_dir, progress)]
    if "schema-registry" in only:
        fetched["schema-registry"] = [schema_registry.build(s.schema_registry_version, s.cache_dir, progress)]
    if "kafka-sink" in only:
        fetched["kafka-sink"] = kafka_txn.sender_classpath(s.cache_dir, progress)
    if "spark-connector" in only:
        fetched["spark-connector"] = jars.connector_jars(
            s.spark_version, s.cache_dir, Path(pyspark.__file__).parent / "jars", progress
        )
    return fetched
