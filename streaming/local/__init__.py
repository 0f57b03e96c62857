"""The embedded runtime on loopback: a KRaft Kafka broker and an S3 API server
(versitygw), started from artifacts the project resolves and caches itself, and
the Spark Kafka connector jars for the session factory."""

from streaming.local.runtime import LocalRuntime, RuntimeStatus, ServiceStatus

__all__ = ["LocalRuntime", "RuntimeStatus", "ServiceStatus"]
