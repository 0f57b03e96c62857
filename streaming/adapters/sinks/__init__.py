"""The exactly-once sinks, the two-phase commit at the end of the pipeline:

- ``base``: what every sink shares (the staging area, the two phases,
  recovery after a restore);
- ``object_store``: Parquet per epoch and task in object storage;
- ``kafka``: a Kafka transaction per epoch, with a signed commit marker;
- ``delta``: a Delta Lake commit per epoch, with the task's application
  transaction;
- ``factory``: the sink a pipeline names, opened for one task."""
