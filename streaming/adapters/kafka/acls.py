"""The Kafka ACLs one job needs, as docs/operations/security-kafka.md lists
them, computed from its pipeline (``job_grants``), and granted or revoked
through an admin's client (``grant``, ``revoke``).

Prefixed where the job names its own resources, literal where the
pipeline names someone else's:

- topics ``spark-abs.<job>.`` (internal topics, control topic, dead
  letters) and transactional ids ``spark-abs.<job>.`` (the Kafka sink's):
  prefixed (a job's name has no dot: no other job's name starts so);
- each ingress topic: Create, Describe, DescribeConfigs, Read and Write
  (the runner appends its barriers to the ingress partitions);
- a Kafka sink's topic and its ``.commits`` topic: Create, Describe,
  DescribeConfigs, Read, Write;
- consumer groups ``spark-kafka-source-`` and ``spark-kafka-relation-``
  (prefixed): the group ids Spark's Kafka source gives its consumers in a
  streaming and a batch query (they assign partitions, commit nothing);
- the cluster: Describe, IdempotentWrite.

``cleanup`` adds Delete and DeleteRecords on the job's topics (a drill's
retention kind, and removing a job), which a production job does not need."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streaming.adapters.kafka import clients
from streaming.api.config import KafkaAccess
from streaming.api.pipeline import Pipeline, SinkKind
from streaming.api.topics import commits_topic, job_prefix
from streaming.errors import ConfigError

__all__ = ["Grant", "grant", "job_grants", "revoke"]

CLUSTER = "kafka-cluster"
SPARK_GROUPS = ("spark-kafka-source-", "spark-kafka-relation-")

_CREATE_AND_READ = ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ")
_CLEANUP = ("DELETE",)


@dataclass(frozen=True, slots=True)
class Grant:
    """Operations on a resource (``TOPIC``, ``GROUP``, ``TRANSACTIONAL_ID``, ``CLUSTER``; kafka-python's
    names) named literally or by a prefix."""

    resource: str
    name: str
    operations: tuple[str, ...]
    prefixed: bool = False

    def render(self, principal: str) -> str:
        """The grant as ``kafka-acls.sh --add`` arguments."""
        flag = {
            "TOPIC": f"--topic {self.name}",
            "GROUP": f"--group {self.name}",
            "TRANSACTIONAL_ID": f"--transactional-id {self.name}",
            "CLUSTER": "--cluster",
        }[self.resource]
        operations = " ".join(f"--operation {_camel(op)}" for op in self.operations)
        pattern = " --resource-pattern-type prefixed" if self.prefixed else ""
        return f"--allow-principal User:{principal} {operations} {flag}{pattern}"


def _camel(operation: str) -> str:
    return "".join(part.capitalize() for part in operation.split("_"))


def job_grants(pipeline: Pipeline, *, cleanup: bool = False) -> list[Grant]:
    """What the user of ``pipeline``'s job needs on Kafka, least first; ``cleanup``: also deleting
    the job's topics and their records."""
    job = pipeline.job
    extra = _CLEANUP if cleanup else ()
    grants = [
        Grant("TOPIC", job_prefix(job), (*_CREATE_AND_READ, "WRITE", *extra), prefixed=True),
        Grant("TRANSACTIONAL_ID", job_prefix(job), ("DESCRIBE", "WRITE"), prefixed=True),
        *(Grant("GROUP", group, ("DESCRIBE", "READ"), prefixed=True) for group in SPARK_GROUPS),
        Grant("CLUSTER", CLUSTER, ("DESCRIBE", "IDEMPOTENT_WRITE")),
    ]
    for topic in sorted({ingress.topic for ingress in pipeline.ingress}):
        # Write: the runner appends its barriers to every ingress partition
        grants.append(Grant("TOPIC", topic, (*_CREATE_AND_READ, "WRITE", *extra)))
    sinks = {s.sink.topic for s in pipeline.stages if s.sink is not None and s.sink.kind is SinkKind.KAFKA}
    for topic in sorted(t for t in sinks if t):
        for name in (topic, commits_topic(topic)):
            grants.append(Grant("TOPIC", name, (*_CREATE_AND_READ, "WRITE", *extra)))
    return grants


def _acls(principal: str, grants: Iterable[Grant]) -> list:
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )

    acls = []
    for g in grants:
        kind = ACLResourcePatternType.PREFIXED if g.prefixed else ACLResourcePatternType.LITERAL
        pattern = ResourcePattern(ResourceType[g.resource], g.name, kind)
        for operation in g.operations:
            acls.append(ACL(f"User:{principal}", "*", ACLOperation[operation], ACLPermissionType.ALLOW, pattern))
    return acls


def grant(admin: KafkaAccess, principal: str, grants: Iterable[Grant]) -> None:
    """Grant ``principal`` the ``grants``, through ``admin`` (a user Kafka lets alter ACLs;
    idempotent).  A ``ConfigError`` names what Kafka refused."""
    client = clients.admin(admin)
    try:
        result = client.create_acls(_acls(principal, grants))
    finally:
        client.close()
    if result.get("failed"):
        raise ConfigError(f"Kafka refused ACLs of User:{principal}: {result['failed']}")


def revoke(admin: KafkaAccess, principal: str, grants: Iterable[Grant]) -> int:
    """Remove ``grants`` of ``principal`` (those there; through ``admin``); how many ACLs went."""
    from kafka.admin import ACLFilter

    filters = [
        ACLFilter(acl.principal, acl.host, acl.operation, acl.permission_type, acl.resource_pattern)
        for acl in _acls(principal, grants)
    ]
    client = clients.admin(admin)
    try:
        results = client.delete_acls(filters)
    finally:
        client.close()
    removed = 0
    for _, matched, error in results:
        if error is not None and int(getattr(error, "errno", 0) or 0):
            raise ConfigError(f"Kafka refused to remove ACLs of User:{principal}: {error}")
        removed += len(matched)
    return removed
