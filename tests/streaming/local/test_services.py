"""The runtime's services without starting any: the Kafka nodes' names, the
``ports.json`` entries each service listens on, ``ports.json`` read back
(missing, corrupt, valid), and how a port is chosen (configured, remembered,
fresh)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from streaming.api.config import LocalRuntimeSettings
from streaming.errors import PortInUseError
from streaming.local import processes
from streaming.local.services import RuntimeServices


def _services(tmp_path, **over) -> RuntimeServices:
    return RuntimeServices(LocalRuntimeSettings(home=tmp_path, **over))


@contextmanager
def _held_port() -> Iterator[int]:
    """A loopback port something listens on while the block runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _write_ports(services: RuntimeServices, text: str) -> None:
    services.ports_file.parent.mkdir(parents=True, exist_ok=True)
    services.ports_file.write_text(text)


# -- names ---------------------------------------------------------------------


def test_one_kafka_node_is_named_kafka(tmp_path):
    assert _services(tmp_path).kafka_names() == ["kafka"]


def test_the_cluster_s_three_kafka_nodes_are_numbered_from_one(tmp_path):
    services = RuntimeServices(LocalRuntimeSettings.cluster(tmp_path))
    assert services.kafka_names() == ["kafka-1", "kafka-2", "kafka-3"]


def test_the_services_live_under_the_runtime_dir_and_the_cluster_under_its_own(tmp_path):
    assert _services(tmp_path).ports_file == tmp_path / "runtime" / "ports.json"
    assert RuntimeServices(LocalRuntimeSettings.cluster(tmp_path)).ports_file == (
        tmp_path / "cluster" / "runtime" / "ports.json"
    )


@pytest.mark.parametrize(
    ("service", "names"),
    [
        ("kafka", ["kafka", "kafka_controller"]),
        ("kafka-2", ["kafka-2", "kafka-2_controller"]),
        ("spark-master", ["spark", "spark_web"]),
        ("spark-worker-1", ["spark-worker-1_web"]),
        ("s3", ["s3"]),
        ("registry", ["registry"]),
    ],
)
def test_port_names_are_the_ports_json_entries_each_service_listens_on(tmp_path, service, names):
    assert _services(tmp_path).port_names(service) == names


# -- ports.json ------------------------------------------------------------------


def test_no_ports_file_means_no_ports_remembered(tmp_path):
    services = _services(tmp_path)
    assert not services.ports_file.exists()
    assert services.load_ports() == {}


@pytest.mark.parametrize(
    "text",
    ["", "{not json", "[8080, 9092]", '"kafka"', '{"kafka": "ninety"}'],
    ids=["empty", "garbled", "a-list", "a-string", "a-word-for-a-port"],
)
def test_a_corrupt_ports_file_means_no_ports_remembered(tmp_path, text):
    services = _services(tmp_path)
    _write_ports(services, text)
    assert services.load_ports() == {}


@pytest.mark.parametrize("entry", ["null", "[1]", "{}"])
def test_a_ports_file_with_a_port_of_another_type_means_no_ports_remembered(tmp_path, entry):
    services = _services(tmp_path)
    _write_ports(services, f'{{"kafka": {entry}}}')
    assert services.load_ports() == {}


def test_a_valid_ports_file_is_read_back_as_ints(tmp_path):
    services = _services(tmp_path)
    _write_ports(services, json.dumps({"kafka": 39092, "kafka_controller": "39093", "s3": 39000}))
    assert services.load_ports() == {"kafka": 39092, "kafka_controller": 39093, "s3": 39000}


# -- choose_port -----------------------------------------------------------------


def test_a_configured_port_that_is_free_is_used(tmp_path):
    port = processes.free_port()
    chosen = _services(tmp_path).choose_port("s3", port, {"s3": port + 1}, set(), "the S3 server")
    assert chosen == port


def test_a_configured_port_that_is_taken_is_an_error_naming_it(tmp_path):
    services = _services(tmp_path)
    with _held_port() as port, pytest.raises(PortInUseError, match=rf"port {port} .*the S3 server"):
        services.choose_port("s3", port, {}, set(), "the S3 server")


def test_a_remembered_port_that_is_free_is_used_again(tmp_path):
    port = processes.free_port()
    chosen = _services(tmp_path).choose_port("s3", 0, {"s3": port}, set(), "the S3 server")
    assert chosen == port


def test_a_remembered_port_already_taken_by_another_service_is_not_used(tmp_path):
    port = processes.free_port()
    chosen = _services(tmp_path).choose_port("s3", 0, {"s3": port}, {port}, "the S3 server")
    assert chosen != port
    assert chosen > 0


def test_a_remembered_port_something_else_listens_on_is_not_used(tmp_path):
    services = _services(tmp_path)
    with _held_port() as port:
        chosen = services.choose_port("s3", 0, {"s3": port}, set(), "the S3 server")
    assert chosen != port
    assert chosen > 0


def test_a_port_remembered_for_another_name_is_not_used(tmp_path):
    port = processes.free_port()
    # "registry" is remembered, "s3" is not: s3 gets a fresh port, not the registry's
    chosen = _services(tmp_path).choose_port("s3", 0, {"registry": port}, {port}, "the S3 server")
    assert chosen != port
