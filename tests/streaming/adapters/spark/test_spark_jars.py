"""Artifact resolution: pom generation, connector jar filtering, and clear
errors when a tool is missing or the registry cannot deliver."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from streaming.adapters.spark import jars
from streaming.adapters.spark.jars import Artifact
from streaming.errors import ArtifactResolutionError, ToolMissingError
from streaming.local.kafka_broker import broker_artifacts


def test_pom_lists_every_artifact():
    pom = ET.fromstring(jars._pom("x", broker_artifacts("4.1.1")))
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    coords = [
        ":".join(d.find(f"m:{k}", ns).text for k in ("groupId", "artifactId", "version"))
        for d in pom.findall("m:dependencies/m:dependency", ns)
    ]
    assert "org.apache.kafka:kafka_2.13:4.1.1" in coords
    assert any(c.startswith("org.apache.logging.log4j:log4j-slf4j2-impl:") for c in coords)


@pytest.mark.parametrize(
    "jar, artifact_id",
    [
        ("kafka-clients-3.9.1.jar", "kafka-clients"),
        ("spark-sql-kafka-0-10_2.13-4.1.1.jar", "spark-sql-kafka-0-10_2.13"),
        ("commons-pool2-2.12.1.jar", "commons-pool2"),
        ("scala-library-2.13.15.jar", "scala-library"),
    ],
)
def test_artifact_id_of_a_jar_name(jar, artifact_id):
    assert jars._artifact_id(Path(jar)) == artifact_id


def test_missing_tool_says_how_to_install_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolMissingError, match="apt-get install maven"):
        jars.require_tool("mvn")
    with pytest.raises(ToolMissingError, match="Java 17"):
        jars.require_tool("java")


def test_unreachable_registry_is_a_clear_error(tmp_path, monkeypatch):
    # Nothing listens on port 9 of loopback; the artifact is not in any local
    # Maven repository, so mvn has to ask the (unreachable) registry.
    monkeypatch.setenv("SPARK_ABS_MAVEN_REPO", "http://127.0.0.1:9/maven2")
    missing = Artifact("org.spark-abs.nowhere", "not-published", "0.0.1")
    with pytest.raises(ArtifactResolutionError, match="not-published") as info:
        jars.resolve_jars("nowhere", [missing], tmp_path)
    assert "127.0.0.1:9" in str(info.value)
    assert not (tmp_path / "jars" / "nowhere").exists()  # nothing half-written is left


def test_a_resolved_set_is_cached(tmp_path, monkeypatch):
    done = tmp_path / "jars" / "cached"
    done.mkdir(parents=True)
    (done / "a-1.0.jar").write_bytes(b"")
    (done / ".complete").write_text("a-1.0.jar\n")
    monkeypatch.setenv("PATH", "/nonexistent")  # no mvn needed for a cached set
    assert jars.resolve_jars("cached", [Artifact("g", "a", "1.0")], tmp_path) == [done / "a-1.0.jar"]


def test_connector_jars_leave_out_what_spark_ships(tmp_path):
    resolved = tmp_path / "cache" / "jars" / "spark-connectors-9.9.9"
    resolved.mkdir(parents=True)
    for name in (
        "spark-sql-kafka-0-10_2.13-9.9.9.jar",
        "kafka-clients-3.9.1.jar",
        "scala-library-2.13.15.jar",
        "zstd-jni-1.5.6-10.jar",
    ):
        (resolved / name).write_bytes(b"")
    (resolved / ".complete").write_text("")
    shipped = tmp_path / "spark-jars"
    shipped.mkdir()
    for name in ("scala-library-2.13.17.jar", "zstd-jni-1.5.7-4.jar", "spark-sql_2.13-9.9.9.jar"):
        (shipped / name).write_bytes(b"")
    kept = jars.connector_jars("9.9.9", tmp_path / "cache", shipped)
    assert [j.name for j in kept] == ["kafka-clients-3.9.1.jar", "spark-sql-kafka-0-10_2.13-9.9.9.jar"]
