"""The adapters to the outside systems, one package each, named after it:

- ``kafka``: Kafka's clients, topics, writing and reading, the dead letters,
  the Kafka sink's transactions and the job's control topic;
- ``spark``: the Spark session, a stage's query, a stage's Spark code, the
  connector jars and the engine's own JVM classes;
- ``sinks``: the exactly-once sinks, one module per family over ``base``;
- ``serde``: record formats (JSON, Avro, Arrow IPC, the records' shapes) and
  the schema registry's client;
- ``objects``: object storage; ``snapshots``: the snapshot store on it.

Only ``spark.session``, ``spark.query``, ``spark.stage`` and ``spark.decoding``
import pyspark.
They never import the engine or the local runtime."""
