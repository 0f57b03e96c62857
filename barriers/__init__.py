"""The snapshot protocol as a pure core: barrier messages, the per-task
handler for every alignment mode, the coordinator's bookkeeping, a
deterministic simulator of processes joined by FIFO channels, and a checker
for consistent cuts.  No Spark, Kafka or storage imports here."""
