"""What pyproject.toml cannot say: the example pipelines of ``examples/`` are
installed as the package ``spark_abs_examples``, not under the generic name
of their directory."""

from setuptools import find_packages, setup

setup(
    # streaming.adapters.jvm and jvm_kafka hold Java sources only (package data, compiled on first use)
    packages=[
        *find_packages(include=["streaming*", "operators*", "barriers*"]),
        "streaming.adapters.jvm",
        "streaming.adapters.jvm_kafka",
        "spark_abs_examples",
    ],
    package_dir={"spark_abs_examples": "examples"},
)
