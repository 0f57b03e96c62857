"""The engine: stage tasks, the worker processes that run them, restore, the
remote worker groups and the job runner, each a sub-package, from the bottom
up (a sub-package imports only those before it and the modules here):

- ``task``: one stage task, the barrier handler driven by micro-batches;
- ``restore``: where a new generation starts, and into which pipeline;
- ``worker``: a worker process running some tasks as Structured Streaming queries;
- ``remote``: worker groups on other hosts, joined by leases and heartbeats;
- ``job``: the job runner, its coordinator service and its worker processes.

Modules every sub-package uses:

- ``faults``: fault points for drills;
- ``kafka_retention``: what checkpoints rely on Kafka to keep;
- ``metrics``: the Prometheus metrics of the runner and the workers.

It reaches Kafka, Spark and storage only through ``streaming.adapters``;
only ``worker`` loads Spark, when it starts."""
