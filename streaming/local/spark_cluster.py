"""A Spark standalone cluster from the installed pyspark: a master and
workers started through ``$SPARK_HOME/bin/spark-class`` (the wheel has no
``sbin/`` scripts), with ``SPARK_HOME`` the pyspark package directory, each
with its own properties file (what tells its process apart), work directory
and log under the runtime directory.

Workers offer more cores than the machine has on purpose: a core of a
standalone worker is a slot for one executor thread, and every worker group
of a job is an application that asks for two (``spark.cores.max``), so the
groups of a job run at once instead of queueing for slots."""

from __future__ import annotations

import http.client
import json
import sys
import urllib.request
from pathlib import Path

import pyspark

from streaming.errors import ServiceStartError
from streaming.local import processes
from streaming.local.processes import ServiceSpec
from streaming.local.services import Progress, RuntimeServices
from streaming.waits import poll_until

__all__ = [
    "SparkStarter",
    "WORKER_CORES",
    "WORKER_MEMORY",
    "alive_workers",
    "master_spec",
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


def _properties(runtime_dir: Path, name: str) -> Path:
    path = runtime_dir / "spark" / f"{name}.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text("# written by spark-abs local up; its path tells this process apart\n")
    return path


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
