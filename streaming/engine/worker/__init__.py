"""A worker process: the tasks of one group run as Structured Streaming
queries in one Spark application.

- ``worker``: ``Worker``, its queries, its control-topic reader and its loop;
- ``wiring``: a task built for a generation, with its start, sink and I/O;
- ``commits``: its sink tasks' commits once a checkpoint is complete and in the store."""
