"""The runner's metrics endpoint and its Prometheus targets file
(``streaming.engine.job.endpoints``): served once, none when metrics are
off, the workers' endpoints added by group as their tasks name them."""

from __future__ import annotations

import json
import logging
import urllib.request

from streaming.api.config import MetricsSettings
from streaming.engine import metrics
from streaming.engine.job.endpoints import RunnerEndpoints

LOG = logging.getLogger("test")


def test_metrics_off_serve_nothing_and_write_no_targets(tmp_path):
    endpoints = RunnerEndpoints(MetricsSettings.off(), tmp_path, "j", LOG)
    endpoints.serve()
    endpoints.note({"a-0": "127.0.0.1:1"}, {"all": ["a-0"]})
    assert endpoints.server is None and endpoints.targets is None and list(tmp_path.iterdir()) == []
    endpoints.close()


def test_the_endpoint_is_served_once_and_lists_the_workers_by_group(tmp_path):
    endpoints = RunnerEndpoints(MetricsSettings(port=0), tmp_path, "j", LOG)
    try:
        endpoints.serve()
        server = endpoints.server
        assert server is not None
        endpoints.serve()  # the second generation's launch: the same endpoint
        assert endpoints.server is server
        with urllib.request.urlopen(server.url, timeout=10) as page:
            assert page.status == 200
        endpoints.note({"a-0": "127.0.0.1:7001", "b-0": "127.0.0.1:7002", "gone-0": "127.0.0.1:7003"}, {"w": ["a-0"]})
        endpoints.note({}, {"w": ["a-0"]})  # nothing new: the file stays as it is
        targets = json.loads((tmp_path / metrics.TARGETS_FILE).read_text())
        assert [t["targets"] for t in targets] == [[server.address], ["127.0.0.1:7001"]]  # tasks of no group: left out
        assert targets[1]["labels"] == {"spark_abs_role": "worker", "spark_abs_job": "j", "spark_abs_worker": "w"}
    finally:
        endpoints.close()
    assert endpoints.server is None
