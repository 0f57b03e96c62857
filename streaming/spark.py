"""The one Spark session factory: every stage query and tool gets its session
here, with Spark's Kafka connector on the classpath (resolved once into the
cache) and the project's settings applied in one place."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import pyspark
from pyspark.sql import SparkSession

from streaming.config import LocalRuntimeSettings, SparkSettings
from streaming.errors import ConfigError
from streaming.local.artifacts import connector_jars, require_tool

__all__ = ["spark_session", "spark_conf"]

log = logging.getLogger(__name__)


def spark_conf(settings: SparkSettings, jars: list[Path]) -> dict[str, str]:
    """Every option the factory sets, as a plain mapping (easy to read and test)."""
    conf = {
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.driver.memory": settings.driver_memory,
        "spark.ui.enabled": str(settings.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # Arrow moves batches between the JVM and Python in foreachBatch.
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.sql.adaptive.enabled": "false",
    }
    conf.update(dict(settings.extra_conf))
    return conf


def spark_session(settings: SparkSettings | None = None,
                  runtime: LocalRuntimeSettings | None = None,
                  progress: Callable[[str], None] = log.info) -> SparkSession:
    """A session on ``settings.master`` with the Kafka connector jars for the
    installed pyspark.  Reuses the active session when one exists."""
    settings = settings or SparkSettings()
    runtime = runtime or LocalRuntimeSettings()
    if runtime.spark_version != pyspark.__version__:
        raise ConfigError(f"spark_version {runtime.spark_version} differs from the installed "
                          f"pyspark {pyspark.__version__}; the Kafka connector must match it")
    require_tool("java")
    jars = connector_jars(runtime.spark_version, runtime.cache_dir,
                          Path(pyspark.__file__).parent / "jars", progress)
    builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
    for key, value in spark_conf(settings, jars).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
