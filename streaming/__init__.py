"""spark-abs on Spark and Kafka: what a user imports to define a pipeline and
run it, re-exported here so a pipeline needs one import of ``streaming`` (and
one of ``operators``)::

    from streaming import Connection, Ingress, JobRunner, JobSettings, Pipeline, Sink, Stage

and reads a job's output back, each result once: ``read_kafka_output`` (a
Kafka sink's topic, without the epochs its commits topic marks superseded),
``read_committed_output`` (an object-store sink's committed Parquet) and
``read_delta_output`` (a Delta sink's table, without the sink's columns).

The sub-packages, from the top down (docs/architecture/layers.md has the layers):

- ``streaming.testing``: helpers for users' tests;
- ``streaming.tools``: the command line, the demo, the checkpoint tools,
  drills, ``compare``, the UI, the smoke pipeline;
- ``streaming.engine``: stage tasks, restore, worker processes, remote
  worker groups, the job runner;
- ``streaming.adapters``: Kafka, Spark, object storage, snapshots, sinks;
  ``streaming.local``: the local runtime (Kafka, an S3 server, connector jars);
- ``streaming.api``: pipelines, job settings, connection settings;
- ``streaming.waits``: every bounded wait (a deadline, a poll, a retry, a
  call or a thread within a bound), each error naming its bound;
- ``streaming.private_files``: local files written whole (temporary file,
  then rename), owner-only ones (0600), and secrets read only from those;
- ``streaming.hosts``: the ``Host`` names an HTTP server of the project
  answers (the web UI, the metrics endpoints);
- ``streaming.errors``: every error, under ``SparkAbsError``;
  ``streaming.console``: what a command shows of the log (``install``).

The protocol itself lives in ``barriers``, the operators in ``operators``.
Names load on first use, so importing one sub-package does not import the rest."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Connection",
    "Ingress",
    "JobRunner",
    "JobSettings",
    "LocalRuntimeSettings",
    "Mode",
    "Pipeline",
    "RunOptions",
    "Sink",
    "SparkAbsError",
    "SparkSettings",
    "Stage",
    "end_input",
    "KafkaOutput",
    "read_kafka_output",
    "read_committed_output",
    "read_delta_output",
]

_WHERE = {
    "Connection": "streaming.api.config",
    "LocalRuntimeSettings": "streaming.api.config",
    "SparkSettings": "streaming.api.config",
    "Ingress": "streaming.api.pipeline",
    "Pipeline": "streaming.api.pipeline",
    "Sink": "streaming.api.pipeline",
    "Stage": "streaming.api.pipeline",
    "end_input": "streaming.api.producing",
    "JobSettings": "streaming.api.settings",
    "Mode": "streaming.api.settings",
    "JobRunner": "streaming.engine.job.runner",
    "RunOptions": "streaming.engine.job.runner",
    "SparkAbsError": "streaming.errors",
    "KafkaOutput": "streaming.adapters.sinks.kafka",
    "read_kafka_output": "streaming.adapters.sinks.kafka",
    "read_committed_output": "streaming.adapters.sinks.object_store",
    "read_delta_output": "streaming.adapters.sinks.delta",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'streaming' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
