"""What a user writes and configures: a pipeline (``pipeline``), its job's
checkpointing settings (``settings``) and how to reach Kafka, the S3 server
and Spark (``config``).  Depends on nothing of spark-abs but the protocol's
messages and the errors."""
