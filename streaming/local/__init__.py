"""The embedded runtime on loopback: a KRaft Kafka broker, an S3 API server
(versitygw) and, on demand, a schema registry (Apicurio), started from artifacts the project resolves and caches
itself, and the Spark Kafka connector jars for the session factory.

- ``runtime``: ``LocalRuntime``, ``spark-abs local up | down | status``;
- ``services``: the runtime's home and the ports its services listen on;
- ``processes``: background processes, started detached and found again;
- ``artifacts``: what is fetched once into the cache (``local fetch``);

and one module per service, each with its artifact, its spec (pid file,
marker, log) and its starter (started and waited for):

- ``kafka_broker``: the Kafka nodes (KRaft), ``KafkaStarter``;
- ``kafka_security``: a secured broker's certificates, SCRAM users and ACLs (``--secure``);
- ``s3_server``: the S3 API server, ``S3Starter``;
- ``schema_registry``: the schema registry, ``RegistryStarter`` (built and started only for what uses it:
  ``up(registry=True)``);
- ``spark_cluster``: a Spark standalone master and workers (``--cluster``), ``SparkStarter``."""

from streaming.local.runtime import LocalRuntime, RuntimeStatus, ServiceStatus

__all__ = ["LocalRuntime", "RuntimeStatus", "ServiceStatus"]
