"""Artifacts of the local runtime, fetched once into the cache: the Kafka
broker's jars, resolved from Maven Central by ``streaming.adapters.spark.jars``,
the S3 server binary built with ``go install``, and the schema registry
(Apicurio Registry) built from its Maven Central artifact with Quarkus: the
last only when something asks for it (``ON_DEMAND``), as ``up`` does for the
first job that uses a registry.

A finished build is marked, as a jar set is, by a ``.complete`` file written
last, so an interrupted one is redone rather than used half-way.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

from streaming.adapters.spark.jars import (
    COMPLETE,
    MAVEN_CENTRAL,
    Artifact,
    Progress,
    maven_errors,
    maven_settings,
    require_tool,
)
from streaming.api.config import ENV
from streaming.errors import ArtifactResolutionError
from streaming.private_files import replace_into

__all__ = [
    "FETCHABLE",
    "ON_DEMAND",
    "kafka_broker_artifacts",
    "build_versitygw",
    "build_schema_registry",
    "schema_registry_built",
]

log = logging.getLogger(__name__)

# What `spark-abs local fetch` can resolve into the cache.
FETCHABLE = ("kafka", "s3-server", "spark-connector", "schema-registry", "kafka-sink")
# What `spark-abs local up` fetches only when asked to start what needs it: the schema registry
# (a Maven build of minutes, the first time) is built for the first job that uses one.
ON_DEMAND = ("schema-registry",)


def kafka_broker_artifacts(version: str) -> tuple[Artifact, ...]:
    """The broker and a log4j2 binding (the Maven artifact brings only slf4j-api)."""
    return (
        Artifact("org.apache.kafka", "kafka_2.13", version),
        Artifact("org.slf4j", "slf4j-api", "2.0.16"),
        Artifact("org.apache.logging.log4j", "log4j-slf4j2-impl", "2.24.3"),
        Artifact("org.apache.logging.log4j", "log4j-core", "2.24.3"),
    )


def build_versitygw(version: str, cache_dir: Path, progress: Progress = log.info) -> Path:
    """The versitygw binary at ``version``, built with ``go install`` once."""
    target = cache_dir / "bin" / f"versitygw-{version}"
    binary = target / "versitygw"
    if (target / COMPLETE).exists() and binary.exists():
        return binary
    go = require_tool("go")
    progress(f"building the S3 API server versitygw {version} with `go install` (first time only, about 2-3 minutes)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".versitygw-") as tmp:
        env = dict(os.environ, GOBIN=tmp, CGO_ENABLED="0")
        cmd = [go, "install", f"github.com/versity/versitygw/cmd/versitygw@{version}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
        except subprocess.TimeoutExpired as exc:
            raise ArtifactResolutionError(
                "go install versitygw took over 20 minutes; is the Go module proxy reachable?"
            ) from exc
        built = Path(tmp) / "versitygw"
        if done.returncode != 0 or not built.exists():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise ArtifactResolutionError(f"go install versitygw@{version} failed (exit {done.returncode}):\n{tail}")
        target.mkdir(exist_ok=True)
        replace_into(built, binary)
        (target / COMPLETE).write_text(version + "\n")
    return binary


# Apicurio Registry's Maven artifact is its application before Quarkus' build step: a
# project of one dependency builds it into a runnable jar.  For 2.4.2.Final: everit's JSON
# Schema validator comes from JitPack in its POM (Maven Central has the same packages as
# com.github.erosb's), the config-index deployment module is served at 0.1.10.Final, and
# the application jar has no Jandex index, so Quarkus is told to index it.
_REGISTRY_QUARKUS = {"2.4.2.Final": "2.16.4.Final"}
_REGISTRY_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>spark-abs.local</groupId><artifactId>schema-registry</artifactId><version>1</version>
  <properties><maven.compiler.release>17</maven.compiler.release></properties>
  <dependencyManagement><dependencies>
    <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-common-app-components-config-index</artifactId><version>0.1.10.Final</version></dependency>
    <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-common-app-components-config-index-deployment</artifactId><version>0.1.10.Final</version></dependency>
    <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-registry</artifactId><version>{version}</version><type>pom</type><scope>import</scope></dependency>
  </dependencies></dependencyManagement>
  <dependencies>
    <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-registry-app</artifactId><version>{version}</version>
      <exclusions><exclusion><groupId>com.github.everit-org.json-schema</groupId><artifactId>org.everit.json.schema</artifactId></exclusion></exclusions></dependency>
    <dependency><groupId>com.github.erosb</groupId><artifactId>everit-json-schema</artifactId><version>1.14.2</version></dependency>
  </dependencies>
  <build><plugins><plugin><groupId>io.quarkus</groupId><artifactId>quarkus-maven-plugin</artifactId><version>{quarkus}</version>
    <executions><execution><goals><goal>build</goal></goals></execution></executions></plugin></plugins></build>
</project>
"""
_REGISTRY_INDEX = (
    "\nquarkus.index-dependency.apicurioapp.group-id=io.apicurio"
    "\nquarkus.index-dependency.apicurioapp.artifact-id=apicurio-registry-app\n"
)


def _registry_runner(version: str, cache_dir: Path) -> Path:
    return cache_dir / "bin" / f"apicurio-registry-{version}" / "registry-runner.jar"


def schema_registry_built(version: str, cache_dir: Path) -> bool:
    """Whether Apicurio Registry ``version`` is built in the cache (``build_schema_registry`` has finished)."""
    runner = _registry_runner(version, cache_dir)
    return (runner.parent / COMPLETE).exists() and runner.exists()


def build_schema_registry(version: str, cache_dir: Path, progress: Progress = log.info) -> Path:
    """Apicurio Registry ``version``'s runnable jar (with its ``lib/`` beside
    it), built once with Maven and Quarkus from Maven Central."""
    runner = _registry_runner(version, cache_dir)
    target = runner.parent
    if schema_registry_built(version, cache_dir):
        return runner
    quarkus = _REGISTRY_QUARKUS.get(version)
    if quarkus is None:
        raise ArtifactResolutionError(
            f"schema registry {version}: only {', '.join(_REGISTRY_QUARKUS)} is known to build here "
            "(schema_registry_version)"
        )
    mvn = require_tool("mvn")
    repo = os.environ.get(ENV["maven_repo"]) or MAVEN_CENTRAL
    progress(f"building the schema registry Apicurio {version} with Maven (first time only, about a minute)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".registry-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_REGISTRY_POM.format(version=escape(version), quarkus=escape(quarkus)))
        (work / "settings.xml").write_text(maven_settings(repo))
        base = [mvn, "-B", "-q", "-s", str(work / "settings.xml"), "-f", str(work / "pom.xml")]
        app = f"io.apicurio:apicurio-registry-app:{version}"
        _maven(base + ["dependency:copy", f"-Dartifact={app}", f"-DoutputDirectory={work / 'app'}"], app)
        resources = work / "src" / "main" / "resources"
        (resources / "META-INF").mkdir(parents=True)
        with zipfile.ZipFile(work / "app" / f"apicurio-registry-app-{version}.jar") as jar:
            for name in ("application.properties", "META-INF/web.xml", "META-INF/openapi.json"):
                (resources / name).write_bytes(jar.read(name))
        with open(resources / "application.properties", "a") as properties:
            properties.write(_REGISTRY_INDEX)
        _maven(base + ["package"], f"the registry application {version}")
        built = work / "target"
        target.mkdir(exist_ok=True)
        shutil.move(str(built / "lib"), target / "lib")
        replace_into(built / "schema-registry-1-runner.jar", runner)
        (target / COMPLETE).write_text(version + "\n")
    return runner


def _maven(cmd: list[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired as exc:
        raise ArtifactResolutionError(f"mvn took over 20 minutes on {what}; is the Maven registry reachable?") from exc
    if done.returncode != 0:
        raise ArtifactResolutionError(
            f"mvn failed on {what} (exit {done.returncode}):\n{maven_errors(done.stdout + done.stderr)}"
        )
