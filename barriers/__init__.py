"""The snapshot protocol as a pure core: barrier messages (``messages``), every
record header name spark-abs writes or reads (``headers``), the
per-task handler for every alignment mode (``handler``), the coordinator's
bookkeeping (``coordinator``), why checkpoints fail (``failures``), the
lineage of restores (``lineage``) and the errors (``errors``).  The
simulator, checker and narration are in ``barriers.simulation``.  No Spark,
Kafka or storage imports here (a test says so)."""
