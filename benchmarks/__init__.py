"""Benchmarks of spark-abs against plain Spark, run with ``python -m benchmarks``
(``--quick`` for the short profile).  Every figure is a ratio of runs taken
side by side in the same invocation, alternating, with medians; the raw runs
are kept as JSON beside a Markdown table.  See ``benchmarks.__main__``."""
