"""The Spark session factory: Spark's Kafka connector (and Delta's, when a
job asks) on the classpath, resolved once into the cache (``jars``), the
engine's own classes (``jvm``), and the project's settings applied in one
place (``spark_conf``); a local master's driver bound to the loopback.

Secrets: a session given the cluster's secret file authenticates and
encrypts its RPC (``spark.authenticate``, ``spark.network.crypto.enabled``);
a session whose options hold a secured Kafka's credentials refuses a master
elsewhere that does not (``unprotected_rpc``: the credentials would travel
to executors in the clear); and Spark's redaction also hides a Kafka
client key's PEM and a JAAS config, in the UI, the event log and plans."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from streaming.adapters.spark.jars import connector_jars, delta_jars, require_tool
from streaming.adapters.spark.jvm import helper_jar
from streaming.adapters.spark.query import STOP_BOUND_S
from streaming.api.config import ENV, LocalRuntimeSettings, SparkSettings
from streaming.api.job_key import read_secret_file
from streaming.errors import ConfigError

__all__ = ["REDACTION", "spark_session", "spark_conf", "local_master", "unprotected_rpc"]

log = logging.getLogger(__name__)


# attempts of a Spark task in local mode, as spark.task.maxFailures gives a cluster's
LOCAL_TASK_ATTEMPTS = 4


_LOCAL_MASTER = re.compile(r"local(\[(\d+|\*)\])?")


# where the driver listens when every executor runs on this machine (local_master): its RPC and block
# manager ports (spark.driver.port, spark.driver.blockManager.port) bind spark.driver.bindAddress and
# are advertised as spark.driver.host.  With a master elsewhere the executors must reach the driver:
# where it binds is the deployment's (SparkSettings.extra_conf, or SPARK_LOCAL_IP)
LOCAL_DRIVER_ADDRESS = "127.0.0.1"


# Spark's redaction (spark.redaction.regex, matched against an option's name and its value, in the
# UI's environment, the event log and the options plans show): Spark's default, plus a client
# key's PEM (kafka.ssl.keystore.key, whose name and value the default misses) and a JAAS config
REDACTION = r"(?i)secret|password|token|access[.]?key|keystore[.]key|PRIVATE KEY|jaas"

# what a master elsewhere must run with when the session's options hold secrets
RPC_PROTECTION = ("spark.authenticate", "spark.network.crypto.enabled")

# options that never go on the command line launching Spark's JVM (pyspark passes every option
# it is given there as --conf, which any user of the machine reads in /proc/<pid>/cmdline): they
# are set in the JVM's SparkConf once it runs
SECRET_CONF = ("spark.authenticate.secret",)


_LOOPBACK_HOST = re.compile(r"localhost|127(\.\d{1,3}){3}|\[::1\]")


def local_master(master: str) -> bool:
    """Whether every executor of ``master`` runs on this machine: a local
    master (``local``, ``local[...]``, ``local-cluster[...]``) or a standalone
    master on loopback (``spark://127.0.0.1:7077``, the local runtime's
    cluster), whose workers are on this machine too."""
    if master.startswith("local"):
        return True
    if not master.startswith("spark://"):
        return False
    hosts = [address.rsplit(":", 1)[0] for address in master.removeprefix("spark://").split(",")]
    return all(_LOOPBACK_HOST.fullmatch(host) for host in hosts)


def master_url(master: str) -> str:
    """``master`` as the session is started on: a local master without a
    failure count gets Spark's cluster default of 4 attempts per task
    (``local[2]`` becomes ``local[2,4]``). Local mode tries a task once, so a
    Kafka consumer that timed out while a broker restarted failed the stage
    query, and the worker with it, where a cluster retries the task."""
    match = _LOCAL_MASTER.fullmatch(master)
    if match is None:
        return master
    return f"local[{match.group(2) or 1},{LOCAL_TASK_ATTEMPTS}]"


def spark_conf(settings: SparkSettings, jars: list[Path]) -> dict[str, str]:
    """Every option the factory sets, as a plain mapping (easy to read and test).
    The driver of a master on this machine (``local_master``) listens on
    loopback alone; ``extra_conf``, applied last, may say otherwise."""
    conf = {
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.driver.memory": settings.driver_memory,
        "spark.ui.enabled": str(settings.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # Arrow moves batches between the JVM and Python in foreachBatch.
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        # a stage query's Spark checkpoint is a temporary directory of one generation (positions live
        # in spark-abs's snapshots): without Hadoop's checksums on local files, each micro-batch
        # writes its offset and commit logs in about half the time (16 against 30 ms each, idle)
        "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
        # a query's stop waits this long for its micro-batch thread, then fails (Spark's default: for good)
        "spark.sql.streaming.stopTimeout": f"{int(STOP_BOUND_S * 1000)}ms",
        "spark.sql.adaptive.enabled": "false",
        # the tasks of a job are queries of one application, whose jobs run in the order they
        # come: Spark's FAIR pools break ties by pool name, so with every pool idle between
        # micro-batches, queries named late in the alphabet waited for minutes behind the others
        "spark.scheduler.mode": "FIFO",
        "spark.redaction.regex": REDACTION,
    }
    if settings.secret_file:
        # the cluster's shared secret: RPC with the master, the workers and the executors
        # authenticated and encrypted (executors are given it by their worker, not in their conf)
        conf |= {
            "spark.authenticate": "true",
            "spark.authenticate.secret": read_secret_file(Path(settings.secret_file), ENV["spark_secret_file"]),
            "spark.network.crypto.enabled": "true",
        }
    if local_master(settings.master):
        conf |= {"spark.driver.bindAddress": LOCAL_DRIVER_ADDRESS, "spark.driver.host": LOCAL_DRIVER_ADDRESS}
    if settings.master.startswith("spark://"):
        # a worker group is one application among others: it must leave them cores
        conf.update(
            {
                "spark.cores.max": str(settings.cores_max),
                "spark.executor.cores": "1",
                "spark.executor.memory": settings.executor_memory,
                "spark.pyspark.python": sys.executable,
            }
        )
    if settings.delta:
        conf |= {
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        }
    conf.update(dict(settings.extra_conf))
    return conf


def unprotected_rpc(settings: SparkSettings, conf: dict[str, str]) -> list[str]:
    """What of ``RPC_PROTECTION`` a session with options ``conf`` lacks, where that matters: its
    options hold secrets (``carries_secrets``) and its executors run elsewhere (not a
    ``local_master``); empty otherwise."""
    if not settings.carries_secrets or local_master(settings.master):
        return []
    return [name for name in RPC_PROTECTION if conf.get(name, "false").strip().lower() != "true"]


def _refuse_unprotected_rpc(settings: SparkSettings, conf: dict[str, str]) -> None:
    """A ``ConfigError`` when ``unprotected_rpc`` names anything, Spark's defaults
    (spark-defaults.conf, as the launched JVM read them) under ``conf``."""
    if not unprotected_rpc(settings, conf):
        return
    from pyspark import SparkConf

    missing = unprotected_rpc(settings, {**dict(SparkConf().getAll()), **conf})
    if missing:
        raise ConfigError(
            f"the Spark master {settings.master} runs executors elsewhere, and this job's Kafka source options "
            "hold its credentials: Spark's RPC must be authenticated and encrypted, or they travel in the clear. "
            f"Set {' and '.join(f'{name}=true' for name in missing)} (spark-defaults.conf, on the master and "
            f"workers too) with a shared secret ({ENV['spark_secret_file']}, or spark.authenticate.secret); "
            "see docs/operations/security.md"
        )


def _launch_without_secrets(conf: dict[str, str]) -> None:
    """Start Spark's JVM (once per process) with ``conf`` on its command line but for
    ``SECRET_CONF``: the session then sets those in the running JVM's conf."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is not None:
        return
    public = SparkConf(loadDefaults=False)
    for key, value in conf.items():
        if key not in SECRET_CONF:
            public.set(key, value)
    SparkContext._ensure_initialized(conf=public)


def spark_session(
    settings: SparkSettings | None = None,
    runtime: LocalRuntimeSettings | None = None,
    progress: Callable[[str], None] = log.info,
) -> SparkSession:
    """A session on ``settings.master`` with the Kafka connector jars for the
    installed pyspark.  Reuses the active session when one exists.  On a
    master on this machine (``local_master``) the driver listens on loopback,
    its UI too when enabled (``SPARK_LOCAL_IP``, unless set, for the JVM this
    starts)."""
    settings = settings or SparkSettings()
    runtime = runtime or LocalRuntimeSettings()
    if runtime.spark_version != pyspark.__version__:
        raise ConfigError(
            f"spark_version {runtime.spark_version} differs from the installed "
            f"pyspark {pyspark.__version__}; the Kafka connector must match it"
        )
    require_tool("java")
    spark_jars = Path(pyspark.__file__).parent / "jars"
    jars = [
        *connector_jars(runtime.spark_version, runtime.cache_dir, spark_jars, progress),
        helper_jar(runtime.spark_version, runtime.cache_dir, spark_jars, progress),
    ]
    if settings.delta:
        jars += delta_jars(runtime.delta_version, runtime.cache_dir, spark_jars, progress)
    if settings.ui_enabled and local_master(settings.master):
        # the Spark UI binds SPARK_LOCAL_IP, not spark.driver.bindAddress: every interface without it
        os.environ.setdefault("SPARK_LOCAL_IP", LOCAL_DRIVER_ADDRESS)
    conf = spark_conf(settings, jars)
    _launch_without_secrets(conf)
    _refuse_unprotected_rpc(settings, conf)
    builder = SparkSession.builder.master(master_url(settings.master)).appName(settings.app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
