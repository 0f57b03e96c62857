"""The peers a spark-abs user would pick instead, on the benchmark's topic:
Flink SQL (PyFlink) and Quix Streams, each in a virtualenv of its own
(their pins conflict with pyspark's: PyFlink wants py4j 0.10.9.7, pandas <
2.3 and pyarrow < 21), made by ``make bench`` (``benchmarks.peers.setup``).

Each peer runs the keyed count exactly once with checkpoints (commits) every
second and writes its updates to a Kafka topic of its own, in transactions;
``benchmarks.runs.peer_run`` reads that topic (read_committed) and checks the
totals.  The scripts here run in the peers' environments and import nothing
of spark-abs: ``flink_count`` (Flink SQL) and ``quix_count`` (Quix Streams)."""
