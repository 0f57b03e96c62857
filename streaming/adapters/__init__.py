"""The adapters: Kafka (``kafka_admin`` topics, ``kafka_io`` markers, ranges
and dead letters, ``control`` the job's control topic), Spark (``spark``,
the only module that imports pyspark), record shapes and values
(``records``, ``codec``), object storage (``objects``), the snapshot store
(``snapshots``) and the exactly-once sinks (``sinks``).  They never import
the engine."""
