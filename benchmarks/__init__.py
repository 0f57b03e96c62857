"""Benchmarks of spark-abs against plain Spark and its peers, run with
``python -m benchmarks`` (``--quick`` for the short profile).  Every figure
is a ratio of runs taken side by side in the same invocation, alternating,
with medians; the raw runs are kept as JSON beside a Markdown table.

- ``__main__``: the command, its profiles and its report;
- ``workloads``: the keyed count as spark-abs pipelines;
- ``runs``: single runs of a spark-abs job;
- ``native``: the same count as plain Structured Streaming;
- ``peers``: the same count on Flink and Quix Streams;
- ``state``: keyed state at 100 thousand to 10 million keys;
- ``profiles``: py-spy profiles of the hot path;
- ``delta_sink``: one epoch's commit to Delta Lake by delta-rs against
  delta-spark (``python -m benchmarks.delta_sink``);
- ``origins``: what carrying each row's origin (for dead letters that name
  their ingress record) costs a task's Python side
  (``python -m benchmarks.origins``)."""
