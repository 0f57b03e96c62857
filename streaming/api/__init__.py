"""What a user writes and configures:

- ``pipeline``: a pipeline (ingress topics, stages, sinks), loaded by reference or by name;
- ``avro_schema``: an ingress's Avro record schema;
- ``partitioning``: the checks a pipeline passes before it runs (rows of a key meet in one task);
- ``producing``: end of input and watermarks, for producers of ingress topics;
- ``settings``: its job's checkpointing settings;
- ``config``: how to reach Kafka, the S3 server and Spark;
- ``topics``: every Kafka topic name the engine makes (stage, control, dead letters, commits);
- ``job_key``: the key a job signs its control events, leases and barriers with.

Depends on nothing of spark-abs but the protocol's messages and the errors."""
