"""The adapters of spark-abs: Kafka, Spark, object storage, the local runtime
and the command line.  The protocol itself lives in ``barriers``."""

from streaming.api.config import Connection, LocalRuntimeSettings, SparkSettings
from streaming.errors import SparkAbsError

__all__ = ["Connection", "LocalRuntimeSettings", "SparkSettings", "SparkAbsError"]
