"""The adapters to Kafka, Spark and storage:

- Kafka: ``kafka_clients`` (every client, made from a ``KafkaAccess``, and
  Kafka's refusals explained), ``kafka_admin`` (topics), ``kafka_io``
  (markers, ranges and dead letters), ``control`` (the job's control topic),
  ``kafka_txn`` (the Kafka sink's transactions, written by Kafka's Java
  client, ``jvm_kafka/*.java``, in a JVM of their own);
- Spark: ``spark`` (the session factory and a stage's query) and
  ``spark_stage`` (a stage's Spark code), the two modules that import
  pyspark, ``jars`` (the connector jars, resolved from Maven) and
  ``jvm_helpers`` (the engine's own Spark classes, ``jvm/*.java``, compiled
  with javac);
- records: ``records`` (their shapes as Arrow), ``codec`` (JSON and Arrow
  values), ``arrow_ipc`` (Arrow batches read within a cap on their
  decompressed bytes), ``avro`` (Avro values), ``registry`` (a schema
  registry's client: Avro schemas by id);
- storage: ``objects`` (object storage), ``snapshots`` (the snapshot store);
- ``sinks``: the exactly-once sinks (object store, Kafka, Delta Lake).

They never import the engine or the local runtime."""
