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
from streaming.private_files import read_private

__all__ = [
    "ENV",
    "KAFKA_PROTOCOLS",
    "SASL_MECHANISMS",
    "Connection",
    "KafkaAccess",
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
    # Kafka's security (KafkaAccess): the password from a variable or, better, a file
    "kafka_security_protocol": "SPARK_ABS_KAFKA_SECURITY_PROTOCOL",
    "kafka_sasl_mechanism": "SPARK_ABS_KAFKA_SASL_MECHANISM",
    "kafka_username": "SPARK_ABS_KAFKA_USERNAME",
    "kafka_password": "SPARK_ABS_KAFKA_PASSWORD",
    "kafka_password_file": "SPARK_ABS_KAFKA_PASSWORD_FILE",
    "kafka_ca_file": "SPARK_ABS_KAFKA_CA_FILE",
    "kafka_cert_file": "SPARK_ABS_KAFKA_CERT_FILE",
    "kafka_key_file": "SPARK_ABS_KAFKA_KEY_FILE",
    "s3_endpoint": "SPARK_ABS_S3_ENDPOINT",
    "s3_access_key": "SPARK_ABS_S3_ACCESS_KEY",
    "s3_secret_key": "SPARK_ABS_S3_SECRET_KEY",
    "s3_bucket": "SPARK_ABS_S3_BUCKET",
    "s3_region": "SPARK_ABS_S3_REGION",
    "spark_master": "SPARK_ABS_SPARK_MASTER",
    # a file holding the Spark cluster's shared secret (spark.authenticate.secret): its owner's alone
    "spark_secret_file": "SPARK_ABS_SPARK_SECRET_FILE",
    # a Confluent-compatible schema registry's API (Avro ingress resolved by schema id)
    "schema_registry": "SPARK_ABS_SCHEMA_REGISTRY",
    # the registry's basic-auth user and a file holding its password, and a CA file for https://
    "schema_registry_user": "SPARK_ABS_SCHEMA_REGISTRY_USER",
    "schema_registry_password_file": "SPARK_ABS_SCHEMA_REGISTRY_PASSWORD_FILE",
    "schema_registry_ca_file": "SPARK_ABS_SCHEMA_REGISTRY_CA_FILE",
    "maven_repo": "SPARK_ABS_MAVEN_REPO",
    # the secret the job's key is derived from (streaming.api.job_key), or a file holding it
    "job_secret": "SPARK_ABS_JOB_SECRET",
    "job_secret_file": "SPARK_ABS_JOB_SECRET_FILE",
    # where a process serves its Prometheus metrics (MetricsSettings.from_env)
    "metrics_host": "SPARK_ABS_METRICS_HOST",
    "metrics_allow_host": "SPARK_ABS_METRICS_ALLOW_HOST",
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

# Kafka's security, when it has any: optional, so not in docker/compose.yaml (its broker is PLAINTEXT)
KAFKA_SECURITY_ENV_FIELDS = (
    "kafka_security_protocol",
    "kafka_sasl_mechanism",
    "kafka_username",
    "kafka_password",
    "kafka_password_file",
    "kafka_ca_file",
    "kafka_cert_file",
    "kafka_key_file",
)

# optional services: a job that uses none of them needs none
OPTIONAL_ENV_FIELDS = (
    "schema_registry",
    "schema_registry_user",
    "schema_registry_password_file",
    "schema_registry_ca_file",
    "spark_secret_file",
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
    kafka_version: str = "4.4.0"
    # Spark's Kafka connector; must equal the installed pyspark version.
    spark_version: str = "4.2.0"
    # delta-spark, for sessions with SparkSettings.delta: 4.4.0 is built on Spark 4.2.0.
    delta_version: str = "4.4.0"
    # S3 API server: versitygw (POSIX backend), built once with `go install`.
    s3_server_version: str = "v1.8.0"
    # Schema registry: Apicurio Registry (Confluent-compatible API), built once from Maven Central.
    schema_registry_version: str = "2.4.2.Final"
    # 0 = pick a free loopback port on first start and keep it afterwards.
    kafka_port: int = 0
    kafka_controller_port: int = 0
    s3_port: int = 0
    registry_port: int = 0
    # Credentials of the local S3 server (loopback only): "" = generated on first start into
    # <runtime>/secrets/s3.keys (its owner's alone) and kept; its bucket.
    s3_access_key: str = ""
    s3_secret_key: str = field(default="", repr=False)
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
    # "plaintext", or "sasl_ssl": the broker's listener takes SASL (SCRAM) over TLS
    # only, ACLs on (streaming.local.kafka_security); one node only.
    kafka_security: str = "plaintext"

    def __post_init__(self) -> None:
        if not isinstance(self.home, Path):
            raise ConfigError(f"home must be a pathlib.Path, got {type(self.home).__name__}")
        for name in ("kafka_port", "kafka_controller_port", "s3_port", "registry_port"):
            _check_port(name, getattr(self, name))
        nonzero = [p for p in (self.kafka_port, self.kafka_controller_port, self.s3_port, self.registry_port) if p]
        if len(nonzero) != len(set(nonzero)):
            raise ConfigError(
                "kafka_port, kafka_controller_port, s3_port and registry_port must differ, "
                f"got {self.kafka_port}, {self.kafka_controller_port}, {self.s3_port}, {self.registry_port}"
            )
        if self.start_timeout_s <= 0:
            raise ConfigError(f"start_timeout_s must be positive, got {self.start_timeout_s}")
        if self.kafka_nodes < 1 or self.spark_workers < 0:
            raise ConfigError(
                f"kafka_nodes must be >= 1 and spark_workers >= 0, got {self.kafka_nodes}, {self.spark_workers}"
            )
        if self.kafka_security not in ("plaintext", "sasl_ssl"):
            raise ConfigError(f"kafka_security {self.kafka_security!r}: use 'plaintext' or 'sasl_ssl'")
        if self.kafka_security != "plaintext" and self.kafka_nodes > 1:
            raise ConfigError("a secured broker (kafka_security sasl_ssl) is one node: not a cluster yet")
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

    @classmethod
    def secure(cls, home: Path | None = None, **changes: Any) -> LocalRuntimeSettings:
        """The secured runtime: its broker's listener SASL_SSL with ACLs on,
        under ``<home>/secure`` (its own data, logs, secrets and connection
        file), sharing ``<home>/cache``."""
        home = home or default_home()
        defaults = {"kafka_security": "sasl_ssl", "cache": home / "cache"}
        return cls(home=home / "secure", **{**defaults, **changes})

    @property
    def is_cluster(self) -> bool:
        return self.kafka_nodes > 1 or self.spark_workers > 0

    @property
    def is_secure(self) -> bool:
        return self.kafka_security != "plaintext"

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


KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _readable(path: Path, name: str) -> None:
    if not path.is_file() or not os.access(path, os.R_OK):
        raise ConfigError(f"{ENV[name]}: {path} is not a readable file")


@dataclass(frozen=True, slots=True)
class KafkaAccess:
    """How every Kafka client of a job reaches Kafka: the bootstrap servers and
    the security they use.  Passed wherever a client is made; the one place
    that turns security into kafka-python keyword arguments
    (``client_options``) and Spark's Kafka source and sink options
    (``spark_options``).  ``str()`` gives the servers alone, so messages may
    name it; the password appears in no repr.
    """

    # host:port[,host:port...]
    servers: str
    # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    security_protocol: str = "PLAINTEXT"
    # with SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, and a username and password
    sasl_mechanism: str | None = None
    username: str | None = None
    # the password itself, or (better: it is read from there) a file holding it
    password: str | None = field(default=None, repr=False)
    password_file: Path | None = None
    # with SSL / SASL_SSL: the CA certificates (PEM) the brokers' are checked against; None: the system's
    ca_file: Path | None = None
    # a client certificate (PEM), and its key (PEM, PKCS#8) when the certificate file does not hold it
    cert_file: Path | None = None
    key_file: Path | None = None
    # the password in force: given, or read from password_file
    _secret: str | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigError(f"kafka_bootstrap ({ENV['kafka_bootstrap']}) is empty")
        protocol = str(self.security_protocol).upper()
        object.__setattr__(self, "security_protocol", protocol)
        if protocol not in KAFKA_PROTOCOLS:
            raise ConfigError(
                f"{ENV['kafka_security_protocol']} {self.security_protocol!r}: use one of {', '.join(KAFKA_PROTOCOLS)}"
            )
        for name in ("password_file", "ca_file", "cert_file", "key_file"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value) if value else None)
        self._check_sasl(protocol)
        self._check_tls(protocol)

    def _check_sasl(self, protocol: str) -> None:
        if self.password is not None and self.password_file is not None:
            raise ConfigError(
                f"give the Kafka password once: {ENV['kafka_password']} or {ENV['kafka_password_file']}, not both"
            )
        object.__setattr__(self, "_secret", self.password)
        if self.password_file is not None:
            _readable(self.password_file, "kafka_password_file")
            # a file of this user's no one else may read or write (read_private says how to fix it)
            object.__setattr__(self, "_secret", read_secret_file(self.password_file, ENV["kafka_password_file"]))
        if not protocol.startswith("SASL_"):
            given = [
                ENV[n] for n in ("kafka_sasl_mechanism", "kafka_username", "kafka_password") if getattr(self, n[6:])
            ]
            if given:
                raise ConfigError(
                    f"{', '.join(given)} given, but {ENV['kafka_security_protocol']} is {protocol}: "
                    "set it to SASL_SSL (or SASL_PLAINTEXT) to authenticate"
                )
            return
        if self.sasl_mechanism is None:
            raise ConfigError(
                f"{ENV['kafka_security_protocol']} {protocol} needs {ENV['kafka_sasl_mechanism']} "
                f"({', '.join(SASL_MECHANISMS)})"
            )
        mechanism = self.sasl_mechanism.upper()
        object.__setattr__(self, "sasl_mechanism", mechanism)
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                f"{ENV['kafka_sasl_mechanism']} {self.sasl_mechanism!r}: use one of {', '.join(SASL_MECHANISMS)}"
            )
        if not self.username or not self._secret:
            raise ConfigError(
                f"{ENV['kafka_security_protocol']} {protocol} needs {ENV['kafka_username']} and "
                f"{ENV['kafka_password_file']} (or {ENV['kafka_password']})"
            )

    def _check_tls(self, protocol: str) -> None:
        files = {n: getattr(self, n) for n in ("ca_file", "cert_file", "key_file") if getattr(self, n) is not None}
        if files and not protocol.endswith("SSL"):
            raise ConfigError(
                f"{', '.join(ENV['kafka_' + n] for n in files)} given, but {ENV['kafka_security_protocol']} "
                f"is {protocol}: TLS files need SSL or SASL_SSL"
            )
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError(f"{ENV['kafka_key_file']} given without {ENV['kafka_cert_file']}")
        for name, path in files.items():
            _readable(path, "kafka_" + name)
        if self.key_file is not None:  # the client's private key: this user's alone, as every secret file
            read_private(self.key_file, ENV["kafka_key_file"])

    def __str__(self) -> str:
        return self.servers

    @property
    def is_secured(self) -> bool:
        return self.security_protocol != "PLAINTEXT"

    @property
    def is_cluster(self) -> bool:
        """More than one bootstrap server."""
        return "," in self.servers

    def client_options(self) -> dict[str, Any]:
        """The keyword arguments every kafka-python client (producer, consumer,
        admin) gets: the servers and the security."""
        options: dict[str, Any] = {"bootstrap_servers": self.servers, "security_protocol": self.security_protocol}
        if self.sasl_mechanism is not None:
            options |= {
                "sasl_mechanism": self.sasl_mechanism,
                "sasl_plain_username": self.username,
                "sasl_plain_password": self._secret,
            }
        if self.ca_file is not None:
            options["ssl_cafile"] = str(self.ca_file)
        if self.cert_file is not None:
            options["ssl_certfile"] = str(self.cert_file)
        if self.key_file is not None:
            options["ssl_keyfile"] = str(self.key_file)
        return options

    def spark_options(self) -> dict[str, str]:
        """The options of Spark's Kafka source and sink (``kafka.``-prefixed
        Java client settings): the servers and the security."""
        options = {"kafka.bootstrap.servers": self.servers}
        if not self.is_secured:
            return options
        options["kafka.security.protocol"] = self.security_protocol
        if self.sasl_mechanism is not None:
            quoted = [str(v).replace("\\", "\\\\").replace('"', '\\"') for v in (self.username, self._secret)]
            options["kafka.sasl.mechanism"] = self.sasl_mechanism
            options["kafka.sasl.jaas.config"] = (
                f'{_LOGIN_MODULES[self.sasl_mechanism]} required username="{quoted[0]}" password="{quoted[1]}";'
            )
        if self.ca_file is not None:
            options |= {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(self.ca_file)}
        if self.cert_file is not None and self.key_file is None:
            options |= {"kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.location": str(self.cert_file)}
        elif self.cert_file is not None and self.key_file is not None:
            options |= {
                "kafka.ssl.keystore.type": "PEM",
                "kafka.ssl.keystore.certificate.chain": self.cert_file.read_text(),
                "kafka.ssl.keystore.key": read_private(self.key_file, ENV["kafka_key_file"]),
            }
        return options

    def as_fields(self) -> dict[str, str]:
        """The ``kafka_*`` fields of a connection file (the password only when
        no file holds it), the set ones only."""
        fields = {
            "kafka_bootstrap": self.servers,
            "kafka_security_protocol": self.security_protocol if self.is_secured else None,
            "kafka_sasl_mechanism": self.sasl_mechanism,
            "kafka_username": self.username,
            "kafka_password": self.password,
            "kafka_password_file": self.password_file,
            "kafka_ca_file": self.ca_file,
            "kafka_cert_file": self.cert_file,
            "kafka_key_file": self.key_file,
        }
        return {k: str(v) for k, v in fields.items() if v is not None}

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> KafkaAccess:
        """The access ``as_fields`` (or the ``SPARK_ABS_KAFKA_*`` variables, by role) describe."""
        return cls(
            servers=data.get("kafka_bootstrap") or "",
            security_protocol=data.get("kafka_security_protocol") or "PLAINTEXT",
            **{
                name: data.get("kafka_" + name) or None
                for name in (
                    "sasl_mechanism",
                    "username",
                    "password",
                    "password_file",
                    "ca_file",
                    "cert_file",
                    "key_file",
                )
            },
        )


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach Kafka, the S3 server and Spark: what the local runtime writes
    to its connection file, or what a deployment passes in ``SPARK_ABS_*``.
    Secrets (the S3 secret key, Kafka's password) appear in no repr."""

    kafka: KafkaAccess
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str = field(repr=False)
    s3_bucket: str
    s3_region: str = "us-east-1"
    spark_master: str = "local[2]"
    # a file holding the Spark cluster's shared secret (its owner's alone): drivers then run with
    # spark.authenticate and spark.network.crypto.enabled; "" when the master asks for none
    spark_secret_file: str = ""
    # a Confluent-compatible schema registry's API base (http://host:port/apis/ccompat/v7 for
    # Apicurio's, the local runtime's); "" when there is none
    schema_registry: str = ""
    # its basic-auth user and a file holding the password (its owner's alone), and a CA file for
    # https:// ("" when it asks for none; the local runtime's registry asks for its own)
    schema_registry_user: str = ""
    schema_registry_password_file: str = ""
    schema_registry_ca_file: str = ""
    # what the job's key is derived from (``job_key``): the secret, or a file holding it (which
    # only its owner may read; worker processes are given its name); "" when not given
    job_secret: str = field(default="", repr=False)
    job_secret_file: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kafka, KafkaAccess):
            raise ConfigError(f"kafka must be a KafkaAccess, got {type(self.kafka).__name__}")
        endpoint = urlparse(self.s3_endpoint)
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise ConfigError(
                f"s3_endpoint ({ENV['s3_endpoint']}) must look like http://host:port, got {self.s3_endpoint!r}"
            )
        if not self.s3_bucket:
            raise ConfigError(f"s3_bucket ({ENV['s3_bucket']}) is empty")

    def to_dict(self) -> dict[str, Any]:
        """The connection file's fields (Kafka's flattened, ``kafka_*``)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "kafka"}
        return {**self.kafka.as_fields(), **fields}

    def as_env(self) -> dict[str, str]:
        """The ``SPARK_ABS_*`` variables that describe this connection: every
        one, those it does not use empty (``from_env`` reads an empty one as
        unset), so that a process given them over an environment of its own
        (a worker the runner starts) has this connection, not a mix."""
        data = {k: str(v) for k, v in self.to_dict().items() if v not in (None, "")}
        names = (
            CONNECTION_ENV_FIELDS + KAFKA_SECURITY_ENV_FIELDS + OPTIONAL_ENV_FIELDS + ("job_secret", "job_secret_file")
        )
        return {ENV[name]: data.get(name, "") for name in names}

    def spark_settings(self, **changes: Any) -> SparkSettings:
        """The Spark session settings of a driver on this connection's master: its secret file, and
        whether the session carries secrets (a secured Kafka's credentials go into its source
        options, so a remote master must authenticate and encrypt its RPC)."""
        return SparkSettings(
            **{
                "master": self.spark_master,
                "secret_file": self.spark_secret_file,
                "carries_secrets": self.kafka.is_secured,
                **changes,
            }
        )

    def job_key(self, job: str, *, cluster: str) -> JobKey:
        """The key job ``job`` signs its control events, leases and barriers with on the Kafka
        cluster whose id is ``cluster`` (``streaming.adapters.kafka.admin.job_key`` asks Kafka)."""
        return JobKey.derive(self._job_secret(), job, cluster=cluster)

    def store_key(self, job: str) -> bytes:
        """The key job ``job``'s store files are signed with (``JobKey.store_key``)."""
        return JobKey.store_key(self._job_secret(), job)

    def _job_secret(self) -> str:
        if self.job_secret:
            return self.job_secret
        if self.job_secret_file:
            return read_secret_file(Path(self.job_secret_file), ENV["job_secret_file"])
        raise ConfigError(
            f"no job secret: set {ENV['job_secret']}, or {ENV['job_secret_file']} to a file only "
            "its owner can read (the local runtime generates one: `spark-abs local up`)"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Connection:
        fields = [f for f in dataclasses.fields(cls) if f.name != "kafka"]
        missing = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in data]
        if "kafka_bootstrap" not in data:
            missing.insert(0, "kafka_bootstrap")
        if missing:
            raise ConfigError(f"connection details lack {', '.join(missing)}")
        return cls(kafka=KafkaAccess.from_fields(data), **{f.name: data[f.name] for f in fields if f.name in data})

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Connection | None:
        """The connection given in ``SPARK_ABS_*`` variables, or None when
        ``SPARK_ABS_KAFKA_BOOTSTRAP`` is not set."""
        if not environ.get(ENV["kafka_bootstrap"]):
            return None
        names = CONNECTION_ENV_FIELDS + KAFKA_SECURITY_ENV_FIELDS + OPTIONAL_ENV_FIELDS
        data: dict[str, Any] = {name: environ[ENV[name]] for name in names if environ.get(ENV[name])}
        if environ.get(ENV["job_secret"]):
            data["job_secret"] = environ[ENV["job_secret"]]
        elif environ.get(ENV["job_secret_file"]):
            data["job_secret_file"] = environ[ENV["job_secret_file"]]
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
        try:  # it holds the job secret: a file of this user's no one else may read or write
            data = json.loads(read_private(path, "the connection file"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"connection file {path} is unreadable: {exc}") from exc
        return cls.from_dict(data.get("connection", {}))


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """The Spark session every stage and tool gets from ``streaming.adapters.spark.session``."""

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
    # Spark's Delta Lake reader and writer in the session (delta-spark's jars, its SQL extension and
    # catalog): to read a Delta sink's table with Spark (``spark.read.format("delta")``).
    delta: bool = False
    # Extra spark.* options, applied last.
    extra_conf: tuple[tuple[str, str], ...] = ()
    # A file holding the cluster's shared secret (owner-only): spark.authenticate, with RPC encryption
    secret_file: str = ""
    # The session's options hold secrets (a secured Kafka's credentials): a master elsewhere must
    # authenticate and encrypt its RPC, or the session is refused
    carries_secrets: bool = False

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
