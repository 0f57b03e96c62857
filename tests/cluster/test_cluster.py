"""On the local cluster (three Kafka nodes, replication factor 3; a Spark
standalone master with two workers): a topic has a replica on each node, and
writes need two of them in sync.  A job on the cluster, losing a Kafka node,
a Spark worker, its remote worker group's member (with and without a
standby) and its runner, is test_cluster_drill.py's (``spark-abs drill
--cluster``)."""

from __future__ import annotations

import pytest
from kafka.admin import ConfigResource, ConfigResourceType

from streaming.adapters.kafka.admin import admin_client, create_topic

pytestmark = pytest.mark.integration


def test_topics_are_replicated_on_three_brokers(cluster, unique_name):
    _, connection = cluster
    create_topic(connection.kafka, unique_name, 2)
    admin = admin_client(connection.kafka)
    try:
        (described,) = admin.describe_topics([unique_name])
        resource = ConfigResource(ConfigResourceType.TOPIC, unique_name, configs=["min.insync.replicas"])
        configs = admin.describe_configs([resource])
    finally:
        admin.close()
    assert [len(p["replica_nodes"]) for p in described["partitions"]] == [3, 3]
    assert configs["topic"][unique_name]["min.insync.replicas"]["value"] == "2"
