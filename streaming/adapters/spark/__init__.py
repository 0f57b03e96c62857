"""Spark: the only package that imports pyspark (``session``, ``query``,
``stage`` and ``decoding``; importing the package loads none of them).

- ``session``: the session factory and the settings it applies;
- ``query``: a stage task's input channels as a Structured Streaming query;
- ``stage``: a stage's Spark code, run on each micro-batch;
- ``decoding``: how such a stage decodes its input records in Spark, and why one is no row;
- ``jars``: the connector jars, resolved from Maven into the cache;
- ``jvm``: the engine's own classes for Spark's JVM (``java/*.java``),
  compiled with javac on first use."""
