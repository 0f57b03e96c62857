"""The embedded runtime on loopback: a KRaft Kafka broker, an S3 API server
(versitygw) and, on demand, a schema registry (Apicurio), started from artifacts the project resolves and caches
itself, and the Spark Kafka connector jars for the session factory.

- ``runtime``: ``LocalRuntime``, ``spark-abs local up | down | status``;
- ``services``: where each service lives (pid file, log, ports);
- ``starters``: a class per service, started and waited for;
- ``processes``: background processes, started detached and found again;
- ``artifacts``: what is fetched once into the cache;
- ``kafka_broker``: the Kafka nodes (KRaft);
- ``kafka_security``: a secured broker's certificates, SCRAM users and ACLs (``--secure``);
- ``s3_server``: the S3 API server;
- ``schema_registry``: the schema registry (built and started only for what uses it: ``up(registry=True)``);
- ``spark_cluster``: a Spark standalone master and workers (``--cluster``)."""

from streaming.local.runtime import LocalRuntime, RuntimeStatus, ServiceStatus

__all__ = ["LocalRuntime", "RuntimeStatus", "ServiceStatus"]
