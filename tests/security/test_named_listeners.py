"""Named listeners: PLAINTEXT on localhost next to mTLS, on one real node.

A plaintext client that bootstraps from the LOCAL listener is given LOCAL addresses in
metadata (so its produce and fetch stay plaintext), an mTLS client is given the BROKER
ones; a plaintext replica fetch through LOCAL is still refused (node identity needs the
certificate once loopback trust is off).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from client.admin import Admin, NewTopic
from client.cluster import ClusterClient
from client.consumer import Consumer
from client.producer import Producer
from client.security import make_channel
from deploy.local.cluster import LocalCluster, free_port
from proto import broker_pb2, broker_pb2_grpc
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, int]]:
    cluster = LocalCluster(tmp_path_factory.mktemp("listeners"), nodes=1, tls=True)
    spec = cluster.spec(1)
    local_port = free_port()
    cluster.state.overrides.update({
        "listeners": f"BROKER://127.0.0.1:{spec.broker_port},CONTROLLER://127.0.0.1:{spec.controller_port},"
                     f"LOCAL://127.0.0.1:{local_port}",
        "listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL,LOCAL:PLAINTEXT",
        "offsets.topic.replication.factor": "1",
    })
    with cluster:
        yield cluster, local_port


def test_plaintext_client_on_the_local_listener_stays_on_it(node: tuple[LocalCluster, int]) -> None:
    cluster, local_port = node
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
        admin.create_topics([NewTopic("mixed", 1, 1)])
    local = f"127.0.0.1:{local_port}"
    with ClusterClient(local, request_timeout_ms=30_000) as plain:
        brokers = plain.metadata(refresh=True).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", local_port)]
    with ClusterClient(cluster.bootstrap_servers, request_timeout_ms=30_000, security=cluster.security) as tls:
        brokers = tls.metadata(refresh=True).brokers
        assert [b.port for b in brokers.values()] == [cluster.spec(1).broker_port]
    with Producer(bootstrap_servers=local, acks="all") as producer:
        producer.send("mixed", b"over-loopback").get(timeout=60)
    consumer = Consumer("mixed", bootstrap_servers=local, auto_offset_reset="earliest", group_id="local-group")
    try:
        deadline = time.monotonic() + 60
        seen: list[bytes] = []
        while not seen and time.monotonic() < deadline:
            for records in consumer.poll(1000).values():
                seen += [r.value for r in records]
    finally:
        consumer.close()
    assert seen == [b"over-loopback"]


def test_plaintext_replica_fetch_on_loopback_is_refused(node: tuple[LocalCluster, int]) -> None:
    cluster, local_port = node
    ch = make_channel(f"127.0.0.1:{local_port}")
    req = broker_pb2.FetchRequest(replica_id=1, replica_epoch=0, max_wait_ms=0, max_bytes=1 << 20,
                                  partitions=[broker_pb2.FetchPartition(topic="mixed", partition=0, fetch_offset=0,
                                                                        partition_max_bytes=1 << 20,
                                                                        current_leader_epoch=-1,
                                                                        last_fetched_epoch=-1)])
    resp = broker_pb2_grpc.BrokerServiceStub(ch).Fetch(req, timeout=30)
    assert [p.error_code for p in resp.partitions] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
