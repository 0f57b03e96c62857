"""Configuration of the adapters: frozen settings with commented defaults, the
connection details the local runtime (or a real deployment) publishes, and the
one place that turns environment variables into them.

The environment names are shared with ``docker/compose.yaml``: a pipeline
container gets the same ``SPARK_ABS_*`` variables that the local runtime writes
into its connection file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from streaming.api.job_key import JobKey, read_secret_file
from streaming.errors import ConfigError, RuntimeNotRunningError

__all__ = [
    "ENV",
    "Connection",
    "LocalRuntimeSettings",
    "MetricsSettings",
    "SparkSettings",
    "default_home",
]

# Every environment variable the project reads, by role.  docker/compose.yaml
# sets the connection ones for the pipeline service; a test checks it does.
ENV = {
    "home": "SPARK_ABS_HOME",
    "kafka_bootstrap": "SPARK_ABS_KAFKA_BOOTSTRAP",
    "s3_endpoint": "SPARK_ABS_S3_ENDPOINT",
    "s3_access_key": "SPARK_ABS_S3_ACCESS_KEY",
    "s3_secret_key": "SPARK_ABS_S3_SECRET_KEY",
    "s3_bucket": "SPARK_ABS_S3_BUCKET",
    "s3_region": "SPARK_ABS_S3_REGION",
    "spark_master": "SPARK_ABS_SPARK_MASTER",
    "maven_repo": "SPARK_ABS_MAVEN_REPO",
    # the secret the job's key is derived from (streaming.api.job_key), or a file holding it
    "job_secret": "SPARK_ABS_JOB_SECRET",
    "job_secret_file": "SPARK_ABS_JOB_SECRET_FILE",
    # where a process serves its Prometheus metrics (MetricsSettings.from_env)
    "metrics_host": "SPARK_ABS_METRICS_HOST",
    "metrics_port": "SPARK_ABS_METRICS_PORT",
}

CONNECTION_ENV_FIELDS = (
    "kafka_bootstrap",
    "s3_endpoint",
    "s3_access_key",
    "s3_secret_key",
    "s3_bucket",
    "s3_region",
    "spark_master",
)


def default_home(environ: Mapping[str, str] | None = None) -> Path:
    """Where the runtime caches artifacts and keeps its state:
    ``$SPARK_ABS_HOME``, else ``~/.cache/spark-abs``."""
    environ = os.environ if environ is None else environ
    configured = environ.get(ENV["home"])
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "spark-abs"


def _check_port(name: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise ConfigError(f"{name} must be 0 (pick a free port) or 1-65535, got {port}")


@dataclass(frozen=True, slots=True)
class LocalRuntimeSettings:
    """What ``spark-abs local up`` starts and where it keeps it."""

    # Root of the cache (jars, binaries) and of the runtime's state (data, logs, pids).
    home: Path = field(default_factory=default_home)
    # Where artifacts are cached; None = <home>/cache.  Runtimes with different
    # homes may share one cache.
    cache: Path | None = None
    # Broker: org.apache.kafka:kafka_2.13 from Maven Central, KRaft combined node.
    kafka_version: str = "4.1.1"
    # Spark's Kafka connector; must equal the installed pyspark version.
    spark_version: str = "4.1.1"
    # S3 API server: versitygw (POSIX backend), built once with `go install`.
    s3_server_version: str = "v1.8.0"
    # 0 = pick a free loopback port on first start and keep it afterwards.
    kafka_port: int = 0
    kafka_controller_port: int = 0
    s3_port: int = 0
    # Credentials and bucket of the local S3 server (loopback only).
    s3_access_key: str = "sparkabs"
    s3_secret_key: str = "sparkabs-secret"
    s3_bucket: str = "spark-abs"
    # Heap of each broker JVM.
    kafka_heap: str = "512m"
    # Kafka nodes (1, or 3 for a cluster: replication factor 3, min.insync.replicas 2).
    kafka_nodes: int = 1
    # Spark standalone workers under a master of the runtime's own; 0 = no
    # cluster, jobs run in local[2] applications.
    spark_workers: int = 0
    # Seconds a service may take to become ready before `up` fails with its log tail.
    start_timeout_s: float = 90.0

    def __post_init__(self) -> None:
        if not isinstance(self.home, Path):
            raise ConfigError(f"home must be a pathlib.Path, got {type(self.home).__name__}")
        for name in ("kafka_port", "kafka_controller_port", "s3_port"):
            _check_port(name, getattr(self, name))
        nonzero = [p for p in (self.kafka_port, self.kafka_controller_port, self.s3_port) if p]
        if len(nonzero) != len(set(nonzero)):
            raise ConfigError(
                "kafka_port, kafka_controller_port and s3_port must differ, "
                f"got {self.kafka_port}, {self.kafka_controller_port}, {self.s3_port}"
            )
        if self.start_timeout_s <= 0:
            raise ConfigError(f"start_timeout_s must be positive, got {self.start_timeout_s}")
        if self.kafka_nodes < 1 or self.spark_workers < 0:
            raise ConfigError(
                f"kafka_nodes must be >= 1 and spark_workers >= 0, got {self.kafka_nodes}, {self.spark_workers}"
            )
        if self.kafka_nodes > 1 and (self.kafka_port or self.kafka_controller_port):
            raise ConfigError("kafka_port and kafka_controller_port fix one node's ports: leave them 0 for a cluster")

    @classmethod
    def cluster(cls, home: Path | None = None, **changes: Any) -> LocalRuntimeSettings:
        """The local cluster: three Kafka nodes and a Spark master with two
        workers, under ``<home>/cluster`` (its own data, logs and connection
        file), sharing ``<home>/cache``."""
        home = home or default_home()
        defaults = {"kafka_nodes": 3, "spark_workers": 2, "kafka_heap": "384m", "cache": home / "cache"}
        return cls(home=home / "cluster", **{**defaults, **changes})

    @property
    def is_cluster(self) -> bool:
        return self.kafka_nodes > 1 or self.spark_workers > 0

    @property
    def cache_dir(self) -> Path:
        return self.cache if self.cache is not None else self.home / "cache"

    @property
    def runtime_dir(self) -> Path:
        return self.home / "runtime"

    @property
    def connection_file(self) -> Path:
        return self.runtime_dir / "connection.json"

    @property
    def job_secret_file(self) -> Path:
        """The secret the runtime's jobs derive their keys from, generated on first start."""
        return self.runtime_dir / "job.secret"


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach Kafka, the S3 server and Spark: what the local runtime writes
    to its connection file, or what a deployment passes in ``SPARK_ABS_*``."""

    kafka_bootstrap: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    s3_bucket: str
    s3_region: str = "us-east-1"
    spark_master: str = "local[2]"
    # what the job's key is derived from (``job_key``); "" when none was given
    job_secret: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not self.kafka_bootstrap:
            raise ConfigError(f"kafka_bootstrap ({ENV['kafka_bootstrap']}) is empty")
        endpoint = urlparse(self.s3_endpoint)
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise ConfigError(
                f"s3_endpoint ({ENV['s3_endpoint']}) must look like http://host:port, got {self.s3_endpoint!r}"
            )
        if not self.s3_bucket:
            raise ConfigError(f"s3_bucket ({ENV['s3_bucket']}) is empty")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def as_env(self) -> dict[str, str]:
        """The ``SPARK_ABS_*`` variables that describe this connection."""
        variables = {ENV[name]: str(getattr(self, name)) for name in CONNECTION_ENV_FIELDS}
        if self.job_secret:
            variables[ENV["job_secret"]] = self.job_secret
        return variables

    def job_key(self, job: str) -> JobKey:
        """The key job ``job`` signs its control events, leases and barriers with."""
        if not self.job_secret:
            raise ConfigError(
                f"no job secret: set {ENV['job_secret']}, or {ENV['job_secret_file']} to a file only "
                "its owner can read (the local runtime generates one: `spark-abs local up`)"
            )
        return JobKey.derive(self.job_secret, job)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Connection:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.name not in data]
        if missing:
            raise ConfigError(f"connection details lack {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Connection | None:
        """The connection given in ``SPARK_ABS_*`` variables, or None when
        ``SPARK_ABS_KAFKA_BOOTSTRAP`` is not set."""
        if not environ.get(ENV["kafka_bootstrap"]):
            return None
        data = {name: environ[ENV[name]] for name in CONNECTION_ENV_FIELDS if environ.get(ENV[name])}
        if environ.get(ENV["job_secret"]):
            data["job_secret"] = environ[ENV["job_secret"]]
        elif environ.get(ENV["job_secret_file"]):
            data["job_secret"] = read_secret_file(Path(environ[ENV["job_secret_file"]]), ENV["job_secret_file"])
        return cls.from_dict(data)

    @classmethod
    def load(cls, settings: LocalRuntimeSettings | None = None, environ: Mapping[str, str] | None = None) -> Connection:
        """The environment's connection if it names one, else the local runtime's file."""
        environ = os.environ if environ is None else environ
        from_env = cls.from_env(environ)
        if from_env is not None:
            return from_env
        settings = settings or LocalRuntimeSettings(home=default_home(environ))
        path = settings.connection_file
        if not path.exists():
            raise RuntimeNotRunningError(
                f"no connection file at {path}: start the local runtime with "
                f"`spark-abs local up`, or set {ENV['kafka_bootstrap']} and the other "
                "SPARK_ABS_* variables"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"connection file {path} is unreadable: {exc}") from exc
        return cls.from_dict(data.get("connection", {}))


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """The Spark session every stage and tool gets from ``streaming.adapters.spark``."""

    # Any master URL: local[N], spark://host:7077, ...
    master: str = "local[2]"
    app_name: str = "spark-abs"
    # Small on purpose: stage batches are small and shuffles should not fan out.
    shuffle_partitions: int = 2
    driver_memory: str = "2g"
    # The Spark UI costs start-up time and a port; off unless asked for.
    ui_enabled: bool = False
    # On a standalone master (spark://): executor threads one application
    # (a worker group) takes at most, one per executor, and each executor's memory.
    cores_max: int = 2
    executor_memory: str = "1g"
    # Extra spark.* options, applied last.
    extra_conf: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.shuffle_partitions < 1:
            raise ConfigError(f"shuffle_partitions must be >= 1, got {self.shuffle_partitions}")
        for key, _ in self.extra_conf:
            if not key.startswith("spark."):
                raise ConfigError(f"extra_conf key {key!r} is not a spark.* option")


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Where a process serves its Prometheus metrics (``streaming.engine.metrics``;
    docs/operations/metrics.md): the job runner, and each worker process."""

    # the address the endpoint binds: loopback, or 0.0.0.0 for a Prometheus on another host
    host: str = "127.0.0.1"
    # the port: 0 picks a free one (the runner logs it and lists it in its targets file);
    # None serves no metrics.  A runner's own workers take the next ports (port + 1 + the
    # worker's index) when it is given, free ones when it is 0
    port: int | None = 0

    def __post_init__(self) -> None:
        if self.port is not None:
            _check_port("metrics port", self.port)
        if not self.host:
            raise ConfigError("metrics host: give an address to bind, e.g. 127.0.0.1 or 0.0.0.0")

    @classmethod
    def off(cls) -> MetricsSettings:
        """No metrics endpoint."""
        return cls(port=None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MetricsSettings:
        """The defaults, or what ``SPARK_ABS_METRICS_HOST`` and
        ``SPARK_ABS_METRICS_PORT`` (a port, 0, or ``off``) say."""
        environ = os.environ if environ is None else environ
        host = environ.get(ENV["metrics_host"]) or cls().host
        port = (environ.get(ENV["metrics_port"]) or "").strip()
        if port.lower() == "off":
            return cls(host, None)
        if not port:
            return cls(host)
        try:
            return cls(host, int(port))
        except ValueError:
            raise ConfigError(f"{ENV['metrics_port']}: a port, 0 or off, got {port!r}") from None

    def for_worker(self, index: int) -> MetricsSettings:
        """The settings of a runner's worker process number ``index`` (from 0)."""
        if self.port is None or self.port == 0:
            return self
        return MetricsSettings(self.host, self.port + 1 + index)
