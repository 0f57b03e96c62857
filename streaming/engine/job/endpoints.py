"""Where a job's metrics are served: the runner's own Prometheus endpoint
(``run --metrics-port``, ``SPARK_ABS_METRICS_PORT``: a free port by
default), and ``prometheus-targets.json`` in the job's log directory, which
lists it and every worker's endpoint for Prometheus's ``file_sd_configs``
(``streaming.engine.metrics``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from streaming.api.config import MetricsSettings
from streaming.engine import metrics

__all__ = ["RunnerEndpoints"]


class RunnerEndpoints:
    """The runner's metrics endpoint (``server``) and its targets file
    (``targets``) for job ``job``, from the first ``serve`` on (neither with
    ``MetricsSettings.off``)."""

    def __init__(self, settings: MetricsSettings, log_dir: Path, job: str, log: logging.Logger | logging.LoggerAdapter):
        self.settings = settings
        self.log_dir = log_dir
        self.job = job
        self.log = log
        self.server: metrics.MetricsServer | None = None
        self.targets: metrics.Targets | None = None

    def serve(self) -> None:
        """Serve the runner's metrics and write the targets file, the first time."""
        if self.server is not None:
            return
        self.server = metrics.serve(self.settings, "run --metrics-port")
        if self.server is None:
            return
        self.targets = metrics.Targets(self.log_dir / metrics.TARGETS_FILE, self.job, self.server.address)
        self.log.info(
            "job %s: metrics on %s; Prometheus targets (file_sd) in %s", self.job, self.server.url, self.targets.path
        )

    def note(self, endpoints: Mapping[str, str], groups: Mapping[str, list[str]]) -> None:
        """The workers' metrics endpoints their tasks' ready events named
        (task -> address), by worker group (``groups``), into the targets file."""
        if self.targets is None or not endpoints:
            return
        group_of = {task: group for group, tasks in groups.items() for task in tasks}
        self.targets.update({group_of[task]: address for task, address in endpoints.items() if task in group_of})

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
