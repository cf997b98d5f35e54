"""Raw per-broker calls for the security tests (a unique module name: tests/ has no packages)."""

from __future__ import annotations

import time

import grpc

from client.sasl import ScramCredentials, scram_channel
from proto import broker_pb2, broker_pb2_grpc
from storage.record_batch import RecordBatchBuilder

ADMIN_PASSWORD = "admin-secret"
SECURE_OVERRIDES = {
    "authorizer.class.name": "StandardAuthorizer",
    "super.users": "User:admin;User:broker",
    "scram.bootstrap.users": f"admin:{ADMIN_PASSWORD},broker:broker-secret",
    "inter.broker.sasl.username": "broker",
    "inter.broker.sasl.password": "broker-secret",
    # Two 1 s samples: a quota's burst allowance stays small, so the quota test is short.
    "quota.window.num": "2",
}


def sasl(user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism, "sasl_username": user,
            "sasl_password": password}


def _channel(address: str, creds: tuple[str, str] | None) -> grpc.Channel:
    if creds is None:
        return grpc.insecure_channel(address)
    return scram_channel(address, ScramCredentials(*creds))


def broker_metadata_error(address: str, creds: tuple[str, str] | None, topic: str) -> int:
    """The error code one broker answers a Metadata request for ``topic`` with."""
    with _channel(address, creds) as ch:
        resp = broker_pb2_grpc.BrokerServiceStub(ch).Metadata(
            broker_pb2.MetadataRequest(topics=[topic], allow_auto_topic_creation=False), timeout=10)
    return resp.topics[0].error_code


def produce_raw(address: str, creds: tuple[str, str] | None, topic: str,
                value: bytes) -> broker_pb2.ProducePartitionResponse:
    """One record to partition 0 of ``topic`` on one broker, acks=all."""
    batch = RecordBatchBuilder()
    batch.append(int(time.time() * 1000), None, value)
    with _channel(address, creds) as ch:
        resp = broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            acks=-1, timeout_ms=10_000,
            partitions=[broker_pb2.ProducePartitionData(topic=topic, partition=0, records=batch.build())]),
            timeout=20)
    return resp.partitions[0]


def metric_total(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def scrape_anonymously(cluster: object, node_id: int, admin: object, timeout_s: float = 30.0) -> str:
    """Node ``node_id``'s /metrics over plain HTTP, as the SASL test cluster serves it. With an authorizer the
    page needs DESCRIBE on the cluster, and a caller without a client certificate is User:ANONYMOUS: this grants
    that to it from loopback only (idempotent), as an operator lets an unauthenticated local scraper in."""
    import urllib.error
    import urllib.request

    from metadata_quorum.security import acl_binding

    admin.create_acls([acl_binding(["CLUSTER", "kafka-cluster", "LITERAL", "User:ANONYMOUS", "127.0.0.1",  # type: ignore[attr-defined]
                                    "DESCRIBE", "ALLOW"])])
    from waiting import wait_for

    def page() -> str | None:
        try:
            with urllib.request.urlopen(cluster.metrics_url(node_id), timeout=10) as resp:  # type: ignore[attr-defined]
                return resp.read().decode()  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:
            if exc.code != 403:
                raise
            return None  # the ACL reaches the node with the next metadata update
    return wait_for(page, timeout_s, f"node {node_id}'s /metrics for User:ANONYMOUS from 127.0.0.1")
