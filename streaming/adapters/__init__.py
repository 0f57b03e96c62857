"""The adapters: Kafka (``kafka_admin`` topics, ``kafka_io`` markers, ranges
and dead letters, ``control`` the job's control topic), Spark (``spark``,
the only module that imports pyspark, and ``jars``, the connector jars it
loads, resolved from Maven), record shapes and values (``records``,
``codec``), object storage (``objects``), the snapshot store (``snapshots``)
and the exactly-once sinks (``sinks``).  They never import the engine or the
local runtime."""
