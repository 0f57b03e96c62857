"""Artifacts of the local runtime, fetched once into the cache: the Kafka
broker's jars, resolved from Maven Central by ``streaming.adapters.jars``,
and the S3 server binary built with ``go install``.

A finished build is marked, as a jar set is, by a ``.complete`` file written
last, so an interrupted one is redone rather than used half-way.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from pathlib import Path

from streaming.adapters.jars import COMPLETE, Artifact, Progress, require_tool
from streaming.errors import ArtifactResolutionError

__all__ = ["FETCHABLE", "kafka_broker_artifacts", "build_versitygw"]

log = logging.getLogger(__name__)

# What `spark-abs local fetch` can resolve into the cache.
FETCHABLE = ("kafka", "s3-server", "spark-connector")


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
        built.rename(binary)
        (target / COMPLETE).write_text(version + "\n")
    return binary
