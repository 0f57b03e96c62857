"""A Spark standalone cluster from the installed pyspark: a master and
workers started through ``$SPARK_HOME/bin/spark-class`` (the wheel has no
``sbin/`` scripts), with ``SPARK_HOME`` the pyspark package directory, each
with its own properties file (what tells its process apart), work directory
and log under the runtime directory.

Workers offer more cores than the machine has on purpose: a core of a
standalone worker is a slot for one executor thread, and every worker group
of a job is an application that asks for two (``spark.cores.max``), so the
groups of a job run at once instead of queueing for slots.

The cluster takes only applications that hold its secret: the master, the
workers and every driver run with ``spark.authenticate`` and
``spark.network.crypto.enabled`` (RPC authenticated and encrypted), the
secret generated on first start into ``<runtime>/secrets/spark.secret``
(its owner's alone; the connection names the file).  Without it, any user
of the machine could submit an application to the master and run code as
the runtime's owner.  The master's REST submission server is off, and
neither web UI kills anything.  A master or worker started by an earlier
version without authentication is stopped and started again."""

from __future__ import annotations

import http.client
import json
import sys
import urllib.request
from pathlib import Path

import pyspark

from streaming.api.job_key import kept_secret
from streaming.errors import ServiceStartError
from streaming.local import processes
from streaming.local.processes import ServiceSpec
from streaming.local.services import Progress, RuntimeServices
from streaming.private_files import write_private
from streaming.waits import poll_until

__all__ = [
    "SparkStarter",
    "WORKER_CORES",
    "WORKER_MEMORY",
    "alive_workers",
    "daemon_conf",
    "master_spec",
    "secret_file",
    "spark_home",
    "specs",
    "worker_spec",
]

WORKER_CORES = 4
WORKER_MEMORY = "6g"


def spark_home() -> Path:
    return Path(pyspark.__file__).resolve().parent


def _env(runtime_dir: Path) -> dict[str, str]:
    return {
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(runtime_dir / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
        "PYSPARK_PYTHON": sys.executable,
    }


def secret_file(runtime_dir: Path) -> Path:
    """The file of the cluster's shared secret (``spark.authenticate.secret``)."""
    return runtime_dir / "secrets" / "spark.secret"


def _secret(runtime_dir: Path) -> str:
    """The cluster's secret: generated on first start, its owner's alone, then kept."""
    return kept_secret(secret_file(runtime_dir), "the Spark cluster's secret file")


def daemon_conf(secret: str) -> dict[str, str]:
    """What the master and each worker run with: RPC authenticated by
    ``secret`` and encrypted, no REST submissions, no kill links."""
    return {
        "spark.authenticate": "true",
        "spark.authenticate.secret": secret,
        "spark.network.crypto.enabled": "true",
        "spark.master.rest.enabled": "false",
        "spark.ui.killEnabled": "false",
    }


_AUTHENTICATED = "spark.authenticate true"


def _properties(runtime_dir: Path, name: str) -> Path:
    """The properties file of ``name`` (it holds the secret: its owner's alone)."""
    path = runtime_dir / "spark" / f"{name}.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# written by spark-abs local up; its path tells this process apart"]
    lines += [f"{key} {value}" for key, value in daemon_conf(_secret(runtime_dir)).items()]
    text = "\n".join(lines) + "\n"
    if not path.exists() or path.read_text() != text:
        write_private(path, text)
    return path


def _authenticated(spec: ServiceSpec) -> bool:
    """Whether the process of ``spec`` was started with authentication on (its properties say so)."""
    try:
        return _AUTHENTICATED in Path(spec.marker).read_text().splitlines()
    except OSError:
        return False


def master_spec(runtime_dir: Path, port: int = 0, web_port: int = 0) -> ServiceSpec:
    properties = runtime_dir / "spark" / "spark-master.properties"
    argv = [str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master"]
    if port:  # the spec without ports is how `down` and `status` recognise it
        properties = _properties(runtime_dir, "spark-master")
        argv += ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web_port)]
    return ServiceSpec(
        name="spark-master",
        argv=argv + ["--properties-file", str(properties)],
        log_path=runtime_dir / "logs" / "spark-master.out",
        pid_path=runtime_dir / "pids" / "spark-master.pid",
        marker=str(properties),
        env=_env(runtime_dir),
    )


def worker_spec(runtime_dir: Path, index: int, master_port: int = 0, web_port: int = 0) -> ServiceSpec:
    name = f"spark-worker-{index}"
    properties = runtime_dir / "spark" / f"{name}.properties"
    work_dir = runtime_dir / "spark" / name
    argv = [str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker"]
    if master_port:
        properties = _properties(runtime_dir, name)
        work_dir.mkdir(parents=True, exist_ok=True)
        argv += [
            "--host",
            "127.0.0.1",
            "--webui-port",
            str(web_port),
            "--cores",
            str(WORKER_CORES),
            "--memory",
            WORKER_MEMORY,
            "--work-dir",
            str(work_dir),
            "--properties-file",
            str(properties),
            f"spark://127.0.0.1:{master_port}",
        ]
    return ServiceSpec(
        name=name,
        argv=argv,
        log_path=runtime_dir / "logs" / f"{name}.out",
        pid_path=runtime_dir / "pids" / f"{name}.pid",
        marker=str(properties),
        env=_env(runtime_dir),
    )


def alive_workers(web_port: int) -> int:
    """How many workers the master's web UI lists as ALIVE; none while the UI
    cannot say yet (its port opens before its ``/json/`` page answers: a 404
    or a refused connection for a moment after the master starts)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=3) as response:
            state = json.loads(response.read())
    except (OSError, ValueError, http.client.HTTPException):  # urllib's errors are OSErrors; a page cut short
        return 0
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")


def specs(services: RuntimeServices, ports: dict[str, int] | None = None) -> list[ServiceSpec]:
    """The master and workers of the runtime ``services``, the master first (with ``ports``, as
    they start; without, to find them); none but on a cluster."""
    workers = services.settings.spark_workers
    if not workers:
        return []
    ports = ports or {}
    found = [master_spec(services.dir, ports.get("spark", 0), ports.get("spark_web", 0))]
    for i in range(1, workers + 1):
        found.append(worker_spec(services.dir, i, ports.get("spark", 0), ports.get(f"spark-worker-{i}_web", 0)))
    return found


class SparkStarter:
    """The Spark standalone master, then its workers (a cluster only); ready
    once the master lists every worker ALIVE."""

    def __init__(self, services: RuntimeServices, progress: Progress):
        self.services = services
        self._progress = progress

    def up(self, remembered: dict[str, int], taken: set[int]) -> dict[str, int]:
        """The master, then the workers; ready once the master lists every worker ALIVE."""
        settings = self.services.settings
        workers = settings.spark_workers
        if not workers:
            return {}
        names = ["spark", "spark_web", *(f"spark-worker-{i}_web" for i in range(1, workers + 1))]
        probe = specs(self.services)
        running = [spec for spec in probe if processes.running_pid(spec.pid_path, spec.marker) is not None]
        if any(not _authenticated(spec) for spec in running):
            # started without authentication (an earlier version): every application was welcome
            self._progress("restarting the Spark cluster with authentication and encryption on")
            for spec in reversed(running):
                processes.stop(spec.pid_path, spec.marker)
        master_running = processes.running_pid(probe[0].pid_path, probe[0].marker) is not None
        ports: dict[str, int] = {}
        for name in names:
            keep = master_running and name in ("spark", "spark_web") and name in remembered
            ports[name] = (
                remembered[name] if keep else self.services.choose_port(name, 0, remembered, taken, f"Spark {name}")
            )
            taken.add(ports[name])
        started = specs(self.services, ports)
        for spec in started:
            if processes.running_pid(spec.pid_path, spec.marker) is not None:
                continue
            self._progress(f"starting {spec.name}")
            proc = processes.start(spec)
            if spec.name == "spark-master":
                processes.wait_ready(
                    spec, proc, lambda: processes.port_open(ports["spark_web"]), settings.start_timeout_s
                )

        def too_few(message: str) -> ServiceStartError:
            logs = "\n".join(f"--- {spec.log_path}:\n{processes.tail(spec.log_path, 8)}" for spec in started[1:])
            return ServiceStartError(
                f"the Spark master at 127.0.0.1:{ports['spark']} lists fewer than {workers} live workers after "
                f"{settings.start_timeout_s:.0f} s; the workers' logs end:\n{logs}"
            )

        poll_until(
            lambda: alive_workers(ports["spark_web"]) >= workers,
            settings.start_timeout_s,
            f"{workers} live Spark workers",
            bound="start_timeout_s",
            every_s=0.5,
            error=too_few,
        )
        self._progress(f"Spark master spark://127.0.0.1:{ports['spark']} with {workers} workers ready")
        return ports
