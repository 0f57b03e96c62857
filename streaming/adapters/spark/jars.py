"""Jar sets resolved from Maven with ``mvn`` into a cache, once: the Kafka
connectors the Spark session loads (Kafka and Avro: ``connector_jars``) and the local
runtime's Kafka broker (``streaming.local.artifacts``).

A finished set is marked by a ``.complete`` file (``COMPLETE``) written last,
so an interrupted download is redone rather than used half-way.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from streaming.api.config import ENV
from streaming.errors import ArtifactResolutionError, ToolMissingError

__all__ = [
    "COMPLETE",
    "Progress",
    "Artifact",
    "spark_kafka_connector_artifacts",
    "require_tool",
    "resolve_jars",
    "maven_settings",
    "maven_errors",
    "connector_jars",
    "delta_jars",
]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"
COMPLETE = ".complete"

_INSTALL_HINTS = {
    "java": "install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)",
    "javac": "install a Java 17 JDK (Debian: apt-get install openjdk-17-jdk-headless)",
    "mvn": "install Maven (Debian: apt-get install maven)",
    "go": "install Go 1.22 or newer (Debian: apt-get install golang)",
}


@dataclass(frozen=True, slots=True)
class Artifact:
    """A Maven coordinate."""

    group: str
    artifact: str
    version: str

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


def spark_kafka_connector_artifacts(spark_version: str) -> tuple[Artifact, ...]:
    """Spark's Kafka source and sink, and its Avro functions (``from_avro``
    decodes the records of an Avro ingress on the executors)."""
    return (
        Artifact("org.apache.spark", "spark-sql-kafka-0-10_2.13", spark_version),
        Artifact("org.apache.spark", "spark-avro_2.13", spark_version),
    )


def require_tool(name: str) -> str:
    """The path of ``name`` on PATH, or a ToolMissingError saying how to get it."""
    path = shutil.which(name)
    if path is None:
        hint = _INSTALL_HINTS.get(name, "install it")
        raise ToolMissingError(f"`{name}` is not on PATH; the local runtime needs it: {hint}")
    return path


def _pom(name: str, artifacts: Iterable[Artifact]) -> str:
    deps = "\n".join(
        f"    <dependency><groupId>{escape(a.group)}</groupId><artifactId>{escape(a.artifact)}</artifactId><version>{escape(a.version)}</version></dependency>"
        for a in artifacts
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        f"  <groupId>spark-abs.local</groupId><artifactId>{escape(name)}</artifactId>"
        "<version>1</version><packaging>pom</packaging>\n"
        f"  <dependencies>\n{deps}\n  </dependencies>\n"
        "</project>\n"
    )


def maven_settings(repo: str) -> str:
    # A mirror of everything onto one repository: some poms (Spark's) declare
    # extra repositories that are unreachable from closed networks.
    return (
        "<settings><mirrors><mirror><id>spark-abs-central</id><mirrorOf>*</mirrorOf>"
        f"<url>{escape(repo)}</url></mirror></mirrors></settings>\n"
    )


def maven_errors(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if "[ERROR]" in ln and ln.strip() != "[ERROR]"]
    return "\n".join(lines[:6]) or output.strip()[-2000:]


def resolve_jars(
    name: str, artifacts: Sequence[Artifact], cache_dir: Path, progress: Progress = log.info
) -> list[Path]:
    """Resolve ``artifacts`` and their runtime dependencies into
    ``cache_dir/jars/<name>`` (once) and return the jar paths."""
    target = cache_dir / "jars" / name
    if (target / COMPLETE).exists():
        return sorted(target.glob("*.jar"))
    target.parent.mkdir(parents=True, exist_ok=True)
    # processes resolving the same set at once (workers' first use): one resolves, the others wait for it
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (target / COMPLETE).exists():
                return sorted(target.glob("*.jar"))
            return _resolve(name, artifacts, target, progress)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _resolve(name: str, artifacts: Sequence[Artifact], target: Path, progress: Progress) -> list[Path]:
    mvn = require_tool("mvn")
    repo = os.environ.get(ENV["maven_repo"]) or MAVEN_CENTRAL
    progress(f"resolving {', '.join(map(str, artifacts))} from {repo} (first time only)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_pom(name, artifacts))
        (work / "settings.xml").write_text(maven_settings(repo))
        out = work / "jars"
        cmd = [
            mvn,
            "-B",
            "-q",
            "-s",
            str(work / "settings.xml"),
            "-f",
            str(work / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise ArtifactResolutionError(
                f"mvn took over 15 minutes resolving {name}; is the Maven registry reachable?"
            ) from exc
        if done.returncode != 0 or not out.is_dir():
            raise ArtifactResolutionError(
                f"mvn could not resolve {', '.join(map(str, artifacts))} "
                f"(exit {done.returncode}):\n{maven_errors(done.stdout + done.stderr)}"
            )
        (out / COMPLETE).write_text("\n".join(sorted(p.name for p in out.glob("*.jar"))) + "\n")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    return sorted(target.glob("*.jar"))


_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+\.\d+[^_]*)$")


def _artifact_id(jar: Path) -> str:
    """``kafka-clients-3.9.1.jar`` -> ``kafka-clients``; the version is the first
    dash-separated tail that starts like ``N.N`` (so ``-0-10_2.13`` stays a name)."""
    match = _JAR_NAME.match(jar.stem)
    return match.group("artifact") if match else jar.stem


def _not_shipped(resolved: list[Path], spark_jars_dir: Path) -> list[Path]:
    shipped = {_artifact_id(j) for j in spark_jars_dir.glob("*.jar")}
    return [j for j in resolved if _artifact_id(j) not in shipped]


def delta_jars(delta_version: str, cache_dir: Path, spark_jars_dir: Path, progress: Progress = log.info) -> list[Path]:
    """delta-spark (Spark's Delta Lake reader and writer) and what it needs
    beyond the jars Spark ships."""
    artifact = Artifact("io.delta", "delta-spark_2.13", delta_version)
    return _not_shipped(resolve_jars(f"delta-spark-{delta_version}", [artifact], cache_dir, progress), spark_jars_dir)


def connector_jars(
    spark_version: str, cache_dir: Path, spark_jars_dir: Path, progress: Progress = log.info
) -> list[Path]:
    """Spark's Kafka connector and what it needs beyond the jars Spark ships:
    jars whose artifact Spark already has (scala, hadoop, slf4j...) are left out
    so the classpath has one copy of each."""
    resolved = resolve_jars(
        f"spark-connectors-{spark_version}", spark_kafka_connector_artifacts(spark_version), cache_dir, progress
    )
    return _not_shipped(resolved, spark_jars_dir)
