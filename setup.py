"""What pyproject.toml cannot say: the example pipelines of ``examples/`` are
installed as the package ``spark_abs_examples``, not under the generic name
of their directory."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["streaming*", "operators*", "barriers*"]), "spark_abs_examples"],
    package_dir={"spark_abs_examples": "examples"},
)
