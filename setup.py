"""What pyproject.toml cannot say: the example pipelines of ``examples/`` are
installed as the package ``spark_abs_examples``, not under the generic name
of their directory."""

from setuptools import find_packages, setup

setup(
    # streaming.adapters.spark.java and kafka.java hold Java sources only (package data, compiled on first use)
    packages=[
        *find_packages(include=["streaming*", "operators*", "barriers*"]),
        "streaming.adapters.spark.java",
        "streaming.adapters.kafka.java",
        "spark_abs_examples",
    ],
    package_dir={"spark_abs_examples": "examples"},
)
