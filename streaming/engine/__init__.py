"""The engine: stage tasks driven by the barrier handler (``task``, with
``segments``, ``watermarks`` and ``uploads``), worker processes that run
them as Structured Streaming queries (``worker``), the coordinator service
(``coordinator``), where a task starts after a restore (``restore``), the
job runner and its worker processes (``runner``, ``supervisor``), and fault
points for drills (``faults``).  It reaches Kafka, Spark and storage only
through ``streaming.adapters``; only ``worker`` loads Spark, when it starts."""
