"""The engine's own Spark classes, compiled once per source and Spark
version with the JDK's javac."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pyspark
import pytest

from streaming.adapters.spark.jvm import helper_jar
from streaming.errors import ArtifactResolutionError

SPARK_JARS = Path(pyspark.__file__).parent / "jars"


def test_the_classes_are_compiled_once_into_a_jar_named_by_spark_version_and_sources(tmp_path):
    said: list[str] = []
    jar = helper_jar(pyspark.__version__, tmp_path, SPARK_JARS, said.append)
    assert jar.name.startswith(f"spark-abs-jvm-{pyspark.__version__}-")
    assert "spark_abs/Runs.class" in zipfile.ZipFile(jar).namelist()
    assert len(said) == 1 and "compiling" in said[0]
    again = helper_jar(pyspark.__version__, tmp_path, SPARK_JARS, said.append)
    assert again == jar and len(said) == 1  # found, not compiled again
    # another Spark version is another jar
    assert helper_jar("0.0.0", tmp_path, SPARK_JARS, said.append) != jar


def test_sources_that_do_not_compile_against_the_jars_given_say_so(tmp_path):
    empty = tmp_path / "no-jars"
    empty.mkdir()
    with pytest.raises(ArtifactResolutionError, match=r"javac could not compile .* is pyspark 9.9.9 installed whole"):
        helper_jar("9.9.9", tmp_path, empty)
    assert not list((tmp_path / "jars").glob("*.jar"))  # nothing half-built left behind
